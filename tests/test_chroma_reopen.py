"""Embedded Chroma keeps every record reachable across close and reopen.

chromadb 1.5.9's HNSW graph leaves some near-duplicate vectors unreachable by their own
vector (more after deletes and re-adds following a reopen). ``ChromaIndex`` searches small
users exactly and pins the records a reachability check finds lost for larger ones; these
tests fill stores with near-duplicates and count records a search cannot return.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memories_core.backends import ChromaIndex, SQLiteRecordStore
from memories_core.embedders.hashing import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.errors import ConfigurationError
from memories_core.types import Scope, Turn

N = 200
USER = "u"


def _unique_words(n: int, seed: int = 1) -> list[str]:
    rnd = random.Random(seed)
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rnd.choice("bcdfghjklmnprstvz") + rnd.choice("aeiou") for _ in range(4)))
    return sorted(words)


def _texts(n: int) -> list[str]:
    return [
        f"Today I had lunch at the small cafe near the office and the soup was fine {word}"
        for word in _unique_words(n)
    ]


def _near_duplicates(n: int, noise: float, seed: int = 0) -> npt.NDArray[np.float32]:
    rng = np.random.default_rng(seed)
    base = rng.normal(size=64).astype(np.float32)
    vectors = base + noise * rng.normal(size=(n, 64)).astype(np.float32)
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def _meta(n: int) -> list[dict[str, str | int | float | bool]]:
    return [{"user_id": USER, "kind": "turn"} for _ in range(n)]


def _unreachable(index: ChromaIndex, ids: list[str], vectors: npt.NDArray[np.float32]) -> int:
    """Records that a search with their own vector (10 neighbours) does not return."""
    return sum(
        vid not in {hit for hit, _ in index.search(vector, user_id=USER, k=10)}
        for vid, vector in zip(ids, vectors, strict=True)
    )


def _cycle_writes(
    index: ChromaIndex, cycle: int, ids: list[str], vectors: npt.NDArray[np.float32]
) -> None:
    """What breaks the graph on reopen: re-upserts, then deletes and re-adds."""
    part = slice(cycle * 20 % N, cycle * 20 % N + 20)
    index.add(ids[part], vectors[part], _meta(20))
    index.delete(ids[part][:5], user_id=USER)
    index.add(ids[part][:5], vectors[part][:5], _meta(5))


@pytest.fixture
def near_duplicates() -> tuple[list[str], npt.NDArray[np.float32]]:
    embedder = HashingEmbedder()
    vectors = np.asarray(embedder.embed_documents(_texts(N)), dtype=np.float32)
    return [f"r{i}" for i in range(N)], vectors


@pytest.mark.slow
def test_ten_reopen_cycles_leave_no_record_unreachable_by_its_own_vector(
    tmp_path: Path, near_duplicates: tuple[list[str], npt.NDArray[np.float32]]
) -> None:
    ids, vectors = near_duplicates
    index = ChromaIndex(path=tmp_path / "chroma")
    for start in range(0, N, 7):  # many small writes, as a chat fills a store
        index.add(
            ids[start : start + 7], vectors[start : start + 7], _meta(len(ids[start : start + 7]))
        )
    index.close()
    for cycle in range(10):
        index = ChromaIndex(path=tmp_path / "chroma")
        assert index.count(USER) == N
        assert _unreachable(index, ids, vectors) == 0, f"cycle {cycle}, on open"
        _cycle_writes(index, cycle, ids, vectors)
        assert _unreachable(index, ids, vectors) == 0, f"cycle {cycle}, after writes"
        assert index.probe(ids, user_id=USER) == set()
        index.close()


@pytest.mark.slow
@pytest.mark.parametrize("background", [False, True])
def test_large_users_pin_what_the_graph_loses(tmp_path: Path, background: bool) -> None:
    # exact_below=0 sends every search through the graph; the open check samples them all.
    ids = [f"r{i}" for i in range(N)]
    vectors = _near_duplicates(N, 0.001)

    def opened() -> ChromaIndex:
        return ChromaIndex(
            path=tmp_path / "chroma", exact_below=0, open_check=N, open_check_background=background
        )

    index = opened()
    for start in range(0, N):  # one at a time: the graph loses some of these
        index.add(ids[start : start + 1], vectors[start : start + 1], _meta(1))
    assert _unreachable(index, ids, vectors) == 0
    index.close()
    for cycle in range(3):
        index = opened()
        if background:  # the first search starts the check; it pins once it is done
            index.search(vectors[0], user_id=USER, k=1)
            assert index.wait_checks(timeout=120)
        assert _unreachable(index, ids, vectors) == 0, f"cycle {cycle}"
        _cycle_writes(index, cycle, ids, vectors)
        # A probe pins what the graph misses; a second probe has nothing new to report.
        index.probe(ids, user_id=USER)
        assert index.probe(ids, user_id=USER) == set()
        assert _unreachable(index, ids, vectors) == 0, f"cycle {cycle}, after writes"
        index.close()


@pytest.fixture
def engine_path(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def _engine(path: Path) -> MemoryEngine:
    return MemoryEngine(
        store=SQLiteRecordStore(path / "records.sqlite3"),
        index=ChromaIndex(path=path / "chroma"),
        embedder=HashingEmbedder(),
    )


@pytest.mark.slow
def test_every_saved_turn_is_found_by_its_unique_word_after_reopening(engine_path: Path) -> None:
    texts = _texts(N)
    words = _unique_words(N)
    engine = _engine(engine_path)
    scope = Scope(USER)
    for start in range(0, N, 10):
        engine.save([Turn("user", text) for text in texts[start : start + 10]], scope)
    engine.close()
    for _ in range(3):
        engine = _engine(engine_path)
        missed = [
            word
            for word, text in zip(words, texts, strict=True)
            if not any(hit.record.text.endswith(text) for hit in engine.search(word, USER, k=3))
        ]
        assert missed == []
        assert engine.verify().ok
        engine.close()


def test_user_collections_within_the_limit_are_searched_exactly(tmp_path: Path) -> None:
    vectors = _near_duplicates(50, 0.001)
    ids = [f"r{i}" for i in range(50)]
    index = ChromaIndex(path=tmp_path / "chroma")
    index.add(ids, vectors, _meta(50))
    for vid, vector in zip(ids, vectors, strict=True):
        top = index.search(vector, user_id=USER, k=1)
        assert top[0][0] == vid and top[0][1] == pytest.approx(1.0, abs=1e-5)
    # Writes through the index keep the exact search current.
    index.delete(ids[:10], user_id=USER)
    assert not {vid for vid, _ in index.search(vectors[0], user_id=USER, k=50)} & set(ids[:10])
    moved = -vectors[20]
    index.add([ids[20]], moved[None, :], _meta(1))
    assert index.search(moved, user_id=USER, k=1)[0][0] == ids[20]
    # Filters apply to the exact search as to the graph's.
    index.add(["other"], vectors[30][None, :], [{"user_id": USER, "kind": "memo"}])
    hits = index.search(vectors[30], user_id=USER, k=5, where={"kind": "memo"})
    assert [vid for vid, _ in hits] == ["other"]
    # Another user's vectors are never in the answer.
    index.add(["theirs"], vectors[30][None, :], [{"user_id": "v", "kind": "turn"}])
    assert "theirs" not in {vid for vid, _ in index.search(vectors[30], user_id=USER, k=60)}
    index.delete_user(USER)
    assert index.search(vectors[30], user_id=USER, k=5) == []
    index.close()


def test_a_second_instance_in_the_process_sees_the_first_ones_writes(tmp_path: Path) -> None:
    vectors = _near_duplicates(20, 0.01)
    ids = [f"r{i}" for i in range(20)]
    client_path = tmp_path / "chroma"
    first = ChromaIndex(path=client_path)
    first.add(ids[:10], vectors[:10], _meta(10))
    second = ChromaIndex(path=client_path)
    assert second.search(vectors[3], user_id=USER, k=1)[0][0] == "r3"  # mirror loaded
    first.add(ids[10:], vectors[10:], _meta(10))
    first.delete(["r3"], user_id=USER)
    assert second.search(vectors[15], user_id=USER, k=1)[0][0] == "r15"
    assert "r3" not in {vid for vid, _ in second.search(vectors[3], user_id=USER, k=20)}
    first.close()
    assert second.search(vectors[15], user_id=USER, k=1)[0][0] == "r15"  # still open
    second.close()


def test_a_memory_made_where_a_deleted_one_was_works_in_the_same_process(tmp_path: Path) -> None:
    """Closing releases Chroma's per-folder system, so a new folder at the path is fresh."""
    from memories_core import HistoryMemory

    folder = tmp_path / "memory"
    closed = []  # still referenced (as a caller may keep them): nothing is garbage collected
    for round_ in range(3):
        memory = HistoryMemory(path=folder, embedder=HashingEmbedder(dimension=64))
        closed.append(memory)
        memory.save([Turn("user", f"my parrot is called Kiwi{round_}")], Scope(USER))
        memory.flush()
        found = memory.recall("parrot name", Scope(USER), k=5)
        assert [r.record.text for r in found.records] == [f"user: my parrot is called Kiwi{round_}"]
        memory.close()
        shutil.rmtree(folder)


@pytest.mark.parametrize("arg", ["exact_below", "open_check"])
@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_bad_reachability_settings_are_refused(arg: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=arg):
        ChromaIndex(**{arg: value})  # type: ignore[arg-type]


def _collection_key(index: ChromaIndex) -> str:
    from memories_core.backends.chroma_exact import _key_of

    return index._on_collection(USER, False, _key_of, "")


def test_pinned_ids_are_kept_on_disk_restored_after_a_restart_and_erased_with_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import json

    from memories_core.backends.chroma_exact import _MIRRORS
    from memories_core.backends.chroma_reach import PINS_FILE

    folder = tmp_path / "chroma"
    ids = [f"r{i}" for i in range(20)]
    vectors = _near_duplicates(20, 0.01)
    index = ChromaIndex(path=folder, exact_below=0, open_check=0)
    index.add(ids, vectors, _meta(20))
    # The graph "loses" r3 (forced): a probe pins it and writes it down.
    monkeypatch.setattr(ChromaIndex, "_probe_in", lambda self, c, wanted, k: {"r3"} & set(wanted))
    assert index.probe(ids, user_id=USER) == {"r3"}
    key = _collection_key(index)
    assert json.loads((folder / PINS_FILE).read_text()) == {key: ["r3"]}
    index.close()

    _MIRRORS.forget(key)  # a new process: nothing pinned in memory
    monkeypatch.undo()
    again = ChromaIndex(path=folder, exact_below=0, open_check=0)  # no sampled check either
    assert {hit for hit, _ in again.search(vectors[3], user_id=USER, k=5)} >= {"r3"}
    pinned = _MIRRORS.pinned(key)
    assert pinned is not None and "r3" in pinned.ids  # restored from the file, not re-found

    again.delete(["r3"], user_id=USER)
    assert not (folder / PINS_FILE).exists()  # no deleted id stays in the file
    again.close()

    (folder / PINS_FILE).write_text('{"x": [1, 2]', encoding="utf-8")  # damaged
    third = ChromaIndex(path=folder, exact_below=0, open_check=0)
    with caplog.at_level("WARNING"):
        assert len(third.search(vectors[5], user_id=USER, k=3)) == 3
    assert "damaged Chroma pins file" in caplog.text
    third.delete_user(USER)
    third.close()


def _graph_hiding(monkeypatch: pytest.MonkeyPatch, hidden: str, shallow: int = 10) -> None:
    """Make every Chroma query of ``shallow`` results or fewer miss ``hidden`` (a lossy graph).

    Deeper queries still return it, as a graph search with a wider beam may.
    """
    from chromadb.api.models.Collection import Collection

    real = Collection.query

    def query(self: Any, *args: Any, **kwargs: Any) -> Any:
        n = int(kwargs.get("n_results", 10))
        if n > shallow:
            return real(self, *args, **kwargs)
        got = real(self, *args, **{**kwargs, "n_results": n + 1})
        shown = [[i != hidden for i in row] for row in got["ids"]]
        for key in ("ids", "distances"):
            got[key] = [
                [v for v, keep in zip(row, keep_row, strict=True) if keep][:n]
                for row, keep_row in zip(got[key], shown, strict=True)
            ]
        return got

    monkeypatch.setattr(Collection, "query", query)


def test_a_probe_pins_a_near_duplicate_the_graph_finds_only_deeper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 30 near-duplicates lie 1e-6 apart: all under the tie distance, none equal to r5.
    ids = [f"r{i}" for i in range(30)]
    vectors = _near_duplicates(30, 0.001)
    index = ChromaIndex(path=tmp_path / "chroma", exact_below=0, open_check=0)
    index.add(ids, vectors, _meta(30))
    _graph_hiding(monkeypatch, "r5")
    assert "r5" not in {hit for hit, _ in index.search(vectors[5], user_id=USER, k=10)}
    # Found deeper, but its own distance beats the tenth neighbour's: lost, not crowded out.
    assert index.probe(ids, user_id=USER) == {"r5"}
    assert index.search(vectors[5], user_id=USER, k=10)[0][0] == "r5"  # pinned
    assert index.probe(ids, user_id=USER) == set()
    index.close()


def test_a_probe_accepts_an_id_crowded_out_by_equal_vectors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 15 copies of one vector: any 10 of them are a correct answer for r5's own vector.
    ids = [f"r{i}" for i in range(15)]
    vectors = np.repeat(_near_duplicates(1, 0.0), 15, axis=0)
    index = ChromaIndex(path=tmp_path / "chroma", exact_below=0, open_check=0)
    index.add(ids, vectors, _meta(15))
    _graph_hiding(monkeypatch, "r5")
    assert index.probe(ids, user_id=USER) == set()
    index.close()


def test_a_close_during_the_background_open_check_stops_it(tmp_path: Path) -> None:
    ids = [f"r{i}" for i in range(300)]
    vectors = _near_duplicates(300, 0.05)
    folder = tmp_path / "chroma"
    index = ChromaIndex(path=folder, exact_below=0, open_check=300)
    index.add(ids, vectors, _meta(300))
    index.close()
    index = ChromaIndex(path=folder, exact_below=0, open_check=300)
    assert index.search(vectors[0], user_id=USER, k=1)  # starts the check in the background
    index.close()  # stops and joins it: no thread is left writing to a closed client
    assert index.wait_checks(timeout=0)
    again = ChromaIndex(path=folder, exact_below=0, open_check=300, open_check_background=False)
    assert again.count(USER) == 300
    assert again.search(vectors[5], user_id=USER, k=1)[0][0] == "r5"
    assert again.wait_checks(timeout=0)  # the waiting check ran inside the search
    again.close()


def test_lost_records_found_by_writes_are_logged_at_most_once_a_minute(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = ChromaIndex(path=tmp_path / "chroma", exact_below=0, open_check=0)
    # Each write's probe reports the record it wrote as lost (as a bad graph would).
    monkeypatch.setattr(index, "_probe_in", lambda collection, wanted, k: set(wanted))
    vectors = _near_duplicates(10, 0.05)
    with caplog.at_level("WARNING", logger="memories_core.backends.chroma_index"):
        for i in range(10):
            index.add([f"r{i}"], vectors[i : i + 1], _meta(1))
        during = [r.getMessage() for r in caplog.records if "cannot reach" in r.getMessage()]
        index.close()
    messages = [r.getMessage() for r in caplog.records if "cannot reach" in r.getMessage()]
    assert len(during) == 1 and "1 of 1 checked" in during[0]
    assert len(messages) == 2 and "9 of 9 checked" in messages[1]  # the rest, on close
    again = ChromaIndex(path=tmp_path / "chroma", exact_below=0, open_check=0)
    assert {hit for hit, _ in again.search(vectors[3], user_id=USER, k=10)} >= {"r3"}
    again.close()


@pytest.mark.parametrize("exact_below", [0, 1000])  # the graph; the exact mirror
def test_prefetch_loads_a_users_collection_after_a_reopen(tmp_path: Path, exact_below: int) -> None:
    from memories_core import HistoryMemory
    from memories_core.retrieval import Pipeline

    def opened() -> HistoryMemory:
        index = ChromaIndex(path=tmp_path / "chroma", exact_below=exact_below, open_check=0)
        return HistoryMemory(
            store=SQLiteRecordStore(tmp_path / "records.sqlite3"),
            index=index,
            embedder=HashingEmbedder(),
            pipeline=Pipeline(),
        )

    memory = opened()
    texts = _texts(30)
    memory.save([Turn("user", text) for text in texts], Scope(USER, "s1"))
    memory.close()
    memory = opened()
    before = memory.engine.failures.get("index", 0)
    assert memory.engine.warm(USER) is True
    assert memory.engine.warm("nobody") is False
    assert memory.prefetch(USER, progress=False) == 0  # no reranker data without a reranker
    hits = memory.recall(texts[7], Scope(USER), k=3).records
    assert hits and hits[0].record.text.endswith(texts[7])
    assert memory.engine.failures.get("index", 0) == before
    memory.close()


def test_learned_filter_shares_size_the_first_search_after_a_reopen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A reopened index fetches what it learned it needs, not the first guess (4k + 20)."""
    import json

    from chromadb.api.models.Collection import Collection

    from memories_core.backends.chroma_filtered import SHARES_FILE

    fetches: list[int] = []
    real_query = Collection.query

    def spy(self: Collection, *args: object, **kwargs: object) -> object:
        if "where" not in kwargs:
            fetches.append(int(kwargs["n_results"]))  # type: ignore[call-overload]
        return real_query(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Collection, "query", spy)
    folder = tmp_path / "chroma"
    ids = [f"r{i}" for i in range(300)]
    vectors = _near_duplicates(300, 0.5)
    index = ChromaIndex(path=folder, exact_below=0, open_check=0)
    index.add(ids, vectors, _meta(300))  # every record is a turn: every hit passes
    key = _collection_key(index)
    fetches.clear()
    turns = {"kind": "turn"}
    assert len(index.search(vectors[0], user_id=USER, k=20, where=turns)) == 20
    # A filter holding a value (here a session id) is learned too, but never written down.
    assert index.search(vectors[0], user_id=USER, k=20, where={**turns, "session_id": "s1"}) == []
    assert fetches == [100, 100]  # nothing learned yet: 4 * 20 + 20
    index.close()
    kept = json.loads((folder / SHARES_FILE).read_text(encoding="utf-8"))
    assert kept == [[key, json.dumps(turns), 0.8]]

    fetches.clear()
    again = ChromaIndex(path=folder, exact_below=0, open_check=0)
    assert len(again.search(vectors[1], user_id=USER, k=20, where=turns)) == 20
    assert fetches == [45]  # 20 / 0.8 + 20, as before the reopen
    again.close()

    (folder / SHARES_FILE).write_text('[["x", "{\\"kind\\": 1}", 7]]', encoding="utf-8")
    fetches.clear()
    with caplog.at_level("WARNING"):
        third = ChromaIndex(path=folder, exact_below=0, open_check=0)
    assert "damaged filter shares file" in caplog.text
    assert len(third.search(vectors[1], user_id=USER, k=20, where=turns)) == 20
    assert fetches == [100]  # back to the first guess, and still a right answer
    third.close()  # writes what it learned again
    assert key in (folder / SHARES_FILE).read_text(encoding="utf-8")
    fourth = ChromaIndex(path=folder, exact_below=0, open_check=0)
    fourth.delete_user(USER)
    assert not (folder / SHARES_FILE).exists()  # nothing is kept of a deleted user
    fourth.close()
