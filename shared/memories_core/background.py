"""Derivations off the caller's path: the engine's background worker and its status report.

A save stores and indexes its turns, writes its jobs and returns; the model calls that derive
notes, memos, summaries and graph edges run later, in a daemon thread of the engine
(:class:`DerivationWorker`). The jobs are rows of the record store (claimed with a lease,
retried with backoff), so nothing is lost when the process stops: an unfinished job is run
again after a reopen, by the next save of its user or by ``flush()``. Several processes on a
shared store (PostgreSQL) each run a worker; the lease makes sure a job runs once.

:class:`WorkStatus` is what ``status()`` reports: pending, running and failed jobs per
mechanism and job kind.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from memories_core.llms.cancel import cancellable

__all__ = ["CANCEL_GRACE", "DerivationWorker", "JobCounts", "WorkStatus"]

logger = logging.getLogger(__name__)

#: Longest sleep of an idle worker that still has jobs in backoff (seconds).
_MAX_POLL = 30.0
#: Shortest sleep, so that a job due "now" on a frozen clock cannot spin the CPU.
_MIN_POLL = 0.5
#: Seconds a job whose model call :meth:`DerivationWorker.stop` cancelled gets to end. The
#: local models check the cancel between layers: measured on 2 CPU cores, the 1.5B model
#: ended 1.0 s and 1.9 s (two runs) after a cancel in the middle of reading a 74-76 s
#: prompt, SmolLM2 0.2 s (BENCHMARKS.md, "Stopping a generation when the engine stops").
CANCEL_GRACE = 10.0


@dataclass(frozen=True)
class JobCounts:
    """Jobs of one mechanism and kind.

    Attributes:
        pending: Waiting to run (never failed, or due again).
        running: Claimed by a worker now (this process's, or another's lease).
        failed: Failed at least once and waiting for their retry time (backoff).
        parked: Failed for their content ``JobPolicy.max_attempts`` times: kept, and run
            again only on an explicit retry (``retry_pending()``).
    """

    pending: int = 0
    running: int = 0
    failed: int = 0
    parked: int = 0

    @property
    def total(self) -> int:
        """Jobs not done yet."""
        return self.pending + self.running + self.failed + self.parked


@dataclass(frozen=True)
class WorkStatus:
    """Pending derivations of one user (or everyone), by mechanism and job kind.

    Attributes:
        user_id: Whose jobs (``None``: every user's).
        derive: ``"background"`` or ``"inline"``: where derivations run.
        worker_alive: Whether this engine's background thread is running.
        jobs: ``(mechanism, kind) -> JobCounts``.
        last_errors: ``(mechanism, kind) ->`` the last failure message of a failed job.
    """

    user_id: str | None
    derive: str
    worker_alive: bool
    jobs: Mapping[tuple[str, str], JobCounts] = field(default_factory=dict)
    last_errors: Mapping[tuple[str, str], str] = field(default_factory=dict)

    @property
    def pending(self) -> int:
        """Jobs waiting to run."""
        return sum(c.pending for c in self.jobs.values())

    @property
    def running(self) -> int:
        """Jobs running now."""
        return sum(c.running for c in self.jobs.values())

    @property
    def failed(self) -> int:
        """Jobs in backoff after a failure."""
        return sum(c.failed for c in self.jobs.values())

    @property
    def parked(self) -> int:
        """Jobs that wait for an explicit retry."""
        return sum(c.parked for c in self.jobs.values())

    @property
    def idle(self) -> bool:
        """Whether no derivation is left to do."""
        return not self.jobs

    def __str__(self) -> str:
        who = self.user_id if self.user_id is not None else "all users"
        if not self.jobs:
            return f"{who}: no pending derivations"
        lines = [
            f"{who}: {self.pending} pending, {self.running} running, {self.failed} failed"
            + (f", {self.parked} parked" if self.parked else "")
            + f" ({self.derive})"
        ]
        for (mechanism, kind), counts in sorted(self.jobs.items()):
            line = (
                f"  {mechanism}/{kind}: {counts.pending} pending, {counts.running} running, "
                f"{counts.failed} failed" + (f", {counts.parked} parked" if counts.parked else "")
            )
            error = self.last_errors.get((mechanism, kind))
            if error:
                line += f" (last error: {error[:120]})"
            lines.append(line)
        return "\n".join(lines)


class DerivationWorker:
    """One daemon thread that drains the due jobs of the users that have work.

    The engine wakes it after a save or a session end (:meth:`wake`); it runs every due job of
    those users, then sleeps until woken or until a job in backoff is due again. A failing job
    never stops it (the engine keeps the failure in the job row); :meth:`stop` lets the job
    in hand finish and leaves the rest pending. Its passes run inside
    :func:`memories_core.llms.cancel.cancellable`, so that a stop past its timeout can end a
    local model's generation instead of leaving the thread in native code.

    Args:
        drain: Runs the due jobs of one user (``None``: every user) and returns
            ``(remaining, model_ok)``: jobs left, and ``False`` if the run stopped because
            the model is down (the remaining jobs then wait for their retry time).
        next_due: Seconds until the earliest job in backoff of the given users is due
            (``None``: none left).
        name: Thread name.
    """

    def __init__(
        self,
        drain: Callable[[str | None], tuple[int, bool]],
        next_due: Callable[[set[str | None]], float | None],
        *,
        name: str = "memories-derivations",
    ) -> None:
        self._drain = drain
        self._next_due = next_due
        self._name = name
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._wanted: set[str | None] = set()
        self._waiting: set[str | None] = set()
        self._stopping = False
        #: Finished passes, and per user the number of its last pass that the model stopped.
        self._seq = 0
        self._stalled: dict[str | None, int] = {}
        self._busy: str | bool | None = False
        self._cancel = threading.Event()

    @property
    def alive(self) -> bool:
        """Whether the thread is running."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stopping

    def wake(self, user_id: str | None) -> None:
        """Ask for a pass over ``user_id``'s due jobs (``None``: everyone's); starts the thread."""
        with self._cond:
            if self._stopping:
                return
            self._wanted.add(user_id)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def mark(self) -> int:
        """The number of passes finished so far (for :meth:`stalled_since`)."""
        with self._cond:
            return self._seq

    def stalled_since(self, user_id: str | None, mark: int) -> bool:
        """Whether a pass over ``user_id`` after ``mark`` stopped because the model was down."""
        with self._cond:
            return max(self._stalled.get(user_id, -1), self._stalled.get(None, -1)) > mark

    def busy_with(self, user_id: str | None) -> bool:
        """Whether a pass over ``user_id`` (or over everyone) is under way or asked for."""
        with self._cond:
            if user_id is None:
                return self._busy is not False or bool(self._wanted)
            return self._busy in (user_id, None) or user_id in self._wanted or None in self._wanted

    def wait_change(self, timeout: float) -> None:
        """Sleep until the worker finishes a pass or ``timeout`` seconds pass."""
        with self._cond:
            self._cond.wait(timeout)

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`stop` had to cancel the job in hand's model call."""
        return self._cancel.is_set()

    def stop(self, timeout: float | None, *, grace: float = CANCEL_GRACE) -> bool:
        """Stop after the job in hand; returns whether the thread ended.

        Past ``timeout`` (``None``: wait for the job however long it takes) the job in
        hand's model call is cancelled (a local model stops between its layers; the engine
        gives the job back, pending) and the thread gets ``grace`` more seconds to end.
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        if thread.is_alive() and timeout is not None:
            self._cancel.set()
            thread.join(grace)
        return not thread.is_alive()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._wanted and not self._stopping:
                    delay = self._poll_delay()
                    if delay is None:
                        self._cond.wait()
                        continue
                    if not self._cond.wait(delay) and not self._wanted:
                        self._wanted |= self._waiting
                if self._stopping:
                    self._busy = False
                    self._cond.notify_all()
                    return
                # Everyone's pass covers every user's.
                users = [None] if None in self._wanted else list(self._wanted)
                self._wanted.clear()
            for user in users:
                self._pass(user)
                if self._stopping:
                    break

    def _pass(self, user: str | None) -> None:
        with self._cond:
            self._busy = user
        remaining, model_ok = 0, True
        try:
            with cancellable(self._cancel):
                remaining, model_ok = self._drain(user)
        except Exception:
            # The store itself failed (e.g. closed under us): the jobs stay in their rows.
            logger.warning("background derivation pass failed; jobs stay pending", exc_info=True)
        with self._cond:
            self._busy = False
            self._seq += 1
            if model_ok:
                self._stalled.pop(user, None)
            else:
                self._stalled[user] = self._seq
            if remaining:
                self._waiting.add(user)
            else:
                self._waiting.discard(user)
            self._cond.notify_all()

    def _poll_delay(self) -> float | None:
        """Seconds to sleep before retrying jobs in backoff (``None``: sleep until woken)."""
        if not self._waiting:
            return None
        try:
            due = self._next_due(set(self._waiting))
        except Exception:
            logger.warning("could not read the retry times of pending jobs", exc_info=True)
            due = _MAX_POLL
        if due is None:
            self._waiting.clear()
            return None
        return min(_MAX_POLL, max(_MIN_POLL, due))
