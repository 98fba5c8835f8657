"""MaLP's personalized model as a LlamaIndex ``LLM`` (Zhang et al., 2023, eq. 3)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, field_validator
from llama_index.core.llms import LLM
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback

from llamaindex_memories.retriever import MemoryRetriever
from memories_core.mechanisms.dpem import DualProcessMemory
from memories_core.personalize import PersonalizedLLM, Personalizer
from memories_core.types import ChatMessage as CoreMessage
from memories_core.types import Scope

__all__ = ["PersonalizedLlamaLLM", "dpem_retriever"]

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
}


def _to_core(messages: Sequence[ChatMessage]) -> list[CoreMessage]:
    return [
        CoreMessage(_ROLES.get(m.role, "user"), m.content or "")
        for m in messages
        if (m.content or "").strip()
    ]


class PersonalizedLlamaLLM(LLM):
    """A user's MaLP model as a LlamaIndex ``LLM``: their LoRA adapter + recalled DPeM memory.

    Chat and completion calls go to :class:`memories_core.personalize.PersonalizedLLM`: the
    user's DPeM memory is recalled for the latest user message and put in the system message,
    and the user's adapter (the base model until one is trained) generates. Streaming yields
    the whole answer once. Usable wherever LlamaIndex takes an ``llm`` (chat engines, query
    engines, agents).

    Setup:
        ``pip install "llm-memories[llamaindex,personalize]"``.

    Example:
        .. code-block:: python

            from llama_index.core.chat_engine import SimpleChatEngine
            from llamaindex_memories import PersonalizedLlamaLLM

            llm = PersonalizedLlamaLLM(personalizer=personalizer, user_id="ann")
            engine = SimpleChatEngine.from_defaults(llm=llm)
            engine.chat("I got red spots on my skin recently")
    """

    personalizer: Personalizer = Field(description="Base model, adapters and memory.")
    user_id: str = Field(description="Whose adapter and memory.")
    use_memory: bool = Field(default=True, description="Prepend the recalled DPeM memory.")
    use_adapter: bool = Field(default=True, description="Use the user's LoRA adapter.")
    max_tokens: int | None = Field(default=None, ge=1, description="Generation limit.")

    @field_validator("user_id")
    @classmethod
    def _check_user(cls, value: str) -> str:
        Scope(value)
        return value

    @classmethod
    def class_name(cls) -> str:
        """Name used by LlamaIndex serialization."""
        return "PersonalizedLlamaLLM"

    @property
    def metadata(self) -> LLMMetadata:
        """A chat model named after the base model."""
        return LLMMetadata(
            model_name=f"malp:{self.personalizer.base_identity}",
            is_chat_model=True,
            num_output=self.max_tokens or self.personalizer.max_new_tokens,
            context_window=self.personalizer.config.max_input_tokens,
        )

    @property
    def core_llm(self) -> PersonalizedLLM:
        """The core model this LLM runs (``last_prompt`` shows what it sent)."""
        return self.personalizer.llm(
            self.user_id, use_memory=self.use_memory, use_adapter=self.use_adapter
        )

    def _answer(self, messages: Sequence[CoreMessage]) -> tuple[str, dict[str, Any]]:
        llm = self.core_llm
        text = llm.generate(messages, max_tokens=self.max_tokens)
        return text, {"adapter": llm.trace.adapter, "user_id": self.user_id}

    def _chat(self, messages: Sequence[ChatMessage], stream: bool = False) -> ChatResponse:
        text, extra = self._answer(_to_core(messages))
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=text),
            delta=text if stream else None,
            additional_kwargs=extra,
        )

    def _complete(self, prompt: str, stream: bool = False) -> CompletionResponse:
        text, extra = self._answer([CoreMessage("user", prompt)])
        return CompletionResponse(
            text=text, delta=text if stream else None, additional_kwargs=extra
        )

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Answer the conversation as the user's personalized model."""
        return self._chat(messages)

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async twin of :meth:`chat` (a worker thread: generation is CPU-bound)."""
        return await asyncio.to_thread(self._chat, messages)

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Answer ``prompt`` as the user's message."""
        return self._complete(prompt)

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """Async twin of :meth:`complete`."""
        return await asyncio.to_thread(self._complete, prompt)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """:meth:`chat`, yielded once."""
        response = self._chat(messages, stream=True)

        def gen() -> ChatResponseGen:
            yield response

        return gen()

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        """Async twin of :meth:`stream_chat`."""
        response = await asyncio.to_thread(self._chat, messages, True)

        async def gen() -> ChatResponseAsyncGen:
            yield response

        return gen()

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        """:meth:`complete`, yielded once."""
        response = self._complete(prompt, stream=True)

        def gen() -> CompletionResponseGen:
            yield response

        return gen()

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        """Async twin of :meth:`stream_complete`."""
        response = await asyncio.to_thread(self._complete, prompt, True)

        async def gen() -> CompletionResponseAsyncGen:
            yield response

        return gen()


def dpem_retriever(
    memory: DualProcessMemory, user_id: str, *, k: int | None = None
) -> MemoryRetriever:
    """The generic retriever over a DPeM memory: STM and LTM knowledge items as nodes.

    The nodes interleave LTM's fused semantic hits and STM's closest Levenshtein matches,
    each carrying its type (user-specific or common-sense) in the metadata, as the
    executive process's retrieval has them (Zhang et al., 2023, "DPeM Mechanism",
    Figure 5).
    """
    return MemoryRetriever(memory, user_id, similarity_top_k=k)
