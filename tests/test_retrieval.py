"""HybridRetriever, fusion math, and the evaluation helpers used to tune it."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memories_core.backends import NumpyIndex, SQLiteRecordStore
from memories_core.embedders import HashingEmbedder
from memories_core.errors import ConfigurationError, InvalidInputError, MissingUserError
from memories_core.evaluation import (
    hit_at_k,
    leave_one_out,
    load_locomo,
    mrr,
    ndcg_at_k,
    normalise_evidence,
    precision_at_k,
    recall_at_k,
)
from memories_core.retrieval import (
    FusionConfig,
    HybridRetriever,
    _adjacent_via_list,
    index_metadata,
    rrf_fuse,
    spread_context,
    zscore_fuse,
)
from memories_core.types import MemoryRecord

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def rec(
    rid: str,
    text: str,
    user: str = "alice",
    *,
    kind: str = "turn",
    minutes: int = 0,
    session: str | None = None,
    **metadata: Any,
) -> MemoryRecord:
    return MemoryRecord(rid, user, kind, text, T0 + timedelta(minutes=minutes), session, metadata)


@pytest.fixture
def parts() -> Iterator[tuple[SQLiteRecordStore, NumpyIndex, HybridRetriever]]:
    store, index = SQLiteRecordStore(), NumpyIndex()
    yield store, index, HybridRetriever(store, index, HashingEmbedder())
    store.close()


# -- fusion math ---------------------------------------------------------------------------


def test_zscore_fuse_by_hand() -> None:
    dense = [("a", 0.9), ("b", 0.5), ("c", 0.1)]  # mean 0.5, std sqrt(0.32/3)
    lexical = [("b", 10.0), ("d", 2.0)]  # mean 6, std 4
    fused = dict(zscore_fuse((dense, lexical), (1.0, 2.0)))
    std = math.sqrt(0.32 / 3)
    za, zb, zc = 0.4 / std, 0.0, -0.4 / std
    # Items missing from a ranking sit half a standard deviation below its weakest candidate.
    assert fused["a"] == pytest.approx(za + 2 * -1.5)
    assert fused["b"] == pytest.approx(zb + 2 * 1.0)
    assert fused["c"] == pytest.approx(zc + 2 * -1.5)
    assert fused["d"] == pytest.approx(zc - 0.5 + 2 * -1.0)
    one = dict(zscore_fuse((dense, lexical), (1.0, 2.0), missing_margin=1.0))
    assert one["a"] == pytest.approx(za + 2 * -2.0)
    # A ranking shorter than the depth ran out of matches: misses sit 2 below (default).
    short = dict(zscore_fuse((dense, lexical), (1.0, 2.0), depth=3))
    assert short["a"] == pytest.approx(za + 2 * -3.0)
    assert short["d"] == pytest.approx(zc - 0.5 + 2 * -1.0)  # dense returned 3: full
    assert [i for i, _ in zscore_fuse((dense, lexical), (1.0, 2.0))][:2] == ["b", "a"]


def test_zscore_fuse_edge_cases() -> None:
    assert zscore_fuse(([], []), (1, 1)) == []
    # One empty side: the other decides alone.
    assert [i for i, _ in zscore_fuse(([("a", 1.0), ("b", 3.0)], []), (1, 1))] == ["b", "a"]
    # Equal scores give z = 0 and keep first-seen order...
    assert zscore_fuse(([("a", 2.0), ("b", 2.0)],), (1,)) == [("a", 0.0), ("b", 0.0)]
    # ...but being returned still beats being missed (the only lexical hit).
    fused = dict(zscore_fuse(([("a", 0.9), ("b", 0.8), ("c", 0.7)], [("c", 3.2)]), (1, 1)))
    # Dense z: a +1.22, c -1.22; the lexical hit c gains half a unit on a (it used to gain
    # 0), two units when the lexical side was asked for more than it found.
    assert fused["a"] - fused["c"] == pytest.approx(math.sqrt(6) - 0.5)
    rankings = ([("a", 0.9), ("b", 0.8), ("c", 0.7)], [("c", 3.2)])
    deep = dict(zscore_fuse(rankings, (1, 1), depth=3))
    assert deep["a"] - deep["c"] == pytest.approx(math.sqrt(6) - 2)
    with pytest.raises(InvalidInputError):
        zscore_fuse(([],), (1, 2))
    with pytest.raises(InvalidInputError):
        zscore_fuse(([("a", 1.0)],), (1,), missing_margin=0)


def test_rrf_fuse_by_hand() -> None:
    fused = dict(rrf_fuse(([("a", 9), ("b", 8)], [("b", 1), ("c", 0)]), (1.0, 0.5), k=60))
    assert fused["a"] == pytest.approx(1 / 61)
    assert fused["b"] == pytest.approx(1 / 62 + 0.5 / 61)
    assert fused["c"] == pytest.approx(0.5 / 62)
    assert [i for i, _ in rrf_fuse(([("a", 9), ("b", 8)], [("b", 1)]), (1, 1))] == ["b", "a"]
    # A duplicate in one ranking counts once, at its best rank.
    assert dict(rrf_fuse(([("a", 1), ("a", 0)],), (1,), k=0)) == {"a": 1.0}


def test_spread_context_by_hand() -> None:
    ranking = [("q", 3.0), ("x", 2.0), ("low", 1.0)]
    neighbours = {"q": ("before", "answer"), "x": (None, None)}
    got = dict(spread_context(ranking, neighbours, previous_weight=0.5, next_weight=0.25))
    # Shifted: q=2, x=1, low=0; "answer" inherits half of q, "before" a quarter.
    assert got == pytest.approx({"q": 2.0, "x": 1.0, "low": 0.0, "before": 0.5, "answer": 1.0})
    assert spread_context([], {}, previous_weight=1, next_weight=1) == []
    # A link known from one side works both ways.
    chain = dict(
        spread_context(
            [("a", 1.0), ("b", 1.0), ("z", 0.0)],
            {"a": (None, "b")},
            previous_weight=1.0,
            next_weight=1.0,
        )
    )
    assert chain == pytest.approx({"a": 2.0, "b": 2.0, "z": 0.0})


def test_fusion_config_validation_and_depth() -> None:
    config = FusionConfig()
    assert config.candidate_count(5) == 50
    # The depth does not grow with k below min_candidates (prefix property).
    assert config.candidate_count(40) == 50
    assert config.candidate_count(80) == 80
    assert FusionConfig(candidates=10).candidate_count(25) == 25
    for bad in (
        {"method": "max"},
        {"dense_weight": -1},
        {"lexical_weight": math.nan},
        {"dense_weight": 0, "lexical_weight": 0},
        {"candidates": 0},
        {"rrf_k": -1},
        {"previous_context_weight": -0.1},
        {"context_depth": 0},
        {"missing_margin": 0},
        {"context_gap": timedelta(minutes=-1)},
    ):
        with pytest.raises(ConfigurationError):
            FusionConfig(**bad)
    assert not FusionConfig(previous_context_weight=0, next_context_weight=0).uses_context


def test_index_metadata_keeps_scalars_and_record_fields() -> None:
    metadata = {"topic": "x", "n": 1, "tags": ["a"], "none": None, "user_id": "evil", "kind": "x"}
    record = MemoryRecord("r", "alice", "turn", "t", T0, "s", metadata)
    assert index_metadata(record) == {
        "topic": "x",
        "n": 1,
        "user_id": "alice",
        "kind": "turn",
        "session_id": "s",
    }
    assert "session_id" not in index_metadata(rec("r", "t", session_id="spoof"))


# -- HybridRetriever ------------------------------------------------------------------------


def test_search_finds_and_scopes(
    parts: tuple[SQLiteRecordStore, NumpyIndex, HybridRetriever],
) -> None:
    store, index, retriever = parts
    store.add(
        [
            rec("a1", "I adopted a golden retriever puppy named Max"),
            rec("a2", "My favourite food is spicy Thai curry"),
            rec("b1", "My golden retriever puppy is named Rex", user="bob"),
        ]
    )
    for mode in ("hybrid", "dense", "lexical"):
        hits = retriever.search("what is the puppy called", user_id="alice", k=5, mode=mode)
        assert hits[0].record.id == "a1", mode
        assert {h.record.user_id for h in hits} == {"alice"}
        assert all(a.score >= b.score for a, b in itertools.pairwise(hits))
    assert index.count() == 3 and store.pending_index() == []
    assert retriever.search("puppy", user_id="carol", k=5) == []


def test_search_validates_input(
    parts: tuple[SQLiteRecordStore, NumpyIndex, HybridRetriever],
) -> None:
    _, _, retriever = parts
    for kwargs in ({"k": 0}, {"k": -1}, {"k": True}, {"mode": "magic"}):
        with pytest.raises(InvalidInputError):
            retriever.search("q", user_id="alice", **{"k": 3, **kwargs})  # type: ignore[arg-type]
    for query in ("", "   \n"):
        with pytest.raises(InvalidInputError):
            retriever.search(query, user_id="alice", k=3)
    with pytest.raises(MissingUserError):
        retriever.search("q", user_id="", k=3)


def test_where_filters_apply_to_both_sides(
    parts: tuple[SQLiteRecordStore, NumpyIndex, HybridRetriever],
) -> None:
    store, _, retriever = parts
    store.add(
        [rec(f"t{i}", f"we talked about pizza toppings {i}") for i in range(20)]
        + [rec("n1", "pizza note", kind="note", topic="food", session="s1")]
    )
    for where in ({"kind": "note"}, {"topic": "food"}, {"session_id": "s1"}):
        hits = retriever.search("pizza", user_id="alice", k=3, where=where)
        assert [h.record.id for h in hits] == ["n1"]


def test_pending_records_heal_after_index_failure(
    parts: tuple[SQLiteRecordStore, NumpyIndex, HybridRetriever], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, index, retriever = parts
    store.add([rec("r1", "the violin lesson is on Tuesday")])
    real_add = index.add
    calls = {"n": 0}

    def failing_add(*args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        raise RuntimeError("index down")

    monkeypatch.setattr(index, "add", failing_add)
    with pytest.raises(RuntimeError):
        retriever.index_pending()
    assert calls["n"] == 1 and index.count() == 0
    assert [r.id for r in store.pending_index()] == ["r1"]
    monkeypatch.setattr(index, "add", real_add)
    # Dense-only search proves the vector got there: the next search indexes first.
    hits = retriever.search("violin lesson", user_id="alice", k=1, mode="dense")
    assert [h.record.id for h in hits] == ["r1"]
    assert store.pending_index() == [] and index.count("alice") == 1


def test_index_pending_batches_and_reports(
    parts: tuple[SQLiteRecordStore, NumpyIndex, HybridRetriever],
) -> None:
    store, index, retriever = parts
    store.add([rec(f"r{i}", f"note number {i}", user=f"u{i % 3}") for i in range(25)])
    store.add([rec("raw", "not for the index")], indexed=False)
    assert retriever.index_pending(batch_size=4, progress=True) == 25
    assert index.count() == 25 and retriever.index_pending() == 0
    with pytest.raises(InvalidInputError):
        retriever.index_pending(batch_size=0)


def test_reindex_rebuilds_from_the_store(
    parts: tuple[SQLiteRecordStore, NumpyIndex, HybridRetriever],
) -> None:
    store, index, retriever = parts
    store.add([rec("r1", "alpha"), rec("r2", "beta", user="bob")])
    retriever.index_pending()
    stale = np.full((1, 256), 1 / 16, np.float32)
    index.add(["stale"], stale, [{"user_id": "alice", "kind": "turn"}])
    assert retriever.reindex(progress=False) == 2
    assert index.count() == 2


def test_stale_and_foreign_index_entries_are_dropped(
    parts: tuple[SQLiteRecordStore, NumpyIndex, HybridRetriever],
) -> None:
    store, _, _ = parts
    store.add([rec("mine", "apple pie recipe"), rec("theirs", "apple pie recipe", user="bob")])

    class LeakyIndex(NumpyIndex):
        """Returns every id it holds, whoever owns it: the retriever must not trust it."""

        def search(
            self, vector: npt.NDArray[np.float32], *, user_id: str, k: int, where: Any = None
        ) -> list[tuple[str, float]]:
            return [("theirs", 0.99), ("deleted", 0.98), ("mine", 0.5)]

    retriever = HybridRetriever(store, LeakyIndex(), HashingEmbedder())
    hits = retriever.search("apple pie", user_id="alice", k=5)
    assert [h.record.id for h in hits] == ["mine"]


def test_conversation_context_lifts_the_answer_turn(
    parts: tuple[SQLiteRecordStore, NumpyIndex, HybridRetriever],
) -> None:
    store, index, _ = parts
    filler = [
        rec(f"f{i}", text, minutes=i, session="s1")
        for i, text in enumerate(["Morning!", "How was the weekend?", "Busy but fun."])
    ]
    store.add(
        [
            *filler,
            rec(
                "q",
                "Tim: What position do you play on the basketball team?",
                minutes=10,
                session="s2",
            ),
            rec("a", "John: Shooting guard, since last season.", minutes=11, session="s2"),
            rec("other", "John: I love basketball", minutes=12, session="s3"),
        ]
    )
    plain = HybridRetriever(
        store,
        index,
        HashingEmbedder(),
        fusion=FusionConfig(previous_context_weight=0, next_context_weight=0),
    )
    with_context = HybridRetriever(store, index, HashingEmbedder())
    query = "What position does John play on the basketball team?"
    plain_ids = [h.record.id for h in plain.search(query, user_id="alice", k=3)]
    context_ids = [h.record.id for h in with_context.search(query, user_id="alice", k=3)]
    assert "a" in context_ids[:2]
    assert context_ids.index("a") < (plain_ids.index("a") if "a" in plain_ids else 99)


def test_context_fallback_through_the_protocol_matches_the_store() -> None:
    store = SQLiteRecordStore()
    store.add(
        [rec(f"r{i}", f"t{i}", minutes=i % 4, session=f"s{i % 2}", kind="turn") for i in range(10)]
        + [rec("lone", "x")]
    )
    ids = [f"r{i}" for i in range(10)] + ["lone", "missing"]
    assert _adjacent_via_list(store, ids, user_id="alice") == store.adjacent(ids, user_id="alice")
    store.close()


class _ListOnlyStore:
    """A RecordStore without the optional ``adjacent`` method (delegates the rest)."""

    def __init__(self, inner: SQLiteRecordStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == "adjacent":
            raise AttributeError(name)
        return getattr(self._inner, name)


def test_search_works_with_a_store_without_adjacent() -> None:
    inner = SQLiteRecordStore()
    inner.add(
        [
            rec("a", "chess club on Friday", session="s"),
            rec("b", "see you there", minutes=1, session="s"),
        ]
    )
    retriever = HybridRetriever(_ListOnlyStore(inner), NumpyIndex(), HashingEmbedder())
    assert [h.record.id for h in retriever.search("chess club", user_id="alice", k=2)] == ["a", "b"]
    inner.close()


WORDS = ["cat", "dog", "tea", "jazz", "paris", "chess", "rain", "bread", "violin", "kayak"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    actions=st.lists(
        st.one_of(
            st.tuples(
                st.just("add"),
                st.sampled_from(["ann", "bob", "cy"]),
                st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
            ),
            st.tuples(
                st.just("search"),
                st.sampled_from(["ann", "bob", "cy"]),
                st.lists(st.sampled_from(WORDS), min_size=1, max_size=3),
            ),
            st.tuples(st.just("delete"), st.sampled_from(["ann", "bob", "cy"]), st.just([])),
        ),
        max_size=25,
    ),
    mode=st.sampled_from(["hybrid", "dense", "lexical"]),
)
def test_no_cross_user_results_ever(actions: list[tuple[str, str, list[str]]], mode: str) -> None:
    store, index = SQLiteRecordStore(), NumpyIndex()
    retriever = HybridRetriever(store, index, HashingEmbedder(dimension=64))
    owned: dict[str, set[str]] = {"ann": set(), "bob": set(), "cy": set()}
    for n, (action, user, words) in enumerate(actions):
        if action == "add":
            rid = f"{user}-{n}"
            store.add([rec(rid, " ".join(words), user=user, minutes=n, session="s")])
            owned[user].add(rid)
            if n % 2:  # leave some pending: search must index them itself
                retriever.index_pending()
        elif action == "search":
            hits = retriever.search(" ".join(words), user_id=user, k=5, mode=mode)  # type: ignore[arg-type]
            assert all(h.record.user_id == user and h.record.id in owned[user] for h in hits)
        else:
            index.delete_user(user)
            store.delete_user(user)
            owned[user].clear()
            assert store.count(user) == 0 and index.count(user) == 0
            assert retriever.search(" ".join(WORDS), user_id=user, k=5) == []
    for user, ids in owned.items():
        retriever.index_pending()
        assert store.count(user) == len(ids) == index.count(user)
    store.close()


# -- evaluation helpers ---------------------------------------------------------------------


def test_metrics() -> None:
    ranked = ["a", "b", "c", "d"]
    assert recall_at_k(ranked, {"b", "z"}, 2) == 0.5
    assert precision_at_k(ranked, {"b", "c"}, 4) == 0.5
    assert hit_at_k(ranked, {"d"}, 3) == 0.0 and hit_at_k(ranked, {"d"}, 4) == 1.0
    assert mrr(ranked, {"c"}) == pytest.approx(1 / 3) and mrr(ranked, {"x"}) == 0.0
    assert ndcg_at_k(ranked, {"a"}, 3) == 1.0
    assert ndcg_at_k(ranked, {"b"}, 3) == pytest.approx(1 / math.log2(3))
    with pytest.raises(ValueError):
        recall_at_k(ranked, set(), 5)
    with pytest.raises(ValueError):
        recall_at_k(ranked, {"a"}, 0)


def test_leave_one_out_scores_each_choice_on_the_group_it_did_not_see() -> None:
    scores = {
        "default": {"c1": [0.5, 0.5], "c2": [0.2, 0.2], "c3": [0.4]},
        "wide": {"c1": [0.9, 0.7], "c2": [0.1, 0.1], "c3": [0.4]},
    }
    cv = leave_one_out(scores)
    # Without c1, "default" is better on c2 (0.2 > 0.1) and ties on c3: it is chosen.
    assert cv["folds"]["c1"] == {"chosen": "default", "train": 0.8 / 3, "held_out": 0.5, "n": 2}
    assert cv["folds"]["c2"]["chosen"] == "wide" and cv["folds"]["c2"]["held_out"] == 0.1
    assert cv["folds"]["c3"]["chosen"] == "wide"
    assert not cv["agree"] and cv["best_on_all"] == "wide"
    assert cv["held_out"] == pytest.approx((0.5 + 0.5 + 0.1 + 0.1 + 0.4) / 5) and cv["n"] == 5
    tied = leave_one_out({"default": {"a": [1.0], "b": [0.0]}, "other": {"a": [0.0], "b": [1.0]}})
    assert tied["best_on_all"] == "default"  # a tie keeps the first setting
    assert [f["chosen"] for f in tied["folds"].values()] == ["other", "default"]
    alone = leave_one_out({"default": {"a": [1.0]}})
    assert alone["folds"] == {} and math.isnan(alone["held_out"]) and alone["agree"] is False
    with pytest.raises(ValueError, match="same groups"):
        leave_one_out({"x": {"a": [1.0]}, "y": {"b": [1.0]}})
    with pytest.raises(ValueError):
        leave_one_out({})


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("D1:3", ["D1:3"]),
        ("D8:6; D9:17", ["D8:6", "D9:17"]),
        ("D:11:26", ["D11:26"]),
        ("D30:05", ["D30:5"]),
        ("D", []),
        ("", []),
    ],
)
def test_normalise_evidence(raw: str, expected: list[str]) -> None:
    assert normalise_evidence(raw) == expected


def test_load_locomo_handles_the_quirks(tmp_path: Path) -> None:
    sample: Mapping[str, Any] = {
        "sample_id": "conv-x",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bo",
            "session_2_date_time": "1:56 pm on 8 May, 2023",
            "session_2": [
                {"speaker": "Bo", "dia_id": "D2:1", "text": "later", "blip_caption": "a cat"}
            ],
            "session_1_date_time": "9:00 am on 1 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "hi"},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "hello"},
            ],
            "session_3_date_time": "no session list for this date",
        },
        "qa": [
            {"question": "q1", "answer": 2022, "evidence": ["D1:2", "D:2:1", "D"], "category": 2},
            {
                "question": "q2",
                "adversarial_answer": "x",
                "evidence": ["D1:1; D2:01"],
                "category": 5,
            },
            {"question": "q3", "answer": "y", "evidence": [], "category": 4},
        ],
    }
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([sample]), encoding="utf-8")
    [conv] = load_locomo(path)
    assert [t.dia_id for t in conv.turns] == ["D1:1", "D1:2", "D2:1"]
    assert conv.turns[0].render() == "Ann: hi" and conv.turns[2].image_caption == "a cat"
    assert sorted(conv.session_times) == [1, 2]
    assert conv.session_datetime(2) == datetime(2023, 5, 8, 13, 56)
    q1, q2, q3 = conv.qa
    assert (q1.answer, q1.evidence, q1.category_name) == ("2022", ("D1:2", "D2:1"), "temporal")
    assert (q2.answer, q2.evidence) == ("x", ("D1:1", "D2:1"))
    assert q3.evidence == ()


def test_assistant_replies_keep_their_own_score() -> None:
    ranking = [("question", 2.0), ("reply", 0.0), ("fact", 1.0)]
    neighbours = {"question": (None, "reply"), "reply": ("question", "fact")}
    spread = dict(spread_context(ranking, neighbours, previous_weight=0.4, next_weight=0.3))
    assert spread["reply"] == pytest.approx(0.4 * 2.0 + 0.3 * 1.0)
    kept = dict(
        spread_context(
            ranking,
            neighbours,
            previous_weight=0.4,
            next_weight=0.3,
            own_score_only=frozenset({"reply"}),
        )
    )
    assert kept["reply"] == 0.0
    assert kept["fact"] > kept["reply"]


def test_a_chat_reply_does_not_push_the_users_statement_out() -> None:
    from memories_core import HistoryMemory, Scope, Turn

    memory = HistoryMemory(embedder=HashingEmbedder())
    scope = Scope("sam", "monday")
    reply = "I'm glad to help, but I'm not a vegetarian. I'm happy to help with any dietary needs."
    memory.save(
        [
            Turn("user", "Hi, I'm Sam. I'm vegetarian, so please never suggest meat dishes."),
            Turn("assistant", reply),
        ],
        scope,
    )
    memory.save(
        [
            Turn("user", "Also, I live in Lyon and I cook dinner for two most evenings."),
            Turn("assistant", reply),
        ],
        scope,
    )
    for query in (
        "Can you suggest something I could cook for dinner tonight?",
        "What should I make for dinner tonight?",
    ):
        recall = memory.recall(query, Scope("sam"), k=3)
        # Both user statements outrank the replies next to them.
        assert [h.record.metadata["role"] for h in recall.records][:2] == ["user", "user"]


def test_only_dialogue_turns_share_scores_with_neighbours() -> None:
    from memories_core.backends import NumpyIndex, SQLiteRecordStore
    from memories_core.retrieval import FusionConfig

    store = SQLiteRecordStore(None)
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    texts = ["the boat is blue", "we sailed to the island of Hydra", "lunch was grilled fish"]
    store.add(
        [
            MemoryRecord(
                id=f"n{i}",
                user_id="u",
                kind="note",
                text=text,
                created_at=start + timedelta(minutes=i),
                session_id="s1",
            )
            for i, text in enumerate(texts)
        ]
    )
    index, embedder = NumpyIndex(), HashingEmbedder()

    def scores(fusion: FusionConfig) -> dict[str, float]:
        hits = HybridRetriever(store, index, embedder, fusion=fusion).search(
            "sailing to Hydra island", user_id="u", k=3, where={"kind": "note"}
        )
        return {h.record.id: h.score for h in hits}

    default = scores(FusionConfig())
    boosted = scores(FusionConfig(context_kinds=("note",)))
    assert boosted["n2"] > default["n2"]  # the neighbour of the match inherits only if allowed
    plain = scores(FusionConfig(previous_context_weight=0, next_context_weight=0))
    # Without the boost, notes keep their own scores (shifted by a constant) and order.
    assert default["n2"] - default["n0"] == pytest.approx(plain["n2"] - plain["n0"])
    assert sorted(default, key=default.__getitem__) == sorted(plain, key=plain.__getitem__)
