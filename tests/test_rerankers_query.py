"""Query-side rerankers: the temporal boost and the entity boost.

Through the pipeline over the in-memory reference backend and through ``engine.search``
with the deterministic HashingEmbedder.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from memories_core import ConfigurationError, FixedClock
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.retrieval import ContextSpreading, Pipeline, RecallRequest
from memories_core.retrieval.entity import EntityBoost, query_entities
from memories_core.retrieval.memory_backend import InMemoryBackend
from memories_core.retrieval.temporal import TemporalBoost, parse_time_window
from memories_core.types import MemoryRecord, new_id

NOW = datetime(2024, 1, 10, 15, 30, tzinfo=timezone.utc)


def day(year: int, month: int, d: int) -> datetime:
    return datetime(year, month, d, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("query", "start", "end"),
    [
        ("What did Maria donate in December 2023?", day(2023, 12, 1), day(2024, 1, 1)),
        ("Who came to dinner on May 3, 2023?", day(2023, 5, 3), day(2023, 5, 4)),
        ("What did Gina find on 1 February, 2023?", day(2023, 2, 1), day(2023, 2, 2)),
        ("what happened on 2023-06-16", day(2023, 6, 16), day(2023, 6, 17)),
        ("When did she go camping in June?", day(2023, 6, 1), day(2023, 7, 1)),
        ("any trips in 2022?", day(2022, 1, 1), day(2023, 1, 1)),
        ("what did I say yesterday?", day(2024, 1, 9), day(2024, 1, 10)),
        ("what did we plan today?", day(2024, 1, 10), day(2024, 1, 11)),
        ("what happened last week?", day(2024, 1, 1), day(2024, 1, 8)),
        ("what did I do last month?", day(2023, 12, 1), day(2024, 1, 1)),
        ("where was I last year?", day(2023, 1, 1), day(2024, 1, 1)),
        ("what did I buy 3 days ago?", day(2024, 1, 7), day(2024, 1, 8)),
        ("the party two weeks ago", day(2023, 12, 25), day(2024, 1, 1)),
        ("where did I go last weekend?", day(2024, 1, 6), day(2024, 1, 8)),
    ],
)
def test_parse_time_window(query: str, start: datetime, end: datetime) -> None:
    window = parse_time_window(query, NOW)
    assert window is not None
    assert (window.start, window.end) == (start, end)


def test_questions_without_a_time_have_no_window() -> None:
    for query in ("What does Melanie paint?", "how many kids does she have", "May I ask?"):
        assert parse_time_window(query, NOW) is None


def test_relative_times_are_measured_from_the_questions_own_time() -> None:
    first = parse_time_window("what happened yesterday", NOW)
    later = parse_time_window("what happened yesterday", NOW + timedelta(days=30))
    assert first is not None and later is not None
    assert later.start - first.start == timedelta(days=30)


def test_query_entities() -> None:
    found = query_entities('What did Melanie think of "Becoming Nicole" by Amy Ellis Nutt?')
    assert found.phrases == ("becoming nicole",)
    assert {"melanie", "amy", "ellis", "nutt"} <= set(found.names)
    assert query_entities("Caroline's favourite book?").names == ("caroline",)
    assert not query_entities("what did she paint in May?")


def backend_with(records: list[MemoryRecord]) -> InMemoryBackend:
    backend = InMemoryBackend(HashingEmbedder())
    for record in records:
        backend.add([record], batch=False)
    return backend


def rec(text: str, when: datetime, user: str = "u") -> MemoryRecord:
    return MemoryRecord(id=new_id(), user_id=user, kind="turn", text=text, created_at=when)


def ids(pipeline: Pipeline, backend: InMemoryBackend, query: str, now: datetime) -> list[str]:
    request = RecallRequest(query, user_id="u", k=5, now=now)
    return [hit.record.id for hit in pipeline.run(request, backend)]


def test_temporal_boost_prefers_records_from_the_named_period() -> None:
    march = rec("we had dinner at the harbour restaurant", day(2023, 3, 12))
    july = rec("we had dinner at the harbour restaurant again", day(2023, 7, 2))
    other = rec("I repaired the bike", day(2023, 3, 13))
    backend = backend_with([july, march, other])
    plain = Pipeline(rerankers=())
    timed = Pipeline(rerankers=(TemporalBoost(weight=2.0),))
    in_march = "where did we have dinner in March 2023?"
    in_july = "where did we have dinner in July 2023?"
    # Without the boost the month makes no difference (no record names it).
    assert ids(plain, backend, in_march, NOW)[0] == ids(plain, backend, in_july, NOW)[0]
    assert ids(timed, backend, in_march, NOW)[:2] == [march.id, other.id]
    assert ids(timed, backend, in_july, NOW)[0] == july.id


def test_temporal_boost_uses_the_recall_now_for_relative_times() -> None:
    monday = rec("I went to the pottery class", day(2024, 1, 8))
    friday = rec("I went to the pottery class with Anna", day(2024, 1, 12))
    backend = backend_with([monday, friday])
    timed = Pipeline(
        rerankers=(TemporalBoost(weight=2.0, after=timedelta(0), half_life=timedelta(hours=6)),)
    )
    question = "what class did I go to yesterday?"
    assert ids(timed, backend, question, day(2024, 1, 9) + timedelta(hours=9))[0] == monday.id
    assert ids(timed, backend, question, day(2024, 1, 13) + timedelta(hours=9))[0] == friday.id


def test_a_question_without_a_time_is_unchanged() -> None:
    records = [rec(f"note {i} about gardening and roses", day(2023, 1, 1 + i)) for i in range(8)]
    backend = backend_with(records)
    question = "what about the roses in the garden?"
    base = ids(Pipeline(rerankers=()), backend, question, NOW)
    assert ids(Pipeline(rerankers=(TemporalBoost(weight=5.0),)), backend, question, NOW) == base


def test_entity_boost_prefers_the_named_person_and_the_quoted_phrase() -> None:
    caroline = rec("Caroline: I painted a sunrise over the lake", day(2023, 5, 1))
    melanie = rec("Melanie: I painted a sunset on the lake", day(2023, 5, 2))
    backend = backend_with([caroline, melanie])
    boosted = Pipeline(rerankers=(EntityBoost(name_weight=2.0),))
    assert ids(boosted, backend, "What did Melanie paint on the lake?", NOW)[0] == melanie.id
    assert ids(boosted, backend, "What did Caroline paint on the lake?", NOW)[0] == caroline.id

    split = rec("Nicole is becoming a great friend of the book club", day(2023, 5, 3))
    exact = rec("I just finished reading Becoming Nicole", day(2023, 5, 4))
    books = backend_with([split, exact])
    question = 'What did she think of "Becoming Nicole" and the book club?'
    assert ids(Pipeline(rerankers=()), books, question, NOW)[0] == split.id
    quoted = Pipeline(rerankers=(EntityBoost(phrase_weight=2.0),))
    assert ids(quoted, books, question, NOW)[0] == exact.id


def test_rerankers_are_deterministic_and_validate_their_knobs() -> None:
    records = [
        rec(f"Maria talked about the shelter event {i}", day(2023, 5, i + 1)) for i in range(9)
    ]
    backend = backend_with(records)
    pipeline = Pipeline(rerankers=(ContextSpreading(), TemporalBoost(), EntityBoost()))
    question = "What did Maria do at the shelter on May 3, 2023?"
    assert ids(pipeline, backend, question, NOW) == ids(pipeline, backend, question, NOW)
    with pytest.raises(ConfigurationError):
        TemporalBoost(weight=-1)
    with pytest.raises(ConfigurationError):
        TemporalBoost(half_life=timedelta(0))
    with pytest.raises(ConfigurationError):
        EntityBoost(name_weight=float("inf"))


def test_engine_search_with_the_query_rerankers() -> None:
    engine = MemoryEngine(embedder=HashingEmbedder(), clock=FixedClock(NOW))
    march = rec("we had dinner at the harbour restaurant", day(2023, 3, 12))
    july = rec("we had dinner at the harbour restaurant again", day(2023, 7, 2))
    engine.add_records([july, march])
    pipeline = Pipeline(rerankers=(TemporalBoost(weight=2.0),))
    question = "where did we have dinner in March 2023?"
    hits = engine.search(question, "u", k=2, pipeline=pipeline)
    assert [h.record.id for h in hits] == [march.id, july.id]
    engine.close()


def test_the_default_pipeline_boosts_the_named_period_and_the_knob_switches_it_off() -> None:
    from memories_core.retrieval import FusionConfig
    from memories_core.retrieval.temporal import DEFAULT_TEMPORAL_WEIGHT

    assert DEFAULT_TEMPORAL_WEIGHT > 0
    engine = MemoryEngine(embedder=HashingEmbedder(), clock=FixedClock(NOW))
    march = rec("we had dinner at the harbour restaurant", day(2023, 3, 12))
    july = rec("we had dinner at the harbour restaurant again", day(2023, 7, 2))
    filler = [rec(f"I fixed the {thing}", day(2023, 5, 1)) for thing in ("bike", "roof", "sink")]
    engine.add_records([july, march, *filler])
    question = "where did we have dinner in March 2023?"
    off = FusionConfig(temporal_weight=0.0, entity_weight=0.0)
    top_off = engine.search(question, "u", k=1, fusion=off)[0].record.id
    top_in_july = engine.search("where did we have dinner in July 2023?", "u", k=1)[0].record.id
    assert engine.search(question, "u", k=1)[0].record.id == march.id
    assert top_in_july == july.id
    assert top_off == engine.search("where did we have dinner?", "u", k=1)[0].record.id
    assert [type(r).__name__ for r in off.pipeline().rerankers] == ["ContextSpreading"]
    with pytest.raises(ConfigurationError):
        FusionConfig(temporal_weight=-1.0)
    engine.close()
