"""Writing a memory file: everything the engine keeps of one user, and nothing of anybody else."""

from __future__ import annotations

import builtins
import io
import json
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from memories_core import token_vectors as stored_tokens
from memories_core.errors import InvalidInputError
from memories_core.portable.format import CHECKPOINT_SUFFIX, FORMAT, _engine
from memories_core.types import (
    GraphEdge,
    GraphNode,
    Job,
    MemoryRecord,
    StateChange,
    check_user_id,
)

if TYPE_CHECKING:
    from memories_core.artifacts import ArtifactInfo
    from memories_core.engine import MemoryEngine

__all__ = ["export_user"]


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
