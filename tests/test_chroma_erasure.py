"""ChromaIndex on disk: erasure after delete_user, stale collections, lost HNSW links."""

from __future__ import annotations

import gc
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from memories_core.backends import ChromaIndex

DIM = 16
ROOT = Path(__file__).resolve().parents[1]


def unit(seed: int, dim: int = DIM) -> npt.NDArray[np.float32]:
    v = np.random.default_rng(seed).normal(size=dim).astype(np.float32)
    return v / np.linalg.norm(v)


def vectors(n: int, seed: int) -> npt.NDArray[np.float32]:
    return np.stack([unit(seed * 100_000 + i) for i in range(n)])


def grep(folder: Path, needles: list[bytes]) -> list[tuple[str, bytes]]:
    """Every (file, needle) pair such that the needle occurs in the file's raw bytes."""
    hits = []
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = file.read_bytes()
        hits += [(str(file.relative_to(folder)), n) for n in needles if n in data]
    return hits


def secrets_of(
    user: str, ids: list[str], marker: str, vecs: npt.NDArray[np.float32]
) -> list[bytes]:
    # A vector is looked for by its middle 8 floats: the bytes Chroma or HNSW would store.
    needles = [user.encode(), marker.encode()] + [i.encode() for i in ids[:20]]
    return needles + [vecs[i, 4:12].tobytes() for i in range(min(20, len(vecs)))]


def close_all(*indexes: ChromaIndex) -> None:
    for index in indexes:
        index.close()
    del indexes
    gc.collect()


def run_child(code: str) -> str:
    """Run ``code`` in another Python process (the index on the same path from elsewhere)."""
    env_path = f"{ROOT / 'shared'}:{ROOT}"
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin", "ANONYMIZED_TELEMETRY": "False"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize("n", [3, 1500])  # 1500 > Chroma's HNSW sync threshold (1000)
def test_delete_user_leaves_nothing_in_the_files(tmp_path: Path, n: int) -> None:
    path = tmp_path / "chroma"
    user, marker = "user-Zq7secret-alice", "MARKER-Xk2-private-fact"
    ids = [f"rec-Zq7-{i:05d}" for i in range(n)]
    secret = vectors(n, 1)
    kept = vectors(5, 2)
    index = ChromaIndex(path=path)
    metas = [{"user_id": user, "kind": "turn", "note": f"{marker} {i}"} for i in range(n)]
    index.add(ids, secret, metas)
    index.add([f"bob-{i}" for i in range(5)], kept, [{"user_id": "bob", "kind": "turn"}] * 5)
    # Replace and delete some, so old versions sit in Chroma's free space and queue.
    index.add(ids[:2], secret[:2], metas[:2])
    index.delete(ids[-1:], user_id=user)
    assert index.search(secret[0], user_id=user, k=1)[0][0] == ids[0]  # HNSW loaded
    assert grep(path, secrets_of(user, ids, marker, secret))  # the data was on disk
    index.delete_user(user)
    assert index.count(user) == 0 and index.ids(user) == set()
    close_all(index)
    assert grep(path, secrets_of(user, ids, marker, secret)) == []
    reopened = ChromaIndex(path=path)
    assert reopened.count() == 5 and reopened.users() == {"bob"}
    assert reopened.search(kept[3], user_id="bob", k=1)[0][0] == "bob-3"
    close_all(reopened)


def test_delete_with_erase_removes_one_record(tmp_path: Path) -> None:
    path = tmp_path / "chroma"
    vecs = vectors(30, 3)
    ids = [f"r{i}" for i in range(29)] + ["gone-Qm4-id"]
    metas = [{"user_id": "u", "kind": "turn"}] * 29 + [
        {"user_id": "u", "kind": "turn", "note": "MARKER-Qm4-erase-me"}
    ]
    index = ChromaIndex(path=path)
    index.add(ids, vecs, metas)
    index.delete(["gone-Qm4-id"], user_id="u", erase=True)
    assert index.ids("u") == set(ids[:29])
    assert index.search(vecs[7], user_id="u", k=1)[0][0] == "r7"
    close_all(index)
    needles = [b"gone-Qm4-id", b"MARKER-Qm4-erase-me", vecs[29, 4:12].tobytes()]
    assert grep(path, needles) == []


def test_stale_collection_of_another_instance_is_re_resolved(tmp_path: Path) -> None:
    path = tmp_path / "chroma"
    first = ChromaIndex(path=path)
    second = ChromaIndex(path=path)
    first.add(
        ["a1", "b1"],
        np.stack([unit(0), unit(1)]),
        [
            {"user_id": "alice", "kind": "turn"},
            {"user_id": "bob", "kind": "turn"},
        ],
    )
    assert second.search(unit(0), user_id="alice", k=1)[0][0] == "a1"  # cached in second
    first.delete_user("alice")
    assert second.search(unit(0), user_id="alice", k=1) == []
    assert second.count("alice") == 0
    second.add(["a2"], np.stack([unit(2)]), [{"user_id": "alice", "kind": "turn"}])
    assert first.search(unit(2), user_id="alice", k=1)[0][0] == "a2"
    first.delete_user("alice")
    first.add(["a3"], np.stack([unit(3)]), [{"user_id": "alice", "kind": "turn"}])
    # second's cache holds a collection dropped and recreated by first.
    assert [h[0] for h in second.search(unit(3), user_id="alice", k=5)] == ["a3"]
    assert second.search(unit(1), user_id="bob", k=1)[0][0] == "b1"
    close_all(first, second)


def test_second_process_is_refused_then_works_after_close(tmp_path: Path) -> None:
    # Two processes on one embedded folder corrupt it (folder_lock.py); the second is refused
    # at open with an error naming the server setup, and nothing of the first is touched.
    path = tmp_path / "chroma"
    user, marker = "user-Pp9-carol", "MARKER-Pp9-secret"
    secret = vectors(40, 4)
    index = ChromaIndex(path=path)
    index.add(
        [f"c-Pp9-{i}" for i in range(40)],
        secret,
        [{"user_id": user, "kind": "turn", "note": marker}] * 40,
    )
    index.add(["b1"], np.stack([unit(1)]), [{"user_id": "bob", "kind": "turn"}])
    child = f"""
        from memories_core.backends import ChromaIndex
        from memories_core.errors import StoreInUseError
        try:
            index = ChromaIndex(path={str(path)!r})
        except StoreInUseError as exc:
            print("refused", exc.holder, "ChromaIndex(host=" in str(exc), "Postgres" in str(exc))
        else:
            index.delete_user({user!r})
            print("deleted", index.count())
            index.close()
        """
    assert run_child(child).split() == ["refused", str(os.getpid()), "True", "True"]
    assert index.search(secret[0], user_id=user, k=1)[0][0] == "c-Pp9-0"
    assert index.count() == 41
    close_all(index)
    assert run_child(child).split() == ["deleted", "1"]
    reopened = ChromaIndex(path=path)
    assert reopened.search(secret[0], user_id=user, k=3) == []
    assert reopened.users() == {"bob"}
    close_all(reopened)
    needles = [user.encode(), marker.encode(), b"c-Pp9-", secret[5, 4:12].tobytes()]
    assert grep(path, needles) == []


def _hnsw(segment: Path) -> tuple[bytearray, int, int, int, int]:
    """data_level0 bytes, element count and size, offset of vectors, entry point.

    Chroma's hnswlib header: int32 version, then size_t offsetLevel0, max_elements,
    cur_element_count, size_data_per_element, label_offset, offsetData, int maxlevel,
    uint32 enterpoint_node, ... Each element of ``data_level0.bin`` starts with its level-0
    links (a uint16 count in a uint32, then the neighbour ids), then its vector.
    """
    header = (segment / "header.bin").read_bytes()
    _, _, _, count, size_element, _, offset_data, _, entry = struct.unpack_from("<i6QiI", header)
    data = bytearray((segment / "data_level0.bin").read_bytes())
    return data, count, size_element, offset_data, entry


def _victim(segment: Path, target: npt.NDArray[np.float32]) -> int | None:
    """HNSW element holding ``target`` if it is a level-0-only non-entry element."""
    data, count, size_element, offset_data, entry = _hnsw(segment)
    stored = np.stack(
        [np.frombuffer(data, np.float32, DIM, i * size_element + offset_data) for i in range(count)]
    )
    victim = int(np.argmax(stored @ target))
    return victim if victim != entry and _upper_links(segment, count)[victim] == 0 else None


def _upper_links(segment: Path, count: int) -> list[int]:
    """Bytes of upper-level links per element (0: the element is on level 0 only).

    ``link_lists.bin`` holds, per element, a uint32 size and that many bytes.
    """
    raw = (segment / "link_lists.bin").read_bytes()
    sizes, at = [], 0
    for _ in range(count):
        (size,) = struct.unpack_from("<I", raw, at)
        sizes.append(size)
        at += 4 + size
    assert at == len(raw)
    return sizes


def _cut_links_to(segment: Path, victim: int) -> None:
    """Remove every level-0 link to ``victim``: no search can walk to it any more."""
    data, count, size_element, _, _ = _hnsw(segment)
    for i in range(count):
        base = i * size_element
        (n,) = struct.unpack_from("<H", data, base)
        links = list(struct.unpack_from(f"<{n}I", data, base + 4))
        if victim in links:
            links.remove(victim)
            struct.pack_into("<H", data, base, len(links))
            struct.pack_into(f"<{len(links)}I", data, base + 4, *links)
    (segment / "data_level0.bin").write_bytes(bytes(data))


def test_probe_finds_a_vector_hnsw_cannot_reach(tmp_path: Path) -> None:
    path = tmp_path / "chroma"
    n = 1200  # above Chroma's sync threshold: the HNSW graph is written to its folder
    vecs = vectors(n, 5)
    ids = [f"r{i}" for i in range(n)]
    index = ChromaIndex(path=path)
    index.add(ids, vecs, [{"user_id": "u", "kind": "turn"}] * n)
    assert index.probe(ids, user_id="u") == set()
    assert index.ids("u") == set(ids) and index.users() == {"u"}
    close_all(index)
    [segment] = [p for p in path.iterdir() if p.is_dir() and (p / "header.bin").stat().st_size]
    target, victim = next((i, v) for i in range(n) if (v := _victim(segment, vecs[i])) is not None)
    _cut_links_to(segment, victim)
    # A fresh process loads the damaged HNSW files from disk.
    out = run_child(
        f"""
        from memories_core.backends import ChromaIndex
        index = ChromaIndex(path={str(path)!r}, exact_below=0, open_check=0)  # the graph
        ids = sorted(index.ids("u"))
        print(len(ids), *sorted(index.probe(ids, user_id="u")))
        index.close()
        """
    )
    assert out.split() == [str(n), f"r{target}"]


def test_erasure_resumes_after_a_crash_and_with_an_injected_client(tmp_path: Path) -> None:
    import chromadb
    from chromadb.config import Settings

    path = tmp_path / "chroma"
    client = chromadb.PersistentClient(
        path=str(path), settings=Settings(anonymized_telemetry=False)
    )
    index = ChromaIndex(client=client)
    secret = vectors(1100, 6)
    ids = [f"Rs8-{i}" for i in range(1100)]
    index.add(ids, secret, [{"user_id": "user-Rs8", "kind": "turn", "note": "MARKER-Rs8"}] * 1100)
    index.add(["b"], np.stack([unit(1)]), [{"user_id": "bob", "kind": "turn"}])
    # A crash right after Chroma dropped the collection: nothing was erased yet.
    index._drop_collection(index.user_collection_name("user-Rs8"))
    needles = secrets_of("user-Rs8", ids, "MARKER-Rs8", secret)
    assert grep(path, needles)
    index.delete_user("user-Rs8")  # the repeated call finishes the erasure
    assert index.users() == {"bob"}
    close_all(index)
    del client
    gc.collect()
    assert grep(path, needles) == []


def test_stale_memory_in_other_users_hnsw_files_is_scrubbed_at_close(tmp_path: Path) -> None:
    # Chroma's HNSW writer persists an index's whole preallocated buffer; past the stored
    # elements it is uninitialised memory, which held a deleted user's bytes in 2 of 30 runs.
    # Simulate such stale bytes in the keeper's live segment, delete another user, close.
    path = tmp_path / "chroma"
    index = ChromaIndex(path=path)
    keeper = {"user_id": "keeper", "kind": "turn"}
    index.add([f"k{i}" for i in range(5)], vectors(5, 3), [keeper] * 5)
    index.add(["v1"], vectors(1, 4), [{"user_id": "victim", "kind": "turn"}])
    planted = b"STALE-victim-bytes"
    for data in path.glob("*/data_level0.bin"):
        with data.open("r+b") as handle:
            handle.seek(data.stat().st_size - 64)
            handle.write(planted)
    index.delete_user("victim")
    index.close()
    assert grep(path, [planted]) == []
    again = ChromaIndex(path=path)
    assert again.count("keeper") == 5
    found = again.search(vectors(5, 3)[2], user_id="keeper", k=1)
    assert found[0][0] == "k2"


def test_hnsw_files_written_after_a_reopen_are_scrubbed_at_close_without_a_delete(
    tmp_path: Path,
) -> None:
    # A process that once held a deleted user's texts may persist them into another user's
    # HNSW buffer on a later open that deletes nothing: a close scrubs what was written since.
    path = tmp_path / "chroma"
    first = ChromaIndex(path=path)
    first.add(
        [f"k{i}" for i in range(5)], vectors(5, 3), [{"user_id": "keeper", "kind": "turn"}] * 5
    )
    close_all(first)
    index = ChromaIndex(path=path)
    index.add(["k5"], vectors(1, 5), [{"user_id": "keeper", "kind": "turn"}])
    planted = b"STALE-gone-user-bytes"
    segments = list(path.glob("*/data_level0.bin"))
    assert segments
    for data in segments:
        with data.open("r+b") as handle:
            handle.seek(data.stat().st_size - 64)
            handle.write(planted)
    close_all(index)
    assert grep(path, [planted]) == []
    again = ChromaIndex(path=path)
    assert again.count("keeper") == 6
    assert again.search(vectors(1, 5)[0], user_id="keeper", k=1)[0][0] == "k5"
    close_all(again)


def test_a_close_after_a_delete_scrubs_the_files_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every file after a delete, once, and after the client is closed (nothing writes then).
    path = tmp_path / "chroma"
    index = ChromaIndex(path=path)
    index.add(["k0"], vectors(1, 3), [{"user_id": "keeper", "kind": "turn"}])
    index.add(["v0"], vectors(1, 4), [{"user_id": "victim", "kind": "turn"}])
    index.delete_user("victim")
    calls: list[float | None] = []
    scrub = ChromaIndex._scrub_unused_capacity

    def counted(self: ChromaIndex, since: float | None = None) -> int:
        calls.append(since)
        return scrub(self, since)

    monkeypatch.setattr(ChromaIndex, "_scrub_unused_capacity", counted)
    index.close()
    assert calls == [None]
