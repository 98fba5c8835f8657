"""Table family ``deletions``: tombstones of unfinished ``delete_user`` runs, and the purge.

``delete_user`` first writes a tombstone, then erases the user's vectors and files, then
purges every row of the user (tombstone included) in one transaction. A run cut short is
resumed when the memory opens again; until then the user's data is not served.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from datetime import datetime

from memories_core.backends.sql.base import SQLBase
from memories_core.backends.sql.rows import to_micros
from memories_core.types import check_user_id

__all__ = ["TombstonesTable"]


class TombstonesTable(SQLBase):
    """Tombstones, the purge of a user's rows, and every user any table knows."""

    def compact(self) -> None:
        """Drop deleted content from indexes and logs (the backend's own)."""
        raise NotImplementedError  # pragma: no cover

    def mark_deleting(self, user_id: str, *, at: datetime) -> None:
        """Write the tombstone that starts a ``delete_user`` (resumable until purged)."""
        with self._write([user_id]) as conn:
            self._run(
                conn,
                "INSERT INTO deletions (user_id, started_at) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (user_id, to_micros(at)),
            )

    def deleting_users(self) -> builtins.list[str]:
        """Users whose deletion started and has not finished."""
        with self._read() as conn:
            return [row[0] for row in self._run(conn, "SELECT user_id FROM deletions")]

    def is_deleting(self, user_id: str) -> bool:
        """Whether ``user_id`` has an unfinished deletion (their data must not be served)."""
        with self._read() as conn:
            row = self._run(conn, "SELECT 1 FROM deletions WHERE user_id = ?", (user_id,))
            return row.fetchone() is not None

    def purge_user(self, user_id: str) -> None:
        """Delete every row of ``user_id`` in every table, and the tombstone, in one transaction.

        Call :meth:`compact` afterwards, so that nothing of the deleted rows stays in the
        full-text index, the free pages or the log.
        """
        with self._write([user_id]) as conn:
            for table in ("records", *self.user_tables):
                self._run(conn, f"DELETE FROM {table} WHERE user_id = ?", (user_id,))

    def delete_user(self, user_id: str) -> None:
        """Delete every row of ``user_id`` in every table, then :meth:`compact`."""
        check_user_id(user_id)
        self.purge_user(user_id)
        self.compact()

    def iter_user_ids(self) -> Iterator[str]:
        """Every user id known to any table (records, state, jobs, graph, artifacts)."""
        with self._read() as conn:
            rows = self._run(
                conn,
                f"SELECT user_id FROM (SELECT user_id FROM {self.owners_table} "
                "UNION SELECT user_id FROM jobs UNION SELECT user_id FROM graph_nodes "
                "UNION SELECT user_id FROM artifacts "
                "UNION SELECT user_id FROM state WHERE user_id <> '') AS known "
                f"ORDER BY user_id{self.dialect.collate}",
            ).fetchall()
        yield from (row[0] for row in rows)
