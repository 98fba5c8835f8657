"""Reading a memory file: the whole file is validated before anything is written."""

from __future__ import annotations

import builtins
import io
import json
import math
import re
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from memories_core import token_vectors as stored_tokens
from memories_core.errors import InvalidInputError
from memories_core.portable.format import (
    _ARTIFACT_MEMBER,
    _COUNTS,
    _INDEX_STATES,
    _LIBRARY_META_KEYS,
    _MANIFEST_BYTES,
    _REQUIRED,
    _SHA256,
    _TOKEN_MEMBERS,
    _VECTOR_MEMBERS,
    CHECKPOINT_SUFFIX,
    FORMAT,
    MIN_VERSION,
    VERSION,
    ImportLimits,
    _fail,
)
from memories_core.token_vectors import TokenVectors
from memories_core.types import (
    MAX_META_INT,
    MIN_META_INT,
    GraphEdge,
    GraphNode,
    Job,
    MemoryRecord,
    RecordState,
    check_metadata,
    check_user_id,
    clean_text,
    ensure_utc,
    holds_lone_surrogate,
)

__all__ = ["read_manifest"]


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


class _Reader:
    """Validates one memory file; every problem raises :class:`MemoryFileError`."""

    def __init__(self, archive: zipfile.ZipFile, limits: ImportLimits) -> None:
        self.archive = archive
        self.limits = limits
        self.members: dict[str, zipfile.ZipInfo] = {}
        self.artifact_members: dict[str, dict[str, zipfile.ZipInfo]] = {}

    # -- the archive ---------------------------------------------------------------------
    def check_archive(self) -> None:
        """Member count, sizes and ratios, from the central directory (nothing is read)."""
        limits = self.limits
        infos = self.archive.infolist()
        if len(infos) > limits.max_members:
            raise _fail("archive", f"{len(infos)} members; the limit is {limits.max_members}")
        total = 0
        for info in infos:
            name = info.filename
            if name in self.members:
                raise _fail(name, "the archive holds this member twice")
            if info.flag_bits & 0x1:
                raise _fail(name, "the member is encrypted")
            if info.file_size > limits.max_member_bytes:
                raise _fail(
                    name,
                    f"expands to {info.file_size} bytes; the limit is {limits.max_member_bytes}",
                )
            if info.file_size > limits.ratio_floor and (
                info.file_size > limits.max_ratio * max(info.compress_size, 1)
            ):
                raise _fail(
                    name,
                    f"expands {info.file_size / max(info.compress_size, 1):.0f}-fold; "
                    f"the limit is {limits.max_ratio:.0f}",
                )
            total += info.file_size
            if total > limits.max_total_bytes:
                raise _fail(
                    "archive", f"expands to over {limits.max_total_bytes} bytes (the limit)"
                )
            self.members[name] = info
        if "manifest.json" not in self.members:
            raise _fail("archive", "no manifest.json: not an llm-memories memory file")

    def check_names(self) -> None:
        """Every member is one the format (of a version read) names; none is missing."""
        for name, info in self.members.items():
            match = _ARTIFACT_MEMBER.fullmatch(name)
            if match is not None:
                file = _artifact_file_name(match.group(2), name, self.limits)
                self.artifact_members.setdefault(match.group(1), {})[file] = info
            elif name not in _REQUIRED and name not in _VECTOR_MEMBERS | _TOKEN_MEMBERS:
                raise _fail(name, "not a member of the memory file format")
        missing = sorted(_REQUIRED - set(self.members))
        if missing:
            raise _fail("archive", f"missing member(s) {', '.join(missing)}")
        vectors = _VECTOR_MEMBERS & set(self.members)
        if vectors and vectors != _VECTOR_MEMBERS:
            raise _fail("archive", "vectors.npy and vector_ids.json come together")
        tokens = _TOKEN_MEMBERS & set(self.members)
        if tokens and tokens != _TOKEN_MEMBERS:
            raise _fail("archive", "token_vectors.jsonl and token_vectors.npy come together")

    def read(self, name: str, limit: int | None = None) -> bytes:
        """A member's bytes, read no further than its declared (and checked) size."""
        info = self.members[name]
        bound = info.file_size if limit is None else min(info.file_size, limit)
        if info.file_size > bound:
            raise _fail(name, f"larger than {bound} bytes")
        try:
            with self.archive.open(info) as handle:
                data = handle.read(bound + 1)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError, RuntimeError) as exc:
            raise _fail(name, f"damaged ({type(exc).__name__}: {exc})") from exc
        except NotImplementedError as exc:
            raise _fail(name, f"unsupported compression: {exc}") from exc
        if len(data) != info.file_size:
            raise _fail(name, "its size differs from the one the archive declares")
        return data

    def text(self, name: str, limit: int | None = None) -> str:
        try:
            return self.read(name, limit).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _fail(name, f"not UTF-8 ({exc})") from exc

    def load_json(self, name: str, limit: int | None = None) -> Any:
        return _loads(self.text(name, limit), name)

    def load_jsonl(self, name: str, limit: int) -> builtins.list[dict[str, Any]]:
        rows: builtins.list[dict[str, Any]] = []
        for number, line in enumerate(self.text(name).split("\n"), start=1):
            if not line.strip():
                continue
            if len(rows) >= limit:
                raise _fail(name, f"more than {limit} rows (the limit)")
            row = _loads(line, f"{name} line {number}")
            if not isinstance(row, dict):
                raise _fail(f"{name} line {number}", "a row must be a JSON object")
            rows.append(row)
        return rows


def _loads(text: str, where: str) -> Any:
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except RecursionError as exc:
        raise _fail(where, "JSON nested too deeply") from exc
    except ValueError as exc:
        raise _fail(where, f"not valid JSON ({exc})") from exc


def _artifact_file_name(file: str, where: str, limits: ImportLimits) -> str:
    """An artifact's file name from the archive: a plain relative path inside its folder."""
    parts = file.split("/")
    if (
        len(file) > 1000
        or "\\" in file
        or "\x00" in file
        or any(p in ("", ".", "..") or p.startswith(".") for p in parts)
        or PurePosixPath(file).is_absolute()
        or len(parts) > limits.max_depth
    ):
        raise _fail(where, "an artifact file name must be a plain relative path")
    return file


def _fields(
    row: Any, where: str, required: frozenset[str], optional: frozenset[str] = frozenset()
) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise _fail(where, "must be a JSON object")
    missing = sorted(required - set(row))
    if missing:
        raise _fail(where, f"missing field(s) {', '.join(missing)}")
    unknown = sorted(set(row) - required - optional)
    if unknown:
        raise _fail(where, f"unknown field(s) {', '.join(map(str, unknown))}")
    return row


def _str(value: Any, where: str, *, limit: int, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise _fail(where, "must be a non-empty string")
    if len(value) > limit:
        raise _fail(where, f"longer than {limit} characters")
    if "\x00" in value:
        raise _fail(where, "holds a NUL character")
    if holds_lone_surrogate(value):
        raise _fail(where, "holds a lone surrogate")
    return value


def _opt_str(value: Any, where: str, *, limit: int) -> str | None:
    return None if value is None else _str(value, where, limit=limit, empty=True)


def _int(value: Any, where: str, *, low: int = 0, high: int = MAX_META_INT) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise _fail(where, f"must be an integer from {low} to {high}")
    return value


def _time(value: Any, where: str) -> datetime:
    if not isinstance(value, str) or len(value) > 64:
        raise _fail(where, "must be an ISO 8601 time")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise _fail(where, f"must be an ISO 8601 time ({exc})") from exc
    if parsed.tzinfo is None:
        raise _fail(where, "must carry a time zone")
    return ensure_utc(parsed)


def _opt_time(value: Any, where: str) -> datetime | None:
    return None if value is None else _time(value, where)


def _json_value(value: Any, where: str, depth: int) -> Any:
    """A JSON value with finite numbers and 64-bit integers, nested at most ``depth`` deep."""
    if depth < 0:
        raise _fail(where, "nested too deeply")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return _str(value, where, limit=10_000_000, empty=True)
    if isinstance(value, int):
        return _int(value, where, low=MIN_META_INT)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise _fail(where, "must be a finite number")
        return value
    if isinstance(value, list):
        return [_json_value(v, f"{where}[{i}]", depth - 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {
            _str(k, f"{where} key", limit=1000, empty=True): _json_value(
                v, f"{where}.{k}", depth - 1
            )
            for k, v in value.items()
        }
    raise _fail(where, f"unexpected {type(value).__name__}")  # pragma: no cover - JSON types


def _json_object(value: Any, where: str, depth: int) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, "must be a JSON object")
    out = _json_value(value, where, depth)
    assert isinstance(out, dict)
    return out


_RECORD_FIELDS = frozenset(
    {"id", "kind", "text", "created_at", "session_id", "metadata", "source_ids", "state", "index"}
)


_STATE_FIELDS = frozenset(
    {
        "strength",
        "recall_count",
        "last_recalled_at",
        "tier",
        "valid_from",
        "valid_until",
        "archived",
        "attrs",
    }
)


def _state(value: Any, where: str, limits: ImportLimits) -> RecordState:
    data = _fields(value, where, _STATE_FIELDS)
    strength = data["strength"]
    if (
        isinstance(strength, bool)
        or not isinstance(strength, (int, float))
        or not math.isfinite(strength)
    ):
        raise _fail(f"{where}.strength", "must be a finite number")
    if not isinstance(data["archived"], bool):
        raise _fail(f"{where}.archived", "must be true or false")
    return RecordState(
        strength=float(strength),
        recall_count=_int(data["recall_count"], f"{where}.recall_count"),
        last_recalled_at=_opt_time(data["last_recalled_at"], f"{where}.last_recalled_at"),
        tier=_opt_str(data["tier"], f"{where}.tier", limit=limits.max_id_chars),
        valid_from=_opt_time(data["valid_from"], f"{where}.valid_from"),
        valid_until=_opt_time(data["valid_until"], f"{where}.valid_until"),
        archived=data["archived"],
        attrs=_json_object(data["attrs"], f"{where}.attrs", limits.max_depth),
    )


def _record(
    user_id: str, row: dict[str, Any], where: str, limits: ImportLimits
) -> tuple[MemoryRecord, str | None]:
    """A record row through the rules of ``save``; returns the record and its index state."""
    data = _fields(row, where, _RECORD_FIELDS)
    index = data["index"]
    if index is not None and index not in _INDEX_STATES:
        raise _fail(f"{where}.index", f"must be null or one of {sorted(_INDEX_STATES)}")
    try:
        text = clean_text(data["text"], what="text")
        metadata = check_metadata(data["metadata"], allow_reserved=_LIBRARY_META_KEYS)
    except InvalidInputError as exc:
        raise _fail(where, str(exc)) from exc
    _json_value(metadata, f"{where}.metadata", limits.max_depth)
    sources = data["source_ids"]
    if not isinstance(sources, list) or len(sources) > limits.max_rows:
        raise _fail(f"{where}.source_ids", "must be a list of ids")
    record = MemoryRecord(
        id=_str(data["id"], f"{where}.id", limit=limits.max_id_chars),
        user_id=user_id,
        kind=_str(data["kind"], f"{where}.kind", limit=limits.max_id_chars),
        text=text,
        created_at=_time(data["created_at"], f"{where}.created_at"),
        session_id=_opt_str(data["session_id"], f"{where}.session_id", limit=1024),
        metadata=metadata,
        source_ids=tuple(
            _str(s, f"{where}.source_ids[{i}]", limit=limits.max_id_chars)
            for i, s in enumerate(sources)
        ),
        state=_state(data["state"], f"{where}.state", limits),
    )
    return record, index


@dataclass
class _History:
    record_id: str
    at: datetime
    old: dict[str, Any]
    new: dict[str, Any]
    reason: str | None

    def key(self) -> str:
        return json.dumps(
            {
                "record_id": self.record_id,
                "at": self.at.isoformat(),
                "old": self.old,
                "new": self.new,
                "reason": self.reason,
            },
            sort_keys=True,
        )


def _history(row: dict[str, Any], where: str, limits: ImportLimits) -> _History:
    data = _fields(row, where, frozenset({"record_id", "at", "old", "new", "reason"}))
    return _History(
        record_id=_str(data["record_id"], f"{where}.record_id", limit=limits.max_id_chars),
        at=_time(data["at"], f"{where}.at"),
        old=_json_object(data["old"], f"{where}.old", limits.max_depth),
        new=_json_object(data["new"], f"{where}.new", limits.max_depth),
        reason=_opt_str(data["reason"], f"{where}.reason", limit=100_000),
    )


def _job(user_id: str, row: dict[str, Any], where: str, limits: ImportLimits) -> Job:
    data = _fields(
        row,
        where,
        frozenset(
            {
                "id",
                "mechanism",
                "kind",
                "key",
                "payload",
                "attempts",
                "last_error",
                "next_attempt_at",
                "created_at",
            }
        ),
    )
    return Job(
        id=_str(data["id"], f"{where}.id", limit=limits.max_id_chars),
        user_id=user_id,
        mechanism=_str(data["mechanism"], f"{where}.mechanism", limit=limits.max_id_chars),
        kind=_str(data["kind"], f"{where}.kind", limit=limits.max_id_chars),
        key=_str(data["key"], f"{where}.key", limit=1024),
        payload=_json_object(data["payload"], f"{where}.payload", limits.max_depth),
        attempts=_int(data["attempts"], f"{where}.attempts", high=1_000_000),
        last_error=_opt_str(data["last_error"], f"{where}.last_error", limit=100_000),
        next_attempt_at=_time(data["next_attempt_at"], f"{where}.next_attempt_at"),
        created_at=_time(data["created_at"], f"{where}.created_at"),
    )


def _graph(value: Any, limits: ImportLimits) -> tuple[list[GraphNode], list[GraphEdge]]:
    data = _fields(value, "graph.json", frozenset({"nodes", "edges"}))
    nodes_in, edges_in = data["nodes"], data["edges"]
    if not isinstance(nodes_in, list) or not isinstance(edges_in, list):
        raise _fail("graph.json", "nodes and edges must be lists")
    if len(nodes_in) > limits.max_rows or len(edges_in) > limits.max_rows:
        raise _fail("graph.json", f"more than {limits.max_rows} nodes or edges (the limit)")
    chars = limits.max_id_chars
    nodes: list[GraphNode] = []
    for i, raw in enumerate(nodes_in):
        where = f"graph.json nodes[{i}]"
        n = _fields(raw, where, frozenset({"id", "kind", "label", "data"}))
        nodes.append(
            GraphNode(
                _str(n["id"], f"{where}.id", limit=chars),
                _str(n["kind"], f"{where}.kind", limit=chars),
                _str(n["label"], f"{where}.label", limit=100_000, empty=True),
                _json_object(n["data"], f"{where}.data", limits.max_depth),
            )
        )
    edges: list[GraphEdge] = []
    for i, raw in enumerate(edges_in):
        where = f"graph.json edges[{i}]"
        e = _fields(
            raw, where, frozenset({"id", "source", "target", "relation", "record_id", "data"})
        )
        edges.append(
            GraphEdge(
                _str(e["id"], f"{where}.id", limit=chars),
                _str(e["source"], f"{where}.source", limit=chars),
                _str(e["target"], f"{where}.target", limit=chars),
                _str(e["relation"], f"{where}.relation", limit=100_000),
                _opt_str(e["record_id"], f"{where}.record_id", limit=chars),
                _json_object(e["data"], f"{where}.data", limits.max_depth),
            )
        )
    _unique([n.id for n in nodes], "graph.json nodes")
    _unique([e.id for e in edges], "graph.json edges")
    return nodes, edges


def _unique(ids: builtins.list[str], where: str) -> None:
    seen: set[str] = set()
    for item in ids:
        if item in seen:
            raise _fail(where, f"{item!r} appears twice")
        seen.add(item)


@dataclass
class _Artifact:
    name: str
    folder: str
    created_at: datetime
    meta: dict[str, Any]
    sha256: str
    files: dict[str, zipfile.ZipInfo]


@dataclass
class _MemoryFile:
    """A validated memory file, not yet written anywhere."""

    manifest: dict[str, Any]
    user_id: str
    records: builtins.list[MemoryRecord]
    index: dict[str, str | None]
    history: builtins.list[_History]
    jobs: builtins.list[Job]
    nodes: builtins.list[GraphNode]
    edges: builtins.list[GraphEdge]
    state: dict[str, Any]
    vectors: dict[str, np.ndarray] | None
    token_vectors: builtins.list[TokenVectors]
    artifacts: builtins.list[_Artifact]
    dropped: tuple[str, ...]
    reader: _Reader


def _manifest(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict) or value.get("format") != FORMAT:
        raise _fail(where, "not an llm-memories memory file")
    version = value.get("version")
    if isinstance(version, bool) or not isinstance(version, int):
        raise _fail(where, "its format version must be an integer")
    if version > VERSION:
        raise _fail(
            where,
            f"format version {version}; this llm-memories reads versions {MIN_VERSION} to "
            f"{VERSION}: upgrade the package",
        )
    if version < MIN_VERSION:
        raise _fail(where, f"format version {version} does not exist (the first is {MIN_VERSION})")
    data = _fields(
        value,
        where,
        frozenset({"format", "version", "user_id", "exported_at", "embedder", "counts"}),
    )
    try:
        check_user_id(data["user_id"])
    except InvalidInputError as exc:
        raise _fail(f"{where} user_id", str(exc)) from exc
    _time(data["exported_at"], f"{where} exported_at")
    embedder = _fields(data["embedder"], f"{where} embedder", frozenset({"name", "dimension"}))
    _str(embedder["name"], f"{where} embedder.name", limit=1000)
    _int(embedder["dimension"], f"{where} embedder.dimension", low=1, high=1 << 20)
    optional = frozenset({"token_vectors"}) if version >= 2 else frozenset()
    counts = _fields(data["counts"], f"{where} counts", frozenset(_COUNTS), optional)
    for name in (*_COUNTS, *sorted(optional & set(counts))):
        _int(counts[name], f"{where} counts.{name}")
    return data


def _read_file(path: str | Path, limits: ImportLimits, *, expected_user: str | None) -> _MemoryFile:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as exc:
        raise _fail(str(path), f"not a zip archive ({exc})") from exc
    except OSError as exc:
        raise InvalidInputError(f"cannot read memory file {path}: {exc}") from exc
    try:
        return _read_archive(archive, limits, expected_user)
    except BaseException:
        archive.close()
        raise


def _read_archive(
    archive: zipfile.ZipFile, limits: ImportLimits, expected_user: str | None
) -> _MemoryFile:
    reader = _Reader(archive, limits)
    reader.check_archive()
    manifest = _manifest(reader.load_json("manifest.json", _MANIFEST_BYTES), "manifest.json")
    reader.check_names()
    user_id: str = manifest["user_id"]
    if expected_user is not None and user_id != expected_user:
        raise _fail("manifest.json user_id", f"the file holds user {user_id!r}, not the expected")
    counts = manifest["counts"]

    rows = reader.load_jsonl("records.jsonl", limits.max_records)
    records: list[MemoryRecord] = []
    index: dict[str, str | None] = {}
    for number, row in enumerate(rows, start=1):
        record, state = _record(user_id, row, f"records.jsonl line {number}", limits)
        records.append(record)
        index[record.id] = state
    _unique([r.id for r in records], "records.jsonl")
    history = [
        _history(row, f"history.jsonl row {i}", limits)
        for i, row in enumerate(reader.load_jsonl("history.jsonl", limits.max_rows), start=1)
    ]
    jobs = [
        _job(user_id, row, f"jobs.jsonl row {i}", limits)
        for i, row in enumerate(reader.load_jsonl("jobs.jsonl", limits.max_rows), start=1)
    ]
    _unique([j.id for j in jobs], "jobs.jsonl")
    nodes, edges = _graph(reader.load_json("graph.json"), limits)
    raw_state = reader.load_json("state.json")
    if not isinstance(raw_state, dict) or len(raw_state) > limits.max_rows:
        raise _fail("state.json", "must be a JSON object of at most max_rows keys")
    user_state = {
        _str(k, "state.json key", limit=1000): _json_value(v, f"state.json {k}", limits.max_depth)
        for k, v in raw_state.items()
    }
    artifacts, dropped = _artifacts(reader, limits)
    vectors = _vectors(reader, manifest, index)
    token_vectors: list[TokenVectors] = []
    if stored_tokens.ROWS_MEMBER in reader.members:
        if manifest["version"] < 2:
            raise _fail(stored_tokens.ROWS_MEMBER, "token vectors need format version 2")
        token_vectors = stored_tokens.read_rows(
            reader.read, set(index), max_rows=limits.max_records, fail=_fail
        )
    if counts.get("token_vectors", 0) != len(token_vectors):
        raise _fail("manifest.json counts", "token_vectors does not match the file")
    actual = {
        "records": len(records),
        "history": len(history),
        "jobs": len(jobs),
        "graph_nodes": len(nodes),
        "graph_edges": len(edges),
        "artifacts": len(artifacts) + len(dropped),
        "vectors": 0 if vectors is None else len(vectors),
    }
    for name, count in actual.items():
        if counts[name] != count:
            raise _fail(
                "manifest.json counts", f"{name} is {counts[name]} but the file holds {count}"
            )
    return _MemoryFile(
        manifest=manifest,
        user_id=user_id,
        records=records,
        index=index,
        history=history,
        jobs=jobs,
        nodes=nodes,
        edges=edges,
        state=user_state,
        vectors=vectors,
        token_vectors=token_vectors,
        artifacts=artifacts,
        dropped=dropped,
        reader=reader,
    )


def _artifacts(
    reader: _Reader, limits: ImportLimits
) -> tuple[builtins.list[_Artifact], tuple[str, ...]]:
    from memories_core.artifacts import check_artifact_name

    listing = reader.load_json("artifacts.json")
    if not isinstance(listing, list) or len(listing) > limits.max_rows:
        raise _fail("artifacts.json", "must be a list")
    artifacts: list[_Artifact] = []
    dropped: list[str] = []
    for i, raw in enumerate(listing):
        where = f"artifacts.json [{i}]"
        item = _fields(raw, where, frozenset({"name", "folder", "created_at", "meta", "sha256"}))
        try:
            name = check_artifact_name(item["name"])
        except InvalidInputError as exc:
            raise _fail(f"{where}.name", str(exc)) from exc
        _str(name, f"{where}.name", limit=200)
        folder = item["folder"]
        if not isinstance(folder, str) or not re.fullmatch(r"0|[1-9][0-9]{0,8}", folder):
            raise _fail(f"{where}.folder", "must be a folder number")
        sha256 = item["sha256"]
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise _fail(f"{where}.sha256", "must be a SHA-256 hex digest")
        files = reader.artifact_members.get(folder, {})
        if not files:
            raise _fail(where, f"no files under artifacts/{folder}/")
        artifact = _Artifact(
            name=name,
            folder=folder,
            created_at=_time(item["created_at"], f"{where}.created_at"),
            meta=_json_object(item["meta"], f"{where}.meta", limits.max_depth),
            sha256=sha256,
            files=files,
        )
        if name.endswith(CHECKPOINT_SUFFIX):
            dropped.append(name)
        else:
            artifacts.append(artifact)
    named = [a.name for a in artifacts] + dropped
    _unique(named, "artifacts.json names")
    folders = [str(raw["folder"]) for raw in listing]
    _unique(folders, "artifacts.json folders")
    stray = sorted(set(reader.artifact_members) - set(folders))
    if stray:
        raise _fail(f"artifacts/{stray[0]}/", "files of no listed artifact")
    return artifacts, tuple(dropped)


def _vectors(
    reader: _Reader, manifest: Mapping[str, Any], index: Mapping[str, str | None]
) -> dict[str, np.ndarray] | None:
    if "vectors.npy" not in reader.members:
        return None
    ids = reader.load_json("vector_ids.json")
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise _fail("vector_ids.json", "must be a list of record ids")
    _unique(ids, "vector_ids.json")
    for rid in ids:
        if index.get(rid, None) is None:
            raise _fail("vector_ids.json", f"{rid!r} is no indexed record of the file")
    try:
        matrix = np.load(io.BytesIO(reader.read("vectors.npy")), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:  # a pickled array is a ValueError here
        raise _fail("vectors.npy", f"not a plain numeric array ({exc})") from exc
    dimension = manifest["embedder"]["dimension"]
    if (
        not isinstance(matrix, np.ndarray)
        or matrix.dtype.kind != "f"
        or matrix.shape != (len(ids), dimension)
    ):
        raise _fail(
            "vectors.npy",
            f"must be a float array of shape ({len(ids)}, {dimension}), "
            f"got {getattr(matrix, 'dtype', '?')} {getattr(matrix, 'shape', '?')}",
        )
    if not np.isfinite(matrix).all():
        raise _fail("vectors.npy", "holds a non-finite number")
    matrix = matrix.astype(np.float32)
    return dict(zip(ids, matrix, strict=True))


def read_manifest(path: str | Path, *, limits: ImportLimits | None = None) -> dict[str, Any]:
    """The manifest of a memory file (format, version, user, embedder, counts).

    Only the archive's directory and the manifest are read; :func:`import_user` validates
    the rest.

    Raises:
        MemoryFileError: if the file is not a memory file of a version this code reads, or
            breaks ``limits``.
        InvalidInputError: if the file cannot be read.
    """
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as exc:
        raise _fail(str(path), f"not a zip archive ({exc})") from exc
    except OSError as exc:
        raise InvalidInputError(f"cannot read memory file {path}: {exc}") from exc
    with archive:
        reader = _Reader(archive, limits or ImportLimits())
        reader.check_archive()
        return _manifest(reader.load_json("manifest.json", _MANIFEST_BYTES), "manifest.json")
