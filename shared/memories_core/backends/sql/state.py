"""Table families ``state`` (key/value), ``record_state`` and ``record_history``.

* ``state``: JSON values per ``(user_id, key)``; ``''`` is the global scope. Mechanisms keep
  their small per-user bookkeeping here (session tracker, counters).
* ``record_state``: the mutable part of a record, one row per record *that has state*
  (created on the first update; a record without a row has the defaults of
  :class:`~memories_core.types.RecordState`). Keyed by the record's ``seq`` and deleted with
  it.
* ``record_history``: every state update and text edit, per user: old, new, when, why,
  in insertion order (``hseq``).
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from memories_core.backends.sql.base import SQLBase
from memories_core.backends.sql.rows import (
    STATE_COLUMNS,
    STATE_DEFAULTS,
    apply_state_changes,
    changed_fields,
    dumps,
    from_micros,
    state_from_row,
    state_values,
    to_micros,
)
from memories_core.errors import InvalidInputError
from memories_core.types import RecordState, StateChange, check_user_id, ensure_utc

__all__ = ["StateTables"]

_STATE_UPSERT = (
    "ON CONFLICT (seq) DO UPDATE SET "
    "strength = excluded.strength, recall_count = excluded.recall_count, "
    "last_recalled_at = excluded.last_recalled_at, tier = excluded.tier, "
    "valid_from = excluded.valid_from, valid_until = excluded.valid_until, "
    "archived = excluded.archived, attrs = excluded.attrs"
)
_STATE_INSERT = (
    "INSERT INTO record_state (seq, user_id, strength, recall_count, last_recalled_at, tier, "
    "valid_from, valid_until, archived, attrs) "
)
_HISTORY_INSERT = (
    "INSERT INTO record_history (user_id, record_id, at, old, new, reason) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)


class StateTables(SQLBase):
    """Per-user key/value state, records' mutable state, and its history."""

    # -- key/value state --------------------------------------------------------------------

    def get_state(self, key: str, *, user_id: str | None = None) -> Any:
        """Read a JSON value from the per-user (or global, ``user_id=None``) state table.

        Returns:
            The value, or ``None`` if the key is not set.
        """
        scope = "" if user_id is None else check_user_id(user_id)
        with self._read([scope] if scope else []) as conn:
            row = self._run(
                conn,
                f"SELECT {self.dialect.json('value')} FROM state WHERE user_id = ? AND key = ?",
                (scope, key),
            ).fetchone()
        return None if row is None else json.loads(row[0])

    def set_state(self, key: str, value: Any, *, user_id: str | None = None) -> None:
        """Write a JSON value into the state table (``None`` deletes the key).

        Raises:
            InvalidInputError: if ``value`` is not JSON-serialisable, or the key or value
                holds text the database cannot store.
        """
        scope = "" if user_id is None else check_user_id(user_id)
        if not isinstance(key, str) or not key:
            raise InvalidInputError("state key must be a non-empty string")
        self.dialect.check_text(key, "state key")
        users = [scope] if scope else []
        if value is None:
            with self._write(users) as conn:
                self._run(conn, "DELETE FROM state WHERE user_id = ? AND key = ?", (scope, key))
            return
        try:
            encoded = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"state value for {key!r} is not JSON-serialisable") from exc
        self.dialect.check_text(encoded, f"state value for {key!r}")
        with self._write(users) as conn:
            self._run(
                conn,
                "INSERT INTO state (user_id, key, value) VALUES (?, ?, ?) "
                "ON CONFLICT (user_id, key) DO UPDATE SET value = excluded.value",
                (scope, key, encoded),
            )

    def user_state(self, user_id: str) -> dict[str, Any]:
        """Every key of ``user_id``'s state table (session tracker, mechanisms' keys)."""
        with self._read([user_id]) as conn:
            rows = self._run(
                conn,
                f"SELECT key, {self.dialect.json('value')} FROM state WHERE user_id = ? "
                f"ORDER BY key{self.dialect.collate}",
                (user_id,),
            ).fetchall()
        return {key: json.loads(value) for key, value in rows}

    # -- record state -----------------------------------------------------------------------

    def update_state(
        self,
        user_id: str,
        changes: Mapping[str, Mapping[str, Any]],
        *,
        at: datetime,
        reason: str | None = None,
    ) -> builtins.list[StateChange]:
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
        d = self.dialect
        at_micros = to_micros(at)
        with self._write([user_id]) as conn:
            rows = self._run(
                conn,
                f"SELECT r.seq, r.id, {STATE_COLUMNS.replace('s.attrs', d.json('s.attrs'))} "
                "FROM records AS r LEFT JOIN record_state AS s ON s.seq = r.seq "
                f"WHERE {d.hint('r.user_id')} = ? AND {d.ids_in('r.id')}{d.lock(of='r')}",
                (user_id, d.ids(builtins.list(changes))),
            ).fetchall()
            upserts: builtins.list[tuple[Any, ...]] = []
            history: builtins.list[tuple[Any, ...]] = []
            written: builtins.list[StateChange] = []
            for row in rows:
                seq, rid = row[0], row[1]
                old = state_from_row(row[2:])
                new = apply_state_changes(old, changes[rid])
                before, after = changed_fields(old, new)
                if not after:
                    continue
                upserts.append((seq, user_id, *state_values(new, d.encode_bool)))
                history.append((user_id, rid, at_micros, dumps(before), dumps(after), reason))
                written.append(StateChange(0, user_id, rid, ensure_utc(at), before, after, reason))
            values = "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
            self._many(conn, _STATE_INSERT + values + _STATE_UPSERT, upserts)
            self._many(conn, _HISTORY_INSERT, history)
        return written

    def restore_state(self, user_id: str, states: Mapping[str, RecordState]) -> None:
        """Write records' state exactly, without history entries (import of a memory file)."""
        rows = [
            (*state_values(new, self.dialect.encode_bool), rid, user_id)
            for rid, new in states.items()
            if new != STATE_DEFAULTS
        ]
        if not rows:
            return
        with self._write([user_id]) as conn:
            self._many(
                conn,
                _STATE_INSERT + "SELECT seq, user_id, ?, ?, ?, ?, ?, ?, ?, ? FROM records "
                "WHERE id = ? AND user_id = ? " + _STATE_UPSERT,
                rows,
            )

    # -- history ----------------------------------------------------------------------------

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
        with self._write([user_id]) as conn:
            self._run(
                conn,
                _HISTORY_INSERT,
                (user_id, record_id, to_micros(at), dumps(dict(old)), dumps(dict(new)), reason),
            )

    def history(
        self, user_id: str, *, record_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateChange]:
        """``user_id``'s update history, oldest first (of one record if ``record_id``)."""
        d = self.dialect
        sql = (
            f"SELECT hseq, user_id, record_id, at, {d.json('old')}, {d.json('new')}, reason "
            "FROM record_history WHERE user_id = ?"
        )
        params: builtins.list[Any] = [user_id]
        if record_id is not None:
            sql += " AND record_id = ?"
            params.append(record_id)
        sql += " ORDER BY hseq"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._read([user_id]) as conn:
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
                for row in self._run(conn, sql, params)
            ]
