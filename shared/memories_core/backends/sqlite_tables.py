"""The engine's tables in the SQLite record store.

Record state and its history, pending work, per-user graphs, the artifact registry and
deletion tombstones.

They live in the same file and connection as the records, so a mechanism can write a derived
record, complete the job that derived it and update state in one transaction
(:meth:`SQLiteRecordStore.transaction`). :class:`EngineTablesMixin` is mixed into
:class:`~memories_core.backends.sqlite_store.SQLiteRecordStore`; it only uses the store's
``_read``/``_write`` context managers.

Schema (added in schema version 2; a version-1 file gains the tables when opened):

* ``record_state``: the mutable part of a record, one row per record *that has state*
  (created on the first update; a record without a row has the defaults of
  :class:`~memories_core.types.RecordState`). Keyed by the record's ``seq`` and deleted with it.
* ``record_history``: every state update and text edit, per user: old, new, when, why.
* ``jobs``: pending derivations (user, mechanism, kind, dedupe key, payload, attempts, last
  error, next attempt, claim). A job is written in the transaction of the turns it derives
  from and deleted in the transaction of the records it produced, so a crash between any two
  steps neither loses nor duplicates a derivation.
* ``graph_nodes`` / ``graph_edges``: per-user graphs. Edges reference nodes through
  ``(user_id, node id)`` foreign keys, so an edge can never join two users' nodes.
* ``artifacts``: registry of per-user files (the bytes live in the artifact directory).
* ``deletions``: tombstones of ``delete_user`` runs not yet finished (resumed on open).
"""

from __future__ import annotations

import builtins
import json
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta, timezone
from typing import Any

from memories_core.backends.claims import current_owner, owner_is_dead
from memories_core.errors import InvalidInputError
from memories_core.types import (
    STATE_FIELDS,
    GraphEdge,
    GraphNode,
    Job,
    JobSpec,
    RecordState,
    StateChange,
    check_metadata,
    ensure_utc,
    new_id,
)

__all__ = ["ENGINE_SCHEMA", "EngineTablesMixin", "from_micros", "to_micros"]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)

ENGINE_SCHEMA = """
CREATE TABLE IF NOT EXISTS record_state (
    seq INTEGER PRIMARY KEY REFERENCES records (seq) ON DELETE CASCADE,
    user_id TEXT NOT NULL,
    strength REAL,
    recall_count INTEGER,
    last_recalled_at INTEGER,
    tier TEXT,
    valid_from INTEGER,
    valid_until INTEGER,
    archived INTEGER,
    attrs TEXT
);
CREATE INDEX IF NOT EXISTS record_state_user ON record_state (user_id);
CREATE TABLE IF NOT EXISTS record_history (
    hseq INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id TEXT NOT NULL,
    record_id TEXT NOT NULL,
    at INTEGER NOT NULL,
    old TEXT NOT NULL,
    new TEXT NOT NULL,
    reason TEXT
);
CREATE INDEX IF NOT EXISTS record_history_user ON record_history (user_id, record_id, hseq);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    kind TEXT NOT NULL,
    key TEXT NOT NULL,
    payload TEXT NOT NULL DEFAULT '{}',
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    next_attempt_at INTEGER NOT NULL,
    claimed_until INTEGER,
    created_at INTEGER NOT NULL,
    UNIQUE (user_id, mechanism, key)
);
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (user_id, next_attempt_at);
CREATE TABLE IF NOT EXISTS graph_nodes (
    user_id TEXT NOT NULL,
    id TEXT NOT NULL,
    kind TEXT NOT NULL,
    label TEXT NOT NULL,
    data TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (user_id, id)
);
CREATE TABLE IF NOT EXISTS graph_edges (
    user_id TEXT NOT NULL,
    id TEXT NOT NULL,
    source TEXT NOT NULL,
    target TEXT NOT NULL,
    relation TEXT NOT NULL,
    record_id TEXT,
    data TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (user_id, id),
    FOREIGN KEY (user_id, source) REFERENCES graph_nodes (user_id, id) ON DELETE CASCADE,
    FOREIGN KEY (user_id, target) REFERENCES graph_nodes (user_id, id) ON DELETE CASCADE
);
CREATE INDEX IF NOT EXISTS graph_edges_source ON graph_edges (user_id, source);
CREATE INDEX IF NOT EXISTS graph_edges_target ON graph_edges (user_id, target);
CREATE INDEX IF NOT EXISTS graph_edges_record ON graph_edges (user_id, record_id);
CREATE TABLE IF NOT EXISTS artifacts (
    user_id TEXT NOT NULL,
    name TEXT NOT NULL,
    folder TEXT NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (user_id, name)
);
CREATE TABLE IF NOT EXISTS deletions (
    user_id TEXT PRIMARY KEY,
    started_at INTEGER NOT NULL
);
"""

_STATE_DEFAULTS = RecordState()
_TIME_FIELDS = ("last_recalled_at", "valid_from", "valid_until")

#: Columns of ``record_state`` selected with a record (after the record's own columns).
STATE_COLUMNS = (
    "s.strength, s.recall_count, s.last_recalled_at, s.tier, s.valid_from, s.valid_until, "
    "s.archived, s.attrs"
)


def to_micros(value: datetime) -> int:
    """Integer microseconds since the Unix epoch (exact, sortable)."""
    return (ensure_utc(value) - _EPOCH) // _MICROSECOND


def from_micros(value: int) -> datetime:
    """Inverse of :func:`to_micros`."""
    return _EPOCH + timedelta(microseconds=value)


def _opt_micros(value: datetime | None) -> int | None:
    return None if value is None else to_micros(value)


def _opt_time(value: int | None) -> datetime | None:
    return None if value is None else from_micros(value)


def state_from_row(row: Sequence[Any]) -> RecordState:
    """Build a :class:`RecordState` from the 8 ``STATE_COLUMNS`` (all ``NULL``: defaults)."""
    strength, count, last, tier, vfrom, vuntil, archived, attrs = row
    if all(value is None for value in row):
        return _STATE_DEFAULTS
    return RecordState(
        strength=1.0 if strength is None else float(strength),
        recall_count=0 if count is None else int(count),
        last_recalled_at=_opt_time(last),
        tier=tier,
        valid_from=_opt_time(vfrom),
        valid_until=_opt_time(vuntil),
        archived=bool(archived),
        attrs=json.loads(attrs) if attrs else {},
    )


def _state_change(current: RecordState, changes: Mapping[str, Any]) -> RecordState:
    """Apply ``changes`` (state field -> new value; ``attrs`` merges, None deletes a key)."""
    values: dict[str, Any] = {
        "strength": current.strength,
        "recall_count": current.recall_count,
        "last_recalled_at": current.last_recalled_at,
        "tier": current.tier,
        "valid_from": current.valid_from,
        "valid_until": current.valid_until,
        "archived": current.archived,
    }
    attrs = dict(current.attrs)
    for key, value in changes.items():
        if key == "attrs":
            if not isinstance(value, Mapping):
                raise InvalidInputError("attrs changes must be a mapping")
            checked = check_metadata(value, allow_reserved=frozenset(value))
            for name, item in checked.items():
                if item is None:
                    attrs.pop(name, None)
                else:
                    attrs[name] = item
            continue
        if key not in STATE_FIELDS:
            raise InvalidInputError(
                f"{key!r} is not a state field; state fields: {sorted(STATE_FIELDS)} and 'attrs'"
            )
        values[key] = _check_state_value(key, value)
    return RecordState(**values, attrs=attrs)


def _check_state_value(key: str, value: Any) -> Any:
    import math

    if key in _TIME_FIELDS:
        if value is not None and not isinstance(value, datetime):
            raise InvalidInputError(f"{key} must be a datetime or None")
        return None if value is None else ensure_utc(value)
    if key == "strength":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidInputError("strength must be a number")
        if not math.isfinite(value):
            raise InvalidInputError("strength must be finite")
        return float(value)
    if key == "recall_count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInputError("recall_count must be an int >= 0")
        return value
    if key == "tier":
        if value is not None and not isinstance(value, str):
            raise InvalidInputError("tier must be a string or None")
        return value
    if not isinstance(value, bool):
        raise InvalidInputError("archived must be a bool")
    return value


def _state_values(state: RecordState) -> tuple[Any, ...]:
    """The 8 ``record_state`` column values of ``state`` (after ``seq, user_id``)."""
    return (
        state.strength,
        state.recall_count,
        _opt_micros(state.last_recalled_at),
        state.tier,
        _opt_micros(state.valid_from),
        _opt_micros(state.valid_until),
        int(state.archived),
        _dumps(dict(state.attrs)),
    )


def _changed(old: RecordState, new: RecordState) -> tuple[dict[str, Any], dict[str, Any]]:
    before, after = old.to_json(), new.to_json()
    keys = [key for key in after if before[key] != after[key]]
    return {k: before[k] for k in keys}, {k: after[k] for k in keys}


def _row_to_job(row: Sequence[Any]) -> Job:
    jid, user_id, mechanism, kind, key, payload, attempts, error, next_at, created = row
    return Job(
        id=jid,
        user_id=user_id,
        mechanism=mechanism,
        kind=kind,
        key=key,
        payload=json.loads(payload),
        attempts=attempts,
        last_error=error,
        next_attempt_at=from_micros(next_at),
        created_at=from_micros(created),
    )


_JOB_COLUMNS = (
    "id, user_id, mechanism, kind, key, payload, attempts, last_error, next_attempt_at, created_at"
)


def unclaimed_jobs(
    rows: Sequence[Sequence[Any]], due_micros: int | None, limit: int | None
) -> builtins.list[Job]:
    """Jobs of rows ``(*_JOB_COLUMNS, claimed_until, claimed_by)``.

    With ``due_micros``, a row claimed until later is kept only if its owner is a dead
    process of this host (:mod:`memories_core.backends.claims`); then at most ``limit``.
    """
    jobs: builtins.list[Job] = []
    for row in rows:
        claimed_until, owner = row[-2], row[-1]
        if (
            due_micros is not None
            and claimed_until is not None
            and claimed_until >= due_micros
            and not owner_is_dead(owner)
        ):
            continue
        jobs.append(_row_to_job(row[:-2]))
        if limit is not None and len(jobs) >= limit:
            break
    return jobs


def _add_claim_owner(connection: Any, dialect: str) -> None:
    """Migration step: ``jobs.claimed_by`` (the claim's owner process), if missing."""
    columns = {row[1] for row in connection.execute("PRAGMA table_info(jobs)")}
    if "claimed_by" not in columns:
        connection.execute("ALTER TABLE jobs ADD COLUMN claimed_by TEXT")


def _dumps(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"value is not JSON-serialisable: {exc}") from exc


class EngineTablesMixin:
    """State, history, jobs, graph, artifacts and tombstones (see the module docstring)."""

    # Provided by SQLiteRecordStore.
    def _read(self) -> AbstractContextManager[sqlite3.Connection]:  # pragma: no cover
        raise NotImplementedError

    def _write(self) -> AbstractContextManager[sqlite3.Connection]:  # pragma: no cover
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[sqlite3.Connection]:
        """One transaction around several calls: all of them commit, or none.

        Calls made inside (by the same thread) join it; other threads wait for it to end, and
        other processes too (``BEGIN IMMEDIATE``). Keep model calls out of it.
        """
        return self._write()

    # -- record state -----------------------------------------------------------------------

    def update_state(
        self,
        user_id: str,
        changes: Mapping[str, Mapping[str, Any]],
        *,
        at: datetime,
        reason: str | None = None,
    ) -> list[StateChange]:
        """Change the mutable state of ``user_id``'s records; never touches text or vectors.

        Args:
            user_id: Owner; ids of other users are skipped.
            changes: Record id -> ``{state field: new value}`` (``attrs`` merges).
            at: When (kept in the history).
            reason: Why (kept in the history).

        Returns:
            The history entries written (records whose state did not change get none).

        Raises:
            InvalidInputError: on an unknown field or a value of the wrong type (nothing
                is written).
        """
        if not changes:
            return []
        at_micros = to_micros(at)
        with self._write() as conn:
            rows = conn.execute(
                f"SELECT r.seq, r.id, {STATE_COLUMNS} FROM records AS r "
                "LEFT JOIN record_state AS s ON s.seq = r.seq "
                "WHERE +r.user_id = ? AND r.id IN (SELECT value FROM json_each(?))",
                (user_id, json.dumps(list(changes))),
            ).fetchall()
            upserts: builtins.list[tuple[Any, ...]] = []
            history: builtins.list[tuple[Any, ...]] = []
            written: builtins.list[StateChange] = []
            for row in rows:
                seq, rid = row[0], row[1]
                old = state_from_row(row[2:])
                new = _state_change(old, changes[rid])
                before, after = _changed(old, new)
                if not after:
                    continue
                upserts.append((seq, user_id, *_state_values(new)))
                history.append((user_id, rid, at_micros, _dumps(before), _dumps(after), reason))
                written.append(StateChange(0, user_id, rid, ensure_utc(at), before, after, reason))
            conn.executemany(
                "INSERT INTO record_state (seq, user_id, strength, recall_count, "
                "last_recalled_at, tier, valid_from, valid_until, archived, attrs) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (seq) DO UPDATE SET "
                "strength = excluded.strength, recall_count = excluded.recall_count, "
                "last_recalled_at = excluded.last_recalled_at, tier = excluded.tier, "
                "valid_from = excluded.valid_from, valid_until = excluded.valid_until, "
                "archived = excluded.archived, attrs = excluded.attrs",
                upserts,
            )
            conn.executemany(
                "INSERT INTO record_history (user_id, record_id, at, old, new, reason) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                history,
            )
        return written

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
        """Append one entry to ``user_id``'s update history (text edits, deletions)."""
        with self._write() as conn:
            conn.execute(
                "INSERT INTO record_history (user_id, record_id, at, old, new, reason) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (user_id, record_id, to_micros(at), _dumps(dict(old)), _dumps(dict(new)), reason),
            )

    def history(
        self, user_id: str, *, record_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateChange]:
        """``user_id``'s update history, oldest first (of one record if ``record_id``)."""
        sql = "SELECT hseq, user_id, record_id, at, old, new, reason FROM record_history "
        sql += "WHERE user_id = ?"
        params: builtins.list[Any] = [user_id]
        if record_id is not None:
            sql += " AND record_id = ?"
            params.append(record_id)
        sql += " ORDER BY hseq"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._read() as conn:
            return [
                StateChange(
                    seq=row[0],
                    user_id=row[1],
                    record_id=row[2],
                    at=from_micros(row[3]),
                    old=json.loads(row[4]),
                    new=json.loads(row[5]),
                    reason=row[6],
                )
                for row in conn.execute(sql, params)
            ]

    # -- pending work -----------------------------------------------------------------------

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
                _dumps(dict(spec.payload)),
                micros,
                micros,
            )
            for spec in specs
        ]
        with self._write() as conn:
            before = conn.total_changes
            conn.executemany(
                "INSERT OR IGNORE INTO jobs (id, user_id, mechanism, kind, key, payload, "
                "next_attempt_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            return conn.total_changes - before

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
        sql = f"SELECT {_JOB_COLUMNS}, claimed_until, claimed_by FROM jobs WHERE 1 = 1"
        params: builtins.list[Any] = []
        if user_id is not None:
            sql += " AND user_id = ?"
            params.append(user_id)
        if mechanisms is not None:
            sql += " AND mechanism IN (SELECT value FROM json_each(?))"
            params.append(json.dumps(list(mechanisms)))
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
        sql += " ORDER BY created_at, rowid"
        if limit is not None and due_at is None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._read() as conn:
            rows = conn.execute(sql, params).fetchall()
        return unclaimed_jobs(rows, None if due_at is None else to_micros(due_at), limit)

    def claim_job(self, job_id: str, *, now: datetime, lease: timedelta) -> bool:
        """Claim a job for ``lease`` so that no other worker runs it meanwhile.

        Returns:
            ``False`` if the job is gone or claimed by a live worker.
        """
        micros, until, owner = to_micros(now), to_micros(now + lease), current_owner()
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE jobs SET claimed_until = ?, claimed_by = ? WHERE id = ? "
                "AND (claimed_until IS NULL OR claimed_until < ?)",
                (until, owner, job_id, micros),
            )
            if cursor.rowcount == 1:
                return True
            # A live lease: taken over at once if its owner is a dead process of this host.
            row = conn.execute("SELECT claimed_by FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None or not owner_is_dead(row[0]):
                return False
            cursor = conn.execute(
                "UPDATE jobs SET claimed_until = ?, claimed_by = ? WHERE id = ? AND claimed_by = ?",
                (until, owner, job_id, row[0]),
            )
            return cursor.rowcount == 1

    def finish_job(self, job_id: str) -> bool:
        """Delete a done job; call it in the transaction that stores what it derived.

        Returns:
            ``False`` if the job no longer exists (another worker finished it): the caller
            must then roll back, so that nothing is derived twice.
        """
        with self._write() as conn:
            return conn.execute("DELETE FROM jobs WHERE id = ?", (job_id,)).rowcount == 1

    def fail_job(self, job_id: str, *, error: str, retry_at: datetime) -> None:
        """Count a failed attempt, keep the error, release the claim, retry after ``retry_at``."""
        with self._write() as conn:
            conn.execute(
                "UPDATE jobs SET attempts = attempts + 1, last_error = ?, next_attempt_at = ?, "
                "claimed_until = NULL, claimed_by = NULL WHERE id = ?",
                (error[:2000], to_micros(retry_at), job_id),
            )

    def update_job(self, job_id: str, payload: Mapping[str, Any]) -> None:
        """Replace a job's payload (e.g. a decision already made, so a retry skips it)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE jobs SET payload = ? WHERE id = ?", (_dumps(dict(payload)), job_id)
            )

    def release_job(self, job_id: str) -> None:
        """Release a claim without counting a failure."""
        with self._write() as conn:
            conn.execute(
                "UPDATE jobs SET claimed_until = NULL, claimed_by = NULL WHERE id = ?", (job_id,)
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
                _dumps(dict(job.payload)),
                job.attempts,
                job.last_error,
                to_micros(job.next_attempt_at),
                to_micros(job.created_at),
            )
            for job in jobs
        ]
        with self._write() as conn:
            before = conn.total_changes
            conn.executemany(
                "INSERT OR IGNORE INTO jobs (id, user_id, mechanism, kind, key, payload, "
                "attempts, last_error, next_attempt_at, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            return conn.total_changes - before

    # -- import / export ----------------------------------------------------------------------

    def user_state(self, user_id: str) -> dict[str, Any]:
        """Every key of ``user_id``'s state table (session tracker, mechanisms' keys)."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT key, value FROM state WHERE user_id = ? ORDER BY key", (user_id,)
            ).fetchall()
        return {key: json.loads(value) for key, value in rows}

    def restore_state(self, user_id: str, states: Mapping[str, RecordState]) -> None:
        """Write records' state exactly, without history entries (import of a memory file)."""
        rows = [
            (*_state_values(new), rid, user_id)
            for rid, new in states.items()
            if new != _STATE_DEFAULTS
        ]
        with self._write() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO record_state (seq, user_id, strength, recall_count, "
                "last_recalled_at, tier, valid_from, valid_until, archived, attrs) "
                "SELECT seq, user_id, ?, ?, ?, ?, ?, ?, ?, ? FROM records "
                "WHERE id = ? AND user_id = ?",
                rows,
            )

    # -- graph ------------------------------------------------------------------------------

    def put_graph(
        self,
        user_id: str,
        *,
        nodes: Sequence[GraphNode] = (),
        edges: Sequence[GraphEdge] = (),
    ) -> None:
        """Insert or replace nodes and edges of ``user_id``'s graph, atomically.

        Raises:
            InvalidInputError: if an edge names a node the user does not have (nothing is
                written).
        """
        node_rows = [(user_id, n.id, n.kind, n.label, _dumps(dict(n.data))) for n in nodes]
        edge_rows = [
            (user_id, e.id, e.source, e.target, e.relation, e.record_id, _dumps(dict(e.data)))
            for e in edges
        ]
        with self._write() as conn:
            conn.executemany(
                "INSERT INTO graph_nodes (user_id, id, kind, label, data) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id, id) DO UPDATE SET "
                "kind = excluded.kind, label = excluded.label, data = excluded.data",
                node_rows,
            )
            ends = sorted({e.source for e in edges} | {e.target for e in edges})
            if ends:
                known = {
                    row[0]
                    for row in conn.execute(
                        "SELECT id FROM graph_nodes WHERE user_id = ? "
                        "AND id IN (SELECT value FROM json_each(?))",
                        (user_id, json.dumps(ends)),
                    )
                }
                unknown = [end for end in ends if end not in known]
                if unknown:
                    # Raising inside the transaction rolls the nodes above back too.
                    raise InvalidInputError(
                        f"edges name nodes this user does not have: {unknown[:5]}"
                    )
            conn.executemany(
                "INSERT INTO graph_edges (user_id, id, source, target, relation, record_id, "
                "data) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (user_id, id) DO UPDATE SET "
                "source = excluded.source, target = excluded.target, "
                "relation = excluded.relation, record_id = excluded.record_id, "
                "data = excluded.data",
                edge_rows,
            )

    def delete_graph(
        self,
        user_id: str,
        *,
        node_ids: Sequence[str] = (),
        edge_ids: Sequence[str] = (),
    ) -> None:
        """Delete nodes (with their edges) and edges of ``user_id``'s graph."""
        with self._write() as conn:
            conn.execute(
                "DELETE FROM graph_edges WHERE user_id = ? "
                "AND id IN (SELECT value FROM json_each(?))",
                (user_id, json.dumps(list(edge_ids))),
            )
            conn.execute(
                "DELETE FROM graph_nodes WHERE user_id = ? "
                "AND id IN (SELECT value FROM json_each(?))",
                (user_id, json.dumps(list(node_ids))),
            )

    def graph_nodes(self, user_id: str, *, kind: str | None = None) -> builtins.list[GraphNode]:
        """``user_id``'s nodes (of one kind if given), in insertion order."""
        sql = "SELECT id, kind, label, data FROM graph_nodes WHERE user_id = ?"
        params: builtins.list[Any] = [user_id]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        with self._read() as conn:
            return [
                GraphNode(id=row[0], kind=row[1], label=row[2], data=json.loads(row[3]))
                for row in conn.execute(sql + " ORDER BY rowid", params)
            ]

    def graph_edges(
        self,
        user_id: str,
        *,
        node_id: str | None = None,
        record_id: str | None = None,
    ) -> builtins.list[GraphEdge]:
        """``user_id``'s edges (touching ``node_id`` / from ``record_id`` if given)."""
        sql = (
            "SELECT id, source, target, relation, record_id, data FROM graph_edges "
            "WHERE user_id = ?"
        )
        params: builtins.list[Any] = [user_id]
        if node_id is not None:
            sql += " AND (source = ? OR target = ?)"
            params += [node_id, node_id]
        if record_id is not None:
            sql += " AND record_id = ?"
            params.append(record_id)
        with self._read() as conn:
            return [
                GraphEdge(
                    id=row[0],
                    source=row[1],
                    target=row[2],
                    relation=row[3],
                    record_id=row[4],
                    data=json.loads(row[5]),
                )
                for row in conn.execute(sql + " ORDER BY rowid", params)
            ]

    # -- artifacts registry -----------------------------------------------------------------

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
        """Record (or replace) the registry entry of an artifact."""
        with self._write() as conn:
            conn.execute(
                "INSERT INTO artifacts (user_id, name, folder, size, sha256, created_at, meta) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (user_id, name) DO UPDATE SET "
                "folder = excluded.folder, size = excluded.size, sha256 = excluded.sha256, "
                "created_at = excluded.created_at, meta = excluded.meta",
                (user_id, name, folder, size, sha256, to_micros(at), _dumps(dict(meta or {}))),
            )

    def artifact_rows(self, user_id: str | None = None) -> builtins.list[dict[str, Any]]:
        """Registry entries (of one user, or all), by user then name."""
        sql = "SELECT user_id, name, folder, size, sha256, created_at, meta FROM artifacts"
        params: builtins.list[Any] = []
        if user_id is not None:
            sql += " WHERE user_id = ?"
            params.append(user_id)
        with self._read() as conn:
            return [
                {
                    "user_id": row[0],
                    "name": row[1],
                    "folder": row[2],
                    "size": row[3],
                    "sha256": row[4],
                    "created_at": from_micros(row[5]),
                    "meta": json.loads(row[6]),
                }
                for row in conn.execute(sql + " ORDER BY user_id, name", params)
            ]

    def unregister_artifact(self, user_id: str, name: str) -> None:
        """Remove an artifact's registry entry."""
        with self._write() as conn:
            conn.execute("DELETE FROM artifacts WHERE user_id = ? AND name = ?", (user_id, name))

    # -- deletion ---------------------------------------------------------------------------

    def mark_deleting(self, user_id: str, *, at: datetime) -> None:
        """Write the tombstone that starts a ``delete_user`` (resumable until purged)."""
        with self._write() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO deletions (user_id, started_at) VALUES (?, ?)",
                (user_id, to_micros(at)),
            )

    def deleting_users(self) -> builtins.list[str]:
        """Users whose deletion started and has not finished."""
        with self._read() as conn:
            return [row[0] for row in conn.execute("SELECT user_id FROM deletions")]

    def is_deleting(self, user_id: str) -> bool:
        """Whether ``user_id`` has an unfinished deletion (their data must not be served)."""
        with self._read() as conn:
            row = conn.execute("SELECT 1 FROM deletions WHERE user_id = ?", (user_id,)).fetchone()
            return row is not None

    def purge_user(self, user_id: str) -> None:
        """Delete every row of ``user_id`` in every table, and the tombstone, in one transaction.

        Full-text entries go with the records (triggers); call :meth:`compact` afterwards so
        that no token of the deleted text stays in the index's segments or the WAL.
        """
        with self._write() as conn:
            conn.execute("DELETE FROM records WHERE user_id = ?", (user_id,))
            for table in (
                "record_state",
                "record_history",
                "jobs",
                "graph_edges",
                "graph_nodes",
                "artifacts",
                "state",
                "users",
                "deletions",
            ):
                conn.execute(f"DELETE FROM {table} WHERE user_id = ?", (user_id,))

    def iter_user_ids(self) -> Iterator[str]:
        """Every user id known to any table (records, state, jobs, graph, artifacts)."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT user_id FROM users UNION SELECT user_id FROM jobs "
                "UNION SELECT user_id FROM graph_nodes UNION SELECT user_id FROM artifacts "
                "UNION SELECT user_id FROM state WHERE user_id != '' ORDER BY 1"
            ).fetchall()
        yield from (row[0] for row in rows)
