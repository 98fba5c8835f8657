"""pgvector index: record vectors in PostgreSQL, HNSW with cosine distance.

One table (``vectors`` by default, in the schema given as ``schema=``; versioned in
``schema_version``, component ``pgvector``): ``id`` (the record's id), ``user_id``,
``metadata`` (``json``: ``kind``, ``session_id`` and the record's scalar metadata, see
:func:`~memories_core.retrieval.index_metadata`), ``embedding vector(dimension)``, and
``kind`` / ``session_id`` as stored columns generated from ``metadata`` (schema version 2),
a B-tree on ``user_id``, and ``graph`` (schema version 3): whether the row is in the HNSW
index (``vector_cosine_ops``), which is partial (``WHERE graph``).

Small users are searched exactly (schema version 3): a user with at most ``exact_below``
vectors (10,000) keeps them out of the HNSW graph and is searched by an exact sort of their
rows (read from the covering index below), like
:class:`~memories_core.backends.ChromaIndex`'s small users. One global graph made every
insert a walk of everybody's vectors: about 50 ms per 384-dimension vector into a 1M-row
graph, 42 records/s whatever the number of writers (BENCHMARKS.md, "Scale out"). The
``add`` that takes a user past ``exact_below`` moves all of that user's rows into the graph
(one ``UPDATE``, under the user's advisory lock, so a user's rows always agree).

Searches filter by user **inside** the SQL query (``WHERE user_id = %s ... ORDER BY
embedding <=> query LIMIT k``), together with the part of the caller's filter the metadata can
answer (:func:`~memories_core.filters.index_prefilter`, translated by
:class:`~memories_core.filters.PostgresTranslator`). pgvector >= 0.8 keeps scanning the HNSW
graph until ``k`` rows pass the filter (``hnsw.iterative_scan = strict_order``), so a user
with few vectors among many users still gets ``k`` results; for a small table the planner uses
the ``user_id`` index and an exact sort instead.

A small user's exact search reads their vectors from a covering B-tree (schema version 4):
``(user_id) INCLUDE (id, kind, session_id, embedding) WHERE NOT graph``. Users write in turn,
so the heap holds each user's rows on as many pages as rows (1,000 users, 1M rows: ~1,040
pages per user); the B-tree keeps them together (a quarter of the pages), and an index-only
scan reads nothing else. It doubles the disk of the small users' vectors. A B-tree row holds
at most 2,704 bytes, so rows whose ids, kind and session id are too long for the vector
(:func:`_fits_clause`) go to a second, key-only index, and the search unites both parts; for
vectors too long for any row (about 580 dimensions and more) neither index is built and the
search reads the heap as before. At 1M 384-dimension vectors the covering index takes
2.2 GB beside the table's 2.2 GB; where disk matters more than search time, drop
``{table}_exact`` and ``{table}_exact_rest`` (the index sees it at its next open and reads the
heap; the migration does not build them again).

The search settings (``hnsw.iterative_scan`` and ``hnsw.ef_search``, at least ``k``) are set
at session level on each of the index's own pooled connections, and again only when a search
needs another ``ef_search``: a search is then one statement, where setting them per query
took a transaction (``BEGIN``, ``set_config``, the query, ``COMMIT``); a ``MemoryStore`` search
makes 10 round trips instead of 13 (BENCHMARKS.md, "Storage"). The pool is the index's own,
so no other query sees these settings.
"""

from __future__ import annotations

import builtins
import json
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import numpy as np
import numpy.typing as npt

from memories_core.backends.numpy_index import (
    PROBE_DEPTH,
    as_query,
    check_filter,
    checked_batch,
)
from memories_core.backends.pg_common import (
    check_schema,
    make_pool,
    migrate,
    prepare,
    redact_dsn,
)
from memories_core.errors import (
    BackendError,
    ConfigurationError,
    EmbedderMismatchError,
    InvalidInputError,
    check_count,
)
from memories_core.filters import ColumnType, index_prefilter
from memories_core.interfaces import Filter
from memories_core.types import check_user_id

__all__ = ["PgVectorIndex"]

# How much lower a score may be and still tie with a probed vector's own score.
_TIE = 1e-5

#: Users with at most this many vectors are searched exactly, outside the HNSW graph.
#: Chosen by cost (an exact search against the graph on the 1M-row store, PostgreSQL's default
#: settings, the covering index): an exact search of a 10,000-vector user took 7.9 ms p50,
#: a search of a graph holding only that user's rows 14.6 ms; at 20,000 the two were level
#: (23.7 / 22.6 ms); and a row written outside the graph costs 0.14 ms against 2.3-4.6 ms
#: into even a one-user graph (BENCHMARKS.md, "Scale out"). Was 2,000 (Chroma's bound).
EXACT_BELOW = 10_000

#: Rows added by this process after which the table's planner statistics are refreshed
#: (or a fifth of the rows counted at the last refresh, whichever is more).
ANALYZE_AFTER_ROWS = 1_000

_FILTER_COLUMNS: dict[str, tuple[str, ColumnType]] = {
    "id": ("v.id", "text"),
    # Stored generated columns (migration 2): reading them costs nothing per row, where
    # ``metadata ->> 'kind'`` parses each candidate's json text again.
    "kind": ("v.kind", "text"),
    "session_id": ("v.session_id", "text"),
}


#: PostgreSQL's largest B-tree row (bytes), and what our estimate leaves for its headers.
_BTREE_ROW_LIMIT = 2704
_BTREE_ROW_MARGIN = 100
#: Below this many bytes left for the ids, kind and session id, no covering index is built.
_MIN_KEY_BYTES = 128


def _key_budget(dimension: int) -> int:
    """Bytes a covering B-tree row has left for ``user_id``, ``id``, ``kind`` and ``session_id``.

    A ``vector`` value is 8 header bytes and 4 per dimension; what is left under the row limit
    (less a margin for the tuple and field headers) is the budget. Below
    :data:`_MIN_KEY_BYTES` (about 580 dimensions and more) there is no covering index.
    """
    return _BTREE_ROW_LIMIT - _BTREE_ROW_MARGIN - (8 + 4 * dimension)


def _fits_clause(budget: int, alias: str = "") -> str:
    """SQL: this row's ids, kind and session id fit a covering B-tree row (``budget`` bytes).

    The same text is the covering index's predicate and the search's condition, so the
    planner can prove the index answers it; ``budget`` is an int, never user input.
    """
    a = alias
    return (
        f"(octet_length({a}user_id) + octet_length({a}id) + coalesce(octet_length({a}kind), 0)"
        f" + coalesce(octet_length({a}session_id), 0) <= {int(budget)})"
    )


def _literal(vector: npt.NDArray[np.float32]) -> str:
    """The pgvector text form of a vector (9 significant digits: exact for float32)."""
    return "[" + ",".join(format(float(x), ".9g") for x in vector) + "]"


def _parse(text: str) -> npt.NDArray[np.float32]:
    return np.asarray(json.loads(text), dtype=np.float32)


class PgVectorIndex:
    """A :class:`~memories_core.interfaces.VectorIndex` on PostgreSQL with pgvector.

    Setup:
        ``pip install 'llm-memories[postgres]'`` and a server with the ``vector`` extension
        (>= 0.8 for iterative filtered scans). The extension is created if missing (which
        needs the right to create it; otherwise a DBA runs ``CREATE EXTENSION vector``).

    Key init args:
        dsn: libpq connection string or URI (never logged; see
            :class:`~memories_core.backends.postgres.PostgresRecordStore`).
        dimension: Length of the vectors (the embedder's ``dimension``).
        schema: Schema of the table (default ``llm_memories``, shared with the record store).
        table: Table name (several indexes can share a schema).
        pool_size: Maximum connections of this process's pool.
        ef_search: HNSW candidate list size per query (at least ``k`` is used).
        exact_below: Users with at most this many vectors stay out of the HNSW graph and are
            searched exactly (``0``: every vector goes into the graph, the former layout).

    Instantiate:
        .. code-block:: python

            from memories_core.backends.pgvector_index import PgVectorIndex

            index = PgVectorIndex("postgresql://app@db/app", dimension=384)

    Scores:
        Cosine similarity, ``1 - (embedding <=> query)``, higher is better. A small user's
        search is exact; HNSW search is approximate (pgvector's defaults: ``m = 16``,
        ``ef_construction = 64``).

    Embedder change:
        A table built for another dimension is left as it is; adding or searching with
        the new dimension raises :class:`EmbedderMismatchError` until :meth:`reset` (called
        by ``reindex``) recreates the table with this index's ``dimension``.
    """

    def __init__(
        self,
        dsn: str,
        *,
        dimension: int,
        schema: str = "llm_memories",
        table: str = "vectors",
        pool_size: int = 4,
        timeout: float = 30.0,
        ef_search: int = 100,
        exact_below: int = EXACT_BELOW,
    ) -> None:
        dimension = check_count("dimension", dimension)
        exact_below = check_count("exact_below", exact_below, minimum=0)
        self.exact_below = exact_below
        if dimension > 16000:
            raise ConfigurationError("pgvector stores at most 16000 dimensions")
        self.dimension = dimension
        self.schema = check_schema(schema)
        self.table = check_schema(table)
        self.ef_search = max(1, int(ef_search))
        self._dsn_redacted = redact_dsn(dsn)
        self._lock = threading.Lock()
        self._closed = False
        self._pool = make_pool(
            dsn,
            schema=schema,
            min_size=1,
            max_size=pool_size,
            timeout=timeout,
            name=f"llm-memories-pgvector-{schema}",
        )
        self._stored_dimension: int | None = None
        # The covering indexes' condition (alias ``v.``) where both exist, read at open and
        # after reset (a DBA may drop them for disk); ``None``: searches read the heap.
        self._exact_fits: str | None = None
        # Rows this process added since it last refreshed the planner's statistics.
        self._added_since_analyze = 0
        self._rows_at_analyze = 0
        # The ef_search each pooled connection's session has (a replaced connection: none).
        self._session_ef: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

        def create(conn: Any) -> None:
            migrate(
                conn, schema=schema, component=f"pgvector:{table}", migrations=self._migrations()
            )
            self._stored_dimension = self._read_dimension(conn)
            self._exact_fits = self._covering_condition(conn)

        prepare(self._pool, create, what=f"the pgvector table at {self._dsn_redacted}")

    def __repr__(self) -> str:
        return (
            f"PgVectorIndex({self._dsn_redacted!r}, dimension={self.dimension}, "
            f"schema={self.schema!r}, table={self.table!r})"
        )

    # -- plumbing ---------------------------------------------------------------------------

    def _create_table(self, conn: Any) -> None:
        from psycopg import errors

        exists = conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone()
        if exists is None:
            try:
                with conn.transaction():
                    conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
            except errors.Error as exc:
                raise BackendError(
                    "the pgvector extension is not installed and could not be created "
                    f"({type(exc).__name__}); run CREATE EXTENSION vector as a superuser"
                ) from exc
        t = self.table
        conn.execute(
            f"CREATE TABLE {t} (id text PRIMARY KEY, user_id text NOT NULL, "
            f"metadata json NOT NULL, embedding vector({self.dimension}) NOT NULL)"
        )
        conn.execute(f"CREATE INDEX {t}_user ON {t} (user_id)")
        conn.execute(f"CREATE INDEX {t}_hnsw ON {t} USING hnsw (embedding vector_cosine_ops)")

    def _add_filter_columns(self, conn: Any) -> None:
        """Migration 2: ``kind`` and ``session_id`` as stored columns computed from ``metadata``.

        Most searches filter on ``kind``; as ``metadata ->> 'kind'`` each candidate row's json
        text was parsed again (store benchmark, 2026-11-26: search p50 50 ms, of which 43 ms
        in that filter). Generated from the metadata, they cannot disagree with it, and
        nothing that writes the table has to know they exist.
        """
        t = self.table
        conn.execute(
            f"ALTER TABLE {t} "
            "ADD COLUMN IF NOT EXISTS kind text GENERATED ALWAYS AS (metadata ->> 'kind') STORED, "
            "ADD COLUMN IF NOT EXISTS session_id text "
            "GENERATED ALWAYS AS (metadata ->> 'session_id') STORED"
        )

    def _graph_only_for_large_users(self, conn: Any) -> None:
        """Migration 3: a ``graph`` column and an HNSW index over ``WHERE graph`` rows only.

        Users with at most :data:`EXACT_BELOW` vectors leave the graph (searched exactly).
        The full index is dropped before that ``UPDATE`` (so the rewrite does not feed it)
        and the partial one is built after it, over the larger users' rows.
        """
        t = self.table
        conn.execute(
            f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS graph boolean NOT NULL DEFAULT true"
        )
        conn.execute(f"DROP INDEX IF EXISTS {t}_hnsw")
        conn.execute(
            f"UPDATE {t} SET graph = false WHERE user_id IN "
            f"(SELECT user_id FROM {t} GROUP BY user_id HAVING count(*) <= %s)",
            (EXACT_BELOW,),
        )
        conn.execute(
            f"CREATE INDEX IF NOT EXISTS {t}_graph_hnsw ON {t} "
            "USING hnsw (embedding vector_cosine_ops) WHERE graph"
        )

    def _covering_exact_index(self, conn: Any) -> None:
        """Migration 4: small users' vectors in a covering B-tree, read by index-only scans.

        ``{table}_exact`` holds ``(user_id) INCLUDE (id, kind, session_id, embedding)`` of the
        rows outside the graph whose keys fit a B-tree row (:func:`_fits_clause`);
        ``{table}_exact_rest`` keys the others, so a search of both parts never reads the
        user's heap pages. Built for the table's stored dimension; none when even short keys
        do not fit beside its vectors. On a large table the build blocks writes meanwhile
        (1M rows: BENCHMARKS.md, "Scale out").
        """
        budget = _key_budget(self._read_dimension(conn))
        if budget < _MIN_KEY_BYTES:
            return
        t = self.table
        fits = _fits_clause(budget)
        conn.execute(
            f"CREATE INDEX IF NOT EXISTS {t}_exact ON {t} (user_id) "
            f"INCLUDE (id, kind, session_id, embedding) WHERE NOT graph AND {fits}"
        )
        conn.execute(
            f"CREATE INDEX IF NOT EXISTS {t}_exact_rest ON {t} (user_id) "
            f"WHERE NOT graph AND NOT {fits}"
        )

    def _covering_condition(self, conn: Any) -> str | None:
        """The search's :func:`_fits_clause` if both covering indexes exist, else ``None``."""
        row = conn.execute(
            "SELECT count(*) FROM pg_indexes WHERE schemaname = %s AND tablename = %s "
            "AND indexname IN (%s, %s)",
            (self.schema, self.table, f"{self.table}_exact", f"{self.table}_exact_rest"),
        ).fetchone()
        if not row or int(row[0]) != 2:
            return None
        return _fits_clause(_key_budget(self._read_dimension(conn)), "v.")

    def _migrations(self) -> tuple[Any, ...]:
        """Migration ``i`` brings the table to version ``i + 1`` (see ``pg_common.migrate``)."""
        return (
            self._create_table,
            self._add_filter_columns,
            self._graph_only_for_large_users,
            self._covering_exact_index,
        )

    def _read_dimension(self, conn: Any) -> int:
        row = conn.execute(
            "SELECT a.atttypmod FROM pg_attribute AS a "
            "JOIN pg_class AS c ON c.oid = a.attrelid "
            "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
            "WHERE n.nspname = %s AND c.relname = %s AND a.attname = 'embedding'",
            (self.schema, self.table),
        ).fetchone()
        if row is None:
            raise BackendError(f"table {self.schema}.{self.table} has no embedding column")
        return int(row[0])

    @contextmanager
    def _conn(self, *, transaction: bool = False) -> Iterator[Any]:
        import psycopg

        if self._closed:
            raise BackendError("the vector index is closed")
        try:
            with self._pool.connection() as conn:
                if transaction:
                    with conn.transaction():
                        yield conn
                else:
                    yield conn
        except psycopg.Error as exc:
            raise BackendError(f"pgvector call failed: {exc}") from exc

    def _check_dimension(self, dimension: int) -> None:
        if dimension != self._stored_dimension:
            raise EmbedderMismatchError(
                f"vectors have dimension {dimension} but table {self.schema}.{self.table} "
                f"holds dimension {self._stored_dimension}; use the original embedder or "
                "reindex"
            )

    # -- the protocol -----------------------------------------------------------------------

    def add(
        self,
        ids: Sequence[str],
        vectors: npt.NDArray[np.float32],
        metadatas: Sequence[Mapping[str, str | int | float | bool]],
    ) -> None:
        """Add or replace vectors (an id given again replaces its vector, user and metadata).

        Raises:
            InvalidInputError: on mismatched lengths, bad shapes or non-scalar metadata.
            MissingUserError: if a metadata has no ``user_id``.
            EmbedderMismatchError: if the dimension differs from the table's.
        """
        batch = checked_batch(ids, vectors, metadatas)
        if batch is None:
            return
        matrix, metas = batch
        self._check_dimension(matrix.shape[1])
        rows = []
        for vid, vector, meta in zip(ids, matrix, metas, strict=True):
            encoded = json.dumps(meta, ensure_ascii=False)
            if "\\u0000" in encoded or "\x00" in vid:
                raise InvalidInputError("vector ids and metadata may not contain NUL")
            rows.append((vid, str(meta["user_id"]), encoded, _literal(vector)))
        adding: dict[str, int] = {}
        for row in rows:
            adding[row[1]] = adding.get(row[1], 0) + 1
        with self._conn(transaction=True) as conn, conn.cursor() as cur:
            in_graph = self._graph_of(cur, adding)
            cur.executemany(
                f"INSERT INTO {self.table} (id, user_id, metadata, embedding, graph) "
                "VALUES (%s, %s, %s, %s::vector, %s) ON CONFLICT (id) DO UPDATE SET "
                "user_id = excluded.user_id, metadata = excluded.metadata, "
                "embedding = excluded.embedding, graph = excluded.graph",
                [(*row, in_graph[row[1]]) for row in rows],
            )
        self._analyze_after_growth(len(rows))

    def _graph_of(self, cur: Any, adding: Mapping[str, int]) -> dict[str, bool]:
        """Lock the users of a batch; whether their rows go into the graph (moving them there).

        Each user's transaction-level advisory lock (taken in sorted order, so two batches
        never wait on each other crosswise) makes the read and the write below atomic per
        user: all of a user's rows have the same ``graph``. A user not yet in the graph
        enters it when this batch takes them past ``exact_below``; their rows are moved by
        one ``UPDATE`` (which inserts them into the HNSW index).
        """
        users = sorted(adding)
        for user in users:
            cur.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"llm-memories:vectors:{self.schema}.{self.table}:{user}",),
            )
        t = self.table
        # One row per user: its graph flag (NULL: no rows yet) and, if not in the graph, its
        # count (a CASE runs its sub-select only when the branch is taken).
        found = cur.execute(
            f"SELECT u.user_id, f.graph, CASE WHEN f.graph THEN 0 ELSE "
            f"(SELECT count(*) FROM {t} AS c WHERE c.user_id = u.user_id) END "
            "FROM unnest(%s::text[]) AS u(user_id) "
            f"LEFT JOIN LATERAL (SELECT graph FROM {t} AS g WHERE g.user_id = u.user_id "
            "LIMIT 1) AS f ON true",
            (users,),
        ).fetchall()
        graph: dict[str, bool] = {}
        for user, flag, held in found:
            graph[user] = bool(flag) or int(held) + adding[user] > self.exact_below
            if graph[user] and flag is False:
                cur.execute(
                    f"UPDATE {t} SET graph = true WHERE user_id = %s AND NOT graph", (user,)
                )
        return graph

    def _analyze_after_growth(self, added: int) -> None:
        """Refresh the planner's statistics once the table has grown by a fifth (>= 1,000 rows).

        With statistics from before a bulk load the planner believes a user has a few hundred
        vectors and sorts all of them exactly instead of walking the HNSW graph: on 10k
        vectors of one user, 10.4 ms against 3.4 ms per query once analysed (2026-11-27,
        BENCHMARKS.md, "LangGraph stores"). Autovacuum would analyse too, but up to a minute
        or more later; ``ANALYZE`` samples the table and blocks no reader or writer.
        """
        with self._lock:
            self._added_since_analyze += added
            due = max(ANALYZE_AFTER_ROWS, self._rows_at_analyze // 5)
            if self._added_since_analyze < due:
                return
            self._added_since_analyze = 0
        with self._conn() as conn:
            conn.execute(f"ANALYZE {self.table}")
            row = conn.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::regclass", (self.table,)
            ).fetchone()
        with self._lock:
            self._rows_at_analyze = max(0, int(row[0])) if row else 0

    def search(
        self, vector: npt.NDArray[np.float32], *, user_id: str, k: int, where: Filter | None = None
    ) -> builtins.list[tuple[str, float]]:
        """Up to ``k`` ``(id, cosine)`` pairs of ``user_id``'s vectors, best first.

        The user and the index-answerable part of ``where`` are in the SQL ``WHERE``; the
        caller re-checks the full filter on the loaded records.

        Raises:
            InvalidInputError: if ``k < 1``, the vector is malformed or the filter invalid.
            EmbedderMismatchError: if the query's dimension differs from the table's.
        """
        check_user_id(user_id)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidInputError("k must be an int >= 1")
        usable = index_prefilter(check_filter(where), with_id=True)
        query = as_query(vector)
        self._check_dimension(query.shape[0])
        clause, params = "", list[Any]()
        if usable is not None:
            sql, params = usable.to_sql(
                _FILTER_COLUMNS, metadata_column="v.metadata", dialect="postgres"
            )
            clause = f" AND {sql}"
        literal = _literal(query)
        select = (
            f"SELECT v.id, v.embedding <=> %s::vector AS d FROM {self.table} AS v "
            "WHERE v.user_id = %s"
        )
        with self._conn() as conn:
            flag = conn.execute(
                f"SELECT graph FROM {self.table} WHERE user_id = %s LIMIT 1", (user_id,)
            ).fetchone()
            if flag is None:
                return []
            fits = self._exact_fits
            if flag[0]:  # the user's rows are in the graph: ``v.graph`` lets HNSW serve
                self._tune(conn, max(self.ef_search, min(k, 1000)))
                sql = f"{select} AND v.graph{clause} ORDER BY d LIMIT %s"
                args = [literal, user_id, *params, k]
            elif fits is not None:
                # An exact sort of the user's rows, from the two covering indexes' parts.
                sql = (
                    f"SELECT id, d FROM (({select} AND NOT v.graph AND {fits}{clause} "
                    f"ORDER BY d LIMIT %s) UNION ALL ({select} AND NOT v.graph AND NOT {fits}"
                    f"{clause} ORDER BY d LIMIT %s)) AS hits ORDER BY d LIMIT %s"
                )
                args = [literal, user_id, *params, k, literal, user_id, *params, k, k]
            else:  # no covering index (vectors this long, or dropped): the heap, by user_id
                sql = f"{select} AND NOT v.graph{clause} ORDER BY d LIMIT %s"
                args = [literal, user_id, *params, k]
            rows = conn.execute(sql, args).fetchall()
        return [(vid, 1.0 - float(distance)) for vid, distance in rows]

    def _tune(self, conn: Any, ef_search: int) -> None:
        """Give ``conn``'s session the HNSW search settings, unless it has them already."""
        with self._lock:
            if self._session_ef.get(conn) == ef_search:
                return
            self._session_ef.pop(conn, None)  # unknown until the statement succeeds
        conn.execute(
            "SELECT set_config('hnsw.iterative_scan', 'strict_order', false), "
            "set_config('hnsw.ef_search', %s, false)",
            (str(ef_search),),
        )
        with self._lock:
            self._session_ef[conn] = ef_search

    def delete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Delete vectors by id; ids of other users are left alone."""
        check_user_id(user_id)
        if not ids:
            return
        with self._conn() as conn:
            conn.execute(
                f"DELETE FROM {self.table} WHERE user_id = %s AND id = ANY(%s)",
                (user_id, builtins.list(ids)),
            )

    def delete_user(self, user_id: str) -> None:
        """Delete every vector of ``user_id``."""
        check_user_id(user_id)
        with self._conn() as conn:
            conn.execute(f"DELETE FROM {self.table} WHERE user_id = %s", (user_id,))

    def count(self, user_id: str | None = None) -> int:
        """Number of vectors, of one user or of all."""
        with self._conn() as conn:
            if user_id is None:
                row = conn.execute(f"SELECT count(*) FROM {self.table}").fetchone()
            else:
                check_user_id(user_id)
                row = conn.execute(
                    f"SELECT count(*) FROM {self.table} WHERE user_id = %s", (user_id,)
                ).fetchone()
        return int(row[0])

    def reset(self) -> None:
        """Delete every vector; the table is recreated with this index's ``dimension``."""
        with self._lock, self._conn(transaction=True) as conn:
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"llm-memories:migrate:{self.schema}",),
            )
            conn.execute(f"DROP TABLE IF EXISTS {self.table}")
            for step in self._migrations():  # the latest shape; its version stays recorded
                step(conn)
            self._stored_dimension = self._read_dimension(conn)
            self._exact_fits = self._covering_condition(conn)

    # -- verification and export ------------------------------------------------------------

    def ids(self, user_id: str) -> set[str]:
        """Every id of ``user_id``'s vectors."""
        check_user_id(user_id)
        with self._conn() as conn:
            rows = conn.execute(f"SELECT id FROM {self.table} WHERE user_id = %s", (user_id,))
            return {row[0] for row in rows}

    def users(self) -> set[str]:
        """Every user with at least one vector."""
        with self._conn() as conn:
            return {row[0] for row in conn.execute(f"SELECT DISTINCT user_id FROM {self.table}")}

    def vectors(self, ids: Sequence[str], *, user_id: str) -> dict[str, npt.NDArray[np.float32]]:
        """The stored vectors of those ``ids`` that ``user_id`` has."""
        check_user_id(user_id)
        if not ids:
            return {}
        with self._conn() as conn:
            rows = conn.execute(
                f"SELECT id, embedding::text FROM {self.table} WHERE user_id = %s AND id = ANY(%s)",
                (user_id, builtins.list(ids)),
            ).fetchall()
        return {vid: _parse(text) for vid, text in rows}

    def probe(self, ids: Sequence[str], *, user_id: str, k: int = PROBE_DEPTH) -> set[str]:
        """The ids among ``ids`` that a search with their own stored vector does not return.

        As :meth:`NumpyIndex.probe <memories_core.backends.NumpyIndex.probe>`: an id counts
        as reachable when a ``k``-neighbour search with its stored vector returns it, or
        when ``k`` results tie with its own score (exact duplicates). Used by
        ``MemoryEngine.verify`` to find vectors the HNSW graph no longer reaches.
        """
        if k < 1:
            raise InvalidInputError("k must be >= 1")
        lost: set[str] = set()
        for vid, vector in self.vectors(builtins.list(dict.fromkeys(ids)), user_id=user_id).items():
            hits = self.search(vector, user_id=user_id, k=k)
            if any(hit == vid for hit, _ in hits):
                continue
            # A unit vector's cosine with itself is 1: beaten by k others only on exact ties.
            if not (len(hits) >= k and abs(hits[-1][1] - 1.0) <= _TIE):
                lost.add(vid)
        return lost

    def close(self) -> None:
        """Close the pool. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with suppress(Exception):
            self._pool.close()

    def __enter__(self) -> PgVectorIndex:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
