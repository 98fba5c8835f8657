"""VectorIndex backends: the same contract tests over NumpyIndex and ChromaIndex."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memories_core import testing
from memories_core.backends import ChromaIndex, NumpyIndex
from memories_core.errors import (
    ConfigurationError,
    EmbedderMismatchError,
    InvalidInputError,
    MissingUserError,
)
from memories_core.interfaces import VectorIndex

DIM = 16


def unit(seed: int, dim: int = DIM) -> npt.NDArray[np.float32]:
    v = np.random.default_rng(seed).normal(size=dim).astype(np.float32)
    return v / np.linalg.norm(v)


def near(base: npt.NDArray[np.float32], noise: float, seed: int) -> npt.NDArray[np.float32]:
    v = base + noise * np.random.default_rng(seed).normal(size=base.shape).astype(np.float32)
    return (v / np.linalg.norm(v)).astype(np.float32)


def meta(user: str, kind: str = "turn", **extra: Any) -> dict[str, Any]:
    return {"user_id": user, "kind": kind, **extra}


@pytest.fixture(params=["numpy", "chroma"])
def index(request: pytest.FixtureRequest) -> Iterator[VectorIndex]:
    built: Any = NumpyIndex() if request.param == "numpy" else ChromaIndex()
    yield built
    if hasattr(built, "close"):
        built.close()


def test_implements_protocol(index: VectorIndex) -> None:
    assert isinstance(index, VectorIndex)


def test_search_returns_cosine_best_first(index: VectorIndex) -> None:
    q = unit(0)
    vectors = np.stack([near(q, 0.05, 1), near(q, 0.5, 2), unit(3), -q])
    index.add(["close", "mid", "far", "opposite"], vectors, [meta("alice")] * 4)
    hits = index.search(q, user_id="alice", k=3)
    assert [h[0] for h in hits] == ["close", "mid", "far"]
    expected = vectors[:3] @ q
    assert np.allclose([h[1] for h in hits], expected, atol=1e-4)
    assert [h[0] for h in index.search(q, user_id="alice", k=10)][-1] == "opposite"


def test_users_never_see_each_other(index: VectorIndex) -> None:
    q = unit(0)
    index.add(["a1", "b1"], np.stack([near(q, 0.3, 1), q]), [meta("alice"), meta("bob")])
    assert [h[0] for h in index.search(q, user_id="alice", k=5)] == ["a1"]
    assert [h[0] for h in index.search(q, user_id="bob", k=5)] == ["b1"]
    assert index.search(q, user_id="carol", k=5) == []


def test_where_filters(index: VectorIndex) -> None:
    q = unit(0)
    ids = ["t1", "t2", "n1", "n2"]
    metas = [
        meta("alice", "turn", topic="food", n=1, flag=True),
        meta("alice", "turn", topic="cars", n=2, flag=False),
        meta("alice", "note", topic="food", n=1, flag=False, session_id="s1"),
        meta("bob", "note", topic="food", n=1, flag=True),
    ]
    index.add(ids, np.stack([near(q, 0.1 * (i + 1), i) for i in range(4)]), metas)

    def found(where: dict[str, Any]) -> set[str]:
        return {h[0] for h in index.search(q, user_id="alice", k=10, where=where)}

    assert found({"kind": "note"}) == {"n1"}
    assert found({"topic": "food"}) == {"t1", "n1"}
    assert found({"topic": "food", "kind": "turn"}) == {"t1"}
    assert found({"n": 1}) == {"t1", "n1"}
    assert found({"flag": True}) == {"t1"}
    assert found({"session_id": "s1"}) == {"n1"}
    assert found({"topic": "none"}) == set()
    with pytest.raises(InvalidInputError):
        index.search(q, user_id="alice", k=1, where={"user_id": "bob"})


def test_filtered_search_finds_rare_matches_among_many(index: VectorIndex) -> None:
    q = unit(0)
    n = 300
    vectors = np.stack([near(q, 0.2, i) for i in range(n)])
    metas = [meta("alice", "note" if i == n - 1 else "turn") for i in range(n)]
    index.add([f"r{i}" for i in range(n)], vectors, metas)
    assert [h[0] for h in index.search(-q, user_id="alice", k=1, where={"kind": "note"})] == [
        f"r{n - 1}"
    ]


def test_add_replaces_vector_and_metadata(index: VectorIndex) -> None:
    q = unit(0)
    index.add(["r"], np.stack([-q]), [meta("alice", topic="old")])
    index.add(["r"], np.stack([q]), [meta("alice", topic="new")])
    assert index.count("alice") == 1
    [(rid, score)] = index.search(q, user_id="alice", k=5, where={"topic": "new"})
    assert rid == "r" and score == pytest.approx(1.0, abs=1e-4)


def test_delete_is_scoped_and_count_and_reset(index: VectorIndex) -> None:
    vectors = np.stack([unit(i) for i in range(5)])
    metas = [meta("alice")] * 3 + [meta("bob")] * 2
    index.add(["a1", "a2", "a3", "b1", "b2"], vectors, metas)
    assert (index.count(), index.count("alice"), index.count("bob")) == (5, 3, 2)
    index.delete(["a1", "b1", "missing"], user_id="alice")  # b1 is bob's
    assert (index.count("alice"), index.count("bob")) == (2, 2)
    index.delete_user("bob")
    assert index.count("bob") == 0 and index.search(unit(3), user_id="bob", k=5) == []
    assert {h[0] for h in index.search(unit(1), user_id="alice", k=5)} == {"a2", "a3"}
    index.reset()
    assert index.count() == 0
    # After reset another embedder (dimension) may be used.
    index.add(["x"], np.stack([unit(1, dim=8)]), [meta("alice")])
    assert index.search(unit(1, dim=8), user_id="alice", k=1)[0][0] == "x"


def test_dimension_mismatch_raises(index: VectorIndex) -> None:
    index.add(["a"], np.stack([unit(0)]), [meta("alice")])
    with pytest.raises(EmbedderMismatchError):
        index.add(["b"], np.stack([unit(0, dim=DIM * 2)]), [meta("alice")])
    with pytest.raises(EmbedderMismatchError):
        index.search(unit(0, dim=DIM * 2), user_id="alice", k=1)


def test_invalid_input(index: VectorIndex) -> None:
    v = np.stack([unit(0)])
    with pytest.raises(InvalidInputError):
        index.add(["a", "b"], v, [meta("alice")])
    with pytest.raises(InvalidInputError):
        index.add(["a"], v, [meta("alice"), meta("alice")])
    with pytest.raises(MissingUserError):
        index.add(["a"], v, [{"kind": "turn"}])
    with pytest.raises(InvalidInputError):
        index.add(["a"], v, [meta("alice", tags=["a", "b"])])
    with pytest.raises(InvalidInputError):
        index.add(["a"], np.full((1, DIM), np.nan, np.float32), [meta("alice")])
    index.add(["a"], v, [meta("alice")])
    with pytest.raises(InvalidInputError):
        index.search(unit(0), user_id="alice", k=0)
    with pytest.raises(MissingUserError):
        index.search(unit(0), user_id="", k=1)
    index.add([], np.zeros((0, DIM), np.float32), [])  # no-op
    assert index.count() == 1


def test_batches_larger_than_chroma_limit() -> None:
    index = ChromaIndex()
    index._batch = 7  # force chunking
    n = 30
    index.add([f"r{i}" for i in range(n)], np.stack([unit(i) for i in range(n)]), [meta("u")] * n)
    assert index.count("u") == n
    index.delete([f"r{i}" for i in range(n - 1)], user_id="u")
    assert index.count("u") == 1
    index.close()


def test_numpy_grows_and_swaps_rows_correctly() -> None:
    index = NumpyIndex()
    n = 200  # several capacity doublings
    vectors = np.stack([unit(i) for i in range(n)])
    index.add([f"r{i}" for i in range(n)], vectors, [meta("u")] * n)
    index.delete([f"r{i}" for i in range(0, n, 3)], user_id="u")
    alive = [i for i in range(n) if i % 3]
    for i in alive[::17]:
        assert index.search(vectors[i], user_id="u", k=1)[0][0] == f"r{i}"
    assert index.count("u") == len(alive)


@settings(max_examples=40, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["add", "delete"]),
            st.sampled_from(["u1", "u2"]),
            st.integers(0, 12),
        ),
        max_size=40,
    )
)
def test_numpy_index_matches_brute_force(ops: list[tuple[str, str, int]]) -> None:
    index = NumpyIndex()
    truth: dict[str, tuple[str, npt.NDArray[np.float32]]] = {}
    for op, user, n in ops:
        rid = f"r{n}"
        if op == "add":
            vector = unit(n + 100 * len(truth))
            index.add([rid], vector[None, :], [meta(user)])
            truth[rid] = (user, vector)
        else:
            index.delete([rid], user_id=user)
            if rid in truth and truth[rid][0] == user:
                del truth[rid]
    q = unit(999)
    for user in ("u1", "u2"):
        expected = sorted(
            ((rid, float(v @ q)) for rid, (u, v) in truth.items() if u == user),
            key=lambda p: -p[1],
        )
        got = index.search(q, user_id=user, k=50)
        assert [g[0] for g in got] == [e[0] for e in expected]
        assert index.count(user) == len(expected)


def test_chroma_rejects_contradictory_arguments(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        ChromaIndex(path=tmp_path, host="127.0.0.1")
    with pytest.raises(ConfigurationError):
        ChromaIndex(path=tmp_path, client=object())
    with pytest.raises(ConfigurationError):
        ChromaIndex(port=9000)  # a port without a host


def test_chroma_accepts_an_injected_client() -> None:
    import chromadb
    from chromadb.config import Settings

    client = chromadb.EphemeralClient(settings=Settings(anonymized_telemetry=False))
    index = ChromaIndex(client=client, collection="injected-test")
    index.add(["a"], np.stack([unit(0)]), [meta("u")])
    assert index.search(unit(0), user_id="u", k=1)[0][0] == "a"
    # One collection per user, named from the base name and a hash of the user id.
    names = [c.name for c in client.list_collections()]
    assert index.user_collection_name("u") in names
    assert index.user_collection_name("u").startswith("injected-test-")
    index.reset()
    assert index.count() == 0
    # reset drops the per-user collections; nothing of this index is left in the client.
    assert not [c.name for c in client.list_collections() if c.name.startswith("injected-test")]


def test_two_ephemeral_chroma_indexes_are_separate() -> None:
    first, second = ChromaIndex(), ChromaIndex()
    first.add(["a"], np.stack([unit(0)]), [meta("u")])
    assert second.count() == 0
    first.close()
    second.close()


def test_chroma_persistent_path_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "chroma"
    first = ChromaIndex(path=path)
    first.add(["a", "b"], np.stack([unit(0), unit(1)]), [meta("u"), meta("v")])
    first.close()
    del first
    second = ChromaIndex(path=path)
    assert second.count() == 2 and second.count("u") == 1
    assert second.search(unit(0), user_id="u", k=5)[0][0] == "a"
    # The stored data fixes the dimension even in a fresh process object.
    with pytest.raises(EmbedderMismatchError, match="dimension"):
        second.add(["c"], np.stack([unit(0, dim=DIM + 1)]), [meta("u")])
    second.close()


@pytest.fixture
def chroma_server(tmp_path: Path) -> Iterator[int]:
    with testing.chroma_server(tmp_path) as port:
        yield port


@pytest.mark.server
def test_chroma_server_add_search_and_isolation(chroma_server: int) -> None:
    index = ChromaIndex(host="127.0.0.1", port=chroma_server, collection="server-test")
    q = unit(0)
    index.add(
        ["a1", "a2", "b1"],
        np.stack([near(q, 0.05, 1), near(q, 0.6, 2), q]),
        [meta("alice"), meta("alice", "note"), meta("bob")],
    )
    assert [h[0] for h in index.search(q, user_id="alice", k=5)] == ["a1", "a2"]
    assert [h[0] for h in index.search(q, user_id="alice", k=5, where={"kind": "note"})] == ["a2"]
    assert [h[0] for h in index.search(q, user_id="bob", k=5)] == ["b1"]
    index.delete_user("alice")
    assert index.count("alice") == 0 and index.count("bob") == 1


def test_chroma_keeps_one_collection_per_user() -> None:
    import hashlib

    import chromadb

    client = chromadb.EphemeralClient()
    index = ChromaIndex(client=client, collection="percoll")
    index.add(
        ["a", "b", "c"], np.stack([unit(0), unit(1), unit(2)]), [meta("u"), meta("v"), meta("u")]
    )
    expected = f"{index.collection_name}-{hashlib.sha1(b'u').hexdigest()[:16]}"
    assert index.user_collection_name("u") == expected
    names = {c.name for c in client.list_collections()}
    assert {index.user_collection_name("u"), index.user_collection_name("v")} <= names
    assert (index.count(), index.count("u"), index.count("v"), index.count("w")) == (3, 2, 1, 0)
    index.delete_user("v")
    index.delete_user("never-seen")  # absent collection is fine
    assert index.user_collection_name("v") not in {c.name for c in client.list_collections()}
    assert index.count() == 2
    # A user's collection is created again on their next add.
    index.add(["d"], np.stack([unit(3)]), [meta("v")])
    assert index.search(unit(3), user_id="v", k=5) == [("d", pytest.approx(1.0, abs=1e-4))]
    index.close()
    # The client was the caller's: closing the index leaves the caller's collections alone.
    assert {index.user_collection_name("u"), index.user_collection_name("v")} <= {
        c.name for c in client.list_collections()
    }


def test_chroma_dimension_is_checked_across_users() -> None:
    index = ChromaIndex()
    index.add(["a"], np.stack([unit(0)]), [meta("u")])
    with pytest.raises(EmbedderMismatchError):
        index.add(["b"], np.stack([unit(0, dim=DIM + 1)]), [meta("other")])
    assert index.count("other") == 0
    index.close()


def test_chroma_filter_falls_back_when_over_fetch_is_not_enough() -> None:
    index = ChromaIndex(exact_below=0, open_check=0)  # the graph search path, unchecked
    q = unit(0)
    n = 200
    # The notes are the farthest rows, beyond the over-fetch of 4 * k + 20 neighbours.
    vectors = np.stack([near(q, 0.1, i) for i in range(n - 3)] + [-q, -q, -q])
    metas = [meta("u", "turn")] * (n - 3) + [meta("u", "note", i=i) for i in range(3)]
    index.add([f"r{i}" for i in range(n)], vectors, metas)
    calls: list[dict[str, Any]] = []
    collection = index._collections["u"]
    original = collection.query

    def spy(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return original(**kwargs)

    collection.query = spy
    got = index.search(q, user_id="u", k=2, where={"kind": "note"})
    assert len(got) == 2 and {rid for rid, _ in got} <= {f"r{n - 3}", f"r{n - 2}", f"r{n - 1}"}
    assert [("where" in c) for c in calls] == [False, True]
    calls.clear()
    # Enough matches among the over-fetched rows: one query, no Chroma where.
    assert len(index.search(q, user_id="u", k=5, where={"kind": "turn"})) == 5
    assert [("where" in c) for c in calls] == [False]
    calls.clear()
    # Fewer rows than the over-fetch: the first query saw them all, no fallback.
    assert index.search(q, user_id="u", k=60, where={"kind": "missing"}) == []
    assert len(calls) == 1  # 4 * 60 + 20 > 200 rows: the first query saw every row
    index.close()


@pytest.mark.parametrize(
    "extra",
    [
        {"": 1},
        {"$and": 1},
        {"$or": "x"},
        {"chroma:document": "x"},
        {"chroma:x": 1},
        {"#document": "x"},
        {"#embedding": "x"},
        {"a\x00b": 1},
        {"x": float("nan")},
        {"x": float("inf")},
        {"x": 2**63},
        {"x": None},
    ],
)
def test_rejected_metadata_writes_nothing(index: VectorIndex, extra: dict[str, Any]) -> None:
    v = np.stack([unit(0), unit(1)])
    with pytest.raises(InvalidInputError):
        index.add(["ok", "bad"], v, [meta("alice"), {**meta("alice"), **extra}])
    assert index.count() == 0
    assert index.search(unit(0), user_id="alice", k=5) == []
    # The index stays usable for everyone.
    index.add(["a"], v[:1], [meta("alice", n=-(2**63), f=1.5, s="a\x00b")])
    assert index.search(unit(0), user_id="alice", k=1)[0][0] == "a"


def test_ids_users_and_probe(index: Any) -> None:
    q = unit(0)
    index.add(
        ["a1", "a2", "b1"],
        np.stack([q, near(q, 0.5, 1), unit(2)]),
        [meta("alice"), meta("alice"), meta("bob")],
    )
    assert index.ids("alice") == {"a1", "a2"} and index.ids("bob") == {"b1"}
    assert index.ids("carol") == set()
    assert index.users() == {"alice", "bob"}
    assert index.probe(["a1", "a2", "b1", "missing"], user_id="alice") == set()
    assert index.probe([], user_id="alice") == set()
    assert index.probe(["a1"], user_id="carol") == set()
    index.delete(["b1"], user_id="bob")
    assert index.users() == {"alice"} and index.ids("bob") == set()
    index.delete_user("alice")
    assert index.users() == set() and index.ids("alice") == set()
    with pytest.raises(InvalidInputError):
        index.probe(["a1"], user_id="alice", k=0)


def test_probe_counts_exact_duplicates_as_reachable(index: Any) -> None:
    n = 25  # more copies than the probe depth: they tie and may crowd each other out
    q = unit(0)
    index.add([f"d{i}" for i in range(n)], np.stack([q] * n), [meta("u")] * n)
    index.add(["other"], np.stack([unit(1)]), [meta("u")])
    assert index.probe([f"d{i}" for i in range(n)] + ["other"], user_id="u", k=3) == set()
    assert len(index.ids("u")) == n + 1


def test_numpy_probe_reports_a_row_its_search_cannot_return() -> None:
    index = NumpyIndex()
    index.add(["a", "b"], np.stack([unit(0), unit(1)]), [meta("u"), meta("u")])
    # Corrupt the stored row of "a" (as if its vector were lost): its own vector is now
    # beaten by "b" and a 1-neighbour search no longer returns it.
    part = index._parts["u"]
    part.matrix[part.rows["a"]] = 0.1 * unit(1)
    assert index.probe(["a", "b"], user_id="u", k=1) == {"a"}
