"""`render_hits`: records a caller picked, rendered as the memory's own recall renders them."""

from __future__ import annotations

from datetime import datetime, timezone

from memories_core import FixedClock, HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.mechanisms.base import render_hits
from memories_core.types import MemoryRecord, ScoredRecord

T0 = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)


def test_a_built_in_memory_renders_picked_hits_as_its_recall_does() -> None:
    memory = HistoryMemory(embedder=HashingEmbedder(), clock=FixedClock(T0))
    memory.save([Turn("user", "I keep bees in my garden")], Scope("ann"))
    recall = memory.recall("bees", Scope("ann"), k=1)
    assert recall.records
    assert render_hits(memory, recall.records) == recall.context


def test_a_memory_without_render_gets_one_dated_line_per_record() -> None:
    class ThirdParty:  # implements the Mechanism protocol, which has no render
        pass

    hits = [
        ScoredRecord(MemoryRecord("r1", "ann", "memory", "Ann keeps bees", T0), 1.0),
        ScoredRecord(MemoryRecord("r2", "ann", "memory", "Ann is vegan", T0), 0.5),
    ]
    lines = render_hits(ThirdParty(), hits).splitlines()
    assert lines == ["[8 May 2023, 13:56] Ann keeps bees", "[8 May 2023, 13:56] Ann is vegan"]
