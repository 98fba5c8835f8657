"""DualProcessMemory (DPeM) runs the contract suite of :mod:`memories_core.testing`."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from memories_core import DualProcessMemory
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import LLM, Mechanism
from memories_core.prompts.dpem import dpem_reply
from memories_core.testing import MechanismContract, TaughtLLM


def aware(llm: LLM) -> LLM:
    """``llm`` taught DPeM's own prompts (offline stand-in ``dpem_reply``)."""
    return TaughtLLM(llm, dpem_reply, name="dpem-aware")


class TestDualProcessMemoryContract(MechanismContract):
    needs_llm = True
    derives_records = True
    end_session_derives = False
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return DualProcessMemory(
            path=path, llm=aware(llm), embedder=HashingEmbedder(dimension=64), theta=2
        )
