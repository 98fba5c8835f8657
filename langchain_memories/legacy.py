"""Memory for legacy ``ConversationChain`` / ``LLMChain`` code (``langchain_classic``)."""

from __future__ import annotations

from typing import Any

from langchain_classic.base_memory import BaseMemory
from langchain_classic.memory.utils import get_prompt_input_key
from langchain_core.messages import SystemMessage
from pydantic import ConfigDict, Field, field_validator

from memories_core.background import WorkStatus
from memories_core.interfaces import Mechanism
from memories_core.mechanisms.base import flush_memory, memory_status
from memories_core.types import Recall, Scope, Turn, turns_from_texts

__all__ = ["LegacyChainMemory"]


class LegacyChainMemory(BaseMemory):
    """Long-term memory for chains that take ``memory=`` (``ConversationChain``, ``LLMChain``).

    ``BaseMemory`` is deprecated upstream (removal announced for LangChain 2.0, which is why
    LangChain warns when this class is built); new code should use ``MemoryMiddleware`` with
    ``create_agent``. This class lets existing chains gain long-term memory unchanged.

    Before the chain runs, the chain input is used as the query and the recalled memories
    fill ``memory_key``: a string (the mechanism's rendered context, ``""`` when nothing is
    recalled), or with ``return_messages=True`` a list holding one ``SystemMessage`` with that
    context (an empty list when nothing is recalled), for ``MessagesPlaceholder`` prompts.
    After the chain runs, the input and the output are saved as a user and an assistant
    turn; empty or whitespace-only texts are skipped instead of raised on.

    Setup:
        ```bash
        pip install "llm-memories[langchain]"
        ```

    Key init args:
        memory: Mechanism
            The core memory (``HistoryMemory``, ``SummaryMemory``, ...).
        user_id: str
            Whose memories to read and write. Required.
        session_id: str | None
            Session of the saved turns.
        k: int | None
            Memories recalled per call; ``None`` uses the mechanism default.
        memory_key: str
            Prompt variable to fill (default ``"history"``).
        input_key / output_key: str | None
            Which chain input / output to use; ``None`` infers the only one.
        return_messages: bool
            Fill ``memory_key`` with messages instead of a string.

        An empty ``user_id`` or ``k < 1`` raises pydantic's ``ValidationError`` (a
        ``ValueError``) at construction.

    Instantiate:
        ```python
        from memories_core import HistoryMemory
        from memories_core.embedders import HashingEmbedder
        from langchain_memories import LegacyChainMemory

        core = HistoryMemory(embedder=HashingEmbedder(), path="./.memories")
        memory = LegacyChainMemory(memory=core, user_id="alice")
        ```

    Invoke:
        ```python
        memory.save_context({"input": "I love Thai food"}, {"response": "Noted!"})
        memory.load_memory_variables({"input": "what food do I like?"})["history"]
        ```

    Async:
        ```python
        await memory.asave_context({"input": "I love Thai food"}, {"response": "Noted!"})
        await memory.aload_memory_variables({"input": "what food do I like?"})
        ```

    Use in a chain/agent:
        ```python
        from langchain_classic.chains import ConversationChain

        chain = ConversationChain(llm=llm, memory=memory)
        chain.invoke({"input": "What should I cook tonight?"})
        ```
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: Mechanism = Field(description="The core memory mechanism.")
    user_id: str = Field(description="Whose memories to read and write.")
    session_id: str | None = Field(default=None, description="Session of the saved turns.")
    k: int | None = Field(default=None, ge=1, description="Memories per call; None: default.")
    memory_key: str = Field(default="history", description="Prompt variable to fill.")
    input_key: str | None = Field(default=None, description="Chain input used as the query.")
    output_key: str | None = Field(default=None, description="Chain output saved as answer.")
    return_messages: bool = Field(default=False, description="Fill with messages, not a str.")

    @field_validator("user_id")
    @classmethod
    def _check_user_id(cls, value: str) -> str:
        Scope(value)  # fail at construction, not at the first call, on an empty user id
        return value

    @property
    def memory_variables(self) -> list[str]:
        """The one prompt variable this memory fills."""
        return [self.memory_key]

    def _scope(self) -> Scope:
        return Scope(self.user_id, session_id=self.session_id)

    def _input_text(self, inputs: dict[str, Any]) -> str:
        key = self.input_key or get_prompt_input_key(inputs, self.memory_variables)
        return str(inputs[key])

    def _output_text(self, outputs: dict[str, Any]) -> str:
        if self.output_key is not None:
            key = self.output_key
        elif len(outputs) == 1:
            key = next(iter(outputs))
        else:
            raise ValueError(
                f"Several chain outputs {sorted(outputs)}; set output_key to the one to save"
            )
        return str(outputs[key])

    def _turns(self, inputs: dict[str, Any], outputs: dict[str, Any]) -> list[Turn]:
        texts = [("user", self._input_text(inputs)), ("assistant", self._output_text(outputs))]
        return turns_from_texts(texts)

    def _variables(self, recall: Recall | None) -> dict[str, Any]:
        context = recall.context if recall is not None else ""
        if not self.return_messages:
            return {self.memory_key: context}
        return {self.memory_key: [SystemMessage(content=context)] if context.strip() else []}

    def load_memory_variables(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Recall memories for the chain input."""
        query = self._input_text(inputs)
        if not query.strip():
            return self._variables(None)
        return self._variables(self.memory.recall(query, self._scope(), k=self.k))

    async def aload_memory_variables(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Async twin of :meth:`load_memory_variables` (uses ``memory.arecall``)."""
        query = self._input_text(inputs)
        if not query.strip():
            return self._variables(None)
        return self._variables(await self.memory.arecall(query, self._scope(), k=self.k))

    def save_context(self, inputs: dict[str, Any], outputs: dict[str, str]) -> None:
        """Save the chain input and output as a user and an assistant turn."""
        turns = self._turns(inputs, outputs)
        if turns:
            self.memory.save(turns, self._scope())

    async def asave_context(self, inputs: dict[str, Any], outputs: dict[str, str]) -> None:
        """Async twin of :meth:`save_context` (uses ``memory.asave``)."""
        turns = self._turns(inputs, outputs)
        if turns:
            await self.memory.asave(turns, self._scope())

    def flush(self, *, timeout: float | None = None) -> int:
        """Wait for the memory's pending derivations of ``user_id`` (see ``MemoryEngine.flush``).

        Saves return before the model derives notes, memos or summaries; call this when the
        next recall must see them (scripts, tests). Returns how many jobs are left.
        """
        return flush_memory(self.memory, self.user_id, timeout=timeout)

    def status(self) -> WorkStatus | None:
        """Pending, running and failed derivations of ``user_id`` (``None``: not reported)."""
        return memory_status(self.memory, self.user_id)

    def clear(self) -> None:
        """Forget every memory of ``user_id`` (all sessions, not just this chain's)."""
        self.memory.clear(Scope(self.user_id))
