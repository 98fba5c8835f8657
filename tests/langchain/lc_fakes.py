"""Fakes shared by the LangChain adapter tests (offline, deterministic)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import LanguageModelInput
from langchain_core.language_models.fake import FakeListLLM
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatResult
from langchain_core.runnables import Runnable
from pydantic import Field

from memories_core import HistoryMemory
from memories_core.embedders import HashingEmbedder


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
