"""Table family ``records``: the record of truth, its filters, neighbours and index state.

Schema (both dialects; :mod:`~memories_core.backends.sql.schema`): one row per record;
``id`` is the record's unique key and ``seq`` its storage order (SQLite: a rowid from the
user's range; PostgreSQL: an identity). ``created_at`` is integer microseconds since the
epoch, ``metadata`` and ``source_ids`` are JSON text, ``index_state`` is 0 (not for the
vector index), 1 (pending), 2 (indexed) or 3 (refused by the index). Full-text search is the
backend's own (FTS5, ``tsvector``); everything else here is one statement for every dialect.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from memories_core.backends.sql.base import SQLBase
from memories_core.backends.sql.rows import (
    FAILED,
    INDEXED,
    NOT_INDEXED,
    PENDING,
    STATE_COLUMNS,
    record_from_row,
    state_filter_columns,
    to_micros,
)
from memories_core.backends.sql.text import query_terms
from memories_core.errors import InvalidInputError
from memories_core.filters import compile_filter
from memories_core.interfaces import Filter
from memories_core.types import MemoryRecord, check_user_id

__all__ = ["RecordsTable", "neighbour_sql"]

_MICROSECOND = timedelta(microseconds=1)

#: Neighbour of a record ``c`` in its conversation: ``{side}`` is ``<`` (previous) or ``>``
#: (next), ``{order}`` ``DESC`` or ``ASC``; ``{session}`` matches the session; ``{bound}``
#: limits the time distance. The nearest record at the same time (by ``seq``) else the nearest
#: at another time: two seeks of the ``(user_id, session_id, kind, created_at, seq)`` index
#: (a row-value comparison would walk every record sharing ``c``'s time in SQLite).
_NEIGHBOUR = (
    "COALESCE("
    "(SELECT x.id FROM records AS x{using} WHERE x.user_id = c.user_id AND {session} "
    "AND x.kind = c.kind AND x.created_at = c.created_at AND x.seq {side} c.seq "
    "ORDER BY x.seq {order} LIMIT 1), "
    "(SELECT x.id FROM records AS x{using} WHERE x.user_id = c.user_id AND {session} "
    "AND x.kind = c.kind AND x.created_at {side} c.created_at{bound} "
    "ORDER BY x.created_at {order}, x.seq {order} LIMIT 1))"
)


def neighbour_sql(dialect: Any, session: str, side: str, *, bounded: bool) -> str:
    """The id of record ``c``'s neighbour on ``side`` (``<``: previous, ``>``: next).

    ``session`` matches the session (``x.session_id = c.session_id`` or ``x.session_id IS
    NULL``); with ``bounded`` the neighbour lies within a bound time distance (one ``?``,
    microseconds). The rule of :meth:`RecordsTable.adjacent`.
    """
    before = side == "<"
    sign = "-" if before else "+"
    return _NEIGHBOUR.format(
        using=dialect.using("records_session_order"),
        session=session,
        side=side,
        bound=f" AND x.created_at {'>=' if before else '<='} c.created_at {sign} ?"
        if bounded
        else "",
        order="DESC" if before else "ASC",
    )


class RecordsTable(SQLBase):
    """Records: add, read, list, neighbours, delete, edit, and their vector-index state."""

    def _insert_records(self, conn: Any, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert new records, giving each its ``seq``.

        Rows are ``(kind, text, created_at, session_id, metadata, source_ids, index_state,
        id, user_id)``.
        """
        raise NotImplementedError  # pragma: no cover

    def _columns(self, alias: str = "r.") -> str:
        d = self.dialect
        return (
            f"{alias}id, {alias}user_id, {alias}kind, {alias}text, {alias}created_at, "
            f"{alias}session_id, {d.json(alias + 'metadata')}, {d.json(alias + 'source_ids')}"
        )

    def _stateful(self) -> str:
        """``SELECT`` of records with their mutable state (a missing state row: defaults)."""
        state = STATE_COLUMNS.replace("s.attrs", self.dialect.json("s.attrs"))
        return (
            f"SELECT {self._columns()}, {state} "
            "FROM records AS r LEFT JOIN record_state AS s ON s.seq = r.seq"
        )

    def _filter_sql(self, where: Filter | None) -> tuple[str, builtins.list[Any]]:
        """``where`` as ``" AND (...)"`` and its parameters.

        The condition reads ``records AS r`` joined with ``record_state AS s``.

        Raises:
            InvalidInputError: on an invalid filter.
        """
        expr = compile_filter(where)
        if expr is None:
            return "", []
        sql, params = expr.to_sql(
            state_filter_columns(self.dialect.false),
            metadata_column="r.metadata",
            attrs_column="s.attrs",
            dialect=self.dialect.name,
        )
        # The translator wrote the driver's placeholders; the store writes "?" and
        # translates once, so map them back where they differ.
        if self.dialect.placeholder != "?":
            sql = sql.replace(self.dialect.placeholder, "?")
        return f" AND {sql}", params

    # -- records ----------------------------------------------------------------------------

    def add(self, records: Sequence[MemoryRecord], *, indexed: bool = True) -> None:
        """Insert records atomically (all or none).

        A record whose id exists already replaces it (same user only) and, if ``indexed``,
        becomes pending for the vector index again.

        Args:
            records: The records.
            indexed: Whether the records belong in the vector index (marked pending).

        Raises:
            InvalidInputError: if metadata is not JSON-serialisable, holds text the database
                cannot store, or an id belongs to another user.
            BackendError: if the database fails; nothing is written.
        """
        self._ensure_open()
        check = self.dialect.check_text
        rows: builtins.list[tuple[Any, ...]] = []
        for record in records:
            if not isinstance(record, MemoryRecord):
                raise InvalidInputError(f"expected MemoryRecord, got {type(record).__name__}")
            check_user_id(record.user_id)
            try:
                metadata = json.dumps(dict(record.metadata), ensure_ascii=False)
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(
                    f"metadata of record {record.id!r} is not JSON-serialisable: {exc}"
                ) from exc
            sources = json.dumps(list(record.source_ids), ensure_ascii=False)
            for value, what in (
                (record.id, "record id"),
                (record.kind, "kind"),
                (record.text, "text"),
                (record.session_id, "session_id"),
                (metadata, "metadata"),
                (sources, "source_ids"),
            ):
                check(value, what)
            rows.append(
                (
                    record.kind,
                    record.text,
                    to_micros(record.created_at),
                    record.session_id,
                    metadata,
                    sources,
                    PENDING if indexed else NOT_INDEXED,
                    record.id,
                    record.user_id,
                )
            )
        if not rows:
            return
        with self._write({row[8] for row in rows}) as conn:
            owners: dict[str, str] = dict(
                self._run(
                    conn,
                    f"SELECT id, user_id FROM records WHERE {self.dialect.ids_in('id')}",
                    (self.dialect.ids([row[7] for row in rows]),),
                ).fetchall()
            )
            inserts: builtins.list[tuple[Any, ...]] = []
            updates: builtins.list[tuple[Any, ...]] = []
            for row in rows:
                rid, user_id = row[7], row[8]
                owner = owners.get(rid)
                if owner is None:
                    owners[rid] = user_id
                    inserts.append(row)
                elif owner == user_id:
                    # Also catches an id repeated within this batch: the last one wins.
                    updates.append(row)
                else:
                    raise InvalidInputError(f"record id {rid!r} belongs to another user")
            if inserts:
                self._insert_records(conn, inserts)
            self._many(
                conn,
                "UPDATE records SET kind = ?, text = ?, created_at = ?, session_id = ?, "
                "metadata = ?, source_ids = ?, index_state = ? WHERE id = ? AND user_id = ?",
                updates,
            )

    def get(self, ids: Sequence[str], *, user_id: str) -> builtins.list[MemoryRecord]:
        """Return the records with these ids that belong to ``user_id``, in the given order.

        Missing ids and other users' ids are skipped silently.
        """
        rows = self._rows_by_id(user_id, ids, self._stateful())
        by_id = {row[0]: record_from_row(row) for row in rows}
        result: builtins.list[MemoryRecord] = []
        seen: set[str] = set()
        for rid in ids:
            if rid in by_id and rid not in seen:
                seen.add(rid)
                result.append(by_id[rid])
        return result

    def texts(self, ids: Sequence[str], *, user_id: str) -> dict[str, str]:
        """The texts of the records with these ids that belong to ``user_id``.

        What a reranker reads of its pool: one query over the id index that decodes neither
        metadata nor state, so scoring a few hundred candidates does not pay for building
        them as records (:meth:`get`). Missing ids and other users' ids are left out.
        """
        rows = self._rows_by_id(user_id, ids, "SELECT r.id, r.text FROM records AS r")
        return {rid: text for rid, text in rows}

    def kinds(self, ids: Sequence[str], *, user_id: str) -> dict[str, str]:
        """The kinds of the records with these ids that belong to ``user_id``.

        What a vector index's ``kind`` filter needs of its hits: one query over the id
        index. Chroma returns a hit's metadata at 30-40 microseconds a row, so a deep
        filtered search (200 hits) read its ``kind`` filter's one field faster from here
        (:meth:`~memories_core.backends.chroma_index.ChromaIndex.search`, ``kinds_of``).
        Missing ids and other users' ids are left out.
        """
        rows = self._rows_by_id(user_id, ids, "SELECT r.id, r.kind FROM records AS r")
        return {rid: kind for rid, kind in rows}

    def list(
        self,
        *,
        user_id: str,
        where: Filter | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
    ) -> builtins.list[MemoryRecord]:
        """Return ``user_id``'s records matching ``where``, oldest first (storage order on ties).

        Args:
            user_id: Owner.
            where: A filter (:mod:`memories_core.filters`) on record and state fields.
            since: Keep records created at or after this time.
            until: Keep records created strictly before this time.
            limit: At most this many records (the oldest ones).
        """
        check_user_id(user_id)
        sql = f"{self._stateful()} WHERE r.user_id = ?"
        params: builtins.list[Any] = [user_id]
        if since is not None:
            sql += " AND r.created_at >= ?"
            params.append(to_micros(since))
        if until is not None:
            sql += " AND r.created_at < ?"
            params.append(to_micros(until))
        clause, extra = self._filter_sql(where)
        sql += clause + " ORDER BY r.created_at, r.seq"
        params += extra
        if limit is not None:
            if limit < 0:
                raise InvalidInputError("limit must be >= 0")
            sql += " LIMIT ?"
            params.append(limit)
        with self._read([user_id]) as conn:
            return [record_from_row(row) for row in self._run(conn, sql, params)]

    def _query_terms(self, query: str, *, user_id: str, k: int) -> builtins.list[str]:
        """Validate a lexical search and split its query (:func:`query_terms`)."""
        self._ensure_open()
        check_user_id(user_id)
        if k < 1:
            raise InvalidInputError("k must be >= 1")
        return query_terms(query)

    def adjacent(
        self, ids: Sequence[str], *, user_id: str, gap: timedelta | None = None
    ) -> dict[str, tuple[str | None, str | None]]:
        """Each record's neighbours in its conversation: ``{id: (previous id, next id)}``.

        The rule of :func:`memories_core.retrieval.context.linked`, in at most two indexed
        queries whatever the user's number of records: a record's neighbours are the records
        of the same user and ``kind`` just before and after it in ``(created_at, seq)``
        order, among the records of its session. Records without a session are linked to
        the nearest records that have none either when those lie within ``gap``; with
        ``gap=None`` they are left out, as are missing ids and other users' ids. Each side
        is one seek of the ``(user_id, session_id, kind, created_at)`` index.
        """
        self._ensure_open()
        check_user_id(user_id)
        if not ids:
            return {}
        d = self.dialect
        params: builtins.list[Any] = []
        parts = [self._neighbours_sql("x.session_id = c.session_id", "IS NOT NULL", bounded=False)]
        params += [user_id, d.ids(ids)]
        if gap is not None:
            reach = gap // _MICROSECOND
            parts.append(self._neighbours_sql("x.session_id IS NULL", "IS NULL", bounded=True))
            params += [reach, reach, user_id, d.ids(ids)]
        with self._read([user_id]) as conn:
            rows = self._run(conn, " UNION ALL ".join(parts), params).fetchall()
        return {rid: (prev_id, next_id) for rid, prev_id, next_id in rows}

    def _neighbours_sql(self, session: str, own: str, *, bounded: bool) -> str:
        d = self.dialect
        earlier = neighbour_sql(d, session, "<", bounded=bounded)
        later = neighbour_sql(d, session, ">", bounded=bounded)
        return (
            f"SELECT c.id, {earlier}, {later} FROM records AS c "
            f"WHERE {d.hint('c.user_id')} = ? AND c.session_id {own} AND {d.ids_in('c.id')}"
        )

    def delete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Delete records by id (only those of ``user_id``; other ids are ignored)."""
        self._ensure_open()
        check_user_id(user_id)
        if not ids:
            return
        d = self.dialect
        with self._write([user_id]) as conn:
            self._run(
                conn,
                f"DELETE FROM records WHERE {d.hint('user_id')} = ? AND {d.ids_in('id')}",
                (user_id, d.ids(ids)),
            )

    def edit_text(self, record_id: str, text: str, *, user_id: str) -> str | None:
        """Replace a record's text (its vector becomes pending); returns the old text.

        Returns:
            The previous text, or ``None`` if ``user_id`` has no such record.
        """
        check_user_id(user_id)
        self.dialect.check_text(text, "text")
        with self._write([user_id]) as conn:
            row = self._run(
                conn,
                "SELECT text, index_state FROM records WHERE id = ? AND user_id = ?"
                + self.dialect.lock(),
                (record_id, user_id),
            ).fetchone()
            if row is None:
                return None
            state = PENDING if row[1] != NOT_INDEXED else NOT_INDEXED
            self._run(
                conn,
                "UPDATE records SET text = ?, index_state = ? WHERE id = ? AND user_id = ?",
                (text, state, record_id, user_id),
            )
            return str(row[0])

    def users(self) -> builtins.list[str]:
        """Every user id with at least one record, sorted by code point."""
        with self._read() as conn:
            rows = self._run(
                conn, f"SELECT DISTINCT user_id{self.dialect.collate} FROM records ORDER BY 1"
            )
            return [row[0] for row in rows]

    def count(self, user_id: str | None = None) -> int:
        """Number of records, of one user or of all."""
        with self._read() as conn:
            if user_id is None:
                return int(self._run(conn, "SELECT count(*) FROM records").fetchone()[0])
            check_user_id(user_id)
            row = self._run(conn, "SELECT count(*) FROM records WHERE user_id = ?", (user_id,))
            return int(row.fetchone()[0])

    # -- vector index bookkeeping -----------------------------------------------------------

    def pending_index(self, limit: int | None = None) -> builtins.list[MemoryRecord]:
        """Records marked for the vector index whose vectors are not confirmed yet.

        Returned in storage order, all users together (the indexer scopes each vector by
        the record's own ``user_id``).
        """
        sql = f"SELECT {self._columns()} FROM records AS r WHERE r.index_state = {PENDING} "
        sql += "ORDER BY r.seq"
        params: builtins.list[Any] = []
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        with self._read() as conn:
            return [record_from_row(row) for row in self._run(conn, sql, params)]

    def pending_count(self) -> int:
        """Number of records waiting for the vector index (for progress bars)."""
        with self._read() as conn:
            row = self._run(conn, f"SELECT count(*) FROM records WHERE index_state = {PENDING}")
            return int(row.fetchone()[0])

    def _set_index_state(
        self, ids: Iterable[str], state: int, *, where: str, user_id: str | None = None
    ) -> None:
        id_list = builtins.list(ids)
        if not id_list:
            return
        d = self.dialect
        sql = f"UPDATE records SET index_state = {state} WHERE {where} AND {d.ids_in('id')}"
        params: builtins.list[Any] = [d.ids(id_list)]
        if user_id is not None:
            sql += f" AND {d.hint('user_id')} = ?"
            params.append(user_id)
        with self._write([] if user_id is None else [user_id]) as conn:
            self._run(conn, sql, params)

    def mark_indexed(self, ids: Iterable[str]) -> None:
        """Confirm that these records' vectors are in the vector index."""
        self._ensure_open()
        # The hint: look rows up by id, not by scanning every pending row.
        pending = f"{self.dialect.hint('index_state')} = {PENDING}"
        self._set_index_state(ids, INDEXED, where=pending)

    def mark_index_failed(self, ids: Iterable[str]) -> None:
        """Set records the vector index refused aside, so they cannot block other records."""
        pending = f"{self.dialect.hint('index_state')} = {PENDING}"
        self._set_index_state(ids, FAILED, where=pending)

    def mark_pending(self, ids: Iterable[str], *, user_id: str) -> None:
        """Mark records of ``user_id`` pending for the vector index (repair, reindex)."""
        where = f"index_state <> {NOT_INDEXED}"
        self._set_index_state(ids, PENDING, where=where, user_id=user_id)

    def index_states(self, user_id: str) -> dict[str, str]:
        """Index state of ``user_id``'s records that belong in the vector index.

        Returns:
            ``{record id: "pending" | "indexed" | "failed"}`` (used by ``verify``).
        """
        check_user_id(user_id)
        names = {PENDING: "pending", INDEXED: "indexed", FAILED: "failed"}
        with self._read([user_id]) as conn:
            rows = self._run(
                conn,
                f"SELECT id, index_state FROM records WHERE user_id = ? "
                f"AND index_state <> {NOT_INDEXED}",
                (user_id,),
            ).fetchall()
        return {rid: names[state] for rid, state in rows}

    def include_in_index(self, *, user_id: str | None = None, kind: str) -> int:
        """Mark records of ``kind`` that were kept out of the vector index pending for it.

        Used when a mechanism that recalls turns by vector joins a memory whose turns were
        written without vectors. Returns how many records became pending.
        """
        sql = f"UPDATE records SET index_state = {PENDING} WHERE index_state = {NOT_INDEXED} "
        sql += "AND kind = ?"
        params: builtins.list[Any] = [kind]
        users: builtins.list[str] = []
        if user_id is not None:
            sql += " AND user_id = ?"
            params.append(user_id)
            users.append(user_id)
        with self._write(users) as conn:
            return int(self._run(conn, sql, params).rowcount)

    def mark_all_pending(self) -> int:
        """Mark every indexed (or refused) record pending again (for ``reindex``).

        Returns:
            How many records went from indexed to pending.
        """
        with self._write() as conn:
            cursor = self._run(
                conn,
                f"UPDATE records SET index_state = {PENDING} "
                f"WHERE index_state IN ({INDEXED}, {FAILED})",
            )
            return int(cursor.rowcount)
