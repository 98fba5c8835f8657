"""Pending work: queueing, claiming, running, retrying and committing derivations."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from memories_core.background import JobCounts, WorkStatus
from memories_core.engine_parts.rules import (
    MAX_K,
    PARKED_UNTIL,
    Derivation,
    JobFailed,
    _JobGone,
    is_parked,
    logger,
)
from memories_core.engine_parts.search import EngineSearch
from memories_core.errors import (
    InvalidInputError,
    LLMCancelledError,
    LLMError,
    LLMTimeoutError,
    ParseError,
)
from memories_core.interfaces import MechanismHooks
from memories_core.llms import cancel
from memories_core.types import (
    Job,
    JobSpec,
    check_user_id,
)

__all__ = ["EngineJobs"]


class EngineJobs(EngineSearch):
    """The engine's pending work: jobs queued, claimed, run, retried and committed."""

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
        trying every other job would only multiply failed calls. A batch that times out is
        the exception: its jobs run one by one (counted as ``batch_timeout``), and a single
        call that times out then stops the run.
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
        for group in self._groups([*own, *others]):
            if self._stopping():
                break  # closing, or an inline flush's time is up: the rest stays pending
            # The lease starts now, not when the run started: jobs before this one may have
            # taken longer than a lease, which would hand this one to another worker at once.
            # A batch holds each of its jobs until the last one has run.
            lease = self.policy.lease * len(group)
            claimed = [
                j for j in group if self.store.claim_job(j.id, now=self.clock.now(), lease=lease)
            ]
            if not claimed:
                continue
            with self._running_lock:
                self._running.update((j.id, j.user_id) for j in claimed)
            try:
                model_ok = self._run_group(claimed)
            finally:
                with self._running_lock:
                    for j in claimed:
                        self._running.pop(j.id, None)
            if not model_ok:
                break
        return len(self.store.jobs(user_id=user_id, mechanisms=names)), model_ok

    def _stopping(self) -> bool:
        """Whether to start no more jobs: the worker stops, or this scope was cancelled."""
        if self._worker is not None and self._worker.stopping:
            return True
        event = cancel.current()
        return event is not None and event.is_set()

    def _run_due_within(self, user_id: str | None, timeout: float) -> int:
        """Run the due jobs here for at most about ``timeout`` seconds; returns the jobs left.

        Past ``timeout`` no job is started, and the model call in hand is cancelled at its
        next check (:mod:`memories_core.llms.cancel`); its job is given back pending.
        """
        event = threading.Event()
        timer = threading.Timer(timeout, event.set)
        timer.daemon = True
        timer.start()
        try:
            with cancel.cancellable(event):
                return self._run_due(user_id, budget=MAX_K, inline=True)[0]
        finally:
            timer.cancel()

    def _groups(self, jobs: Sequence[Job]) -> list[list[Job]]:
        """``jobs`` in order, in runs of one, or batches where the mechanism prepares them.

        Consecutive jobs of a mechanism with a ``prepare`` hook form a batch of up to its
        ``batch_size`` (asked once per run); every other job is a run of its own.
        """
        sizes: dict[str, int] = {}
        groups: list[list[Job]] = []
        for job in jobs:
            hooks = self._hooks.get(job.mechanism)
            if hooks is None:
                continue
            if job.mechanism not in sizes:
                sizes[job.mechanism] = self._batch_size(hooks)
            last = groups[-1] if groups else []
            if last and last[0].mechanism == job.mechanism and len(last) < sizes[job.mechanism]:
                last.append(job)
            else:
                groups.append([job])
        return groups

    @staticmethod
    def _batch_size(hooks: MechanismHooks) -> int:
        if hooks.prepare is None or hooks.batch_size is None:
            return 1
        try:
            size = hooks.batch_size()
        except Exception:  # e.g. the model cannot load: its jobs report that one by one
            logger.warning("%s: batch size unknown; jobs run one by one", hooks.name, exc_info=True)
            return 1
        return size if isinstance(size, int) and not isinstance(size, bool) and size > 1 else 1

    def _run_group(self, claimed: list[Job]) -> bool:
        """Run claimed jobs (a batch is prepared first); ``False`` if the model is down."""
        if len(claimed) == 1:
            return self._run_job(claimed[0])
        hooks = self._hooks[claimed[0].mechanism]
        assert hooks.prepare is not None
        failures: dict[str, BaseException] = {}
        try:
            failures = dict(hooks.prepare(claimed))
        except LLMTimeoutError as exc:
            # A batch lasts as long as its longest reply, so a batch that is too slow says
            # little about a model that is down: its jobs run one by one below, each call with
            # its own timeout, and only a single call that times out stops the run.
            self.count_failure("batch_timeout")
            logger.warning(
                "%s: a batch of %d jobs timed out; they run one by one: %s",
                hooks.name,
                len(claimed),
                exc,
            )
        except LLMError as exc:
            self._fail(claimed[0], claimed[0].kind, exc)
            self._release([j.id for j in claimed[1:]])
            return False
        except Exception:  # its jobs make their own calls below, and fail there if they must
            logger.warning("%s: preparing a batch failed", hooks.name, exc_info=True)
        for n, job in enumerate(claimed):
            if self._stopping():
                self._release([j.id for j in claimed[n:]])
                return True
            error = failures.get(job.id)
            if error is not None:
                self._fail(job, error.label if isinstance(error, JobFailed) else job.kind, error)
                continue
            # Its payload now holds what the batch answered.
            current = self.store.jobs(user_id=job.user_id, mechanisms=[job.mechanism], key=job.key)
            fresh = next((j for j in current if j.id == job.id), None)
            if fresh is not None and not self._run_job(fresh):
                self._release([j.id for j in claimed[n + 1 :]])
                return False
        return True

    def _release(self, job_ids: Sequence[str]) -> None:
        """Give back claims of jobs not run (they are due again at once, no failure counted)."""
        release = getattr(self.store, "release_job", None)
        for job_id in job_ids:
            try:
                if release is not None:
                    release(job_id)
            except Exception:
                logger.warning("could not release job %s", job_id, exc_info=True)

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
        here; past ``timeout`` no job is started, and a model call in progress is stopped
        at its next check (as when an engine closes) and its job stays pending.

        Args:
            user_id: Whose derivations (default: every user's).
            timeout: Seconds to wait at most (``None``: until done); the work continues in
                the background after a timeout (inline: at the next ``save`` or ``flush``).
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
            if timeout is None:
                return self._run_due(user_id, budget=MAX_K, inline=True)[0]
            return self._run_due_within(user_id, timeout)
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
        it failed at least once and waits for its retry time, *parked* when it waits for an
        explicit retry (:attr:`JobPolicy.max_attempts`), *pending* otherwise.
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
                    state = "parked" if is_parked(job) else "failed"
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
                key: JobCounts(
                    pending=c["pending"],
                    running=c["running"],
                    failed=c["failed"],
                    parked=c["parked"],
                )
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
            return not _model_failure(exc)
        except Exception as exc:
            self._fail(job, job.kind, exc)
            return True
        try:
            self._commit(job, result)
        except _JobGone:
            logger.info("job %s was finished by another worker; its result is dropped", job.id)
        except (ValueError, TypeError) as exc:
            # A derivation the store refuses for its content (a bad search key, another
            # user's records, a value it cannot encode) commits nothing; the job stays
            # pending, with its failure counted, instead of claimed until its lease ends.
            # A failing store (BackendError) goes up to the worker, which leaves it claimed.
            self._fail(job, job.kind, exc)
        return True

    def _commit(self, job: Job, result: Derivation | None) -> None:
        replaced: list[str] = []
        with self.store.transaction():
            if not self.store.finish_job(job.id):
                raise _JobGone(job.id)
            if result is not None:
                replaced = self._write_derivation(job.user_id, result)
        self.count_finish(job.attempts + 1)
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
        if _cancelled(exc) or (self._worker is not None and self._worker.stopping):
            # Its model call was cancelled (close() past its timeout, exit, or an inline
            # flush's timeout), or the job failed while the interpreter exits (it refuses new
            # threads then, e.g. a model's first load). Neither says anything about the job.
            logger.info(
                "%s job %s was stopped before its end; it stays pending", job.mechanism, job.id
            )
            self._release([job.id])
            return
        self.count_failure(label)
        retry_at = self.policy.retry_at(self.clock.now(), job.attempts)
        if not _model_failure(exc) and self.policy.parks(job.attempts):
            retry_at = PARKED_UNTIL
            logger.warning(
                "%s job %s (%s) failed %d times for its content; it is parked until an explicit "
                "retry (retry_pending): %s",
                job.mechanism,
                job.id,
                label,
                job.attempts + 1,
                exc,
            )
        else:
            logger.warning(
                "%s job %s (%s) failed; it stays pending: %s", job.mechanism, job.id, label, exc
            )
        reply = _unparsable_reply(exc)
        if reply is not None:
            # The reply is the model's text about the user's turns: debug level only, cut.
            logger.debug(
                "%s job %s: the model's last unparsable reply (first %d characters): %r",
                job.mechanism,
                job.id,
                _REPLY_LOG_CHARS,
                reply[:_REPLY_LOG_CHARS],
            )
        self.store.fail_job(job.id, error=f"{type(exc).__name__}: {exc}", retry_at=retry_at)

    async def arun_pending(self, user_id: str | None = None, *, force: bool = False) -> int:
        """Async twin of :meth:`run_pending`."""
        return await asyncio.to_thread(self.run_pending, user_id, force=force)


#: How much of an unparsable reply a failed job's debug line shows.
_REPLY_LOG_CHARS = 2000


def _model_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says the model was unreachable or slow, not that its reply was bad."""
    return isinstance(exc, LLMError) or (
        isinstance(exc, JobFailed) and isinstance(exc.__cause__, LLMError)
    )


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions it was raised from, nearest first.

    At most eight: a cause chain is short, and a cycle must not hang the worker.
    """
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__


def _cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was raised from, a model call its engine cancelled."""
    return any(isinstance(seen, LLMCancelledError) for seen in _chain(exc))


def _unparsable_reply(exc: BaseException) -> str | None:
    """The raw reply of the :class:`ParseError` that ``exc`` is or was raised from."""
    return next((e.raw for e in _chain(exc) if isinstance(e, ParseError) and e.raw), None)
