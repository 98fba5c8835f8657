"""Table family ``token_vectors``: each record's late-interaction token vectors.

One row per record (its ``seq``, so it is deleted with the record by ``ON DELETE CASCADE``,
and with the user by :meth:`~memories_core.backends.sql.SQLStore.purge_user`): the owner,
the encoder's tag, the digest of the text encoded, the matrix's shape, its int8 bytes and
their scale (the codec is :class:`~memories_core.token_vectors.TokenVectors`). Rows are
written by the save's pending job and by a recall that had to encode a record, and read
for a recall's whole pool in one query. Every statement names the user: one user never
reads or writes another's rows.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from memories_core.backends.sql.base import SQLBase
from memories_core.backends.sql.records import neighbour_sql
from memories_core.errors import InvalidInputError
from memories_core.token_vectors import PoolRow, TokenVectors
from memories_core.types import check_user_id

__all__ = ["TokenVectorsTable"]

logger = logging.getLogger(__name__)
_MICROSECOND = timedelta(microseconds=1)

_COLUMNS = "r.id, t.encoder, t.digest, t.tokens, t.dim, t.scale, t.data"


def _row(row: Sequence[Any]) -> TokenVectors:
    return TokenVectors.from_bytes(
        row[0], row[1], row[2], bytes(row[6]), tokens=row[3], dim=row[4], scale=row[5]
    )


class TokenVectorsTable(SQLBase):
    """Write, read and delete token vectors per record (see the module docstring)."""

    def put_token_vectors(self, user_id: str, rows: Sequence[TokenVectors]) -> int:
        """Store (or replace) the rows of ``user_id``'s records; a missing record is skipped.

        A record deleted meanwhile, or another user's id, matches no record of
        ``user_id`` and writes nothing.

        Raises:
            InvalidInputError: if a row is not :class:`TokenVectors`.
        """
        self._ensure_open()
        check_user_id(user_id)
        for row in rows:
            if not isinstance(row, TokenVectors):
                raise InvalidInputError(f"expected TokenVectors, got {type(row).__name__}")
        if not rows:
            return 0
        params = [
            (
                r.encoder,
                r.digest,
                r.tokens,
                r.dim,
                float(r.scale),
                r.data.tobytes(),
                r.record_id,
                user_id,
            )
            for r in rows
        ]
        with self._write([user_id]) as conn:
            return self._many(
                conn,
                "INSERT INTO token_vectors (seq, user_id, encoder, digest, tokens, dim, scale, "
                "data) SELECT seq, user_id, ?, ?, ?, ?, ?, ? FROM records "
                "WHERE id = ? AND user_id = ? ON CONFLICT (seq) DO UPDATE SET "
                "encoder = excluded.encoder, digest = excluded.digest, "
                "tokens = excluded.tokens, dim = excluded.dim, scale = excluded.scale, "
                "data = excluded.data",
                params,
            )

    def token_vectors(
        self, user_id: str, ids: Sequence[str], *, encoder: str
    ) -> dict[str, TokenVectors]:
        """The rows of ``ids`` among ``user_id``'s records made by ``encoder`` (one query).

        The plan seeks each id, then its row by ``seq``: SQLite otherwise walked the user's
        whole ``(user_id, encoder)`` index (72.6 against 10.1 ms for a 250-record pool at
        100k records; BENCHMARKS.md, "Late-interaction vectors kept with the records").
        """
        d = self.dialect
        rows = self._rows_by_id(
            user_id,
            ids,
            f"SELECT {_COLUMNS} FROM records r JOIN token_vectors t ON t.seq = r.seq",
            also=f" AND {d.hint('t.user_id')} = ? AND {d.hint('t.encoder')} = ?",
            params=(user_id, encoder),
        )
        return {row[0]: _row(row) for row in rows}

    def pool_rows(
        self, user_id: str, ids: Sequence[str], *, encoder: str, gap: timedelta | None
    ) -> dict[str, PoolRow]:
        """Each of ``user_id``'s records among ``ids``: the previous record's text and its row.

        One query for a late-interaction pool scored with context
        (:class:`~memories_core.token_vectors.PoolReader`), where the previous neighbours, their
        texts and the pool's rows were three. The neighbour rule is
        :meth:`~memories_core.backends.sql.records.RecordsTable.adjacent`'s. A row that does
        not decode (a damaged file) is logged and left out, so only that record is encoded
        again.
        """
        self._ensure_open()
        check_user_id(user_id)
        if not ids:
            return {}
        d = self.dialect
        listed = d.ids(list(ids))

        def part(own: str, previous: str | None) -> str:
            """The records with ``c.session_id {own}``, linked by the ``previous`` rule."""
            text, link = "NULL", ""  # records without a session, and no gap: no neighbour
            if previous is not None:
                text = "p.text"
                link = f"LEFT JOIN records AS p ON p.id = {previous} AND p.user_id = c.user_id "
            return (
                f"SELECT c.id, {text}, t.digest, t.tokens, t.dim, t.scale, t.data "
                f"FROM records AS c {link}"
                "LEFT JOIN token_vectors AS t ON t.seq = c.seq AND t.user_id = c.user_id "
                f"AND t.encoder = ? WHERE {d.hint('c.user_id')} = ? AND c.session_id {own} "
                f"AND {d.ids_in('c.id')}"
            )

        in_session = neighbour_sql(d, "x.session_id = c.session_id", "<", bounded=False)
        parts = [part("IS NOT NULL", in_session)]
        params: builtins.list[Any] = [encoder, user_id, listed]
        if gap is None:
            parts.append(part("IS NULL", None))
        else:
            parts.append(
                part("IS NULL", neighbour_sql(d, "x.session_id IS NULL", "<", bounded=True))
            )
            params.append(gap // _MICROSECOND)
        params += [encoder, user_id, listed]
        with self._read([user_id]) as conn:
            rows = self._run(conn, " UNION ALL ".join(parts), params).fetchall()
        found: dict[str, PoolRow] = {}
        for rid, previous, digest, tokens, dim, scale, data in rows:
            row = None
            if digest is not None:
                try:
                    row = _row((rid, encoder, digest, tokens, dim, scale, data))
                except (InvalidInputError, ValueError, TypeError):
                    logger.warning("stored token vectors of a record do not decode; re-encoding")
            found[rid] = PoolRow(previous, row)
        return found

    def token_vector_rows(self, user_id: str) -> builtins.list[TokenVectors]:
        """Every row of ``user_id`` (any encoder), in record order, for export."""
        self._ensure_open()
        check_user_id(user_id)
        with self._read([user_id]) as conn:
            rows = self._run(
                conn,
                f"SELECT {_COLUMNS} FROM records r JOIN token_vectors t ON t.seq = r.seq "
                "WHERE r.user_id = ? AND t.user_id = ? ORDER BY r.seq",
                (user_id, user_id),
            ).fetchall()
        return [_row(row) for row in rows]

    def delete_token_vectors(self, user_id: str, *, keep_encoder: str | None = None) -> int:
        """Delete ``user_id``'s rows: all, or those of encoders other than ``keep_encoder``."""
        self._ensure_open()
        check_user_id(user_id)
        sql = "DELETE FROM token_vectors WHERE user_id = ?"
        params: builtins.list[Any] = [user_id]
        if keep_encoder is not None:
            sql += " AND encoder <> ?"
            params.append(keep_encoder)
        with self._write([user_id]) as conn:
            return int(self._run(conn, sql, params).rowcount)
