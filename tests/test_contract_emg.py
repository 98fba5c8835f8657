"""EMG-RAG runs the contract suite of :mod:`memories_core.testing`."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from memories_core import EMGMemory
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import LLM, Mechanism
from memories_core.prompts.emg import emg_reply
from memories_core.testing import MechanismContract, TaughtLLM


def aware(llm: LLM) -> LLM:
    """``llm`` taught EMG's own prompts (offline stand-in ``emg_reply``)."""
    return TaughtLLM(llm, emg_reply, name="emg-aware")


class TestEMGContract(MechanismContract):
    needs_llm = True
    derives_records = True
    end_session_derives = False
    # Recall returns the policy's variable-size selection (top-1 while untrained), §4.3.
    fills_k = False
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return EMGMemory(path=path, llm=aware(llm), embedder=HashingEmbedder(dimension=64))
