"""Index-side search keys through the engine's public API.

A search key is a record ``kind="search_key"`` whose ``metadata["key_for"]`` names a record
of the same user; a key hit counts for its target, keys are never returned, filters apply to
the target, deleting a target deletes its keys, and a key to a missing or foreign record is
rejected. Also: a smaller ``k`` returns a prefix of a larger one (item 5), on Chroma.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from memories_core import FixedClock, HistoryMemory, Scope, SearchKeyError, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.engine import Derivation, MechanismHooks, MemoryEngine
from memories_core.types import Job, JobSpec, MemoryRecord, new_id

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)

FILLER = [
    "we talked about the weather and the garden",
    "the train was late again this morning",
    "I cooked pasta with tomatoes for dinner",
    "my sister called to ask about the holidays",
    "the new phone has a much better camera",
    "I finally cleaned the attic on Sunday",
]


@pytest.fixture
def engine() -> Iterator[MemoryEngine]:
    eng = MemoryEngine(embedder=HashingEmbedder(), clock=FixedClock(T0))
    yield eng
    eng.close()


def record(user: str, text: str, kind: str = "turn", **metadata: object) -> MemoryRecord:
    return MemoryRecord(
        id=new_id(), user_id=user, kind=kind, text=text, created_at=T0, metadata=dict(metadata)
    )


def key(user: str, text: str, target: str) -> MemoryRecord:
    return record(user, text, kind="search_key", key_for=target)


def seeded(engine: MemoryEngine, user: str = "u") -> MemoryRecord:
    """Filler turns plus one turn that never names what it is about."""
    target = record(user, "I went there yesterday and it felt like home")
    engine.add_records([record(user, text) for text in FILLER] + [target])
    return target


QUESTION = "When did she attend the LGBTQ support group?"


def test_a_key_hit_brings_back_its_target_and_never_the_key(engine: MemoryEngine) -> None:
    target = seeded(engine)
    before = [h.record.id for h in engine.search(QUESTION, "u", k=3)]
    assert target.id not in before
    engine.add_records([key("u", "She attended an LGBTQ support group", target.id)])
    hits = engine.search(QUESTION, "u", k=3)
    assert hits[0].record.id == target.id
    assert all(h.record.kind != "search_key" for h in hits)
    # Asking for the key kind explicitly still never returns a key.
    assert engine.search(QUESTION, "u", k=3, kinds=["search_key"]) == []


def test_a_target_matched_by_text_and_key_comes_back_once(engine: MemoryEngine) -> None:
    target = record("u", "I went to the LGBTQ support group yesterday")
    engine.add_records([record("u", text) for text in FILLER] + [target])
    engine.add_records([key("u", "She attended an LGBTQ support group", target.id)])
    ids = [h.record.id for h in engine.search(QUESTION, "u", k=7)]
    assert ids[0] == target.id
    assert ids.count(target.id) == 1
    assert len(ids) == 7


def test_filters_apply_to_the_target_not_the_key(engine: MemoryEngine) -> None:
    turn = seeded(engine)
    note = record("u", "a note without the words", kind="note", topic="pets")
    engine.add_records([note])
    engine.add_records(
        [
            key("u", "She attended an LGBTQ support group", turn.id),
            key("u", "LGBTQ support group notes", note.id),
        ]
    )
    only_turns = [h.record.id for h in engine.search(QUESTION, "u", k=3, kinds=["turn"])]
    assert turn.id in only_turns and note.id not in only_turns
    only_notes = [h.record.id for h in engine.search(QUESTION, "u", k=3, kinds=["note"])]
    assert only_notes == [note.id]
    pets = [h.record.id for h in engine.search(QUESTION, "u", k=3, where={"topic": "pets"})]
    assert pets == [note.id]
    nothing = engine.search(QUESTION, "u", k=3, where={"topic": "food"})
    assert nothing == []


def test_keys_are_validated_on_write(engine: MemoryEngine) -> None:
    mine = seeded(engine, "u")
    theirs = seeded(engine, "v")
    count = len(engine.records("u"))
    with pytest.raises(SearchKeyError, match="another user"):
        engine.add_records([key("u", "stolen", theirs.id)])
    with pytest.raises(SearchKeyError, match="not a record"):
        engine.add_records([key("u", "dangling", "no-such-id")])
    with pytest.raises(SearchKeyError, match="key_for"):
        engine.add_records([record("u", "no target", kind="search_key")])
    first = key("u", "a key", mine.id)
    engine.add_records([first])
    with pytest.raises(SearchKeyError, match="search key"):
        engine.add_records([key("u", "key of a key", first.id)])
    # A rejected call stores nothing, not even its valid records.
    with pytest.raises(SearchKeyError):
        engine.add_records([record("u", "kept?"), key("u", "bad", theirs.id)])
    assert len(engine.records("u")) == count + 1
    # A target written in the same call is fine.
    fresh = record("u", "new turn")
    engine.add_records([fresh, key("u", "its key", fresh.id)])
    assert len(engine.records("u", where={"kind": "search_key"})) == 2


def test_deleting_a_target_deletes_its_keys(engine: MemoryEngine) -> None:
    target = seeded(engine)
    other = record("u", "another turn")
    engine.add_records([other])
    engine.add_records(
        [key("u", "She attended an LGBTQ support group", target.id), key("u", "x", other.id)]
    )
    assert engine.delete_records("u", [target.id]) == 2
    left = engine.records("u", where={"kind": "search_key"})
    assert [r.metadata["key_for"] for r in left] == [other.id]
    assert target.id not in [h.record.id for h in engine.search(QUESTION, "u", k=5)]


def test_clearing_a_session_or_a_user_deletes_keys() -> None:
    memory = HistoryMemory(embedder=HashingEmbedder(), clock=FixedClock(T0))
    engine = memory.engine
    memory.save([Turn("user", "I went there yesterday")], Scope("u", "s1"))
    memory.save([Turn("user", "I like tea")], Scope("u", "s2"))
    first, second = engine.records("u", where={"kind": "turn"})
    engine.add_records([key("u", "support group", first.id), key("u", "tea", second.id)])
    memory.clear(Scope("u", "s1"))
    assert [r.metadata["key_for"] for r in engine.records("u", where={"kind": "search_key"})] == [
        second.id
    ]
    memory.delete_user("u")
    assert engine.records("u") == []
    memory.close()


def test_a_mechanism_writes_keys_with_its_derivation() -> None:
    engine = MemoryEngine(embedder=HashingEmbedder(), clock=FixedClock(T0))

    def on_turns(records: Sequence[MemoryRecord]) -> list[JobSpec]:
        return [
            JobSpec(mechanism="keyer", kind="key", key=r.id, payload={"id": r.id}) for r in records
        ]

    def run_job(job: Job) -> Derivation:
        target = str(job.payload["id"])
        return Derivation(add=[key(job.user_id, "She attended an LGBTQ support group", target)])

    engine.attach(
        MechanismHooks(name="keyer", index_turns=True, on_turns=on_turns, run_job=run_job)
    )
    for text in FILLER:
        engine.save([Turn("user", text)], Scope("u"))
    engine.add_records([])  # no-op
    hits = engine.search(QUESTION, "u", k=1, kinds=["turn"])
    keys = engine.records("u", where={"kind": "search_key"})
    assert len(keys) == len(FILLER)
    assert hits and hits[0].record.kind == "turn"
    engine.close()


def test_a_bad_key_in_a_derivation_fails_the_job_and_keeps_the_turn() -> None:
    engine = MemoryEngine(embedder=HashingEmbedder(), clock=FixedClock(T0))

    def on_turns(records: Sequence[MemoryRecord]) -> list[JobSpec]:
        return [JobSpec(mechanism="bad", kind="key", key="k", payload={})]

    def run_job(job: Job) -> Derivation:
        return Derivation(add=[key(job.user_id, "dangling", "missing-id")])

    engine.attach(MechanismHooks(name="bad", index_turns=True, on_turns=on_turns, run_job=run_job))
    engine.save([Turn("user", "I like tea")], Scope("u"))
    assert [r.kind for r in engine.records("u")] == ["turn"]
    assert len(engine.pending("u", mechanism="bad")) == 1
    engine.close()


# ---------------------------------------------------------------- prefix property (item 5)

WORDS = [
    *("dog", "cat", "garden", "train", "dinner", "sister", "phone", "attic", "beach"),
    *("paint", "museum", "guitar", "yoga", "marathon", "pottery", "camping", "recipe"),
    *("concert", "library", "bakery", "violin", "hiking", "school"),
]


def dialogue(rng: random.Random, n: int) -> list[str]:
    lines = []
    for _ in range(n):
        chosen = rng.sample(WORDS, 4)
        lines.append(
            f"I {rng.choice(['love', 'saw', 'tried', 'miss'])} the {' and the '.join(chosen)}"
        )
    return lines


def test_a_smaller_k_returns_a_prefix_of_a_larger_one_on_chroma(tmp_path: Path) -> None:
    rng = random.Random(7)
    memory = HistoryMemory(path=tmp_path / "m", embedder=HashingEmbedder(), clock=FixedClock(T0))
    start = T0
    for session in range(12):
        when = start + timedelta(days=3 * session)
        turns = [
            Turn(
                "user" if i % 2 == 0 else "assistant",
                text,
                timestamp=when + timedelta(seconds=30 * i),
            )
            for i, text in enumerate(dialogue(rng, 30))
        ]
        memory.save(turns, Scope("u"))
    checked = 0
    for query in [
        f"when did we talk about the {a} and {b}?" for a, b in zip(WORDS, WORDS[3:], strict=False)
    ]:
        small = [h.record.id for h in memory.recall(query, Scope("u"), k=10).records]
        large = [h.record.id for h in memory.recall(query, Scope("u"), k=50).records]
        middle = [h.record.id for h in memory.recall(query, Scope("u"), k=45).records]
        assert small[:5] == large[:5]
        assert small == large[:10] == middle[:10]
        checked += 1
    assert checked >= 10
    memory.close()


def test_conditional_memory_keys_the_turn_with_its_knowledge_line() -> None:
    from memories_core import ConditionalMemory
    from memories_core.llms import ScriptedLLM
    from memories_core.types import ChatMessage

    def writer(messages: Sequence[ChatMessage]) -> str:
        if "three steps" in messages[0].content:
            return (
                "<Context>: NaN\n<Summary>: The user shared a visit.\n"
                "<Note>: She attended an LGBTQ support group"
            )
        return "<Decision>: yes"

    conditional = ConditionalMemory(
        llm=ScriptedLLM(default=writer), embedder=HashingEmbedder(), clock=FixedClock(T0)
    )
    history = HistoryMemory(engine=conditional.engine)
    for text in FILLER:
        conditional.save([Turn("user", text)], Scope("u"))
    conditional.save([Turn("user", "I went there yesterday and it felt like home")], Scope("u"))
    engine = conditional.engine
    keys = engine.records("u", where={"kind": "search_key"})
    turns = {r.id: r for r in engine.records("u", where={"kind": "turn"})}
    notes = {r.id for r in engine.records("u", where={"kind": "conditional"})}
    # One key per turn, and each conditional record is also keyed by its note alone.
    assert len([k for k in keys if k.metadata["key_for"] in turns]) == len(FILLER) + 1
    assert len([k for k in keys if k.metadata["key_for"] in notes]) == len(notes) > 0
    assert all(k.metadata["key_for"] in turns or k.metadata["key_for"] in notes for k in keys)
    assert {k.text for k in keys} == {"She attended an LGBTQ support group"}
    # The raw-turn memory on the same engine now finds turns by the derived knowledge.
    hits = history.recall(QUESTION, Scope("u"), k=7).records
    assert {h.record.kind for h in hits} == {"turn"}
    assert len(hits) == 7
    # Deleting the user's turn deletes the key of that turn (the conditional record stays).
    target = next(r for r in turns.values() if "felt like home" in r.text)
    engine.delete_records("u", [target.id])
    assert all(
        k.metadata["key_for"] != target.id
        for k in engine.records("u", where={"kind": "search_key"})
    )
    conditional.close()


def test_keys_on_chroma_cost_one_dense_index_query_and_change_nothing(tmp_path: Path) -> None:
    """With search keys, the records and the keys of a recall share one Chroma query
    (``ChromaIndex.search_many``); the results equal two separate filtered searches."""
    from memories_core.retrieval import RecallRequest
    from memories_core.retrieval.keys import KeyedBackend

    rng = random.Random(11)
    memory = HistoryMemory(path=tmp_path / "m", embedder=HashingEmbedder(), clock=FixedClock(T0))
    for session in range(6):
        when = T0 + timedelta(days=2 * session)
        memory.save(
            [
                Turn("user", text, timestamp=when + timedelta(seconds=30 * i))
                for i, text in enumerate(dialogue(rng, 25))
            ],
            Scope("u"),
        )
    engine = memory.engine
    turns = engine.records("u", where={"kind": "turn"})
    engine.add_records(
        [key("u", f"a memory about the {rng.choice(WORDS)}", t.id) for t in turns[::3]]
    )
    index = engine.index
    calls = {"search": 0, "search_many": 0}
    search, search_many = index.search, index.search_many

    def counted_search(*args: object, **kwargs: object) -> object:
        calls["search"] += 1
        return search(*args, **kwargs)  # type: ignore[arg-type]

    def counted_many(*args: object, **kwargs: object) -> object:
        calls["search_many"] += 1
        return search_many(*args, **kwargs)  # type: ignore[arg-type]

    index.search = counted_search  # type: ignore[method-assign]
    index.search_many = counted_many  # type: ignore[method-assign]

    class TwoQueries:
        """The engine's backend without ``dense_many``: two separate filtered searches."""

        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> object:
            if name in ("dense_many", "has_kind"):
                raise AttributeError(name)
            return getattr(self.inner, name)

    pipeline = engine.retriever.fusion.pipeline()
    for a, b in zip(WORDS, WORDS[5:], strict=False):
        query = f"the {a} and the {b}"
        calls.update(search=0, search_many=0)
        hits = memory.recall(query, Scope("u"), k=10).records
        assert calls == {"search": 0, "search_many": 1}  # one dense index query
        request = RecallRequest(query, user_id="u", k=10, now=T0)
        shared = pipeline.run(request, KeyedBackend(engine._backend))
        separate = pipeline.run(request, KeyedBackend(TwoQueries(engine._backend)))  # type: ignore[arg-type]
        assert calls["search"] == 2  # the comparison ran the two queries
        assert [(h.record.id, h.score) for h in shared] == [
            (h.record.id, h.score) for h in separate
        ]
        assert [h.record.id for h in hits] == [h.record.id for h in shared]
        assert all(h.record.kind == "turn" for h in hits)
    memory.close()
