"""EMG-RAG runs the contract suite of :mod:`memories_core.testing`."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from memories_core import EMGMemory
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import LLM, Mechanism
from memories_core.llms.base import BaseLLM, LLMResult
from memories_core.prompts.emg import emg_reply
from memories_core.testing import MechanismContract
from memories_core.types import ChatMessage

#: What ``rule_following_reply`` answers to a prompt it does not know.
_UNKNOWN_PROMPT = "I can only answer the memory prompts of llm-memories."


class EMGAware(BaseLLM):
    """The suite's model, taught EMG-RAG's prompts.

    ``rule_following_reply`` answers only the older mechanisms' prompts; where it says so,
    this wrapper answers with ``emg_reply`` (the offline stand-in of the EMG prompts) instead.
    Outages and garbage replies pass through unchanged.
    """

    def __init__(self, inner: LLM) -> None:
        super().__init__()
        self.inner = inner

    @property
    def name(self) -> str:
        return "emg-aware"

    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        reply = self.inner.generate(messages, max_tokens=max_tokens, stop=stop)
        return LLMResult(emg_reply(messages) if reply == _UNKNOWN_PROMPT else reply)


class TestEMGContract(MechanismContract):
    needs_llm = True
    derives_records = True
    end_session_derives = False
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return EMGMemory(path=path, llm=EMGAware(llm), embedder=HashingEmbedder(dimension=64))
