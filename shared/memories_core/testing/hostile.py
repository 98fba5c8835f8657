"""The hostile-file suite: every part of a memory file damaged, for any engine.

A memory file (:mod:`memories_core.portable`) is untrusted input. :func:`hostile_cases`
derives, from one good file, files that an attacker or a broken disk could produce: the zip
truncated or with a corrupted member, each member missing, truncated or replaced by a pickle
payload, an oversized or zip-bomb member, manifests of version 0 and future versions, reserved
user ids and another user's record ids, and rows that ``save`` would refuse (reserved metadata
keys, NaN, integers beyond 64 bits, oversize texts, bad times and states).
:func:`check_hostile_imports` imports each into one engine and asserts the contract of
:func:`~memories_core.portable.import_user`:

* it raises a typed error (a :class:`~memories_core.errors.MemoriesError`);
* it leaves no trace: the target's records, history, jobs, graph, state, artifacts (registry
  and files on disk) and vector ids are exactly what they were;
* nothing is unpickled (a pickle payload would create a marker file when loaded);
* importing the good file afterwards succeeds.

Run it on every record store::

    from memories_core.testing.hostile import check_hostile_imports

    checked = check_hostile_imports(engine, good_file, tmp_path, other_user="bob")
"""

from __future__ import annotations

import builtins
import io
import json
import pickle  # only to *write* payloads that must never be loaded
import struct
import warnings
import zipfile
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from memories_core.errors import MemoriesError
from memories_core.portable import VERSION, ImportLimits, import_user

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine

__all__ = ["HostileCase", "check_hostile_imports", "hostile_cases", "pickle_payload"]

#: Expanded size of the zip-bomb member (the archive holds about a thousandth of it).
BOMB_BYTES = 300 * 1024 * 1024

Members = dict[str, bytes]


@dataclass(frozen=True)
class HostileCase:
    """One damaged memory file.

    Attributes:
        name: What is wrong with it.
        data: The file's bytes.
        limits: Limits to import it with (``None``: the defaults).
        user_id: The user the importer expects (``None``: any).
    """

    name: str
    data: bytes
    limits: ImportLimits | None = None
    user_id: str | None = None


class _Payload:
    """Pickles to a call of ``open(marker, "w")``: loading it creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (builtins.open, (str(self.marker), "w"))


def pickle_payload(marker: Path) -> bytes:
    """Pickle bytes that create ``marker`` if anything ever unpickles them."""
    return pickle.dumps(_Payload(marker))


def _members(path: Path) -> Members:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def _zip(members: Mapping[str, bytes], *, stored: Sequence[str] = ()) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            method = zipfile.ZIP_STORED if name in stored else zipfile.ZIP_DEFLATED
            archive.writestr(name, data, compress_type=method)
    return buffer.getvalue()


def _with(members: Members, name: str, data: bytes | None) -> Members:
    out = dict(members)
    if data is None:
        out.pop(name, None)
    else:
        out[name] = data
    return out


def _manifest(members: Members, change: Callable[[dict[str, Any]], None]) -> Members:
    manifest = json.loads(members["manifest.json"])
    change(manifest)
    return _with(members, "manifest.json", json.dumps(manifest).encode())


def _rows(members: Members, name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in members[name].decode().splitlines() if line.strip()]


def _jsonl(rows: Sequence[Any]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def _record_case(members: Members, change: Callable[[dict[str, Any]], None]) -> Members:
    rows = _rows(members, "records.jsonl")
    change(rows[0])
    return _with(members, "records.jsonl", _jsonl(rows))


def _corrupt_member(data: bytes, name: str) -> bytes:
    """The archive with one byte of ``name``'s stored data flipped (its CRC no longer holds)."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        info = archive.getinfo(name)
    raw = bytearray(data)
    header = info.header_offset
    name_len = int.from_bytes(raw[header + 26 : header + 28], "little")
    extra_len = int.from_bytes(raw[header + 28 : header + 30], "little")
    start = header + 30 + name_len + extra_len
    raw[start + info.compress_size // 2] ^= 0x55
    return bytes(raw)


def _bomb() -> bytes:
    """A valid zip whose ``records.jsonl`` expands from about 300 KB to :data:`BOMB_BYTES`.

    Built without compressing 300 MB: one MiB of zeros deflated with a full flush is a
    self-contained block, and the member's deflate stream is that block repeated.
    """
    chunk = b"\0" * (1 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(chunk) + compressor.flush(zlib.Z_FULL_FLUSH)
    repeats = BOMB_BYTES // len(chunk)
    stream = block * repeats + compressor.flush()
    crc = 0
    for _ in range(repeats):
        crc = zlib.crc32(chunk, crc)
    return _raw_zip(
        [
            ("records.jsonl", zlib.DEFLATED, crc, BOMB_BYTES, stream),
            ("manifest.json", 0, zlib.crc32(b"{}"), 2, b"{}"),
        ]
    )


def _raw_zip(members: Sequence[tuple[str, int, int, int, bytes]]) -> bytes:
    """A zip archive of already-compressed members: (name, method, CRC-32, size, data)."""
    out = bytearray()
    central = bytearray()
    for name, method, crc, size, data in members:
        encoded = name.encode()
        offset = len(out)
        fields = (20, 0, method, 0, 0x21, crc, len(data), size, len(encoded))
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, *fields, 0) + encoded + data
        central += (
            struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, *fields, 0, 0, 0, 0, 0, offset)
            + encoded
        )
    count = len(members)
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(central), len(out), 0)
    return bytes(out + central + end)


def hostile_cases(
    good: Path,
    marker: Path,
    *,
    other_record_id: str | None = None,
    with_bomb: bool = True,
) -> list[HostileCase]:
    """Damaged variants of the good memory file ``good``.

    Args:
        good: A memory file written by :func:`~memories_core.portable.export_user`, with at
            least one record, one history entry, one job, one graph node, one artifact and
            vectors.
        marker: A path that must never come to exist: the pickle payloads create it when
            loaded.
        other_record_id: A record id of another user of the target: a file that reuses it
            must be refused without touching that user.
        with_bomb: Include the 300 MB zip bomb (builds in about a second).

    Returns:
        The cases, each of which an import must refuse.
    """
    m = _members(good)
    data = _zip(m)
    payload = pickle_payload(marker)
    user = json.loads(m["manifest.json"])["user_id"]
    cases: list[HostileCase] = []

    def add(name: str, members: Members, **options: Any) -> None:
        cases.append(HostileCase(name, _zip(members), **options))

    # The archive itself.
    cases.append(HostileCase("empty file", b""))
    cases.append(HostileCase("not a zip", b"llm-memories " * 100))
    cases.append(HostileCase("a pickle instead of a zip", payload))
    for fraction in (0.1, 0.5, 0.9):
        cases.append(
            HostileCase(f"zip truncated at {fraction:.0%}", data[: int(len(data) * fraction)])
        )
    cases.append(HostileCase("zip missing its last byte", data[:-1]))
    for name in m:
        cases.append(HostileCase(f"{name} corrupted in the archive", _corrupt_member(data, name)))
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in m.items():
            archive.writestr(name, content)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # zipfile warns of the duplicate name
            archive.writestr("records.jsonl", m["records.jsonl"])
    cases.append(HostileCase("a member twice", buffer.getvalue()))
    add("an unknown member", {**m, "evil.sh": b"rm -rf /"})

    # Each member: missing, truncated, a pickle payload.
    for name in m:
        if name.startswith("artifacts/"):
            continue
        add(f"{name} missing", _with(m, name, None))
        if len(m[name]) > 2:
            add(f"{name} truncated", _with(m, name, m[name][: len(m[name]) // 2]))
        add(f"{name} replaced by a pickle", _with(m, name, payload))

    # Sizes.
    largest = max(len(v) for v in m.values())
    cases.append(HostileCase("too many members", data, limits=ImportLimits(max_members=len(m) - 1)))
    cases.append(
        HostileCase("a member too large", data, limits=ImportLimits(max_member_bytes=largest - 1))
    )
    total = sum(len(v) for v in m.values())
    cases.append(
        HostileCase("expands too much", data, limits=ImportLimits(max_total_bytes=total - 1))
    )
    five_million = "x" * 5_000_000
    add("a 5-million-character text", _record_case(m, lambda r: r.update(text=five_million)))
    if with_bomb:
        cases.append(HostileCase("zip bomb (300 MB from ~300 KB)", _bomb()))

    # The manifest.
    def manifest_case(name: str, change: Callable[[dict[str, Any]], None], **options: Any) -> None:
        add(name, _manifest(m, change), **options)

    manifest_case("version 0", lambda d: d.update(version=0))
    manifest_case("version -1", lambda d: d.update(version=-1))
    manifest_case("a future version", lambda d: d.update(version=VERSION + 1))
    manifest_case("version as a string", lambda d: d.update(version="1"))
    manifest_case("version true", lambda d: d.update(version=True))
    manifest_case("another format", lambda d: d.update(format="other/thing"))
    manifest_case("no user id", lambda d: d.pop("user_id"))
    manifest_case("an empty user id", lambda d: d.update(user_id=" "))
    manifest_case("user id with NUL", lambda d: d.update(user_id="ann\x00bob"))
    manifest_case("user id too long", lambda d: d.update(user_id="u" * 5000))
    manifest_case("EMG's reserved owner", lambda d: d.update(user_id="__emg_store__"))
    manifest_case("a reserved id", lambda d: d.update(user_id="__internal__"))
    manifest_case(
        "counts that lie", lambda d: d["counts"].update(records=d["counts"]["records"] + 1)
    )
    manifest_case("no counts", lambda d: d.pop("counts"))
    manifest_case("a bad embedder", lambda d: d.update(embedder={"name": "x", "dimension": 0}))
    manifest_case("a bad export time", lambda d: d.update(exported_at="yesterday"))
    manifest_case("an unknown field", lambda d: d.update(run="curl evil"))
    add("the file of another user", m, user_id=f"not-{user}")

    # Records: the rules of save.
    def record_case(name: str, change: Callable[[dict[str, Any]], None]) -> None:
        add(name, _record_case(m, change))

    record_case("an empty text", lambda r: r.update(text="  "))
    record_case("a text that is not a string", lambda r: r.update(text=["x"]))
    record_case("a reserved metadata key", lambda r: r["metadata"].update(user_id="bob"))
    record_case("metadata key 'archived'", lambda r: r["metadata"].update(archived=True))
    record_case("an integer beyond 64 bits", lambda r: r["metadata"].update(n=2**70))
    record_case("metadata that is a list", lambda r: r.update(metadata=[1]))
    record_case("a naive time", lambda r: r.update(created_at="2026-01-05T09:00:00"))
    record_case("a bad time", lambda r: r.update(created_at="soon"))
    record_case("no id", lambda r: r.pop("id"))
    record_case("an unknown field", lambda r: r.update(owner="bob"))
    record_case("an id too long", lambda r: r.update(id="i" * 1000))
    record_case("a bad index state", lambda r: r.update(index="done"))
    record_case("a strength that is a string", lambda r: r["state"].update(strength="high"))
    record_case("a negative recall count", lambda r: r["state"].update(recall_count=-1))
    record_case("source ids that are not ids", lambda r: r.update(source_ids=[1, 2]))
    nan_rows = m["records.jsonl"].decode().replace('"metadata": {', '"metadata": {"bad": NaN, ', 1)
    add("NaN in metadata", _with(m, "records.jsonl", nan_rows.encode()))
    inf_rows = m["records.jsonl"].decode().replace('"strength": ', '"strength": Infinity, "x": ', 1)
    add("an infinite strength", _with(m, "records.jsonl", inf_rows.encode()))
    rows = _rows(m, "records.jsonl")
    add("a record twice", _with(m, "records.jsonl", _jsonl([*rows, rows[0]])))
    add("a row that is not an object", _with(m, "records.jsonl", _jsonl([[1, 2], *rows[1:]])))
    add("invalid UTF-8", _with(m, "records.jsonl", b"\xff\xfe" + m["records.jsonl"]))
    if other_record_id is not None:
        record_case("another user's record id", lambda r: r.update(id=other_record_id))

    # History, jobs, graph, state.
    history = _rows(m, "history.jsonl")
    bad_history = [{**history[0], "at": 12}, *history[1:]]
    add("a history entry with a bad time", _with(m, "history.jsonl", _jsonl(bad_history)))
    jobs = _rows(m, "jobs.jsonl")
    add("a job with bad attempts", _with(m, "jobs.jsonl", _jsonl([{**jobs[0], "attempts": "x"}])))
    add("a job twice", _with(m, "jobs.jsonl", _jsonl([*jobs, jobs[0]])))
    add("a job payload list", _with(m, "jobs.jsonl", _jsonl([{**jobs[0], "payload": [1]}])))
    graph = json.loads(m["graph.json"])
    add(
        "graph nodes not a list", _with(m, "graph.json", json.dumps({**graph, "nodes": 1}).encode())
    )
    twice = {**graph, "nodes": [*graph["nodes"], graph["nodes"][0]]}
    add("a graph node twice", _with(m, "graph.json", json.dumps(twice).encode()))
    add("state not an object", _with(m, "state.json", b"[1, 2]"))
    add("state with NaN", _with(m, "state.json", b'{"k": NaN}'))
    deep = "[" * 100_000 + "]" * 100_000
    add("JSON nested too deeply", _with(m, "state.json", f'{{"k": {deep}}}'.encode()))

    # Vectors.
    if "vectors.npy" in m:
        ids = json.loads(m["vector_ids.json"])
        matrix = np.load(io.BytesIO(m["vectors.npy"]), allow_pickle=False)
        objects = np.empty(len(ids), dtype=object)
        objects[:] = [_Payload(marker) for _ in ids]
        add("vectors.npy of pickled objects", _with(m, "vectors.npy", _npy(objects, pickled=True)))
        add("vectors of the wrong shape", _with(m, "vectors.npy", _npy(matrix[:, :-1])))
        bad = matrix.copy()
        bad[0, 0] = np.nan
        add("a NaN vector", _with(m, "vectors.npy", _npy(bad)))
        add(
            "vector ids of no record",
            _with(m, "vector_ids.json", json.dumps(["nope", *ids[1:]]).encode()),
        )
        add("vectors without ids", _with(m, "vector_ids.json", None))

    # Artifacts.
    listing = json.loads(m["artifacts.json"])
    files = [n for n in m if n.startswith("artifacts/0/")]
    first = files[0]
    add("an artifact file changed", _with(m, first, m[first] + b"!"))
    add("an artifact file escaping its folder", {**m, "artifacts/0/../../../evil": b"x"})
    add("an absolute artifact file", {**m, "artifacts/0//etc/passwd": b"x"})
    add("a hidden artifact file", {**m, "artifacts/0/.hidden": b"x"})
    add("a stray artifact folder", {**m, "artifacts/7/x.bin": b"x"})
    named = [{**listing[0], "name": ""}, *listing[1:]]
    add("an artifact without a name", _with(m, "artifacts.json", json.dumps(named).encode()))
    digest = [{**listing[0], "sha256": "../../x"}, *listing[1:]]
    add("an artifact with a bad checksum", _with(m, "artifacts.json", json.dumps(digest).encode()))
    dup = [*listing, {**listing[0]}]
    add("an artifact listed twice", _with(m, "artifacts.json", json.dumps(dup).encode()))
    return cases


def _npy(array: np.ndarray, *, pickled: bool = False) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=pickled)
    return buffer.getvalue()


def _trace(engine: MemoryEngine, users: Sequence[str]) -> dict[str, Any]:
    """Everything an import could leave behind, for ``users`` and on disk."""
    out: dict[str, Any] = {"users": sorted(engine.users())}
    ids_of = getattr(engine.index, "ids", None)
    for user in users:
        out[user] = {
            "records": [(r.id, r.text, r.state) for r in engine.records(user)],
            "history": [
                (h.record_id, h.at, dict(h.old), dict(h.new)) for h in engine.history(user)
            ],
            "jobs": [j.id for j in engine.pending(user)],
            "nodes": engine.store.graph_nodes(user),
            "edges": engine.store.graph_edges(user),
            "state": engine.store.user_state(user),
            "artifacts": [(a.name, a.sha256) for a in engine.artifacts.list(user)],
            "index_states": engine.store.index_states(user),
            "vectors": sorted(ids_of(user)) if callable(ids_of) else None,
        }
    root = engine.artifacts.root
    out["files"] = sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))
    return out


def check_hostile_imports(
    engine: MemoryEngine,
    good: Path,
    workdir: Path,
    *,
    other_user: str | None = None,
    with_bomb: bool = True,
) -> int:
    """Import every hostile variant of ``good`` into ``engine``; then import ``good``.

    Args:
        engine: The target; it must not hold the file's user. It may hold ``other_user``,
            whose data must come through untouched.
        good: A good memory file (see :func:`hostile_cases`).
        workdir: A folder for the case files and the pickle marker.
        other_user: A user of ``engine`` whose record id the file tries to reuse.
        with_bomb: Include the zip bomb.

    Returns:
        How many hostile files were refused.

    Raises:
        AssertionError: naming the first case that was imported, raised an untyped error,
            left a trace, or was unpickled; or if the good file does not import afterwards.
    """
    marker = workdir / "unpickled.marker"
    user = json.loads(_members(good)["manifest.json"])["user_id"]
    users = [user] if other_user is None else [user, other_user]
    other_id = engine.records(other_user)[0].id if other_user is not None else None
    cases = hostile_cases(good, marker, other_record_id=other_id, with_bomb=with_bomb)
    before = _trace(engine, users)
    for number, case in enumerate(cases):
        path = workdir / f"hostile-{number}.memories.zip"
        path.write_bytes(case.data)
        try:
            report = import_user(engine, path, limits=case.limits, user_id=case.user_id)
        except MemoriesError:
            pass
        except Exception as exc:
            raise AssertionError(
                f"hostile file {case.name!r}: untyped error {type(exc).__name__}: {exc}"
            ) from exc
        else:
            raise AssertionError(f"hostile file {case.name!r} was imported: {report}")
        finally:
            path.unlink()
        assert not marker.exists(), f"hostile file {case.name!r}: a pickle was loaded"
        after = _trace(engine, users)
        assert after == before, f"hostile file {case.name!r} left a trace"
    report = import_user(engine, good)
    assert report.user_id == user and report.records == len(_rows(_members(good), "records.jsonl"))
    assert not marker.exists()
    return len(cases)
