"""MemoChat runs the contract suite of :mod:`memories_core.testing`, with and without an LLM.

The suite's models follow the package's older prompts; :class:`MemoChatAware` lets them
answer MemoChat's prompts too (by :func:`memories_core.prompts.memochat.rule_following_reply`)
while keeping their failures and garbage replies, which is what the suite is about.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from memories_core import MemoChatMemory
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import LLM, Mechanism
from memories_core.prompts.memochat import rule_following_reply
from memories_core.testing import MechanismContract
from memories_core.types import ChatMessage
from memories_core.usage import Usage

#: rule_following_reply's answer to a prompt it does not know.
_UNKNOWN = "I can only answer the memory prompts of llm-memories."


class MemoChatAware:
    """Wraps a suite model: its unknown-prompt fallback becomes a MemoChat answer."""

    def __init__(self, inner: LLM) -> None:
        self.inner = inner

    @property
    def usage(self) -> Usage:
        return self.inner.usage

    @property
    def calls(self) -> Any:
        return getattr(self.inner, "calls", [])

    def generate(self, messages: Sequence[ChatMessage], **kwargs: Any) -> str:
        reply = self.inner.generate(messages, **kwargs)
        if reply == _UNKNOWN:
            return rule_following_reply(messages) or reply
        return reply

    async def agenerate(self, messages: Sequence[ChatMessage], **kwargs: Any) -> str:
        return self.generate(messages, **kwargs)


class TestMemoChatContract(MechanismContract):
    needs_llm = True
    derives_records = True
    # A session end writes the buffer into a memo (Lu et al. §3.1); a killed writer may never
    # end its session, so the restarted app does.
    end_session_derives = True
    # With a model, recall returns the memos it chose (possibly none: NOTO), Lu et al. §3.2.
    fills_k = False
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return MemoChatMemory(
            path=path, llm=MemoChatAware(llm), embedder=HashingEmbedder(dimension=64), max_lines=4
        )


class TestMemoChatLLMFreeContract(MechanismContract):
    needs_llm = False
    derives_records = True
    end_session_derives = True
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return MemoChatMemory(
            path=path, mode="llm_free", embedder=HashingEmbedder(dimension=64), max_lines=4
        )
