"""The :class:`PersonalizedLLM`: the base model with a user's adapter, as an ``LLM``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memories_core.llms.base import BaseLLM, LLMResult, truncate_at_stop
from memories_core.types import ChatMessage, check_user_id

if TYPE_CHECKING:
    from memories_core.personalize.trainer import Personalizer

__all__ = ["PersonalizedLLM"]


@dataclass
class _Trace:
    """The last prompt a :class:`PersonalizedLLM` sent (for inspection and tests)."""

    messages: tuple[ChatMessage, ...] = ()
    adapter: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class PersonalizedLLM(BaseLLM):
    """A core LLM that answers one user with their adapter and their recalled DPeM memory.

    Each call recalls the memory for the last user message (eq. 3's ``p``), puts it in the
    system message, and generates with the user's LoRA adapter (or the base model until one is
    trained). :attr:`last_prompt` keeps the messages of the last call.

    Args:
        personalizer: The :class:`Personalizer` holding the base model and adapters.
        user_id: Whose adapter and memory.
        use_memory: Prepend the recalled memory (MaLP); ``False`` for LoRA alone.
        use_adapter: Use the adapter; ``False`` for memory alone (DPeM without PEFT).
    """

    def __init__(
        self,
        personalizer: Personalizer,
        user_id: str,
        *,
        use_memory: bool = True,
        use_adapter: bool = True,
    ) -> None:
        # The personalizer's own generation limit is the output cap of a call without one.
        super().__init__(max_tokens=None)
        self.personalizer = personalizer
        self.user_id = check_user_id(user_id)
        self.use_memory = use_memory
        self.use_adapter = use_adapter
        self.trace = _Trace()

    @property
    def name(self) -> str:
        """``malp:<base>`` (the adapter is per user)."""
        return f"malp:{self.personalizer.base_identity}"

    @property
    def last_prompt(self) -> tuple[ChatMessage, ...]:
        """The messages sent to the model by the last call."""
        return self.trace.messages

    def personalize(self, messages: Sequence[ChatMessage]) -> list[ChatMessage]:
        """``messages`` with the recalled memory added to (or as) the system message."""
        messages = list(messages)
        if not self.use_memory:
            return messages
        query = next((m.content for m in reversed(messages) if m.role == "user"), "")
        system = [m for m in messages if m.role == "system"]
        rest = [m for m in messages if m.role != "system"]
        if not rest or rest[-1].role != "user":
            return messages
        built = self.personalizer.prompt_messages(self.user_id, rest[:-1], query)
        if system:
            merged = "\n\n".join([*(m.content for m in system), built[0].content])
            built[0] = ChatMessage("system", merged)
        return built

    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        prompt = tuple(self.personalize(messages))
        user = self.user_id if self.use_adapter else None
        self.trace = _Trace(
            prompt, self.use_adapter and self.personalizer.adapter(self.user_id) is not None
        )
        result = self.personalizer.generate(
            user, prompt, max_new_tokens=max_tokens, temperature=temperature
        )
        return LLMResult(
            truncate_at_stop(result.text, stop),
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
        )
