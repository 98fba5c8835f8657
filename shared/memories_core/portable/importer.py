"""Writing a validated memory file into an engine in one store transaction."""

from __future__ import annotations

import builtins
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from memories_core.errors import BackendError, InvalidInputError, MemoriesError
from memories_core.portable.format import (
    ImportLimits,
    ImportReport,
    UserExistsError,
    _engine,
    _fail,
)
from memories_core.portable.reader import _Artifact, _History, _MemoryFile, _read_file
from memories_core.token_vectors import TokenVectorStore
from memories_core.types import (
    check_user_id,
)

if TYPE_CHECKING:
    from memories_core.artifacts import StagedArtifact
    from memories_core.engine import MemoryEngine

__all__ = ["import_user"]

logger = logging.getLogger(__name__)


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
