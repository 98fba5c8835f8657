"""Every mechanism runs the contract suite of :mod:`memories_core.testing`.

``known_failures`` lists what today's core does not meet yet; each entry is an
``xfail(strict=False)``, so the engine author empties the sets as fixes land (an XPASS says
which entry to drop).
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

#: Input checks the core does not make yet (MemoryBase, Turn, Scope, SQLiteRecordStore): they
#: hold for every mechanism alike.
CORE_INPUT_DEFECTS: dict[str, str] = {
    f"{_BAD}[*-k=2**63]": "k=2**63 accepted: recall puts no upper bound on k",
    f"{_BAD}[*-turns-None]": "save(None): TypeError 'NoneType' object is not iterable",
    f"{_BAD}[*-timestamp-str]": "Turn(timestamp=str): AttributeError in ensure_utc",
    f"{_BAD}[*-timestamp-int]": "Turn(timestamp=int): AttributeError in ensure_utc",
    f"{_BAD}[*-metadata-nan]": "NaN in metadata accepted and stored",
    f"{_BAD}[*-metadata-inf]": "inf in metadata accepted and stored",
    f"{_BAD}[*-metadata-nested-nan]": "nested -inf in metadata accepted and stored",
    f"{_BAD}[*-metadata-key-*]": "reserved, empty and non-str metadata keys accepted",
    f"{_BAD}[*-user-surrogate-*]": "lone surrogate in user_id: UnicodeEncodeError from SQLite",
    f"{_BAD}[*-session-surrogate-save]": "lone surrogate in session_id: UnicodeEncodeError",
}

#: Deletion is not erasure yet: SQLite keeps deleted rows in free pages and FTS segments (no
#: secure_delete / FTS optimize), Chroma keeps them in chroma.sqlite3 (and its HNSW files).
NOT_ERASED = (
    "delete_user is not erasure: the marker and user id stay in records.sqlite3 (free pages, "
    "FTS segments) and Chroma's files (chroma.sqlite3, HNSW data_level0.bin)"
)

_GARBAGE = "test_garbage_llm_never_loses_a_turn"

#: parse_session_summary accepts any reply that shares one 3-letter word with the dialogue
#: ("the", "user"), so forged tags become the session's summary.
FORGED_SUMMARY = "summary parser accepts forged tags that share a stopword ('the', 'user')"

#: A kill after a conditional record is added but before its turn leaves the pending list
#: derives the record again on the next run.
DUPLICATE_DERIVATION = (
    "a SIGKILL between storing a conditional record and unqueuing its turn derives it twice"
)


def _embedder() -> HashingEmbedder:
    return HashingEmbedder(dimension=64)


class TestHistoryMemoryContract(MechanismContract):
    known_failures: ClassVar[dict[str, str]] = {
        **CORE_INPUT_DEFECTS,
        "test_delete_user_leaves_no_trace_on_disk": NOT_ERASED,
    }

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return HistoryMemory(path=path, embedder=_embedder())


class TestSummaryMemoryContract(MechanismContract):
    needs_llm = True
    derives_records = True
    end_session_derives = True
    known_failures: ClassVar[dict[str, str]] = {
        **CORE_INPUT_DEFECTS,
        "test_delete_user_leaves_no_trace_on_disk": NOT_ERASED,
        f"{_GARBAGE}[*-forged-tags]": FORGED_SUMMARY,
        f"{_GARBAGE}[*-forged-memory]": FORGED_SUMMARY,
    }

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return SummaryMemory(path=path, llm=llm, embedder=_embedder())


class TestConditionalMemoryContract(MechanismContract):
    needs_llm = True
    derives_records = True
    known_failures: ClassVar[dict[str, str]] = {
        **CORE_INPUT_DEFECTS,
        "test_delete_user_leaves_no_trace_on_disk": NOT_ERASED,
        "test_kill_at_any_point_loses_nothing_acknowledged": DUPLICATE_DERIVATION,
    }

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return ConditionalMemory(path=path, llm=llm, embedder=_embedder())


class TestMultiViewMemoryContract(MechanismContract):
    needs_llm = True
    derives_records = True
    end_session_derives = True
    known_failures: ClassVar[dict[str, str]] = {
        **CORE_INPUT_DEFECTS,
        f"{_BAD}[*-k=0]": "k=0 accepted: MultiViewMemory.recall treats k=0 as 'not given'",
        "test_delete_user_keeps_the_others": "MultiViewMemory has no delete_user",
        "test_delete_user_leaves_no_trace_on_disk": "MultiViewMemory has no delete_user",
        f"{_GARBAGE}[*-forged-tags]": FORGED_SUMMARY,
        f"{_GARBAGE}[*-forged-memory]": FORGED_SUMMARY,
        f"{_GARBAGE}[*-mixed]": "forged <Context>/<Note> or summary tags are stored as records",
        "test_kill_at_any_point_loses_nothing_acknowledged": DUPLICATE_DERIVATION,
    }

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
    known_failures: ClassVar[dict[str, str]] = {
        **CORE_INPUT_DEFECTS,
        "test_delete_user_leaves_no_trace_on_disk": NOT_ERASED,
        f"{_GARBAGE}[*-forged-memory]": (
            "reflection returns a <Memory> that no candidate supports as the recall context"
        ),
    }

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return SelfReflectiveMemory(HistoryMemory(path=path, embedder=_embedder()), llm)
