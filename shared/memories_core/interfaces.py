"""Protocols between the core's parts.

Semantics that every implementation keeps:

* **Scores**: higher means more similar / more relevant, for every index and every search.
* **Ids**: the record store owns ids; mechanisms create them with
  :func:`~memories_core.types.new_id`, and vector indexes store vectors under the same id as
  their record.
* **Scope**: every read and write takes a ``user_id`` (directly or through a
  :class:`~memories_core.types.Scope`), and implementations apply it inside their own query,
  never as a relevance hint after the fact.
* **Vectors**: embedders return L2-normalised ``float32`` arrays, so cosine = dot product.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from memories_core.types import (
    ChatMessage,
    GraphEdge,
    GraphNode,
    Job,
    JobSpec,
    MemoryRecord,
    Recall,
    RecordState,
    Scope,
    StateChange,
    Turn,
)
from memories_core.usage import Usage

if TYPE_CHECKING:
    from memories_core.engine_parts.rules import Derivation

__all__ = [
    "LLM",
    "ArtifactRegistryStore",
    "Clock",
    "DeletionStore",
    "Embedder",
    "EngineStore",
    "Filter",
    "IndexStateStore",
    "JobQueueStore",
    "LLMRouter",
    "Mechanism",
    "MechanismHooks",
    "NeighbourStore",
    "RecordStateStore",
    "RecordStore",
    "TransactionStore",
    "UserGraphStore",
    "UserLockingStore",
    "VectorIndex",
]

#: A filter in the one filter language of :mod:`memories_core.filters`, e.g.
#: ``{"kind": "turn", "created_at": {"$gte": since}, "topic": {"$in": ["food", "travel"]}}``:
#: record and state fields, ``attrs.<name>`` and metadata keys; equality, ``$ne``, ``$in``,
#: ``$nin``, ``$gt``/``$gte``/``$lt``/``$lte``, ``$exists``, ``$and``/``$or``.
Filter = Mapping[str, Any]

Vector = npt.NDArray[np.float32]


@runtime_checkable
class LLM(Protocol):
    """A chat model. Implementations count every call in :attr:`usage`."""

    @property
    def usage(self) -> Usage:
        """Calls, failures and tokens so far."""
        ...

    def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
    ) -> str:
        """Return the model's reply to ``messages``.

        Raises:
            LLMError: if the model or its server fails.
        """
        ...

    async def agenerate(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
    ) -> str:
        """Async twin of :meth:`generate`."""
        ...


#: The ``llm_for`` hook: the model that serves a scope (e.g. a per-user fine-tuned model), or
#: ``None`` to use the memory's default model. Called by the engine before every LLM-backed
#: derivation or reflection; it must be cheap and thread-safe.
LLMRouter = Callable[[Scope], "LLM | None"]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised vectors. Counts every call in :attr:`usage`."""

    @property
    def name(self) -> str:
        """Identity of the model, stored with an index to detect a changed embedder."""
        ...

    @property
    def dimension(self) -> int:
        """Length of every vector."""
        ...

    @property
    def usage(self) -> Usage:
        """Calls and texts embedded so far."""
        ...

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed texts to be stored; returns shape ``(len(texts), dimension)``."""
        ...

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """Embed a query; returns shape ``(dimension,)``."""
        ...


@runtime_checkable
class VectorIndex(Protocol):
    """A derived, rebuildable index of record vectors, partitioned by user."""

    def add(
        self,
        ids: Sequence[str],
        vectors: npt.NDArray[np.float32],
        metadatas: Sequence[Mapping[str, str | int | float | bool]],
    ) -> None:
        """Add or replace vectors. Every metadata holds at least ``user_id`` and ``kind``."""
        ...

    def search(
        self, vector: npt.NDArray[np.float32], *, user_id: str, k: int, where: Filter | None = None
    ) -> list[tuple[str, float]]:
        """Return up to ``k`` ``(id, cosine)`` pairs of ``user_id``'s vectors, best first."""
        ...

    def delete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Delete vectors by id (only those of ``user_id``)."""
        ...

    def delete_user(self, user_id: str) -> None:
        """Delete every vector of ``user_id``."""
        ...

    def count(self, user_id: str | None = None) -> int:
        """Number of vectors, of one user or of all."""
        ...

    def reset(self) -> None:
        """Delete every vector of every user (used by ``reindex``)."""
        ...


@runtime_checkable
class RecordStore(Protocol):
    """The record of truth. Every write is one transaction."""

    def add(self, records: Sequence[MemoryRecord], *, indexed: bool = True) -> None:
        """Insert records atomically (all or none). ``indexed`` marks them for the vector index."""
        ...

    def get(self, ids: Sequence[str], *, user_id: str) -> list[MemoryRecord]:
        """Return the records with these ids that belong to ``user_id`` (in the given order)."""
        ...

    def list(
        self,
        *,
        user_id: str,
        where: Filter | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
    ) -> builtins.list[MemoryRecord]:
        """Return ``user_id``'s records matching ``where``, oldest first."""
        ...

    def search_text(
        self, query: str, *, user_id: str, k: int, where: Filter | None = None
    ) -> builtins.list[tuple[str, float]]:
        """Lexical (BM25) search; returns ``(id, score)`` pairs, higher is better."""
        ...

    def delete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Delete records by id (only those of ``user_id``)."""
        ...

    def delete_user(self, user_id: str) -> None:
        """Delete every record and state entry of ``user_id``."""
        ...

    def users(self) -> builtins.list[str]:
        """Every user id with at least one record."""
        ...

    def pending_index(self, limit: int | None = None) -> builtins.list[MemoryRecord]:
        """Records marked for the vector index whose vectors are not confirmed yet."""
        ...

    def mark_indexed(self, ids: Iterable[str]) -> None:
        """Confirm that these records' vectors are in the vector index."""
        ...

    def mark_all_pending(self) -> int:
        """Mark every indexed record pending again (``reindex``); returns how many."""
        ...

    def get_state(self, key: str, *, user_id: str | None = None) -> Any:
        """Read a JSON value from the per-user (or global, ``user_id=None``) state table."""
        ...

    def set_state(self, key: str, value: Any, *, user_id: str | None = None) -> None:
        """Write a JSON value into the state table (``None`` deletes the key)."""
        ...

    def close(self) -> None:
        """Close the store; further calls raise."""
        ...


@runtime_checkable
class TransactionStore(Protocol):
    """Stores that group several calls into one transaction."""

    def transaction(self) -> AbstractContextManager[Any]:
        """One transaction around several calls (all commit, or none); calls inside join it."""
        ...


@runtime_checkable
class RecordStateStore(Protocol):
    """Records' mutable state, its history, text edits and the per-user state table."""

    def update_state(
        self,
        user_id: str,
        changes: Mapping[str, Mapping[str, Any]],
        *,
        at: datetime,
        reason: str | None = None,
    ) -> builtins.list[StateChange]:
        """Change records' mutable state and append the update history."""
        ...

    def add_history(
        self,
        user_id: str,
        record_id: str,
        *,
        old: Mapping[str, Any],
        new: Mapping[str, Any],
        at: datetime,
        reason: str | None = None,
    ) -> None:
        """Append one history entry (text edits, deletions)."""
        ...

    def history(
        self, user_id: str, *, record_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateChange]:
        """The user's update history, oldest first."""
        ...

    def edit_text(self, record_id: str, text: str, *, user_id: str) -> str | None:
        """Replace a record's text (vector pending again); returns the old text or ``None``."""
        ...

    def user_state(self, user_id: str) -> dict[str, Any]:
        """Every key of the user's state table."""
        ...

    def restore_state(self, user_id: str, states: Mapping[str, RecordState]) -> None:
        """Write records' state exactly, without history entries (import)."""
        ...


@runtime_checkable
class JobQueueStore(Protocol):
    """Pending derivations: enqueue, list, claim with a lease, finish, fail."""

    def add_jobs(self, user_id: str, specs: Sequence[JobSpec], *, now: datetime) -> int:
        """Enqueue jobs, skipping duplicates by ``(mechanism, key)``; returns how many are new."""
        ...

    def jobs(
        self,
        *,
        user_id: str | None = None,
        mechanisms: Sequence[str] | None = None,
        due_at: datetime | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Job]:
        """Stored jobs, oldest first."""
        ...

    def claim_job(self, job_id: str, *, now: datetime, lease: timedelta) -> bool:
        """Claim a job for a lease; ``False`` if gone or claimed by a live worker."""
        ...

    def finish_job(self, job_id: str) -> bool:
        """Delete a done job; ``False`` if it was gone (the caller rolls back)."""
        ...

    def fail_job(self, job_id: str, *, error: str, retry_at: datetime) -> None:
        """Count a failed attempt and set the next attempt time."""
        ...

    def update_job(self, job_id: str, payload: Mapping[str, Any]) -> None:
        """Replace a job's payload."""
        ...

    def restore_jobs(self, user_id: str, jobs: Sequence[Job]) -> int:
        """Write jobs exactly as given (import); returns how many were new."""
        ...


@runtime_checkable
class UserGraphStore(Protocol):
    """Per-user graphs of nodes and edges (edges never join two users' nodes)."""

    def put_graph(
        self, user_id: str, *, nodes: Sequence[GraphNode] = (), edges: Sequence[GraphEdge] = ()
    ) -> None:
        """Insert or replace graph nodes and edges of one user."""
        ...

    def delete_graph(
        self, user_id: str, *, node_ids: Sequence[str] = (), edge_ids: Sequence[str] = ()
    ) -> None:
        """Delete graph nodes (with their edges) and edges."""
        ...

    def graph_nodes(self, user_id: str, *, kind: str | None = None) -> builtins.list[GraphNode]:
        """The user's graph nodes."""
        ...

    def graph_edges(
        self, user_id: str, *, node_id: str | None = None, record_id: str | None = None
    ) -> builtins.list[GraphEdge]:
        """The user's graph edges."""
        ...


@runtime_checkable
class ArtifactRegistryStore(Protocol):
    """The registry of per-user artifacts (the bytes live in files)."""

    def register_artifact(
        self,
        user_id: str,
        name: str,
        *,
        folder: str,
        size: int,
        sha256: str,
        at: datetime,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Record an artifact's registry entry."""
        ...

    def artifact_rows(self, user_id: str | None = None) -> builtins.list[dict[str, Any]]:
        """Artifact registry entries."""
        ...

    def unregister_artifact(self, user_id: str, name: str) -> None:
        """Remove an artifact's registry entry."""
        ...


@runtime_checkable
class DeletionStore(Protocol):
    """Deletion tombstones, the purge of a user, and erasure of what was deleted."""

    def mark_deleting(self, user_id: str, *, at: datetime) -> None:
        """Write a deletion tombstone."""
        ...

    def deleting_users(self) -> builtins.list[str]:
        """Users with an unfinished deletion."""
        ...

    def is_deleting(self, user_id: str) -> bool:
        """Whether the user has an unfinished deletion."""
        ...

    def purge_user(self, user_id: str) -> None:
        """Delete every row of the user in every table, and the tombstone."""
        ...

    def compact(self) -> None:
        """Drop deleted content from indexes and logs (erasure after a purge)."""
        ...

    def vacuum(self) -> None:
        """Rewrite the storage (on request)."""
        ...


@runtime_checkable
class IndexStateStore(Protocol):
    """Which records the vector index holds, still needs, or refused."""

    def mark_index_failed(self, ids: Iterable[str]) -> None:
        """Set records the vector index refused aside."""
        ...

    def index_states(self, user_id: str) -> dict[str, str]:
        """``{id: "pending" | "indexed" | "failed"}`` of the user's indexable records."""
        ...

    def mark_pending(self, ids: Iterable[str], *, user_id: str) -> None:
        """Mark records pending for the vector index."""
        ...

    def include_in_index(self, *, user_id: str | None = None, kind: str) -> int:
        """Mark unindexed records of a kind pending for the vector index."""
        ...


@runtime_checkable
class EngineStore(
    RecordStore,
    TransactionStore,
    RecordStateStore,
    JobQueueStore,
    UserGraphStore,
    ArtifactRegistryStore,
    DeletionStore,
    IndexStateStore,
    Protocol,
):
    """A record store that also keeps what the engine needs, all in one transaction scope.

    The union of the narrow store protocols above: records (:class:`RecordStore`), record
    state and history, pending jobs, per-user graphs, the artifact registry, deletion
    tombstones and vector-index bookkeeping, all joinable in one :meth:`transaction`. The
    SQL store (:mod:`memories_core.backends.sql`) implements it once for every dialect
    (SQLite, PostgreSQL); the engine needs nothing else from its store. A part of the core
    that needs one family types its store with that family's protocol.
    """


@runtime_checkable
class NeighbourStore(Protocol):
    """An optional seam of a record store: a record's neighbours in its conversation.

    :class:`~memories_core.retrieval.store_backend.StoreBackend` uses it for context
    spreading when the store has it, instead of listing records.
    """

    def adjacent(
        self, ids: Sequence[str], *, user_id: str, gap: timedelta | None = None
    ) -> dict[str, tuple[str | None, str | None]]:
        """``{id: (previous id, next id)}`` by :func:`~memories_core.retrieval.context.linked`.

        Records with a session link within it; records without one link to the nearest
        records without one within ``gap`` (left out when ``gap`` is ``None``). The cost is
        bounded by ``len(ids)`` index seeks, whatever the user's number of records.
        """
        ...


@runtime_checkable
class UserLockingStore(Protocol):
    """An optional seam of an :class:`EngineStore` shared by several processes.

    :meth:`MemoryEngine.user_lock <memories_core.engine.MemoryEngine.user_lock>` takes this
    lock after its in-process one, so that a mechanism's read-modify-write of one user is
    serialized across worker processes too (PostgreSQL: an advisory lock). A store that one
    process at a time can open (the embedded default) does not need it.
    """

    def user_lock(self, user_id: str) -> AbstractContextManager[None]:
        """Hold ``user_id``'s lock across processes for the ``with`` block (re-entrant)."""
        ...


@runtime_checkable
class Clock(Protocol):
    """Source of the current time; injected so time-dependent rules are testable."""

    def now(self) -> datetime:
        """Return the current aware UTC datetime."""
        ...


@runtime_checkable
class Mechanism(Protocol):
    """The one contract every memory mechanism meets."""

    def save(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Write path, after an exchange. Raw turns are stored before anything derived."""
        ...

    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Read path, before the model."""
        ...

    def clear(self, scope: Scope) -> None:
        """Forget everything of ``scope.user_id``."""
        ...

    async def asave(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Async twin of :meth:`save`."""
        ...

    async def arecall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Async twin of :meth:`recall`."""
        ...

    async def aclear(self, scope: Scope) -> None:
        """Async twin of :meth:`clear`."""
        ...


@dataclass(frozen=True)
class MechanismHooks:
    """What a mechanism tells the engine when it attaches.

    Attributes:
        name: Unique name on this engine; jobs are stored under it.
        index_turns: Whether raw turns need vectors (a mechanism that recalls turns).
        on_turns: Jobs to create for freshly written turns (runs inside the write
            transaction; must not call a model).
        on_session_end: Jobs to create when a session ends (inside the transaction).
        run_job: Runs one job: model calls happen here, outside every lock. Returns what
            to commit, or ``None`` for nothing. Raises to fail the attempt.
        on_delete_user: Removes the mechanism's own data of a user kept outside the store.
        deferred: Its jobs are long (e.g. training an adapter): a save or a session end
            never runs them; an explicit :meth:`MemoryEngine.run_pending` (a worker) does.
        prepare: Makes the model calls of several claimed jobs together (batched) and keeps
            each job's answers in its payload, where :attr:`run_job` finds them; returns the
            jobs that failed (id -> the error :attr:`run_job` would have raised). Optional.
        batch_size: How many jobs :attr:`prepare` takes at once (read before each run; 1:
            the jobs run one by one, without :attr:`prepare`).
    """

    name: str
    index_turns: bool = False
    on_turns: Callable[[Sequence[MemoryRecord]], Iterable[JobSpec]] | None = None
    on_session_end: Callable[[str, str], Iterable[JobSpec]] | None = None
    run_job: Callable[[Job], Derivation | None] | None = None
    on_delete_user: Callable[[str], None] | None = None
    deferred: bool = False
    prepare: Callable[[Sequence[Job]], Mapping[str, BaseException]] | None = None
    batch_size: Callable[[], int] | None = None
