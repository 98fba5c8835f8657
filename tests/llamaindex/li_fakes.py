"""Fakes shared by the LlamaIndex adapter tests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.schema import NodeWithScore, QueryBundle

from memories_core import ChatMessage as CoreChatMessage
from memories_core.interfaces import LLM


class RecordingLLM(CustomLLM):
    """A scripted LlamaIndex LLM that records every prompt it receives."""

    replies: list[str] = Field(default_factory=list)
    default: str = "OK."
    prompts: list[str] = Field(default_factory=list)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="recording", context_window=4096, num_output=64)

    def _next(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.replies.pop(0) if self.replies else self.default

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=self._next(prompt))

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        text = self._next(prompt)

        def gen() -> CompletionResponseGen:
            yield CompletionResponse(text=text, delta=text)

        return gen()


def message_text(messages: Sequence[ChatMessage]) -> str:
    """All text of a message list, as one string (for assertions)."""
    return "\n".join(str(m.content or "") for m in messages)


class CoreBackedLLM(CustomLLM):
    """A LlamaIndex chat model answered by a core LLM, e.g. ``ScriptedLLM(default=...)``.

    Lets one scripted core model count every call of an exchange: the app's answering calls
    (through this LlamaIndex face) and the memory's own calls (given the core model directly).
    """

    core: LLM = Field(exclude=True)

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="core-backed", context_window=4096, is_chat_model=True)

    @staticmethod
    def _to_core(messages: Sequence[ChatMessage]) -> list[CoreChatMessage]:
        return [CoreChatMessage(m.role.value, m.content or "") for m in messages]

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        text = self.core.generate(self._to_core(messages))
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        text = await self.core.agenerate(self._to_core(messages))
        return ChatResponse(message=ChatMessage(role=MessageRole.ASSISTANT, content=text))

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        return CompletionResponse(text=self.core.generate([CoreChatMessage("user", prompt)]))

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        response = self.complete(prompt)

        def gen() -> CompletionResponseGen:
            yield response

        return gen()


class SpyRetriever(BaseRetriever):
    """Wraps a retriever and records every query string it is asked (sync and async)."""

    def __init__(self, base: BaseRetriever) -> None:
        self.base = base
        self.queries: list[str] = []
        super().__init__()

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.queries.append(query_bundle.query_str)
        return self.base.retrieve(query_bundle)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        self.queries.append(query_bundle.query_str)
        return await self.base.aretrieve(query_bundle)
