"""The portable memory file: one user's whole memory in one versioned file.

:func:`export_user` writes everything the engine keeps of one user, and nothing of anybody
else: records with their state and index status, the update history, pending jobs, the
per-user key-value state (open session, mechanism bookkeeping), graph nodes and edges,
artifacts (their bytes) and the embedder's identity, with the vectors when the index can
give them back. :func:`import_user` restores it into any engine: with the same embedder the
stored vectors are reused (nothing is embedded again); with another embedder the records are
re-embedded. The round trip is exact: records, state, history, graph and artifacts compare
equal after export and import into a fresh engine.

The file is a zip archive (a user's memory file is private and portable, as the
conditional-memory paper asks for):

* ``manifest.json``: ``format`` (:data:`FORMAT`), ``version`` (:data:`VERSION`), ``user_id``,
  ``exported_at``, ``embedder`` (name, dimension) and counts;
* ``records.jsonl``, ``history.jsonl``, ``jobs.jsonl``, ``graph.json``, ``state.json``;
* ``vectors.npy`` + ``vector_ids.json`` (optional);
* ``token_vectors.jsonl`` + ``token_vectors.npy`` (optional, version 2): the records'
  late-interaction token vectors (:mod:`memories_core.token_vectors`);
* ``artifacts/<n>/...`` with ``artifacts.json`` naming each artifact's folder.

Works for every mechanism, because it works on the engine (``memory.engine``).

A memory file is untrusted input. :func:`import_user` reads and validates the whole file
before it writes anything: the zip's size (members, expanded bytes, compression ratio, within
:class:`ImportLimits`), the manifest (format, version, the user id it names, counts), and every
row through the rules ``save`` applies (text length, metadata keys and values, timestamps,
finite numbers). Then it writes in one store transaction, with artifacts staged beside it
and vectors added after it commits, so that a refused or failed import leaves nothing and a
retry of a good file works. Nothing in a file is unpickled, and a training checkpoint
(an artifact named ``*.checkpoint``) is neither exported nor imported: only a checkpoint this
store wrote itself may be resumed.
"""

from __future__ import annotations

import builtins
import io
import json
import logging
import math
import re
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from memories_core import token_vectors as stored_tokens
from memories_core.errors import BackendError, InvalidInputError, MemoriesError
from memories_core.token_vectors import TokenVectors, TokenVectorStore
from memories_core.types import (
    MAX_META_INT,
    MIN_META_INT,
    GraphEdge,
    GraphNode,
    Job,
    MemoryRecord,
    RecordState,
    StateChange,
    check_metadata,
    check_user_id,
    clean_text,
    ensure_utc,
)

if TYPE_CHECKING:
    from memories_core.artifacts import ArtifactInfo, StagedArtifact
    from memories_core.engine import MemoryEngine

logger = logging.getLogger(__name__)

__all__ = [
    "FORMAT",
    "MIN_VERSION",
    "VERSION",
    "ImportLimits",
    "ImportReport",
    "MemoryFileError",
    "UserExistsError",
    "export_user",
    "import_user",
    "read_manifest",
]

#: The ``format`` field of every manifest.
FORMAT = "llm-memories/user"
#: The newest file format version this module writes and reads: 2 adds the optional
#: late-interaction token vectors; a file without them is still written as version 1.
VERSION = 2
#: The oldest file format version this module reads (there is no version 0).
MIN_VERSION = 1

#: Artifacts whose name ends so are resumable training state (MaLP's
#: ``malp/lora.checkpoint``): valid only in the store that wrote them, never exported or
#: imported, so that a checkpoint a file brings is never resumed.
CHECKPOINT_SUFFIX = ".checkpoint"


class UserExistsError(MemoriesError):
    """The target store holds the user already and ``on_conflict="refuse"`` was asked."""


class MemoryFileError(InvalidInputError):
    """A memory file that is refused: damaged, too large, of another version, or invalid.

    Nothing of it was written. The message names the member and row at fault.
    """


@dataclass(frozen=True)
class ImportLimits:
    """Bounds :func:`import_user` checks before it reads a member of a memory file.

    The defaults fit a memory of a million records; a service importing uploads may lower
    them.

    Attributes:
        max_members: Members of the zip archive.
        max_member_bytes: Expanded size of one member.
        max_total_bytes: Expanded size of all members together.
        max_ratio: Largest expanded/compressed ratio of a member larger than
            ``ratio_floor`` (a zip bomb expands a thousandfold; memory files compress
            about tenfold).
        ratio_floor: Members smaller than this many expanded bytes are not ratio-checked.
        max_records: Records in the file.
        max_rows: Rows of each other table (history, jobs, graph nodes, graph edges,
            state keys, artifacts).
        max_id_chars: Length of a record, job, node or edge id.
        max_depth: Nesting of JSON values (metadata, payloads, state).
    """

    max_members: int = 20_000
    max_member_bytes: int = 1 << 30
    max_total_bytes: int = 4 << 30
    max_ratio: float = 200.0
    ratio_floor: int = 1 << 20
    max_records: int = 1_000_000
    max_rows: int = 5_000_000
    max_id_chars: int = 256
    max_depth: int = 32

    def __post_init__(self) -> None:
        for name in (
            "max_members",
            "max_member_bytes",
            "max_total_bytes",
            "ratio_floor",
            "max_records",
            "max_rows",
            "max_id_chars",
            "max_depth",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError(f"ImportLimits.{name} must be a positive int")
        if not isinstance(self.max_ratio, (int, float)) or not self.max_ratio >= 1:
            raise InvalidInputError("ImportLimits.max_ratio must be a number >= 1")


@dataclass(frozen=True)
class ImportReport:
    """What :func:`import_user` did.

    Attributes:
        user_id: The user imported.
        records: Records added.
        skipped: Records skipped (already present, ``on_conflict="merge"``).
        reembedded: Whether the records were embedded again (the embedder differs or the file
            holds no vectors).
        history: History entries added.
        jobs: Pending jobs added.
        artifacts: Artifacts added.
        dropped: Artifacts of the file left out (training checkpoints, see
            :data:`CHECKPOINT_SUFFIX`).
    """

    user_id: str
    records: int
    skipped: int
    reembedded: bool
    history: int
    jobs: int
    artifacts: int
    dropped: tuple[str, ...] = field(default=())


def _engine(memory_or_engine: Any) -> MemoryEngine:
    from memories_core.engine import MemoryEngine

    engine = getattr(memory_or_engine, "engine", memory_or_engine)
    if not isinstance(engine, MemoryEngine):
        raise InvalidInputError(
            f"expected a MemoryEngine or a memory with .engine, got {type(memory_or_engine)}"
        )
    return engine


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _record_json(record: MemoryRecord, index_state: str | None) -> dict[str, Any]:
    return {
        "id": record.id,
        "kind": record.kind,
        "text": record.text,
        "created_at": record.created_at.isoformat(),
        "session_id": record.session_id,
        "metadata": dict(record.metadata),
        "source_ids": list(record.source_ids),
        "state": record.state.to_json(),
        "index": index_state,
    }


def _history_json(change: StateChange) -> dict[str, Any]:
    return {
        "record_id": change.record_id,
        "at": change.at.isoformat(),
        "old": dict(change.old),
        "new": dict(change.new),
        "reason": change.reason,
    }


def _job_json(job: Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "mechanism": job.mechanism,
        "kind": job.kind,
        "key": job.key,
        "payload": dict(job.payload),
        "attempts": job.attempts,
        "last_error": job.last_error,
        "next_attempt_at": job.next_attempt_at.isoformat(),
        "created_at": job.created_at.isoformat(),
    }


def _jsonl(rows: builtins.list[dict[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n" for row in rows)


# -- backend access the EngineStore protocol does not offer ------------------------------------
# The SQLite store keeps per-user key-value state and exact record state / job rows; the
# protocol has no bulk read or exact write for them, so these helpers use its connection
# when the store is the SQLite one, and fall back to the protocol otherwise.


def _user_state(engine: MemoryEngine, user_id: str) -> dict[str, Any]:
    return dict(engine.store.user_state(user_id))


def _read_vectors(engine: MemoryEngine, user_id: str, ids: builtins.list[str]) -> Any:
    """The stored vectors of ``ids`` (rows in that order), or ``None`` if not all readable."""
    read = getattr(engine.index, "vectors", None)
    if not ids or not callable(read):
        return None
    by_id = read(ids, user_id=user_id)
    if any(i not in by_id for i in ids):
        return None
    return np.stack([np.asarray(by_id[i], dtype=np.float32) for i in ids])


# -- export -----------------------------------------------------------------------------------


def export_user(memory_or_engine: Any, user_id: str, path: str | Path) -> Path:
    """Write everything ``user_id``'s memory holds to one portable file.

    Args:
        memory_or_engine: A :class:`~memories_core.engine.MemoryEngine` or any memory with
            an ``.engine`` (every mechanism of this package).
        user_id: Whose memory to export; nothing of another user is written.
        path: The file to write (a zip archive; conventionally ``*.memories.zip``).

    Returns:
        The path written.

    A training checkpoint (an artifact named ``*.checkpoint``) is left out: it is resumable
    state of this store, not memory.

    Raises:
        InvalidInputError: on an empty or reserved user id.
    """
    engine = _engine(memory_or_engine)
    check_user_id(user_id)
    engine.index_pending()  # so that the file carries vectors for everything indexable
    records = engine.records(user_id)
    index_states = engine.store.index_states(user_id)
    ids = [r.id for r in records if index_states.get(r.id) == "indexed"]
    vectors = _read_vectors(engine, user_id, ids)
    token_vectors = stored_tokens.export_rows(engine.store, user_id)
    history = engine.history(user_id)
    jobs = engine.pending(user_id)
    nodes = engine.store.graph_nodes(user_id)
    edges = engine.store.graph_edges(user_id)
    artifacts = [
        a for a in engine.artifacts.list(user_id) if not a.name.endswith(CHECKPOINT_SUFFIX)
    ]
    target = Path(path)
    if target.is_dir():
        raise InvalidInputError(f"{target} is a folder; give the path of the file to write")
    target.parent.mkdir(parents=True, exist_ok=True)
    counts = {
        "records": len(records),
        "history": len(history),
        "jobs": len(jobs),
        "graph_nodes": len(nodes),
        "graph_edges": len(edges),
        "artifacts": len(artifacts),
        "vectors": 0 if vectors is None else len(ids),
    }
    if token_vectors is not None:
        counts["token_vectors"] = token_vectors[stored_tokens.ROWS_MEMBER].count(b"\n")
    manifest = {
        "format": FORMAT,
        "version": 1 if token_vectors is None else 2,
        "user_id": user_id,
        "exported_at": engine.clock.now().isoformat(),
        "embedder": {"name": engine.embedder.name, "dimension": engine.embedder.dimension},
        "counts": counts,
    }
    tmp = target.with_name(target.name + ".tmp")
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            _write_members(
                archive,
                manifest,
                [_record_json(r, index_states.get(r.id)) for r in records],
                history,
                jobs,
                (nodes, edges),
                _user_state(engine, user_id),
                None if vectors is None else (ids, vectors),
                artifacts,
            )
            for name, data in (token_vectors or {}).items():
                archive.writestr(name, data)
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target


def _write_members(
    archive: zipfile.ZipFile,
    manifest: dict[str, Any],
    records: builtins.list[dict[str, Any]],
    history: builtins.list[StateChange],
    jobs: builtins.list[Job],
    graph: tuple[builtins.list[GraphNode], builtins.list[GraphEdge]],
    user_state: dict[str, Any],
    vectors: tuple[builtins.list[str], Any] | None,
    artifacts: builtins.list[ArtifactInfo],
) -> None:
    """Write every member of a memory file (see the module docstring for the layout)."""
    nodes, edges = graph
    archive.writestr("manifest.json", json.dumps(manifest, indent=2, sort_keys=True))
    archive.writestr("records.jsonl", _jsonl(records))
    archive.writestr("history.jsonl", _jsonl([_history_json(h) for h in history]))
    archive.writestr("jobs.jsonl", _jsonl([_job_json(j) for j in jobs]))
    archive.writestr(
        "graph.json",
        json.dumps(
            {
                "nodes": [
                    {"id": n.id, "kind": n.kind, "label": n.label, "data": dict(n.data)}
                    for n in nodes
                ],
                "edges": [
                    {
                        "id": e.id,
                        "source": e.source,
                        "target": e.target,
                        "relation": e.relation,
                        "record_id": e.record_id,
                        "data": dict(e.data),
                    }
                    for e in edges
                ],
            },
            ensure_ascii=False,
            sort_keys=True,
        ),
    )
    archive.writestr("state.json", json.dumps(user_state, ensure_ascii=False))
    if vectors is not None:
        ids, matrix = vectors
        buffer = io.BytesIO()
        np.save(buffer, matrix, allow_pickle=False)
        archive.writestr("vectors.npy", buffer.getvalue())
        archive.writestr("vector_ids.json", json.dumps(ids))
    listing = []
    for n, info in enumerate(artifacts):
        files = sorted(p for p in info.path.rglob("*") if p.is_file())
        for file in files:
            archive.write(file, f"artifacts/{n}/{file.relative_to(info.path).as_posix()}")
        listing.append(
            {
                "name": info.name,
                "folder": str(n),
                "created_at": info.created_at.isoformat(),
                "meta": dict(info.meta),
                "sha256": info.sha256,
            }
        )
    archive.writestr("artifacts.json", json.dumps(listing, ensure_ascii=False))


# -- reading an untrusted file ----------------------------------------------------------------

_TABLES = ("records.jsonl", "history.jsonl", "jobs.jsonl")
_JSON_MEMBERS = ("manifest.json", "graph.json", "state.json", "artifacts.json")
_REQUIRED = frozenset({*_TABLES, *_JSON_MEMBERS})
_VECTOR_MEMBERS = frozenset({"vectors.npy", "vector_ids.json"})
_TOKEN_MEMBERS = frozenset({stored_tokens.ROWS_MEMBER, stored_tokens.VALUES_MEMBER})
_ARTIFACT_MEMBER = re.compile(r"artifacts/(0|[1-9][0-9]{0,8})/(.+)")
_COUNTS = ("records", "history", "jobs", "graph_nodes", "graph_edges", "artifacts", "vectors")
_INDEX_STATES = frozenset({"indexed", "pending", "failed"})
#: Turn metadata the library writes itself (``save``); accepted in a file's records.
_LIBRARY_META_KEYS = frozenset({"role", "speaker", "batch_id"})
_MANIFEST_BYTES = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _fail(where: str, problem: str) -> MemoryFileError:
    return MemoryFileError(f"memory file refused: {where}: {problem}")


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


# -- row validation: the rules of save ----------------------------------------------------------


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
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _fail(where, "holds a lone surrogate") from exc
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


# -- import -----------------------------------------------------------------------------------


def import_user(
    memory_or_engine: Any,
    path: str | Path,
    *,
    on_conflict: Literal["refuse", "merge"] = "refuse",
    user_id: str | None = None,
    limits: ImportLimits | None = None,
) -> ImportReport:
    """Restore a memory file written by :func:`export_user`: validated first, then atomic.

    The whole file is read and checked before anything is written (see the module
    docstring and :class:`ImportLimits`); then records, their state, history, jobs, graph,
    per-user state and the artifact registry are written in one store transaction, with the
    artifacts' files staged beside it (removed if it fails). Vectors of the file are added
    after the commit when the embedder is the same; a failure there leaves the records
    pending, and the next indexing embeds them. A refused or failed import leaves nothing,
    so importing the good file afterwards works.

    Args:
        memory_or_engine: The target engine or a memory with ``.engine``.
        path: The memory file.
        on_conflict: If the target already holds the user: ``"refuse"`` raises
            :class:`UserExistsError` (nothing is written); ``"merge"`` adds what is missing
            (records, history entries, jobs, graph nodes and edges, artifacts, state keys by
            id or name) and keeps what the target has.
        user_id: The user the file must belong to (a service importing an upload for its
            signed-in user); a file naming another user is refused. ``None``: any user.
        limits: Size limits (default :class:`ImportLimits`).

    Returns:
        What was imported.

    Raises:
        MemoryFileError: on a file that is damaged, too large, of another format version,
            names a reserved or unexpected user, or holds a row ``save`` would refuse;
            also when a record id of the file belongs to another user of the target.
        InvalidInputError: on bad arguments, or a file that cannot be read.
        UserExistsError: if the user exists and ``on_conflict="refuse"``.
        BackendError: if the store fails while writing (nothing is kept).
    """
    if on_conflict not in ("refuse", "merge"):
        raise InvalidInputError(f"on_conflict must be 'refuse' or 'merge', got {on_conflict!r}")
    if user_id is not None:
        check_user_id(user_id)
    if limits is not None and not isinstance(limits, ImportLimits):
        raise InvalidInputError(f"limits must be ImportLimits, got {type(limits).__name__}")
    engine = _engine(memory_or_engine)
    memory_file = _read_file(path, limits or ImportLimits(), expected_user=user_id)
    with memory_file.reader.archive, engine.user_lock(memory_file.user_id):
        return _write(engine, memory_file, on_conflict)


def _refuse_existing(engine: MemoryEngine, user_id: str, on_conflict: str) -> None:
    if on_conflict != "refuse":
        return
    if engine.store.list(user_id=user_id, limit=1) or engine.artifacts.list(user_id):
        raise UserExistsError(
            f"this memory holds user {user_id!r} already; pass on_conflict='merge' to merge "
            "the file into it, or delete the user first"
        )


def _write(engine: MemoryEngine, file: _MemoryFile, on_conflict: str) -> ImportReport:
    user_id = file.user_id
    engine._finish_deletion(user_id)  # a delete_user interrupted earlier ends first
    _refuse_existing(engine, user_id, on_conflict)
    same_embedder = file.manifest["embedder"] == {
        "name": engine.embedder.name,
        "dimension": engine.embedder.dimension,
    }
    vectors = file.vectors if same_embedder and file.vectors is not None else {}
    have_artifacts = {a.name for a in engine.artifacts.list(user_id)}
    staged: list[tuple[_Artifact, StagedArtifact]] = []
    try:
        for artifact in file.artifacts:
            if artifact.name in have_artifacts:
                continue
            data = {name: file.reader.read(info.filename) for name, info in artifact.files.items()}
            done = engine.artifacts.stage(user_id, artifact.name, data)
            staged.append((artifact, done))
            if done.sha256 != artifact.sha256:
                raise _fail(
                    f"artifacts/{artifact.folder}/", "its files do not match their checksum"
                )
        with engine.transaction():
            written = _write_rows(engine, file, on_conflict, staged)
    except BaseException as exc:
        for _, done in staged:
            engine.artifacts.discard(done)
        if type(exc) is InvalidInputError:  # the store refused a row (another user's id)
            raise _fail("records.jsonl", str(exc)) from exc
        if isinstance(exc, MemoriesError) or not isinstance(exc, Exception):
            raise
        raise BackendError(f"the memory file could not be written: {exc}") from exc
    added = {r.id for r in file.records} - written.present
    reuse = [r for r in file.records if r.id in added and file.index[r.id] and r.id in vectors]
    if reuse:
        from memories_core.retrieval import index_metadata

        try:
            engine.index.add(
                [r.id for r in reuse],
                np.stack([vectors[r.id] for r in reuse]).astype(np.float32),
                [index_metadata(r) for r in reuse],
            )
            engine.store.mark_indexed([r.id for r in reuse])
        except Exception:
            engine.count_failure("index")
            logger.warning("imported vectors not stored; the records stay pending", exc_info=True)
    engine.index_pending()
    new = [r for r in file.records if r.id in added]
    return ImportReport(
        user_id=user_id,
        records=len(new),
        skipped=len(file.records) - len(new),
        reembedded=any(file.index[r.id] is not None and r.id not in vectors for r in new),
        history=written.history,
        jobs=written.jobs,
        artifacts=len(staged),
        dropped=file.dropped,
    )


@dataclass(frozen=True)
class _Written:
    """What one import transaction wrote: ids already present, history and jobs added."""

    present: set[str]
    history: int
    jobs: int


def _write_rows(
    engine: MemoryEngine,
    file: _MemoryFile,
    on_conflict: str,
    staged: builtins.list[tuple[_Artifact, StagedArtifact]],
) -> _Written:
    """Everything but vectors and artifact bytes, inside the caller's transaction."""
    user_id = file.user_id
    store = engine.store
    _refuse_existing(engine, user_id, on_conflict)  # again, inside the transaction
    present = {r.id for r in store.get([r.id for r in file.records], user_id=user_id)}
    new = [r for r in file.records if r.id not in present]
    store.add([r for r in new if file.index[r.id] is not None], indexed=True)
    store.add([r for r in new if file.index[r.id] is None], indexed=False)
    store.restore_state(user_id, {r.id: r.state for r in new})
    if file.token_vectors and isinstance(store, TokenVectorStore):
        added = {r.id for r in new}
        store.put_token_vectors(user_id, [t for t in file.token_vectors if t.record_id in added])
    have = {
        _History(h.record_id, h.at, dict(h.old), dict(h.new), h.reason).key()
        for h in store.history(user_id)
    }
    history = [h for h in file.history if h.key() not in have]
    for h in history:
        store.add_history(user_id, h.record_id, old=h.old, new=h.new, at=h.at, reason=h.reason)
    jobs = int(store.restore_jobs(user_id, file.jobs))
    node_ids = {n.id for n in store.graph_nodes(user_id)}
    edge_ids = {e.id for e in store.graph_edges(user_id)}
    store.put_graph(
        user_id,
        nodes=[n for n in file.nodes if n.id not in node_ids],
        edges=[e for e in file.edges if e.id not in edge_ids],
    )
    for key, value in file.state.items():
        if store.get_state(key, user_id=user_id) is None:
            store.set_state(key, value, user_id=user_id)
    for artifact, done in staged:
        # The original write time: the registry entry is part of the round trip.
        store.register_artifact(
            user_id,
            artifact.name,
            folder=done.folder,
            size=done.size,
            sha256=done.sha256,
            at=artifact.created_at,
            meta=artifact.meta,
        )
    return _Written(present=present, history=len(history), jobs=jobs)
