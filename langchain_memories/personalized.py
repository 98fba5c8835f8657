"""MaLP's personalized model as a LangChain chat model (Zhang et al., 2023, eq. 3)."""

from __future__ import annotations

from typing import Any

from langchain_core.caches import BaseCache
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import LangSmithParams
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, Field, field_validator

from langchain_memories.chat_parts import PROVIDER, WholeReplyChatModel, ls_params
from langchain_memories.retriever import MemoryRetriever
from memories_core.errors import InvalidInputError
from memories_core.mechanisms.dpem import DualProcessMemory
from memories_core.personalize import PersonalizedLLM, Personalizer
from memories_core.types import ChatMessage, Scope

__all__ = ["PersonalizedChatModel", "dpem_retriever"]


def _to_core(message: BaseMessage) -> ChatMessage:
    if isinstance(message, SystemMessage):
        return ChatMessage("system", message.text)
    if isinstance(message, HumanMessage):
        return ChatMessage("user", message.text)
    if isinstance(message, AIMessage):
        return ChatMessage("assistant", message.text)
    raise InvalidInputError(f"PersonalizedChatModel cannot send a {type(message).__name__}")


class PersonalizedChatModel(WholeReplyChatModel):
    """A user's MaLP model as a LangChain ``BaseChatModel``: their LoRA adapter + DPeM memory.

    Every call recalls the user's DPeM memory for the last human message, puts it in the
    system message (the chain's own system text comes first), and generates with the user's
    adapter (the base model until one is trained), through
    :class:`memories_core.personalize.PersonalizedLLM`.

    Setup:
        ``pip install "llm-memories[langchain,personalize]"``.

    Key init args:
        personalizer: Personalizer
            Holds the base model, the adapters and the memory.
        user_id: str
            Whose adapter and memory.
        use_memory: bool
            Prepend the recalled memory (default ``True``).
        use_adapter: bool
            Generate with the user's adapter (default ``True``).
        max_tokens: int | None
            Generation limit (default: the personalizer's).
        temperature: float
            Sampling temperature (default ``0.0``: greedy).

    ``max_tokens``, ``temperature`` and ``stop`` can also be given per call
    (``chat.invoke(..., max_tokens=64)``, ``chat.bind(stop=[...])``). The model writes a
    whole reply, so ``stream`` yields it as one chunk, with the token counts.

    Instantiate / use in a chain:
        ```python
        from langchain_core.output_parsers import StrOutputParser
        from langchain_core.prompts import ChatPromptTemplate
        from memories_core.personalize import Personalizer
        from langchain_memories import PersonalizedChatModel

        personalizer = Personalizer(memory)            # memory: DualProcessMemory
        chat = PersonalizedChatModel(personalizer=personalizer, user_id="ann")
        chain = ChatPromptTemplate.from_template("{question}") | chat | StrOutputParser()
        chain.invoke({"question": "I got red spots on my skin recently"})
        ```
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    personalizer: Personalizer = Field(description="Base model, adapters and memory.")
    user_id: str = Field(description="Whose adapter and memory.")
    use_memory: bool = Field(default=True, description="Prepend the recalled DPeM memory.")
    use_adapter: bool = Field(default=True, description="Use the user's LoRA adapter.")
    max_tokens: int | None = Field(default=None, ge=1, description="Generation limit.")
    temperature: float = Field(default=0.0, ge=0.0, description="Sampling temperature.")
    # The answer depends on the memory and the adapter, which change: never cache it.
    cache: BaseCache | bool | None = Field(default=False, exclude=True)

    @field_validator("user_id")
    @classmethod
    def _check_user_id(cls, value: str) -> str:
        Scope(value)
        return value

    @property
    def _llm_type(self) -> str:
        return "malp-personalized"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "base": self.personalizer.base_identity,
            "use_memory": self.use_memory,
            "use_adapter": self.use_adapter,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return ls_params(
            self.personalizer.base_identity,
            kwargs,
            stop=stop,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
        )

    @property
    def core_llm(self) -> PersonalizedLLM:
        """The core model this chat model runs (``last_prompt`` shows what it sent)."""
        return self.personalizer.llm(
            self.user_id, use_memory=self.use_memory, use_adapter=self.use_adapter
        )

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        core = [_to_core(m) for m in messages]
        llm = self.core_llm
        before = llm.usage
        text = llm.generate(
            core,
            max_tokens=kwargs.get("max_tokens", self.max_tokens),
            temperature=kwargs.get("temperature", self.temperature),
            stop=stop,
        )
        after = llm.usage
        message = AIMessage(
            content=text,
            usage_metadata={
                "input_tokens": after.prompt_tokens - before.prompt_tokens,
                "output_tokens": after.completion_tokens - before.completion_tokens,
                "total_tokens": after.total_tokens - before.total_tokens,
            },
            response_metadata={
                "adapter": llm.trace.adapter,
                "user_id": self.user_id,
                "model_name": self.personalizer.base_identity,
                "model_provider": PROVIDER,
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


def dpem_retriever(
    memory: DualProcessMemory, user_id: str, *, k: int | None = None
) -> MemoryRetriever:
    """The generic retriever over a DPeM memory: STM and LTM knowledge items as documents.

    The documents interleave LTM's fused semantic hits and STM's closest Levenshtein matches,
    each carrying its type (user-specific or common-sense) in the metadata, as the
    executive process's retrieval has them (Zhang et al., 2023, "DPeM Mechanism",
    Figure 5).
    """
    return MemoryRetriever(memory=memory, user_id=user_id, k=k)
