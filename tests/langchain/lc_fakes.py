"""Fakes shared by the LangChain adapter tests (offline, deterministic)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable
from pydantic import ConfigDict, Field

from memories_core import ChatMessage, HistoryMemory
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.llms.scripted import Response
from memories_core.prompts.rule_following import rule_following_reply


def history_memory(**kwargs: Any) -> HistoryMemory:
    """An in-memory HistoryMemory over the deterministic hashing embedder."""
    return HistoryMemory(embedder=HashingEmbedder(), path=None, **kwargs)


class RecordingChatModel(GenericFakeChatModel):
    """A scripted chat model that records every prompt and supports ``bind_tools``."""

    prompts: list[list[BaseMessage]] = Field(default_factory=list)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.prompts.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    def bind_tools(
        self, tools: Sequence[Any], **kwargs: Any
    ) -> Runnable[LanguageModelInput, AIMessage]:
        return self

    @property
    def last_system_text(self) -> str:
        first = self.prompts[-1][0]
        return first.text if first.type == "system" else ""


def chat_model(*replies: AIMessage | str) -> RecordingChatModel:
    """A recording model answering ``replies`` in order, then ``"ok"`` forever."""
    script: Iterator[AIMessage | str] = itertools.chain(replies, itertools.repeat("ok"))
    return RecordingChatModel(messages=script)


class RecordingLLM(FakeListLLM):
    """A completion-style fake LLM (for ``LLMChain``) that records its prompts."""

    prompts: list[str] = Field(default_factory=list)

    def _call(self, prompt: str, *args: Any, **kwargs: Any) -> str:
        self.prompts.append(prompt)
        return super()._call(prompt, *args, **kwargs)


_CORE_ROLES = {"system": "system", "human": "user", "ai": "assistant"}


class CoreBackedChatModel(BaseChatModel):
    """A LangChain chat model that answers through a core LLM and records every prompt.

    Over ``ScriptedLLM(default=rule_following_reply)`` it follows every prompt of the package
    (``<Respond>``/``<Decision>``, records, reflection) like a perfectly obedient model.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    llm: ScriptedLLM
    prompts: list[list[BaseMessage]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "core-backed-fake"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        self.prompts.append(list(messages))
        core = [ChatMessage(_CORE_ROLES.get(m.type, m.type), m.text) for m in messages]
        text = self.llm.generate(core, stop=stop)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])


def rule_following_chat_model(*responses: Response) -> CoreBackedChatModel:
    """A chat model answering ``responses`` first (texts or exceptions), then by the rules."""
    return CoreBackedChatModel(llm=ScriptedLLM(list(responses), default=rule_following_reply))


class RecordingRetriever(BaseRetriever):
    """A retriever that returns the same ``Document`` objects every time and logs queries."""

    documents: list[Document]
    queries: list[str] = Field(default_factory=list)

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        self.queries.append(query)
        return list(self.documents)
