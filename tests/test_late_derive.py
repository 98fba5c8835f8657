"""Stored token vectors of the unprojected encoder become the projecting encoder's own.

A store written before the 128-dimension default holds rows of the unprojected encoder.
The projecting encoder derives its rows from them (project, normalise, requantise) instead
of running the model: on recall, for the rows a pool lacks, and in ``rebuild_token_vectors``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.errors import ConfigurationError
from memories_core.retrieval.cross_encoder import pair_text
from memories_core.retrieval.late_encoder import (
    BUNDLED_HIDDEN_DIM,
    DEFAULT_LATE_DIM,
    OnnxLateInteractionEncoder,
    bundled_basis,
)
from memories_core.retrieval.late_interaction import (
    LateInteractionReranker,
    late_interaction_pipeline,
)
from memories_core.retrieval.late_vectors import rebuild_token_vectors
from memories_core.token_vectors import (
    TokenVectors,
    TokenVectorStore,
    encoder_tag,
    quantize,
    text_digest,
)
from reranker_scenarios import DIM, NARROW, PERSONAL_TURNS, FakeEncoder, NarrowingEncoder

TURNS = PERSONAL_TURNS


def _unit(rows: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def memory_at(path: Path, encoder: Any) -> HistoryMemory:
    reranker = LateInteractionReranker(encoder, candidates=3, pool=10, context=True)
    return HistoryMemory(
        path=path,
        embedder=HashingEmbedder(),
        pipeline=late_interaction_pipeline(reranker=reranker),
    )


def rows_of(memory: HistoryMemory, user: str) -> dict[str, TokenVectors]:
    store = memory.engine.store
    assert isinstance(store, TokenVectorStore)
    return {row.record_id: row for row in store.token_vector_rows(user)}


def written_wide(tmp_path: Path) -> None:
    """Two users' turns stored with rows of the "wide" encoder only."""
    wide = memory_at(tmp_path, FakeEncoder("wide"))
    for user in ("ana", "bo"):
        for text in TURNS:
            wide.save([Turn("user", f"{user}: {text}")], Scope(user))
    wide.flush()
    assert {row.dim for row in rows_of(wide, "ana").values()} == {DIM}
    wide.close()


def test_a_projecting_encoder_names_the_vectors_it_derives_from() -> None:
    narrow = OnnxLateInteractionEncoder()
    assert narrow.derives_from == OnnxLateInteractionEncoder(dim=BUNDLED_HIDDEN_DIM).name
    assert OnnxLateInteractionEncoder(dim=BUNDLED_HIDDEN_DIM).derives_from is None
    assert OnnxLateInteractionEncoder(model_dir="/nowhere").derives_from is None
    # Settings that change the vectors change the source too.
    marked = OnnxLateInteractionEncoder(markers=True)
    assert marked.derives_from == OnnxLateInteractionEncoder(dim=384, markers=True).name


def test_derive_projects_unit_rows_without_the_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import memories_core.retrieval.late_encoder as late_encoder

    def no_model() -> Path:
        raise AssertionError("deriving must not need the model")

    monkeypatch.setattr(late_encoder, "bundled_colbert_dir", no_model)
    rng = np.random.default_rng(7)
    hidden = rng.standard_normal((6, BUNDLED_HIDDEN_DIM)).astype(np.float32) * 3.0
    derived = OnnxLateInteractionEncoder().derive(hidden)
    expected = _unit(_unit(hidden) @ bundled_basis()[:, :DEFAULT_LATE_DIM])
    assert derived.shape == (6, DEFAULT_LATE_DIM)
    assert np.allclose(derived, expected, atol=1e-6)
    for bad in (hidden[:, :128], hidden[0]):
        with pytest.raises(ConfigurationError, match="derive"):
            OnnxLateInteractionEncoder().derive(bad)
    with pytest.raises(ConfigurationError, match="derive"):
        OnnxLateInteractionEncoder(dim=BUNDLED_HIDDEN_DIM).derive(hidden)


def test_recall_derives_missing_rows_instead_of_encoding(tmp_path: Path) -> None:
    written_wide(tmp_path)
    encoder = NarrowingEncoder()
    memory = memory_at(tmp_path, encoder)
    hits = memory.recall("what is the cat called", Scope("ana"), k=3).records
    assert any("cat" in hit.record.text for hit in hits)
    assert encoder.documents == []  # every pool row came from the stored wide rows
    rows = rows_of(memory, "ana")
    narrow = [row for row in rows.values() if row.encoder == encoder_tag("narrow")]
    assert narrow and all(row.dim == NARROW for row in narrow)
    # Each derived row is what encoding its text would have stored.
    reference = FakeEncoder("wide")
    texts = {r.id: r.text for r in memory.engine.records("ana")}
    previous = dict(zip(list(texts)[1:], list(texts.values())[:-1], strict=True))
    for row in narrow:
        text = texts[row.record_id]
        pair = pair_text(previous.get(row.record_id), text)
        assert row.digest == text_digest("narrow", pair)
        fresh = encoder.derive(reference.encode_document(pair))
        assert np.allclose(row.floats(), fresh, atol=2 * row.scale)
    # Bo's rows were not touched by Ana's recall.
    assert {row.encoder for row in rows_of(memory, "bo").values()} == {encoder_tag("wide")}
    memory.close()


def test_rebuild_derives_what_matches_and_encodes_the_rest(tmp_path: Path) -> None:
    written_wide(tmp_path)
    memory = memory_at(tmp_path, FakeEncoder("wide"))
    store = memory.engine.store
    assert isinstance(store, TokenVectorStore)
    first = memory.engine.records("ana")[0]
    # A stale wide row (its text changed since): it must not be derived from.
    stale = quantize(first.id, encoder_tag("wide"), "f" * 32, np.ones((2, DIM)))
    store.put_token_vectors("ana", [stale])
    memory.close()
    encoder = NarrowingEncoder()
    memory = memory_at(tmp_path, encoder)
    assert rebuild_token_vectors(memory, progress=False) == 2 * len(TURNS)
    assert encoder.documents == [first.text]  # only the stale one ran through the model
    for user in ("ana", "bo"):
        rows = rows_of(memory, user)
        assert {row.encoder for row in rows.values()} == {encoder_tag("narrow")}
        assert {row.dim for row in rows.values()} == {NARROW}
    assert rebuild_token_vectors(memory, progress=False) == 0
    memory.close()


def test_a_source_row_that_derives_to_garbage_is_encoded(tmp_path: Path) -> None:
    written_wide(tmp_path)

    class Broken(NarrowingEncoder):
        def derive(self, vectors: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
            return np.full((2, NARROW), np.nan, dtype=np.float32)  # a failing projection

    encoder = Broken("narrow")
    memory = memory_at(tmp_path, encoder)
    assert rebuild_token_vectors(memory, users=["ana"], progress=False) == len(TURNS)
    assert len(encoder.documents) == len(TURNS)
    assert all(row.dim == NARROW for row in rows_of(memory, "ana").values())
    memory.close()


@pytest.mark.slow
def test_postgres_rows_are_derived_too(postgres_dsn: str, pg_schema: str) -> None:
    from memories_core.backends import NumpyIndex, PostgresRecordStore

    def opened(encoder: Any) -> HistoryMemory:
        reranker = LateInteractionReranker(encoder, candidates=3, pool=10, context=True)
        return HistoryMemory(
            store=PostgresRecordStore(postgres_dsn, schema=pg_schema),
            index=NumpyIndex(),
            embedder=HashingEmbedder(),
            pipeline=late_interaction_pipeline(reranker=reranker),
        )

    wide = opened(FakeEncoder("wide"))
    for text in TURNS:
        wide.save([Turn("user", text)], Scope("ana"))
    wide.flush()
    wide.engine.store.close()
    encoder = NarrowingEncoder()
    memory = opened(encoder)
    assert rebuild_token_vectors(memory, progress=False) == len(TURNS)
    assert encoder.documents == []
    rows = rows_of(memory, "ana")
    assert {row.encoder for row in rows.values()} == {encoder_tag("narrow")}
    assert {row.dim for row in rows.values()} == {NARROW}
    memory.engine.store.close()


def test_a_save_job_does_not_look_for_rows_to_derive_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memories_core.retrieval import late_interaction

    looked: list[int] = []
    real = late_interaction.derive_stored

    def counting(*args: Any) -> dict[int, TokenVectors]:
        looked.append(len(args[-1]))  # positions it was asked to derive
        return real(*args)

    monkeypatch.setattr(late_interaction, "derive_stored", counting)
    memory = memory_at(tmp_path, NarrowingEncoder())
    for text in TURNS:
        memory.save([Turn("user", text)], Scope("ana"))
    memory.flush()
    assert len(rows_of(memory, "ana")) == len(TURNS)  # the job encoded every turn ...
    assert not any(looked)  # ... without a store query for rows of the source encoder
    memory.close()
