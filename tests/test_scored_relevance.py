"""ScoredRecord.relevance: the dense cosine in [0, 1] when known, else the score mapped."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import pytest

from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.types import MemoryRecord, ScoredRecord

RECORD = MemoryRecord(
    id="r1",
    user_id="alice",
    kind="turn",
    text="hello",
    created_at=datetime(2026, 1, 1, tzinfo=timezone.utc),
)


@pytest.mark.parametrize(
    ("similarity", "expected"), [(0.83, 0.83), (1.0000002, 1.0), (-0.2, 0.0), (0.0, 0.0)]
)
def test_relevance_is_the_clamped_cosine(similarity: float, expected: float) -> None:
    hit = ScoredRecord(RECORD, score=-3.5, similarity=similarity)
    assert hit.relevance == pytest.approx(expected)
    assert hit.to_metadata()["fused_score"] == -3.5


@pytest.mark.parametrize("similarity", [None, math.nan])
def test_without_a_cosine_relevance_is_the_logistic_of_the_score(
    similarity: float | None,
) -> None:
    assert ScoredRecord(RECORD, 0.0, similarity).relevance == pytest.approx(0.5)
    low, high = ScoredRecord(RECORD, -800.0), ScoredRecord(RECORD, 2.0)
    assert 0.0 <= low.relevance < 0.5 < high.relevance < 1.0


def test_recall_carries_the_cosine_of_each_dense_hit() -> None:
    memory = HistoryMemory(embedder=HashingEmbedder(), path=None)
    try:
        memory.save(
            [Turn("user", "I love spicy Thai food"), Turn("user", "My dog is called Pixel")],
            Scope("alice"),
        )
        hits = memory.recall("user: I love spicy Thai food", Scope("alice"), k=2).records
        query = memory.engine.embedder.embed_query("user: I love spicy Thai food")
        for hit in hits:
            vector = memory.engine.embedder.embed_documents([hit.record.text])[0]
            assert hit.similarity == pytest.approx(float(vector @ query), abs=1e-5)
        assert hits[0].record.text == "user: I love spicy Thai food"
        assert hits[0].relevance == pytest.approx(1.0, abs=1e-4)
    finally:
        memory.close()
