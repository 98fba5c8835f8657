"""The optional late-interaction reranker: MaxSim blend, per-record cache, the real model."""

from __future__ import annotations

import sys
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.errors import ConfigurationError, InvalidInputError, MissingExtraError
from memories_core.retrieval import Pipeline, RecallRequest
from memories_core.retrieval.cross_encoder import CrossEncoderModelMissing
from memories_core.retrieval.late_encoder import DEFAULT_LATE_DIM
from memories_core.retrieval.late_interaction import (
    DEFAULT_LATE_DEPTH,
    LateInteractionReranker,
    OnnxLateInteractionEncoder,
    TokenVectorCache,
    late_interaction_pipeline,
    late_interaction_reranker,
)
from memories_core.retrieval.memory_backend import InMemoryBackend
from memories_core.types import MemoryRecord
from reranker_scenarios import (
    DIM,
    FakeEncoder,
    needs_bundled,
    top_answer_to_the_cat_question,
    with_reranker,
)

NOW = datetime(2024, 5, 1, tzinfo=timezone.utc)
TEXTS = [
    "Ana: the weather was grey and rainy all week",
    "Ana: my sister visited and we cooked dinner",
    "Bo: hiking boots were too small for the trip",
    "Ana: Pixel chased a zebra toy around the flat",
    "Bo: see you on Sunday then",
]


def backend_with(texts: list[str], user: str = "ana", prefix: str = "r") -> InMemoryBackend:
    backend = InMemoryBackend(HashingEmbedder())
    add_records(backend, texts, user, prefix)
    return backend


def add_records(backend: InMemoryBackend, texts: list[str], user: str, prefix: str) -> None:
    backend.add(
        [
            MemoryRecord(
                id=f"{prefix}{i}",
                user_id=user,
                kind="turn",
                text=text,
                created_at=NOW - timedelta(hours=len(texts) - i),
            )
            for i, text in enumerate(texts)
        ],
        batch=False,
    )


def ranked(
    pipeline: Pipeline, backend: InMemoryBackend, query: str, user: str = "ana"
) -> list[str]:
    request = RecallRequest(query, user_id=user, k=5, now=NOW)
    return [hit.record.id for hit in pipeline.run(request, backend)]


def test_maxsim_order_alone_and_blended_with_the_fused_score() -> None:
    backend = backend_with(TEXTS)
    plain = ranked(Pipeline(), backend, "did Pixel play with the zebra or the weather")
    encoder = FakeEncoder()
    alone = ranked(
        with_reranker(LateInteractionReranker(encoder, weight=1.0, context=False)),
        backend,
        "did Pixel play with the zebra or the weather",
    )
    # "pixel", "zebra", "the" (twice: the query's "the" matches both) are in r3: it wins.
    assert alone[0] == "r3"
    assert set(alone) == set(plain)
    off = ranked(
        with_reranker(LateInteractionReranker(FakeEncoder(), weight=0.0, context=False)),
        backend,
        "did Pixel play with the zebra or the weather",
    )
    assert off == plain


def test_context_encodes_a_turn_after_the_turn_before_it() -> None:
    backend = InMemoryBackend(HashingEmbedder())
    backend.add(  # one save call: the two turns are neighbours
        [
            MemoryRecord(id=f"r{i}", user_id="ana", kind="turn", text=text, created_at=NOW)
            for i, text in enumerate(["Bo: what pet do you have", "Ana: a cat named Bailey"])
        ]
    )
    encoder = FakeEncoder()
    reranker = LateInteractionReranker(encoder, context=True)
    ranked(with_reranker(reranker), backend, "what pet does Ana have")
    assert "Bo: what pet do you have Ana: a cat named Bailey" in encoder.documents
    assert "Bo: what pet do you have" in encoder.documents  # the first turn: no previous turn


def test_vectors_are_computed_once_per_record_and_reused() -> None:
    backend = backend_with(TEXTS)
    encoder = FakeEncoder()
    reranker = LateInteractionReranker(encoder, context=False)
    pipeline = with_reranker(reranker)
    first = ranked(pipeline, backend, "Pixel zebra toy")
    encoded = len(encoder.documents)
    assert encoded == len(TEXTS) == len(reranker.cache)
    tokens = sum(FakeEncoder._rows(text).shape[0] for text in TEXTS)
    assert reranker.cache.nbytes == tokens * DIM  # int8, as stored
    assert ranked(pipeline, backend, "Pixel zebra toy") == first
    ranked(pipeline, backend, "hiking boots")
    assert len(encoder.documents) == encoded  # documents: cached; queries: encoded each time
    assert len(encoder.queries) == 3
    assert reranker.cache.hits == 2 * len(TEXTS)


def rerank_by_hand(reranker: LateInteractionReranker, order: list[str]) -> list[str]:
    """``reranker`` over a fused ranking given by hand (``order``, best first)."""
    backend = backend_with(TEXTS)
    _, ctx = Pipeline(rerankers=()).rank(RecallRequest("x", user_id="ana", k=5, now=NOW), backend)
    request = RecallRequest("did Pixel chase the zebra toy", user_id="ana", k=5, now=NOW)
    fused = [(item, 1.0 - 0.1 * i) for i, item in enumerate(order)]
    return [item for item, _ in reranker.rerank(fused, request, ctx)]


def test_a_pool_lets_a_deep_match_join_the_head() -> None:
    order = ["r0", "r1", "r2", "r4", "r3"]  # the fused ranking buries r3, the answer
    head_only = LateInteractionReranker(
        FakeEncoder(), candidates=2, weight=1.0, context=False, pool=0
    )
    assert rerank_by_hand(head_only, order)[2:] == ["r2", "r4", "r3"]  # only r0, r1 moved
    assert len(head_only.encoder.documents) == 2  # type: ignore[attr-defined]
    encoder = FakeEncoder()
    pooled = LateInteractionReranker(encoder, candidates=2, weight=1.0, context=False, pool=5)
    out = rerank_by_hand(pooled, order)
    assert out[0] == "r3"  # scored in the pool, admitted, first by MaxSim
    assert len(encoder.documents) == 5  # the whole pool was scored
    # The head (r0, r1) and the pool's 2 best below it form the block; the one of r2 / r4
    # not admitted follows it.
    assert set(out[:4]) > {"r0", "r1", "r3"} and out[4] in {"r2", "r4"}


def test_a_pool_at_most_the_head_changes_nothing() -> None:
    order = ["r0", "r1", "r2", "r4", "r3"]
    head_only = LateInteractionReranker(
        FakeEncoder(), candidates=3, weight=0.7, context=False, pool=0
    )
    same = LateInteractionReranker(FakeEncoder(), candidates=3, weight=0.7, context=False, pool=3)
    assert rerank_by_hand(head_only, order) == rerank_by_hand(same, order)


def test_late_interaction_pipeline_fetches_deep_enough_for_the_pool() -> None:
    reranker = LateInteractionReranker(FakeEncoder(), candidates=5, pool=120, context=False)
    base = Pipeline()
    request = RecallRequest("where is Pixel", user_id="ana", k=5)
    pipeline = late_interaction_pipeline(base, reranker, depth=90)
    assert pipeline.candidate_depth(5, request) == 90 and base.depth < 90
    assert pipeline.depth == base.depth  # deeper only on the requests it reranks
    assert pipeline.rerankers == (*base.rerankers, replace(reranker, depth=90))
    assert pipeline.sources == base.sources and pipeline.fusion == base.fusion
    default = late_interaction_pipeline(base, reranker)
    assert default.candidate_depth(5, request) == DEFAULT_LATE_DEPTH
    deeper = late_interaction_pipeline(replace(base, depth=300), reranker)
    assert deeper.candidate_depth(5, request) == 300
    with pytest.raises(ConfigurationError, match="depth"):
        late_interaction_pipeline(base, reranker, depth=0)


def test_with_a_pool_a_smaller_k_is_a_prefix_of_a_larger_one() -> None:
    reranker = LateInteractionReranker(FakeEncoder(), candidates=3, pool=20, context=False)
    memory = HistoryMemory(
        embedder=HashingEmbedder(), pipeline=late_interaction_pipeline(reranker=reranker)
    )
    scope = Scope("ana")
    words = ["tea", "cat", "rain", "boots", "zebra", "sister", "dinner", "trip"]
    for i in range(30):
        memory.save([Turn("user", f"{words[i % 8]} and {words[(3 * i) % 8]} day {i}")], scope)
    query = "zebra trip with my sister"
    ids = {k: [h.record.id for h in memory.recall(query, scope, k=k).records] for k in (3, 10)}
    assert ids[3] == ids[10][:3] and len(ids[10]) == 10
    memory.close()


def test_save_jobs_encode_the_turns_so_prefetch_and_recall_encode_nothing() -> None:
    encoder = FakeEncoder()
    reranker = LateInteractionReranker(encoder, candidates=3, pool=20, context=True)
    memory = HistoryMemory(
        embedder=HashingEmbedder(), pipeline=late_interaction_pipeline(reranker=reranker)
    )
    for user in ("ana", "bo"):
        memory.save([Turn("user", f"{user} likes tea"), Turn("assistant", "noted")], Scope(user))
        memory.save([Turn("user", f"{user} has a cat named Pixel")], Scope(user))
    assert memory.flush() == 0
    assert len(encoder.documents) == 6  # every turn of both users, by the save jobs
    assert "user: ana likes tea assistant: noted" in encoder.documents  # with its context
    assert memory.prefetch("ana", progress=False) == 0  # stored already
    memory.recall("what is the cat called", Scope("ana"), k=2)
    assert len(encoder.documents) == 6  # every candidate had its vectors
    assert HistoryMemory(embedder=HashingEmbedder()).prefetch("ana", progress=False) == 0
    memory.close()


def test_prefetch_reads_no_record_it_was_given_again() -> None:
    backend = backend_with(TEXTS)
    records = list(backend.load([f"r{i}" for i in range(len(TEXTS))], user_id="ana").values())
    loads: list[list[str]] = []
    real_load = backend.load

    def counting_load(ids: list[str], *, user_id: str) -> dict[str, MemoryRecord]:
        loads.append(list(ids))
        return real_load(ids, user_id=user_id)

    backend.load = counting_load  # type: ignore[method-assign,assignment]
    encoder = FakeEncoder()
    reranker = LateInteractionReranker(encoder, context=True)
    assert reranker.prefetch(backend, "ana", records) == len(TEXTS)
    assert loads == []  # the records and their neighbours came from the given records
    foreign = backend_with(TEXTS[:1], user="bo", prefix="b")
    bo = list(foreign.load(["b0"], user_id="bo").values())
    assert reranker.prefetch(backend, "ana", bo) == 0  # another user's records are skipped


def test_cache_is_bounded_in_bytes_least_recently_used_first() -> None:
    cache = TokenVectorCache(max_bytes=3 * 4 * 8)  # three 4 x 8 int8 matrices
    for i in range(4):
        cache.put("ana", f"r{i}", "d", np.ones((4, 8), dtype=np.float32))
    assert len(cache) == 3 and ("ana", "r0") not in cache
    assert cache.get("ana", "r1", "other digest") is None  # a stale digest is dropped
    assert ("ana", "r1") not in cache and cache.nbytes == 2 * 4 * 8
    with pytest.raises(ConfigurationError):
        TokenVectorCache(max_bytes=0)


def test_an_edited_record_is_encoded_again_from_its_new_text() -> None:
    encoder = FakeEncoder()
    reranker = LateInteractionReranker(encoder, weight=1.0, context=False)
    memory = HistoryMemory(embedder=HashingEmbedder(), pipeline=with_reranker(reranker))
    scope = Scope("ana")
    for text in ("I like tea", "my cat is called Pixel", "the weather is grey"):
        memory.save([Turn("user", text)], scope)
    hits = memory.recall("what is my cat called", scope, k=3).records
    cat = next(hit.record for hit in hits if "Pixel" in hit.record.text)
    assert memory.engine.edit_text("ana", cat.id, "my dog is called Rex")
    before = len(encoder.documents)
    hits = memory.recall("what is my dog called", scope, k=3).records
    assert "my dog is called Rex" in encoder.documents[before:]
    assert not any("Pixel" in text for text in encoder.documents[before:])
    assert hits[0].record.id == cat.id and "Rex" in hits[0].record.text
    memory.close()


def test_delete_user_and_clear_drop_that_users_vectors_only() -> None:
    encoder = FakeEncoder()
    reranker = LateInteractionReranker(encoder, context=False)
    memory = HistoryMemory(embedder=HashingEmbedder(), pipeline=with_reranker(reranker))
    for user in ("ana", "bo"):
        for text in ("I like tea", "my cat is called Pixel"):
            memory.save([Turn("user", text)], Scope(user))
        memory.recall("cat", Scope(user), k=2)
    users = {user for user, _ in list(reranker.cache._entries)}
    assert users == {"ana", "bo"} and len(reranker.cache) == 4
    memory.delete_user("ana")
    assert {user for user, _ in list(reranker.cache._entries)} == {"bo"}
    memory.clear(Scope("bo"))
    assert len(reranker.cache) == 0
    memory.close()


def test_users_never_share_cached_vectors() -> None:
    backend = backend_with(TEXTS, user="ana", prefix="a")
    add_records(backend, TEXTS, "bo", "b")
    encoder = FakeEncoder()
    reranker = LateInteractionReranker(encoder, context=False)
    pipeline = with_reranker(reranker)
    ana = ranked(pipeline, backend, "Pixel zebra toy", user="ana")
    encoded = len(encoder.documents)
    bo = ranked(pipeline, backend, "Pixel zebra toy", user="bo")
    assert len(encoder.documents) == 2 * encoded  # bo's records are encoded for bo
    assert all(i.startswith("a") for i in ana) and all(i.startswith("b") for i in bo)
    assert all(key[1].startswith(key[0][0]) for key in reranker.cache._entries)


def test_a_deleted_record_found_in_a_stale_ranking_is_dropped_from_the_cache() -> None:
    backend = backend_with(TEXTS)
    reranker = LateInteractionReranker(FakeEncoder(), context=False)
    pipeline = with_reranker(reranker)
    ranked(pipeline, backend, "Pixel zebra toy")
    assert ("ana", "r3") in reranker.cache
    request = RecallRequest("Pixel", user_id="ana", k=5, now=NOW)
    after = backend_with(TEXTS[:3])  # the same store once r3 and r4 are deleted
    _, ctx = Pipeline(rerankers=()).rank(request, after)
    reranker.rerank([("r3", 1.0), ("r1", 0.5)], ctx.request, ctx)
    assert ("ana", "r3") not in reranker.cache


def test_bad_settings_and_a_missing_extra_are_typed_errors(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    with pytest.raises(ConfigurationError):
        LateInteractionReranker(FakeEncoder(), weight=1.5)
    with pytest.raises(ConfigurationError):
        LateInteractionReranker(FakeEncoder(), candidates=0)
    with pytest.raises(ConfigurationError):
        LateInteractionReranker(object())  # type: ignore[arg-type]
    for pool in (-1, True, 2.5):
        with pytest.raises(ConfigurationError, match="pool"):
            LateInteractionReranker(FakeEncoder(), pool=pool)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        OnnxLateInteractionEncoder(query_length=4)
    monkeypatch.setattr(
        "memories_core.retrieval.cross_encoder.BUNDLED_PACKAGE", "no_such_package_here"
    )
    with pytest.raises(CrossEncoderModelMissing, match="rerank"):
        late_interaction_reranker()
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(MissingExtraError, match="rerank"):
        OnnxLateInteractionEncoder(model_dir=tmp_path).encode_query("where")


@pytest.mark.slow
@needs_bundled
def test_bundled_colbert_scores_the_answer_highest_and_is_deterministic() -> None:
    from memories_core.retrieval.late_interaction import maxsim

    encoder = OnnxLateInteractionEncoder()
    query = encoder.encode_query("What is the name of Ana's cat?")
    texts = [
        "Bo: we went hiking in the hills on Sunday",
        "Ana: I adopted a grey cat and named her Pixel",
        "Bo: thanks, see you soon!",
    ]
    rows = [encoder.encode_document(t) for t in texts]
    assert all(r.shape[1] == DEFAULT_LATE_DIM for r in rows)
    assert np.allclose(np.linalg.norm(rows[1], axis=1), 1.0, atol=1e-4)
    values = [maxsim(query, r) for r in rows]
    assert max(range(3), key=values.__getitem__) == 1
    assert np.array_equal(encoder.encode_document(texts[1]), rows[1])
    long_rows = encoder.encode_document("Ana: " + "I love my cat Pixel and " * 80)
    assert long_rows.shape[0] == encoder.document_length
    # A long query (a whole dialogue) keeps its end: the question asked last still decides.
    dialogue = "Bo: ok, sure. " * 30
    long_query = encoder.encode_query(dialogue + "Ana: What is the name of Ana's cat?")
    assert long_query.shape[0] == encoder.query_length
    assert max(range(3), key=lambda i: maxsim(long_query, rows[i])) == 1
    with pytest.raises(InvalidInputError):
        encoder.encode_query(None)  # type: ignore[arg-type]


@pytest.mark.slow
@needs_bundled
def test_bundled_reranker_in_history_memory_lifts_the_answer() -> None:
    reranker = late_interaction_reranker(candidates=10, weight=1.0, context=False)
    assert "Pixel" in top_answer_to_the_cat_question(reranker)
    assert len(reranker.cache) == 4


def test_the_query_is_encoded_once_on_a_worker_while_the_first_stage_runs() -> None:
    import threading

    threads: list[str] = []

    class Watched(FakeEncoder):
        def encode_query(self, text: str) -> np.ndarray:
            threads.append(threading.current_thread().name)
            return super().encode_query(text)

    encoder = Watched()
    pipeline = late_interaction_pipeline(reranker=LateInteractionReranker(encoder, pool=10))
    backend = backend_with(TEXTS)
    top = ranked(pipeline, backend, "what toy did Pixel chase")
    assert top[0] == "r3" and encoder.queries == ["what toy did Pixel chase"]
    assert threads and threads[0].startswith("late-query")  # not the caller's thread

    class Broken(FakeEncoder):
        def encode_query(self, text: str) -> np.ndarray:
            raise ConfigurationError("the query encoder failed")

    broken = late_interaction_pipeline(reranker=LateInteractionReranker(Broken(), pool=10))
    with pytest.raises(ConfigurationError, match="query encoder failed"):
        ranked(broken, backend, "what toy did Pixel chase")  # raised where it was awaited
