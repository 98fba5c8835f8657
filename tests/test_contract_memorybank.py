"""MemoryBank runs the contract suite of :mod:`memories_core.testing`."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from memories_core import MemoryBankMemory
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import LLM, Mechanism
from memories_core.prompts.memorybank import memorybank_reply
from memories_core.testing import MechanismContract, TaughtLLM


def aware(llm: LLM) -> LLM:
    """``llm`` taught MemoryBank's own prompts (offline stand-in ``memorybank_reply``)."""
    return TaughtLLM(llm, memorybank_reply, name="memorybank-aware")


class TestMemoryBankContract(MechanismContract):
    needs_llm = True
    derives_records = True
    end_session_derives = True
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return MemoryBankMemory(path=path, llm=aware(llm), embedder=HashingEmbedder(dimension=64))
