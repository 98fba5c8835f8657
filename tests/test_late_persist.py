"""Late-interaction token vectors written at save time and kept with the records."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memories_core import HistoryMemory, Scope, Turn
from memories_core.backends import NumpyIndex, SQLiteRecordStore
from memories_core.embedders import HashingEmbedder
from memories_core.errors import BackendError, InvalidInputError
from memories_core.portable import MemoryFileError, export_user, import_user
from memories_core.retrieval.late_interaction import (
    LateInteractionReranker,
    late_interaction_pipeline,
    late_interaction_reranker,
    maxsim,
    maxsim_pool,
)
from memories_core.retrieval.late_vectors import (
    engine_backend,
    late_stages,
    rebuild_token_vectors,
)
from memories_core.token_vectors import (
    TokenVectors,
    TokenVectorStore,
    encoder_tag,
    quantize,
    text_digest,
)
from memories_core.types import MemoryRecord
from reranker_scenarios import PERSONAL_TURNS, FakeEncoder, needs_bundled

TURNS = list(PERSONAL_TURNS)
BO_TURNS = [
    "the train to Lyon was late again",
    "my brother plays the cello",
    "we painted the kitchen yellow",
]


def memory_at(
    path: Path | None, encoder: Any, *, pool: int = 10, context: bool = True, **kw: Any
) -> HistoryMemory:
    reranker = LateInteractionReranker(encoder, candidates=3, pool=pool, context=context)
    return HistoryMemory(
        path=path,
        embedder=HashingEmbedder(),
        pipeline=late_interaction_pipeline(reranker=reranker),
        **kw,
    )


def fill(memory: HistoryMemory, user: str = "ana", turns: list[str] = TURNS) -> list[MemoryRecord]:
    for text in turns:
        memory.save([Turn("user", text)], Scope(user))
    memory.flush()
    return memory.engine.records(user)


def vector_store(memory: HistoryMemory) -> TokenVectorStore:
    store = memory.engine.store
    assert isinstance(store, TokenVectorStore)
    return store


def stored(memory: HistoryMemory, user: str = "ana") -> dict[str, TokenVectors]:
    return {row.record_id: row for row in vector_store(memory).token_vector_rows(user)}


def test_save_jobs_store_compact_vectors_of_every_turn(tmp_path: Path) -> None:
    encoder = FakeEncoder("counting")
    memory = memory_at(tmp_path, encoder)
    records = fill(memory)
    rows = stored(memory)
    assert set(rows) == {r.id for r in records}
    assert len(encoder.documents) == len(TURNS)  # one encode per turn, at save time
    for row in rows.values():
        assert row.data.dtype == np.int8 and row.encoder == encoder_tag("counting")
        assert 0 < row.scale < 1.0 / 100  # unit vectors: the largest value maps to 127
    # The second turn is encoded after the first (context), and tagged with that text.
    second = records[1]
    text = f"user: {TURNS[0]} user: {TURNS[1]}"
    assert text in encoder.documents
    assert rows[second.id].digest == text_digest("counting", text)
    assert (
        np.abs(rows[second.id].floats() - encoder._rows(text)).max()
        <= rows[second.id].scale / 2 + 1e-6
    )
    memory.close()


@pytest.mark.parametrize("context", [True, False])
def test_pair_texts_are_the_texts_the_stored_rows_were_made_from(
    tmp_path: Path, context: bool
) -> None:
    memory = memory_at(tmp_path, FakeEncoder("counting"), context=context)
    records = fill(memory)
    others = fill(memory, "bo", BO_TURNS)
    (stage,) = late_stages(memory.pipeline)
    backend = engine_backend(memory.engine)
    texts = stage.pair_texts(backend, "ana", records + others)  # bo's are left out
    assert len(texts) == len(records)
    rows = stored(memory)
    for record, text in zip(records, texts, strict=True):
        assert rows[record.id].digest == text_digest("counting", text)
    if context:
        assert texts[0] == f"user: {TURNS[0]}"
        assert texts[1] == f"user: {TURNS[0]} user: {TURNS[1]}"
    else:
        assert texts == [r.text for r in records]
    # A record alone is still read after its neighbour in the store.
    assert stage.pair_texts(backend, "ana", records[1:2]) == texts[1:2]
    memory.close()


def test_a_reopened_memory_encodes_nothing_on_recall(tmp_path: Path) -> None:
    memory = memory_at(tmp_path, FakeEncoder("counting"))
    fill(memory)
    first = [
        h.record.id for h in memory.recall("what is the cat called", Scope("ana"), k=3).records
    ]
    memory.close()
    encoder = FakeEncoder("counting")  # a new process: nothing cached
    reopened = memory_at(tmp_path, encoder)
    again = [
        h.record.id for h in reopened.recall("what is the cat called", Scope("ana"), k=3).records
    ]
    assert encoder.documents == []
    assert again == first
    reopened.close()


def test_an_edit_gets_new_vectors_and_the_next_turn_too(tmp_path: Path) -> None:
    encoder = FakeEncoder("counting")
    memory = memory_at(tmp_path, encoder)
    records = fill(memory)
    before = stored(memory)
    cat = records[1]
    dog = "user: I adopted a black dog and named him Rex"
    assert memory.engine.edit_text("ana", cat.id, dog)
    encoder.documents.clear()
    hits = memory.recall("what is the dog called", Scope("ana"), k=3).records
    assert cat.id in {h.record.id for h in hits}
    after = stored(memory)
    assert after[cat.id].digest != before[cat.id].digest  # written back with the new text
    assert after[records[2].id].digest != before[records[2].id].digest  # its context changed
    assert after[records[0].id].digest == before[records[0].id].digest
    assert sorted(encoder.documents) == sorted(
        [
            f"user: {TURNS[0]} {dog}",
            f"{dog} user: {TURNS[2]}",
        ]
    )
    memory.close()


def test_delete_record_and_delete_user_leave_no_vector_bytes(tmp_path: Path) -> None:
    memory = memory_at(tmp_path, FakeEncoder("counting"))
    records = fill(memory)
    fill(memory, "bo", BO_TURNS)
    rows = stored(memory)
    assert memory.engine.delete_records("ana", [records[0].id], erase=True) == 1
    assert records[0].id not in stored(memory) and len(stored(memory)) == len(TURNS) - 1
    secrets = [row.data.tobytes() for row in rows.values()]
    memory.delete_user("ana")
    assert stored(memory) == {} and len(stored(memory, "bo")) == len(BO_TURNS)
    memory.close()
    files = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert not any(secret in files for secret in secrets)
    kept = [row.data.tobytes() for row in stored_after_reopen(tmp_path, "bo")]
    assert kept and all(blob in files for blob in kept)  # the search can see vector bytes


def stored_after_reopen(path: Path, user: str) -> list[TokenVectors]:
    store = SQLiteRecordStore(path / "records.sqlite3")
    try:
        return store.token_vector_rows(user)
    finally:
        store.close()


def test_users_never_read_each_others_vectors(tmp_path: Path) -> None:
    encoder = FakeEncoder("counting")
    memory = memory_at(tmp_path, encoder)
    ana = fill(memory)
    store = vector_store(memory)
    tag = encoder_tag("counting")
    assert store.token_vectors("bo", [r.id for r in ana], encoder=tag) == {}
    row = next(iter(stored(memory).values()))
    assert store.put_token_vectors("bo", [row]) == 0  # ana's record id, bo's name: nothing
    fill(memory, "bo")
    encoder.documents.clear()
    hits = memory.recall("what is the cat called", Scope("bo"), k=3).records
    assert hits and all(h.record.user_id == "bo" for h in hits)
    assert encoder.documents == []  # bo's own stored vectors
    assert {r.record_id for r in store.token_vector_rows("bo")}.isdisjoint({r.id for r in ana})
    memory.close()


def test_export_import_round_trip_carries_the_vectors(tmp_path: Path) -> None:
    memory = memory_at(tmp_path / "a", FakeEncoder("counting"))
    fill(memory)
    file = export_user(memory, "ana", tmp_path / "ana.memories.zip")
    before = stored(memory)
    memory.close()
    encoder = FakeEncoder("counting")
    target = memory_at(tmp_path / "b", encoder)
    import_user(target, file)
    after = stored(target)
    assert set(after) == set(before)
    for rid, row in before.items():
        assert after[rid].digest == row.digest and np.array_equal(after[rid].data, row.data)
    target.recall("what is the cat called", Scope("ana"), k=3)
    assert encoder.documents == []
    target.close()


def rewrite(file: Path, target: Path, change: Callable[[dict[str, bytes]], None]) -> Path:
    with zipfile.ZipFile(file) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    change(members)
    with zipfile.ZipFile(target, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return target


def _row_edit(**fields: Any) -> Callable[[dict[str, bytes]], None]:
    def change(members: dict[str, bytes]) -> None:
        lines = members["token_vectors.jsonl"].decode().splitlines()
        first = json.loads(lines[0])
        first.update(fields)
        members["token_vectors.jsonl"] = ("\n".join([json.dumps(first), *lines[1:]])).encode()

    return change


def _values(array: Any) -> Callable[[dict[str, bytes]], None]:
    def change(members: dict[str, bytes]) -> None:
        import io

        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=True)
        members["token_vectors.npy"] = buffer.getvalue()

    return change


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_row_edit(id="someone-elses-record"), "no record of the file"),
        (_row_edit(scale=-1.0), "scale"),
        (_row_edit(tokens=10_000), "values"),
        (_row_edit(encoder="../../etc"), "hex"),
        (_row_edit(extra=1), "exactly"),
        (_values(np.zeros(7, dtype=np.float32)), "int8"),
        (_values(np.array([{"x": 1}], dtype=object)), "plain numeric"),
        (lambda m: m.pop("token_vectors.npy"), "come together"),
    ],
)
def test_a_hostile_vector_row_is_refused_and_nothing_is_written(
    tmp_path: Path, change: Callable[[dict[str, bytes]], None], message: str
) -> None:
    memory = memory_at(None, FakeEncoder("counting"))
    fill(memory)
    good = export_user(memory, "ana", tmp_path / "good.zip")
    memory.close()
    bad = rewrite(good, tmp_path / "bad.zip", change)
    target = memory_at(None, FakeEncoder("counting"))
    with pytest.raises(MemoryFileError, match=message):
        import_user(target, bad)
    assert target.engine.users() == [] and stored(target) == {}
    target.close()


def test_a_version_one_file_cannot_smuggle_vectors(tmp_path: Path) -> None:
    memory = memory_at(None, FakeEncoder("counting"))
    fill(memory)
    good = export_user(memory, "ana", tmp_path / "good.zip")
    memory.close()

    def downgrade(members: dict[str, bytes]) -> None:
        manifest = json.loads(members["manifest.json"])
        manifest["version"] = 1
        manifest["counts"].pop("token_vectors")
        members["manifest.json"] = json.dumps(manifest).encode()

    with pytest.raises(MemoryFileError, match="version 2"):
        import_user(
            memory_at(None, FakeEncoder("counting")), rewrite(good, tmp_path / "v1.zip", downgrade)
        )


def test_a_memory_without_late_stage_exports_version_one(tmp_path: Path) -> None:
    memory = HistoryMemory(embedder=HashingEmbedder())
    memory.save([Turn("user", "hello")], Scope("ana"))
    with zipfile.ZipFile(export_user(memory, "ana", tmp_path / "plain.zip")) as archive:
        assert json.loads(archive.read("manifest.json"))["version"] == 1
        assert "token_vectors.jsonl" not in archive.namelist()
    memory.close()


def test_rebuild_after_an_encoder_change_re_encodes_and_drops_old_rows(tmp_path: Path) -> None:
    memory = memory_at(tmp_path, FakeEncoder("old"))
    fill(memory)
    fill(memory, "bo")
    memory.close()
    encoder = FakeEncoder("new")
    changed = memory_at(tmp_path, encoder)
    assert rebuild_token_vectors(changed, progress=False) == 2 * len(TURNS)
    for user in ("ana", "bo"):
        assert {row.encoder for row in stored(changed, user).values()} == {encoder_tag("new")}
    assert rebuild_token_vectors(changed, progress=False) == 0  # resumable: nothing left
    encoder.documents.clear()
    changed.recall("what is the cat called", Scope("ana"), k=3)
    assert encoder.documents == []
    with pytest.raises(InvalidInputError):
        rebuild_token_vectors(HistoryMemory(embedder=HashingEmbedder()), progress=False)
    changed.close()


@pytest.mark.background
def test_in_background_mode_flush_waits_for_the_vectors(tmp_path: Path) -> None:
    memory = memory_at(tmp_path, FakeEncoder("counting"), derive="background")
    for text in TURNS:
        memory.save([Turn("user", text)], Scope("ana"))
    assert memory.flush(timeout=30) == 0
    assert len(stored(memory)) == len(TURNS)
    memory.close()


def test_maxsim_pool_is_maxsim_of_each_stored_record() -> None:
    rng = np.random.default_rng(3)
    query = rng.standard_normal((5, 16)).astype(np.float32)
    pool = [
        quantize(f"r{i}", "0" * 32, "1" * 32, rng.standard_normal((n, 16)))
        for i, n in enumerate([1, 4, 9, 2])
    ]
    batched = maxsim_pool(query, pool)
    single = [maxsim(query, item.floats()) for item in pool]
    assert np.allclose(batched, single, rtol=1e-5, atol=1e-5)
    assert maxsim_pool(query, []).shape == (0,)


def test_maxsim_pool_scores_a_pool_wider_than_a_block(monkeypatch: pytest.MonkeyPatch) -> None:
    from memories_core.retrieval import maxsim as module

    monkeypatch.setattr(module, "BLOCK_COLUMNS", 8)
    rng = np.random.default_rng(5)
    query = rng.standard_normal((3, 4)).astype(np.float32)
    # Blocks of 3+5, 2+4+1, then a record wider than a block alone, then 7.
    pool = [
        quantize(f"r{i}", "0" * 32, "1" * 32, rng.standard_normal((n, 4)))
        for i, n in enumerate([3, 5, 2, 4, 1, 20, 7])
    ]
    single = [maxsim(query, item.floats()) for item in pool]
    assert np.allclose(module.maxsim_pool(query, pool), single, rtol=1e-5, atol=1e-5)


def test_maxsim_keeps_no_buffer_for_an_outsized_record(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from memories_core.retrieval import maxsim as module

    monkeypatch.setattr(module, "_SCRATCH", threading.local())
    monkeypatch.setattr(module, "_KEEP_FLOATS", 64)
    monkeypatch.setattr(module, "BLOCK_COLUMNS", 8)  # blocks: [3], [40] alone, [2]
    rng = np.random.default_rng(9)
    query = rng.standard_normal((2, 4)).astype(np.float32)
    pool = [
        quantize(f"r{i}", "0" * 32, "1" * 32, rng.standard_normal((n, 4)))
        for i, n in enumerate([3, 40, 2])
    ]
    single = [maxsim(query, item.floats()) for item in pool]
    assert np.allclose(module.maxsim_pool(query, pool), single, rtol=1e-5, atol=1e-5)
    assert module._SCRATCH.matrix.size <= 64  # the 40-token record's 160 floats were not kept


def test_maxsim_holds_blas_to_one_thread_and_restores_it(monkeypatch: pytest.MonkeyPatch) -> None:
    threadpoolctl = pytest.importorskip("threadpoolctl")
    from memories_core.retrieval import maxsim as module
    from memories_core.retrieval.maxsim import one_blas_thread

    # The controller knows the BLAS libraries loaded when it was made; an earlier test in
    # this process may have loaded another since (torch's), so this test makes its own.
    monkeypatch.setitem(module._BLAS, "controller", None)

    def blas_threads() -> set[int]:
        info = threadpoolctl.threadpool_info()
        return {lib["num_threads"] for lib in info if lib["user_api"] == "blas"}

    before = blas_threads()
    if not before:
        pytest.skip("numpy's BLAS is not visible to threadpoolctl")
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        inside: list[set[int]] = []
        first, second = one_blas_thread(), one_blas_thread()
        first.__enter__()
        second.__enter__()  # overlapping callers share the limit
        inside.append(blas_threads())
        first.__exit__(None, None, None)
        inside.append(blas_threads())  # still one thread: a caller is inside
        second.__exit__(None, None, None)
        assert inside == [{1}, {1}]
        assert blas_threads() == {2}  # the last one out restored the setting
    assert blas_threads() == before


def test_maxsim_scores_alike_when_threadpoolctl_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    import threadpoolctl

    from memories_core.retrieval import maxsim as module

    class Broken:
        def __init__(self) -> None:
            raise OSError("cannot read the loaded libraries")

    rng = np.random.default_rng(8)
    query = rng.standard_normal((3, 8)).astype(np.float32)
    pool = [quantize(f"r{i}", "0" * 32, "1" * 32, rng.standard_normal((4, 8))) for i in range(5)]
    expected = module.maxsim_pool(query, pool)
    monkeypatch.setattr(threadpoolctl, "ThreadpoolController", Broken)
    monkeypatch.setitem(module._BLAS, "controller", None)  # found again, and failing
    assert np.array_equal(module.maxsim_pool(query, pool), expected)
    assert module._BLAS["controller"] is False and module._BLAS["inside"] == 0


def test_building_the_reranker_prepares_maxsim(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from memories_core.retrieval import maxsim as module

    monkeypatch.setitem(module._BLAS, "controller", None)
    monkeypatch.setitem(module._BLAS, "prepared", False)  # as in a fresh process
    monkeypatch.setattr(module, "_SCRATCH", threading.local())
    LateInteractionReranker(FakeEncoder(), candidates=3, pool=10)
    assert module._BLAS["controller"] is not None  # found (or known missing) before a recall
    # This thread's buffers hold a full block of the bundled encoder's width already.
    from memories_core.retrieval.late_encoder import DEFAULT_LATE_DIM

    assert module._SCRATCH.matrix.size >= module.BLOCK_COLUMNS * DEFAULT_LATE_DIM
    # Once per process: a second reranker scores no synthetic block again.
    monkeypatch.setattr(module, "_SCRATCH", threading.local())
    LateInteractionReranker(FakeEncoder(), candidates=3, pool=10)
    assert not hasattr(module._SCRATCH, "matrix")


def test_stored_rows_are_checked() -> None:
    row = quantize("r", "0" * 32, "1" * 32, np.ones((2, 3)))
    with pytest.raises(InvalidInputError):
        TokenVectors("r", "0" * 32, "1" * 32, row.data.astype(np.int16), 1.0)
    with pytest.raises(InvalidInputError):
        TokenVectors("r", "0" * 32, "1" * 32, row.data, float("nan"))
    with pytest.raises(InvalidInputError):
        TokenVectors.from_bytes("r", "0" * 32, "1" * 32, b"\x00" * 5, tokens=2, dim=3, scale=1)
    with pytest.raises(InvalidInputError):
        quantize("r", "0" * 32, "1" * 32, np.full((2, 2), np.inf))
    store = SQLiteRecordStore(None)
    with pytest.raises(InvalidInputError):
        store.put_token_vectors("ana", [object()])  # type: ignore[list-item]


@pytest.fixture
def pg_memory_factory(
    postgres_dsn: str, pg_schema: str
) -> Iterator[Callable[[Any], HistoryMemory]]:
    from memories_core.backends import PostgresRecordStore

    opened: list[HistoryMemory] = []

    def make(encoder: Any) -> HistoryMemory:
        reranker = LateInteractionReranker(encoder, candidates=3, pool=10, context=True)
        memory = HistoryMemory(
            store=PostgresRecordStore(postgres_dsn, schema=pg_schema),
            index=NumpyIndex(),
            embedder=HashingEmbedder(),
            pipeline=late_interaction_pipeline(reranker=reranker),
        )
        opened.append(memory)
        return memory

    yield make
    for memory in opened:
        memory.engine.store.close()


@pytest.mark.slow
def test_postgres_keeps_vectors_across_reopen_and_erases_them(
    pg_memory_factory: Callable[[Any], HistoryMemory],
) -> None:
    memory = pg_memory_factory(FakeEncoder("counting"))
    records = fill(memory)
    fill(memory, "bo")
    assert set(stored(memory)) == {r.id for r in records}
    ids = [r.id for r in records]  # the text-only read a reranker's pool uses, per user
    assert memory.engine.store.texts(ids, user_id="ana") == {r.id: r.text for r in records}
    assert memory.engine.store.texts(ids, user_id="bo") == {}
    assert memory.engine.store.kinds(ids, user_id="ana") == {r.id: "turn" for r in records}
    assert memory.engine.store.kinds(ids, user_id="bo") == {}
    memory.engine.store.close()
    encoder = FakeEncoder("counting")
    reopened = pg_memory_factory(encoder)
    reopened.recall("what is the cat called", Scope("ana"), k=3)
    assert encoder.documents == []
    assert (
        vector_store(reopened).token_vectors(
            "bo", [r.id for r in records], encoder=encoder_tag("counting")
        )
        == {}
    )
    assert reopened.engine.delete_records("ana", [records[0].id]) == 1
    assert records[0].id not in stored(reopened)
    reopened.delete_user("ana")
    assert stored(reopened) == {} and len(stored(reopened, "bo")) == len(TURNS)


@pytest.mark.slow
@needs_bundled
def test_bundled_model_reopened_memory_has_no_cold_start(tmp_path: Path) -> None:
    def make() -> tuple[HistoryMemory, list[str]]:
        reranker = late_interaction_reranker(candidates=3, pool=10)
        encoded: list[str] = []
        real = reranker.encoder.encode_document

        def counting(text: str) -> npt.NDArray[np.float32]:
            encoded.append(text)
            return real(text)

        object.__setattr__(reranker.encoder, "encode_document", counting)
        pipeline = late_interaction_pipeline(reranker=reranker)
        return HistoryMemory(path=tmp_path, embedder=HashingEmbedder(), pipeline=pipeline), encoded

    memory, encoded = make()
    fill(memory)
    assert len(encoded) == len(TURNS)
    first = memory.recall("What is the name of my cat?", Scope("ana"), k=1).records
    memory.close()
    reopened, encoded = make()
    again = reopened.recall("What is the name of my cat?", Scope("ana"), k=1).records
    assert encoded == [] and again[0].record.id == first[0].record.id
    assert "Pixel" in again[0].record.text
    reopened.close()


def test_the_pool_is_read_as_texts_and_ranks_as_full_records_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = [f"turn {i} about {'cats' if i % 3 else 'tea'} and day {i}" for i in range(80)]
    # a pool deeper than the head that context spreading loads as records (20 + neighbours);
    # the pool's previous turns come with its stored vectors (``pool_rows``), as text too
    reranker = LateInteractionReranker(FakeEncoder("counting"), candidates=3, pool=75, context=True)
    memory = HistoryMemory(
        path=tmp_path,
        embedder=HashingEmbedder(),
        pipeline=late_interaction_pipeline(reranker=reranker),
    )
    fill(memory, turns=turns)
    fill(memory, "bo", BO_TURNS)
    store = memory.engine.store
    asked: dict[str, list[str]] = {"get": [], "texts": []}
    real_get, real_texts = store.get, store.texts

    def get(ids: list[str], *, user_id: str) -> list[MemoryRecord]:
        asked["get"] += list(ids)
        return real_get(ids, user_id=user_id)

    def texts(ids: list[str], *, user_id: str) -> dict[str, str]:
        asked["texts"] += list(ids)
        return real_texts(ids, user_id=user_id)

    monkeypatch.setattr(store, "get", get)
    monkeypatch.setattr(store, "texts", texts)
    with_texts = memory.recall("what about the cats", Scope("ana"), k=3).records
    assert len(set(asked["texts"])) >= 20  # the pool beyond the head, and neighbours, as text
    assert len(set(asked["texts"]) - set(asked["get"])) >= 20  # never built as records
    monkeypatch.setattr(store, "texts", None)  # a store without the text-only read
    records_only = memory.recall("what about the cats", Scope("ana"), k=3).records
    assert [h.record.id for h in with_texts] == [h.record.id for h in records_only]
    assert [h.score for h in with_texts] == pytest.approx([h.score for h in records_only])
    memory.close()


def test_a_stores_text_and_kind_reads_are_one_users_and_kinds_feed_the_index(
    tmp_path: Path,
) -> None:
    memory = memory_at(tmp_path, FakeEncoder("counting"))
    ana = fill(memory)
    bo = fill(memory, "bo", BO_TURNS)
    store = memory.engine.store
    ids = [r.id for r in ana] + [r.id for r in bo] + ["missing"]
    assert store.texts(ids, user_id="ana") == {r.id: r.text for r in ana}
    assert store.texts(ids, user_id="bo") == {r.id: r.text for r in bo}
    assert store.texts([], user_id="ana") == {}
    assert store.kinds(ids, user_id="ana") == {r.id: "turn" for r in ana}
    assert store.kinds(ids, user_id="bo") == {r.id: "turn" for r in bo}
    assert store.kinds([], user_id="ana") == {}
    # The engine's searches hand the index a reader bound to the searching user.
    seen: list[dict[str, str]] = []
    search = memory.engine.index.search

    def spying(*args: Any, **kwargs: Any) -> Any:
        reader = kwargs.get("kinds_of")
        assert reader is not None
        seen.append(dict(reader(ids)))
        return search(*args, **kwargs)

    memory.engine.index.search = spying  # type: ignore[method-assign]
    hits = memory.recall("what is the cat called", Scope("ana"), k=3).records
    assert hits and {h.record.user_id for h in hits} == {"ana"}
    assert seen and all(found == {r.id: "turn" for r in ana} for found in seen)
    memory.close()


def _linked_records() -> list[MemoryRecord]:
    """Two users' records: sessions (two turns at one time, a note between turns) and none."""
    start = datetime(2024, 5, 1, 9, tzinfo=timezone.utc)
    minutes = [0, 1, 1, 2, 3, 0, 10, 300, 301]
    sessions: list[str | None] = ["s1", "s1", "s1", "s1", "s1", None, None, None, None]
    kinds = ["turn", "turn", "turn", "note", "turn", "turn", "turn", "turn", "turn"]
    made = [
        MemoryRecord(
            id=f"ana-{i}",
            user_id="ana",
            kind=kind,
            text=f"ana says {i}",
            created_at=start + timedelta(minutes=m),
            session_id=session,
        )
        for i, (m, session, kind) in enumerate(zip(minutes, sessions, kinds, strict=True))
    ]
    made += [
        MemoryRecord(id=f"bo-{i}", user_id="bo", kind="turn", text=f"bo {i}", created_at=start)
        for i in range(2)
    ]
    return made


def check_pool_rows(store: Any) -> None:
    """``pool_rows`` answers what ``adjacent`` + ``texts`` + ``token_vectors`` answer."""
    records = _linked_records()
    store.add(records)
    tag, other = encoder_tag("enc"), encoder_tag("other")
    rng = np.random.default_rng(3)
    rows = [
        quantize(r.id, tag, text_digest("enc", r.text), rng.normal(size=(3, 8)))
        for r in records
        if r.user_id == "ana" and r.id != "ana-2"
    ]
    assert store.put_token_vectors("ana", rows) == len(rows)
    store.put_token_vectors("ana", [quantize("ana-2", other, "0" * 32, np.ones((2, 8)))])
    ids = [r.id for r in records] + ["missing"]
    for gap in (timedelta(minutes=30), None):
        got = store.pool_rows("ana", ids, encoder=tag, gap=gap)
        texts = store.texts(ids, user_id="ana")
        links = store.adjacent(ids, user_id="ana", gap=gap)
        vectors = store.token_vectors("ana", ids, encoder=tag)
        assert set(got) == set(texts) == {r.id for r in records if r.user_id == "ana"}
        for item, row in got.items():
            before = links.get(item, (None, None))[0]
            assert row.previous == (texts[before] if before else None)
            if item in vectors:
                assert row.vectors is not None and row.vectors.digest == vectors[item].digest
                assert np.array_equal(row.vectors.data, vectors[item].data)
            else:
                assert row.vectors is None  # ana-2 has only another encoder's row
    assert store.pool_rows("bo", ids, encoder=tag, gap=None).keys() == {"bo-0", "bo-1"}
    linked = store.pool_rows("ana", ids, encoder=tag, gap=timedelta(minutes=30))
    assert linked["ana-2"].previous == "ana says 1"  # same time: storage order
    assert linked["ana-4"].previous == "ana says 2"  # the note is another kind
    assert linked["ana-6"].previous == "ana says 5"  # no session: ten minutes apart
    assert linked["ana-7"].previous is None  # no session: five hours apart
    unlinked = store.pool_rows("ana", ids, encoder=tag, gap=None)
    assert all(unlinked[f"ana-{i}"].previous is None for i in (5, 6, 7, 8))
    assert store.pool_rows("ana", [], encoder=tag, gap=None) == {}


def test_a_pool_is_linked_and_read_in_one_query(tmp_path: Path) -> None:
    store = SQLiteRecordStore(tmp_path / "records.sqlite3")
    try:
        check_pool_rows(store)
    finally:
        store.close()


@pytest.mark.slow
def test_postgres_links_and_reads_a_pool_in_one_query(postgres_dsn: str, pg_schema: str) -> None:
    from memories_core.backends import PostgresRecordStore

    store = PostgresRecordStore(postgres_dsn, schema=pg_schema)
    try:
        check_pool_rows(store)
    finally:
        store.close()


def test_a_recall_reading_its_pool_in_one_query_ranks_as_the_separate_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    turns = [f"turn {i} about {'cats' if i % 3 else 'tea'} and day {i}" for i in range(40)]
    encoder = FakeEncoder("counting")
    memory = memory_at(tmp_path, encoder, pool=30)
    fill(memory, turns=turns)
    store = memory.engine.store
    calls = {"pool_rows": 0, "adjacent": 0}
    real_pool, real_adjacent = store.pool_rows, store.adjacent

    def pool_rows(*args: Any, **kwargs: Any) -> Any:
        calls["pool_rows"] += 1
        return real_pool(*args, **kwargs)

    def adjacent(*args: Any, **kwargs: Any) -> Any:
        calls["adjacent"] += 1
        return real_adjacent(*args, **kwargs)

    monkeypatch.setattr(store, "pool_rows", pool_rows)
    monkeypatch.setattr(store, "adjacent", adjacent)
    encoder.documents.clear()
    one_query = memory.recall("what about the cats", Scope("ana"), k=5).records
    assert calls["pool_rows"] == 1 and encoder.documents == []  # every row was stored
    linked_by_context_spreading = calls["adjacent"]

    def failing(*args: Any, **kwargs: Any) -> Any:
        raise BackendError("the pool query failed")

    monkeypatch.setattr(store, "pool_rows", failing)  # read apart, as stores without it do
    apart = memory.recall("what about the cats", Scope("ana"), k=5).records
    assert calls["adjacent"] == 2 * linked_by_context_spreading + 1 and encoder.documents == []
    assert len(late_stages(memory.pipeline)[0].cache) == 0  # a pool reader is never fronted
    assert [h.record.id for h in one_query] == [h.record.id for h in apart]
    assert [h.score for h in one_query] == pytest.approx([h.score for h in apart])

    # A damaged stored row costs the encoding of that record only.
    monkeypatch.setattr(store, "pool_rows", real_pool)
    victim = one_query[0].record.id
    with store._write(["ana"]) as conn:
        conn.execute(
            "UPDATE token_vectors SET data = ? WHERE seq = (SELECT seq FROM records WHERE id = ?)",
            (b"\x01\x02", victim),
        )
    again = memory.recall("what about the cats", Scope("ana"), k=5).records
    assert len(encoder.documents) == 1 and encoder.documents[0].endswith(one_query[0].record.text)
    assert [h.record.id for h in again] == [h.record.id for h in one_query]
    memory.close()


@pytest.mark.parametrize("context", [True, False])
def test_the_cache_fronts_only_a_store_that_reads_vectors_apart(
    tmp_path: Path, context: bool
) -> None:
    memory = memory_at(tmp_path, FakeEncoder("counting"), context=context)
    (reranker,) = late_stages(memory.pipeline)
    records = fill(memory)
    memory.recall("what is the cat called", Scope("ana"), k=3)
    assert set(stored(memory)) == {r.id for r in records}  # the save job stored them all
    # With context, recall reads the pool with its links from the store, so neither the
    # save job nor recall fills the cache; without, the cache fronts the store.
    assert len(reranker.cache) == (0 if context else len(records))
    memory.close()
