"""Every mechanism runs the contract suite of :mod:`memories_core.testing`.

``known_failures`` lists what a mechanism does not meet yet; each entry is an
``xfail(strict=False)`` with its reason (an XPASS says which entry to drop).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from memories_core import (
    ConditionalMemory,
    HistoryMemory,
    MultiViewMemory,
    Scope,
    SelfReflectiveMemory,
    SummaryMemory,
    Turn,
)
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import LLM, Mechanism
from memories_core.testing import MechanismContract

_BAD = "test_bad_input_raises_typed_error_and_stores_nothing"


def _embedder() -> HashingEmbedder:
    return HashingEmbedder(dimension=64)


class TestHistoryMemoryContract(MechanismContract):
    # The engine's reference mechanism: every storage-agnostic test on both storages.
    storages: ClassVar[tuple[str, ...]] = ("memory", "disk")
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return HistoryMemory(path=path, embedder=_embedder())


class TestSummaryMemoryContract(MechanismContract):
    needs_llm = True
    derives_records = True
    end_session_derives = True
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return SummaryMemory(path=path, llm=llm, embedder=_embedder())


class TestConditionalMemoryContract(MechanismContract):
    needs_llm = True
    derives_records = True
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return ConditionalMemory(path=path, llm=llm, embedder=_embedder())


class TestMultiViewMemoryContract(MechanismContract):
    needs_llm = True
    derives_records = True
    end_session_derives = True
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return MultiViewMemory.from_defaults(llm=llm, embedder=_embedder(), path=path)

    def stored_turns(self, memory: Any, scope: Scope) -> list[list[Turn]] | None:
        # Each view keeps its own copy of the turns; every copy must be complete.
        return [list(view.turns(scope)) for view in memory.views.values()]

    def retry(self, memory: Any, user_id: str) -> None:
        for view in memory.views.values():
            view.retry_pending(user_id)


class TestSelfReflectiveMemoryContract(MechanismContract):
    needs_llm = True
    fills_k = False  # the model keeps only the records it judges relevant
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return SelfReflectiveMemory(HistoryMemory(path=path, embedder=_embedder()), llm)
