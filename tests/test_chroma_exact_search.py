"""ChromaIndex exact search: as filtering every row first, kept for users written here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memories_core.backends import ChromaIndex

DIM = 16
USER = "u"


def _unit(matrix: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return (matrix / np.linalg.norm(matrix, axis=-1, keepdims=True)).astype(np.float32)


def _reference(
    ids: list[str],
    vectors: npt.NDArray[np.float32],
    kinds: list[str],
    query: npt.NDArray[np.float32],
    k: int,
    kind: str | None,
) -> list[str]:
    """Every matching row scored, sorted by (-cosine, id): what an exact search returns."""
    scores = _unit(vectors) @ _unit(query)
    rows = [row for row in range(len(ids)) if kind is None or kinds[row] == kind]
    rows.sort(key=lambda row: (-float(scores[row]), ids[row]))
    return [ids[row] for row in rows[:k]]


def _graph_index(
    seed: int, n: int, *, note_every: int
) -> tuple[np.random.Generator, list[str], list[str], npt.NDArray[np.float32], ChromaIndex]:
    """An index of ``n`` random vectors searched through the graph; every ``note_every``-th
    is a note, the rest turns (all of role ``user``)."""
    rng = np.random.default_rng(seed)
    ids = [f"r{i}" for i in range(n)]
    kinds = ["note" if i % note_every == 0 else "turn" for i in range(n)]
    vectors = _unit(rng.normal(size=(n, DIM)).astype(np.float32))
    index = ChromaIndex(exact_below=0, open_check=0)  # every search goes through the graph
    index.add(ids, vectors, [{"user_id": USER, "kind": k, "role": "user"} for k in kinds])
    return rng, ids, kinds, vectors, index


def _overfetches(index: ChromaIndex) -> list[dict[str, Any]]:
    """A list that collects the keyword arguments of the index's unfiltered Chroma queries."""
    seen: list[dict[str, Any]] = []
    guard = index._guard

    def watching(call: Any, *args: Any, **kwargs: Any) -> Any:
        if "n_results" in kwargs and "where" not in kwargs:
            seen.append(dict(kwargs))
        return guard(call, *args, **kwargs)

    index._guard = watching  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("seed", [0, 1])
def test_exact_search_equals_filtering_every_row_first(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 400
    vectors = rng.standard_normal((n, DIM)).astype(np.float32)
    vectors[100:130] = vectors[99]  # exact duplicates: ties broken by id
    kinds = ["note" if i % 37 == 0 else "turn" for i in range(n)]  # notes are rare
    ids = [f"r{(i * 7919) % n:04d}" for i in range(n)]  # id order unlike row order
    index = ChromaIndex()
    try:
        for start in range(0, n, 150):
            rows = slice(start, start + 150)
            metas: list[dict[str, Any]] = [{"user_id": USER, "kind": kind} for kind in kinds[rows]]
            index.add(ids[rows], vectors[rows], metas)
        queries = [rng.standard_normal(DIM).astype(np.float32), vectors[99]]
        for query in queries:
            for kind in (None, "turn", "note", "missing"):
                for k in (1, 10, 40, 500):
                    where = None if kind is None else {"kind": kind}
                    got = index.search(query, user_id=USER, k=k, where=where)
                    assert [vid for vid, _ in got] == _reference(
                        ids, vectors, kinds, query, k, kind
                    )
                    scores = [score for _, score in got]
                    assert scores == sorted(scores, reverse=True)
    finally:
        index.close()


def test_a_user_written_in_this_process_stays_exact_past_exact_below(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    base = rng.standard_normal(DIM).astype(np.float32)
    # Near-duplicates: the vectors an HNSW graph is known to lose.
    vectors = _unit(base + 0.02 * rng.standard_normal((300, DIM)).astype(np.float32))
    ids = [f"r{i}" for i in range(300)]
    index = ChromaIndex(path=tmp_path / "chroma", exact_below=20, open_check=0)
    try:
        for start in range(0, 300, 60):
            rows = slice(start, start + 60)
            index.add(ids[rows], vectors[rows], [{"user_id": USER, "kind": "turn"}] * 60)
        collection = index._collections[USER]
        queried: list[dict[str, Any]] = []
        original = collection.query

        def spy(**kwargs: Any) -> Any:
            queried.append(kwargs)
            return original(**kwargs)

        collection.query = spy
        for vid, vector in zip(ids, vectors, strict=True):
            top = index.search(vector, user_id=USER, k=1)
            assert top[0][0] == vid and top[0][1] == pytest.approx(1.0, abs=1e-5)
        assert queried == []  # searched exactly in process memory, never through the graph
        assert index.probe(ids, user_id=USER) == set()
    finally:
        index.close()


def test_a_graph_search_fetches_as_deep_as_its_filter_needs() -> None:
    """The over-fetch follows the share of hits that passed the filter before; results hold."""
    rng, ids, kinds, vectors, index = _graph_index(7, 400, note_every=10)
    try:
        fetches = _overfetches(index)
        queries = _unit(rng.normal(size=(6, DIM)).astype(np.float32))
        for query in queries:
            for kind in ("turn", "note"):
                hits = index.search(query, user_id=USER, k=10, where={"kind": kind})
                found = [h for h, _ in hits]
                assert found == _reference(ids, vectors, kinds, query, 10, kind)
        asked = [int(kw["n_results"]) for kw in fetches]
        turn_fetches, note_fetches = asked[0::2], asked[1::2]
        assert turn_fetches[0] == note_fetches[0] == 4 * 10 + 20  # nothing known yet
        assert all(fetch < 40 for fetch in turn_fetches[1:])  # 90 % pass: about k / 0.72 + 20
        assert all(fetch == 60 for fetch in note_fetches[1:])  # 10 % pass: capped at 4k + 20
    finally:
        index.close()


def test_a_kind_filter_reads_its_kinds_from_the_given_reader() -> None:
    """With ``kinds_of`` a kind filter asks Chroma for distances only and trusts the reader."""
    rng, ids, kinds, vectors, index = _graph_index(11, 300, note_every=4)
    try:
        fetches = _overfetches(index)
        truth = dict(zip(ids, kinds, strict=True))
        asked: list[list[str]] = []

        def reader(wanted: Any) -> dict[str, str]:
            asked.append(list(wanted))
            return {item: truth[item] for item in wanted}

        for query in _unit(rng.normal(size=(4, DIM)).astype(np.float32)):
            for kind in ("turn", "note"):
                plain = index.search(query, user_id=USER, k=10, where={"kind": kind})
                read = index.search(
                    query, user_id=USER, k=10, where={"kind": kind}, kinds_of=reader
                )
                assert read == plain
                assert [h for h, _ in read] == _reference(ids, vectors, kinds, query, 10, kind)
        assert asked and all(len(part) > 10 for part in asked)  # the over-fetched hits
        # Chroma's metadata is read only by the searches without a reader.
        included = [list(kw["include"]) for kw in fetches]
        assert included.count(["distances"]) == len(asked)
        assert included.count(["distances", "metadatas"]) == len(asked)

        # The reader is the authority: a hit it calls another kind, or does not know, is
        # left out even though Chroma's metadata says it passes.
        query = vectors[1]
        assert index.search(query, user_id=USER, k=1, where={"kind": "turn"})[0][0] == "r1"
        relabelled = {**truth, "r1": "note"}
        hits = index.search(
            query,
            user_id=USER,
            k=5,
            where={"kind": "turn"},
            kinds_of=lambda wanted: {i: relabelled[i] for i in wanted if i != "r2"},
        )
        assert "r1" not in dict(hits) and "r2" not in dict(hits) and len(hits) == 5
        # Filters on other fields keep reading Chroma's metadata.
        session = index.search(
            query, user_id=USER, k=3, where={"kind": "turn", "role": "user"}, kinds_of=reader
        )
        assert session[0][0] == "r1"
    finally:
        index.close()
