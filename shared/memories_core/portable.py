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
* ``artifacts/<n>/...`` with ``artifacts.json`` naming each artifact's folder.

Works for every mechanism, because it works on the engine (``memory.engine``).
"""

from __future__ import annotations

import builtins
import io
import json
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from memories_core.errors import InvalidInputError, MemoriesError
from memories_core.types import (
    GraphEdge,
    GraphNode,
    Job,
    MemoryRecord,
    RecordState,
    StateChange,
    check_user_id,
)

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine

__all__ = [
    "FORMAT",
    "VERSION",
    "ImportReport",
    "UserExistsError",
    "export_user",
    "import_user",
    "read_manifest",
]

#: The ``format`` field of every manifest.
FORMAT = "llm-memories/user"
#: The file format version this module writes (and the newest it reads).
VERSION = 1


class UserExistsError(MemoriesError):
    """The target store holds the user already and ``on_conflict="refuse"`` was asked."""


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
    """

    user_id: str
    records: int
    skipped: int
    reembedded: bool
    history: int
    jobs: int
    artifacts: int


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


def _time(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _state_from_json(data: Mapping[str, Any]) -> RecordState:
    return RecordState(
        strength=float(data["strength"]),
        recall_count=int(data["recall_count"]),
        last_recalled_at=_time(data["last_recalled_at"]),
        tier=data["tier"],
        valid_from=_time(data["valid_from"]),
        valid_until=_time(data["valid_until"]),
        archived=bool(data["archived"]),
        attrs=dict(data["attrs"]),
    )


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


def _record_from_json(user_id: str, data: Mapping[str, Any]) -> MemoryRecord:
    return MemoryRecord(
        id=data["id"],
        user_id=user_id,
        kind=data["kind"],
        text=data["text"],
        created_at=datetime.fromisoformat(data["created_at"]),
        session_id=data["session_id"],
        metadata=dict(data["metadata"]),
        source_ids=tuple(data["source_ids"]),
        state=_state_from_json(data["state"]),
    )


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


def _read_jsonl(archive: zipfile.ZipFile, name: str) -> builtins.list[dict[str, Any]]:
    if name not in archive.namelist():
        return []
    text = archive.read(name).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


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


def _restore_state(
    engine: MemoryEngine, user_id: str, states: Mapping[str, RecordState], at: datetime
) -> None:
    """Write record state exactly, without adding history entries."""
    engine.store.restore_state(user_id, states)


def _restore_jobs(engine: MemoryEngine, user_id: str, jobs: builtins.list[dict[str, Any]]) -> int:
    from memories_core.types import Job

    return int(
        engine.store.restore_jobs(
            user_id,
            [
                Job(
                    id=j["id"],
                    user_id=user_id,
                    mechanism=j["mechanism"],
                    kind=j["kind"],
                    key=j["key"],
                    payload=j["payload"],
                    attempts=j["attempts"],
                    last_error=j["last_error"],
                    next_attempt_at=datetime.fromisoformat(j["next_attempt_at"]),
                    created_at=datetime.fromisoformat(j["created_at"]),
                )
                for j in jobs
            ],
        )
    )


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

    Raises:
        InvalidInputError: on an empty user id.
    """
    engine = _engine(memory_or_engine)
    check_user_id(user_id)
    engine.index_pending()  # so that the file carries vectors for everything indexable
    records = engine.records(user_id)
    index_states = engine.store.index_states(user_id)
    ids = [r.id for r in records if index_states.get(r.id) == "indexed"]
    vectors = _read_vectors(engine, user_id, ids)
    history = engine.history(user_id)
    jobs = engine.pending(user_id)
    nodes = engine.store.graph_nodes(user_id)
    edges = engine.store.graph_edges(user_id)
    artifacts = engine.artifacts.list(user_id)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "user_id": user_id,
        "exported_at": engine.clock.now().isoformat(),
        "embedder": {"name": engine.embedder.name, "dimension": engine.embedder.dimension},
        "counts": {
            "records": len(records),
            "history": len(history),
            "jobs": len(jobs),
            "graph_nodes": len(nodes),
            "graph_edges": len(edges),
            "artifacts": len(artifacts),
            "vectors": 0 if vectors is None else len(ids),
        },
    }
    tmp = target.with_name(target.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("manifest.json", json.dumps(manifest, indent=2, sort_keys=True))
        archive.writestr(
            "records.jsonl", _jsonl([_record_json(r, index_states.get(r.id)) for r in records])
        )
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
        archive.writestr("state.json", json.dumps(_user_state(engine, user_id), ensure_ascii=False))
        if vectors is not None:
            buffer = io.BytesIO()
            np.save(buffer, vectors, allow_pickle=False)
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
    tmp.replace(target)
    return target


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The manifest of a memory file (format, version, user, embedder, counts).

    Raises:
        InvalidInputError: if the file is not a memory file of a version this code reads.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            manifest = json.loads(archive.read("manifest.json"))
    except (OSError, KeyError, zipfile.BadZipFile, ValueError) as exc:
        raise InvalidInputError(f"{path} is not an llm-memories memory file: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InvalidInputError(f"{path} is not an llm-memories memory file")
    if not isinstance(manifest.get("version"), int) or manifest["version"] > VERSION:
        raise InvalidInputError(
            f"{path} has format version {manifest.get('version')}; this llm-memories reads "
            f"versions up to {VERSION}: upgrade the package"
        )
    return manifest


# -- import -----------------------------------------------------------------------------------


def import_user(
    memory_or_engine: Any,
    path: str | Path,
    *,
    on_conflict: Literal["refuse", "merge"] = "refuse",
) -> ImportReport:
    """Restore a memory file written by :func:`export_user`.

    Args:
        memory_or_engine: The target engine or a memory with ``.engine``.
        path: The memory file.
        on_conflict: If the target already holds the user: ``"refuse"`` raises
            :class:`UserExistsError` (nothing is written); ``"merge"`` adds what is missing
            (records, history entries, jobs, graph nodes and edges, artifacts, state keys by
            id or name) and keeps what the target has.

    Returns:
        What was imported.

    Raises:
        InvalidInputError: on a file that is not a memory file, or a bad ``on_conflict``.
        UserExistsError: if the user exists and ``on_conflict="refuse"``.
    """
    if on_conflict not in ("refuse", "merge"):
        raise InvalidInputError(f"on_conflict must be 'refuse' or 'merge', got {on_conflict!r}")
    engine = _engine(memory_or_engine)
    manifest = read_manifest(path)
    user_id = check_user_id(manifest["user_id"])
    existing = {r.id for r in engine.records(user_id)}
    exists = bool(existing) or bool(engine.artifacts.list(user_id))
    if exists and on_conflict == "refuse":
        raise UserExistsError(
            f"this memory holds user {user_id!r} already; pass on_conflict='merge' to merge "
            "the file into it, or delete the user first"
        )
    same_embedder = manifest["embedder"] == {
        "name": engine.embedder.name,
        "dimension": engine.embedder.dimension,
    }
    with zipfile.ZipFile(path) as archive:
        rows = _read_jsonl(archive, "records.jsonl")
        history = _read_jsonl(archive, "history.jsonl")
        jobs = _read_jsonl(archive, "jobs.jsonl")
        graph = json.loads(archive.read("graph.json"))
        user_state = json.loads(archive.read("state.json"))
        vectors: dict[str, Any] = {}
        if same_embedder and "vectors.npy" in archive.namelist():
            matrix = np.load(io.BytesIO(archive.read("vectors.npy")), allow_pickle=False)
            vectors = dict(zip(json.loads(archive.read("vector_ids.json")), matrix, strict=True))
        listing = json.loads(archive.read("artifacts.json"))
        artifact_files: dict[str, dict[str, bytes]] = {}
        for item in listing:
            prefix = f"artifacts/{item['folder']}/"
            artifact_files[item["name"]] = {
                name[len(prefix) :]: archive.read(name)
                for name in archive.namelist()
                if name.startswith(prefix)
            }
    new_rows = [row for row in rows if row["id"] not in existing]
    records = [_record_from_json(user_id, row) for row in new_rows]
    indexable = {row["id"] for row in new_rows if row["index"] is not None}
    have_history = {json.dumps(_history_json(h), sort_keys=True) for h in engine.history(user_id)}
    new_history = [h for h in history if json.dumps(h, sort_keys=True) not in have_history]
    node_ids = {n.id for n in engine.store.graph_nodes(user_id)}
    edge_ids = {e.id for e in engine.store.graph_edges(user_id)}
    now = engine.clock.now()
    with engine.transaction():
        engine.store.add([r for r in records if r.id in indexable], indexed=True)
        engine.store.add([r for r in records if r.id not in indexable], indexed=False)
        _restore_state(engine, user_id, {r.id: r.state for r in records}, now)
        for h in new_history:
            engine.store.add_history(
                user_id,
                h["record_id"],
                old=h["old"],
                new=h["new"],
                at=datetime.fromisoformat(h["at"]),
                reason=h["reason"],
            )
        job_count = _restore_jobs(engine, user_id, jobs)
        engine.store.put_graph(
            user_id,
            nodes=[
                GraphNode(n["id"], n["kind"], n["label"], n["data"])
                for n in graph["nodes"]
                if n["id"] not in node_ids
            ],
            edges=[
                GraphEdge(
                    e["id"], e["source"], e["target"], e["relation"], e["record_id"], e["data"]
                )
                for e in graph["edges"]
                if e["id"] not in edge_ids
            ],
        )
        for key, value in user_state.items():
            if engine.store.get_state(key, user_id=user_id) is None:
                engine.store.set_state(key, value, user_id=user_id)
    # Reuse the file's vectors with the same embedder; embed the rest (another embedder, or
    # records that were pending when exported).
    reuse = [r for r in records if r.id in indexable and r.id in vectors]
    if reuse:
        from memories_core.retrieval import index_metadata

        engine.index.add(
            [r.id for r in reuse],
            np.stack([vectors[r.id] for r in reuse]).astype(np.float32),
            [index_metadata(r) for r in reuse],
        )
        engine.store.mark_indexed([r.id for r in reuse])
    reembedded = any(r.id in indexable and r.id not in vectors for r in records)
    engine.index_pending()
    artifacts = 0
    for item in listing:
        if engine.artifacts.get(user_id, item["name"]) is not None:
            continue
        info = engine.artifacts.put(
            user_id, item["name"], artifact_files[item["name"]], meta=item["meta"]
        )
        # Keep the original write time: the registry entry is part of the round trip.
        engine.store.register_artifact(
            user_id,
            item["name"],
            folder=str(info.path.relative_to(engine.artifacts.root).as_posix()),
            size=info.size,
            sha256=info.sha256,
            at=datetime.fromisoformat(item["created_at"]),
            meta=item["meta"],
        )
        artifacts += 1
    return ImportReport(
        user_id=user_id,
        records=len(records),
        skipped=len(rows) - len(new_rows),
        reembedded=reembedded,
        history=len(new_history),
        jobs=job_count,
        artifacts=artifacts,
    )
