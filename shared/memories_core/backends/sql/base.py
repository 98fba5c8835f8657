"""The seam between the shared SQL store and a backend module.

:class:`SQLBase` names what every table family (:mod:`~memories_core.backends.sql.records`,
:mod:`~memories_core.backends.sql.state`, ...) uses: the backend's :class:`SQLDialect`, its
read and write connections (``_read``/``_write``, which take the users a statement touches
so that a backend with per-user locks can take them), and two helpers that run a statement
with the dialect's placeholders. A backend module subclasses
:class:`~memories_core.backends.sql.SQLStore` and fills these in.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar

from memories_core.backends.sql.dialect import SQLDialect
from memories_core.errors import BackendError
from memories_core.types import check_user_id

__all__ = ["SQLBase"]


class SQLBase:
    """Connections and statement helpers every table family of the SQL store relies on.

    Class attributes a backend sets:
        dialect: Its :class:`SQLDialect`.
        user_tables: Tables besides ``records`` that hold rows per ``user_id`` (all of a
            user's rows go in :meth:`~memories_core.backends.sql.SQLStore.purge_user`).
        owners_table: The table listing users who have (had) records.
    """

    dialect: ClassVar[SQLDialect]
    user_tables: ClassVar[tuple[str, ...]] = (
        "record_state",
        "record_history",
        "jobs",
        "graph_edges",
        "graph_nodes",
        "artifacts",
        "state",
        "deletions",
        "token_vectors",
    )
    owners_table: ClassVar[str] = "records"

    _closed: bool = False

    # -- provided by the backend ------------------------------------------------------------

    def _read(self, users: Iterable[str] = ()) -> AbstractContextManager[Any]:
        """A connection for reads (inside the thread's transaction, if one is open)."""
        raise NotImplementedError  # pragma: no cover

    def _write(self, users: Iterable[str] = ()) -> AbstractContextManager[Any]:
        """A transaction (joining the thread's open one), holding ``users``' locks."""
        raise NotImplementedError  # pragma: no cover

    def _lock_users(self, conn: Any, users: Iterable[str]) -> None:
        """Take ``users``' transaction locks on ``conn`` (a database-wide lock: nothing)."""

    def _executemany(self, conn: Any, statement: str, rows: Sequence[Sequence[Any]]) -> int:
        """Run ``statement`` (driver placeholders) once per row; returns rows changed."""
        raise NotImplementedError  # pragma: no cover

    # -- shared -----------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        # Checked up front too, so calls that would return early (no ids, no query terms)
        # still fail on a closed store, as the protocol promises.
        if self._closed:
            raise BackendError("the record store is closed")

    def _run(self, conn: Any, statement: str, params: Sequence[Any] | None = None) -> Any:
        """Execute ``statement`` (written with ``?``) on ``conn``; returns the cursor."""
        if params is None:
            return conn.execute(self.dialect.sql(statement))
        return conn.execute(self.dialect.sql(statement), params)

    def _rows_by_id(
        self,
        user_id: str,
        ids: Sequence[str],
        select: str,
        *,
        also: str = "",
        params: Sequence[Any] = (),
    ) -> list[Any]:
        """Rows of ``select`` (aliasing ``records`` as ``r``) for ``user_id``'s records in ``ids``.

        The one read by a batch of ids: checks the store and the user, returns nothing for
        no ids, and keeps the planner on the id index (the batch is small, a user's records
        may be many). ``also`` adds conditions after the id list, with ``params`` for them.
        """
        self._ensure_open()
        check_user_id(user_id)
        if not ids:
            return []
        d = self.dialect
        sql = f"{select} WHERE {d.hint('r.user_id')} = ? AND {d.ids_in('r.id')}{also}"
        with self._read([user_id]) as conn:
            return list(self._run(conn, sql, (user_id, d.ids(list(ids)), *params)).fetchall())

    def _many(self, conn: Any, statement: str, rows: Sequence[Sequence[Any]]) -> int:
        """Execute ``statement`` (written with ``?``) once per row; returns rows changed."""
        if not rows:
            return 0
        return self._executemany(conn, self.dialect.sql(statement), rows)

    @contextmanager
    def _joined(
        self,
        nesting: Any,
        conn: Any,
        errors: type[BaseException] | tuple[type[BaseException], ...],
        what: str,
        users: Iterable[str] = (),
    ) -> Iterator[Any]:
        """Join the transaction open on ``conn``; the outermost block commits or rolls back.

        ``nesting.depth`` counts the blocks inside it; ``users`` are locked first (until the
        transaction ends). A driver error becomes a :class:`BackendError` saying ``what``.
        """
        nesting.depth += 1
        try:
            self._lock_users(conn, users)
            yield conn
        except errors as exc:
            raise BackendError(f"{what}: {exc}") from exc
        finally:
            nesting.depth -= 1

    @staticmethod
    @contextmanager
    def _held_again(held: dict[Any, int], key: Any) -> Iterator[None]:
        """Re-enter a lock this thread holds already (its depth counted in ``held[key]``)."""
        held[key] += 1
        try:
            yield
        finally:
            held[key] -= 1

    def transaction(self) -> AbstractContextManager[Any]:
        """One transaction around several calls: all of them commit, or none.

        Calls made inside (by the same thread) join it; other writers wait for it to end
        (SQLite: the database's write lock; PostgreSQL: the users' advisory locks). Keep
        model calls out of it.
        """
        return self._write()
