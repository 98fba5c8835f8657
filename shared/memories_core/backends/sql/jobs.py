"""Table family ``jobs``: pending derivations and their claims.

A job (user, mechanism, kind, dedupe key, payload, attempts, last error, next attempt,
claim) is written in the transaction of the turns it derives from and deleted in the
transaction of the records it produced, so a crash between any two steps neither loses nor
duplicates a derivation. Workers claim a job for a lease (``claimed_until``) and name
themselves as its owner (``claimed_by``, :mod:`memories_core.backends.claims`): a claim whose
owner is a dead process of this host is taken over at once, any other only after its lease.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from memories_core.backends.claims import current_owner, owner_is_dead
from memories_core.backends.sql.base import SQLBase
from memories_core.backends.sql.rows import JOB_COLUMNS, dumps, to_micros, unclaimed_jobs
from memories_core.types import Job, JobSpec, new_id

__all__ = ["JobsTable"]

_INSERT = (
    "INSERT INTO jobs (id, user_id, mechanism, kind, key, payload, attempts, last_error, "
    "next_attempt_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)


class JobsTable(SQLBase):
    """Enqueue, list, claim, finish, fail and restore jobs."""

    def add_jobs(self, user_id: str, specs: Sequence[JobSpec], *, now: datetime) -> int:
        """Enqueue jobs (a job whose ``(mechanism, key)`` exists already is skipped).

        Returns:
            How many were new.
        """
        if not specs:
            return 0
        micros = to_micros(now)
        rows = [
            (
                new_id(),
                user_id,
                spec.mechanism,
                spec.kind,
                spec.key,
                dumps(dict(spec.payload)),
                0,
                None,
                micros,
                micros,
            )
            for spec in specs
        ]
        with self._write([user_id]) as conn:
            return self._many(conn, _INSERT, rows)

    def jobs(
        self,
        *,
        user_id: str | None = None,
        mechanisms: Sequence[str] | None = None,
        due_at: datetime | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Job]:
        """Stored jobs, oldest first.

        Args:
            user_id: Only this user's (default: every user's).
            mechanisms: Only these mechanisms'.
            due_at: Only jobs due at this time (backoff over, not claimed by a live worker).
            key: Only the job with this dedupe key.
            limit: At most this many.
        """
        d = self.dialect
        columns = JOB_COLUMNS.replace("payload", d.json("payload"))
        sql = f"SELECT {columns}, claimed_until, claimed_by FROM jobs WHERE 1 = 1"
        params: builtins.list[Any] = []
        users: builtins.list[str] = []
        if user_id is not None:
            sql += " AND user_id = ?"
            params.append(user_id)
            users.append(user_id)
        if mechanisms is not None:
            sql += f" AND {d.ids_in('mechanism')}"
            params.append(d.ids(mechanisms))
        if key is not None:
            sql += " AND key = ?"
            params.append(key)
        if due_at is not None:
            micros = to_micros(due_at)
            # Claimed jobs whose owner is known are checked below (a dead owner frees them).
            sql += (
                " AND next_attempt_at <= ? AND (claimed_until IS NULL OR claimed_until < ?"
                " OR claimed_by IS NOT NULL)"
            )
            params += [micros, micros]
        sql += f" ORDER BY created_at, {d.order('jobs')}"
        if limit is not None and due_at is None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._read(users) as conn:
            rows = self._run(conn, sql, params).fetchall()
        return unclaimed_jobs(rows, None if due_at is None else to_micros(due_at), limit)

    def claim_job(self, job_id: str, *, now: datetime, lease: timedelta) -> bool:
        """Claim a job for ``lease`` so that no other worker runs it meanwhile.

        Where the dialect has row locks, the job row is locked with ``SKIP LOCKED``: a row
        another transaction is finishing (deleting) right now counts as taken instead of
        being waited for.

        Returns:
            ``False`` if the job is gone or claimed by a live worker.
        """
        d = self.dialect
        micros, until, owner = to_micros(now), to_micros(now + lease), current_owner()
        free = d.lock() + d.skip_locked
        with self._write() as conn:
            cursor = self._run(
                conn,
                "UPDATE jobs SET claimed_until = ?, claimed_by = ? WHERE id = ("
                "SELECT id FROM jobs WHERE id = ? AND (claimed_until IS NULL OR claimed_until < ?)"
                f"{free})",
                (until, owner, job_id, micros),
            )
            if cursor.rowcount == 1:
                return True
            # A live lease: taken over at once if its owner is a dead process of this host.
            row = self._run(
                conn, f"SELECT claimed_by FROM jobs WHERE id = ?{free}", (job_id,)
            ).fetchone()
            if row is None or not owner_is_dead(row[0]):
                return False
            cursor = self._run(
                conn,
                "UPDATE jobs SET claimed_until = ?, claimed_by = ? WHERE id = ? AND claimed_by = ?",
                (until, owner, job_id, row[0]),
            )
            return bool(cursor.rowcount == 1)

    def finish_job(self, job_id: str) -> bool:
        """Delete a done job; call it in the transaction that stores what it derived.

        Returns:
            ``False`` if the job no longer exists (another worker finished it): the caller
            must then roll back, so that nothing is derived twice.
        """
        with self._write() as conn:
            # The user's lock before the job's row lock: the order every other transaction
            # takes them in (a save holds the user's lock when it enqueues a job whose key
            # may collide with this row), so the two can never wait on each other.
            owner = self._run(conn, "SELECT user_id FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if owner is None:
                return False
            self._lock_users(conn, [owner[0]])
            cursor = self._run(conn, "DELETE FROM jobs WHERE id = ?", (job_id,))
            return bool(cursor.rowcount == 1)

    def fail_job(self, job_id: str, *, error: str, retry_at: datetime) -> None:
        """Count a failed attempt, keep the error, release the claim, retry after ``retry_at``."""
        with self._write() as conn:
            self._run(
                conn,
                "UPDATE jobs SET attempts = attempts + 1, last_error = ?, next_attempt_at = ?, "
                "claimed_until = NULL, claimed_by = NULL WHERE id = ?",
                (self.dialect.storable(error[:2000]), to_micros(retry_at), job_id),
            )

    def update_job(self, job_id: str, payload: Mapping[str, Any]) -> None:
        """Replace a job's payload (e.g. a decision already made, so a retry skips it)."""
        encoded = dumps(dict(payload))
        self.dialect.check_text(encoded, "job payload")
        with self._write() as conn:
            self._run(conn, "UPDATE jobs SET payload = ? WHERE id = ?", (encoded, job_id))

    def release_job(self, job_id: str) -> None:
        """Release a claim without counting a failure."""
        with self._write() as conn:
            self._run(
                conn,
                "UPDATE jobs SET claimed_until = NULL, claimed_by = NULL WHERE id = ?",
                (job_id,),
            )

    def restore_jobs(self, user_id: str, jobs: Sequence[Job]) -> int:
        """Write jobs exactly as given (ids, attempts, errors, times), skipping existing keys.

        Used by import (a portable memory file); returns how many were new.
        """
        rows = [
            (
                job.id,
                user_id,
                job.mechanism,
                job.kind,
                job.key,
                dumps(dict(job.payload)),
                job.attempts,
                job.last_error,
                to_micros(job.next_attempt_at),
                to_micros(job.created_at),
            )
            for job in jobs
        ]
        with self._write([user_id]) as conn:
            return self._many(conn, _INSERT, rows)
