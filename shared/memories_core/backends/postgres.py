"""PostgreSQL record store: the engine's record of truth, shared by many processes.

:class:`PostgresRecordStore` implements :class:`~memories_core.interfaces.EngineStore` with
the semantics of :class:`~memories_core.backends.SQLiteRecordStore` (records, mutable state
and its history, pending jobs, per-user graphs, the artifact registry, deletion tombstones,
per-user key/value state) on PostgreSQL through psycopg 3 and a connection pool (extra
``postgres``). Vectors go to :class:`~memories_core.backends.pgvector_index.PgVectorIndex`
(same database) or to a Chroma server (:class:`~memories_core.backends.ChromaIndex`).

Schema (in the schema given as ``schema=``, default ``llm_memories``; versioned in
``schema_version``, component ``store``):

* ``records``: one row per record. ``seq`` (identity) gives insertion order; ``created_at``
  is integer microseconds since the epoch (exact round trip, as in SQLite); ``metadata`` and
  ``source_ids`` are ``json`` (kept exactly as written: ``jsonb`` would rewrite numbers such as
  ``1e300``); ``index_state`` is 0 (not for the vector index), 1 (pending), 2 (indexed) or
  3 (refused by the index); ``tsv`` is a stored generated ``tsvector`` of the text
  (``english`` configuration) with a GIN index.
* ``record_state``, ``record_history``, ``jobs``, ``graph_nodes``, ``graph_edges``,
  ``artifacts``, ``deletions``, ``state``: as in SQLite (each described in its table
  family's module of :mod:`memories_core.backends.sql`), with ``identity`` columns where
  SQLite uses the rowid for order.

The store is the shared SQL store (:mod:`memories_core.backends.sql`) on the PostgreSQL
dialect (:data:`POSTGRES`); this module holds only what is PostgreSQL's own: the connection
pool and its transactions, advisory user locks, ``tsvector`` search and ``VACUUM``.

Every statement that reads or writes a user's rows names ``user_id`` in its ``WHERE`` (or
inserts it), except the statements keyed by a job id (``claim_job``, ``finish_job``,
``fail_job``, ``update_job``; job ids are only ever handed out per user) and the all-user
maintenance queries (``pending_index``, ``mark_*`` by record ids, ``users``, ``compact``).
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memories_core.backends.pg_common import (
    check_schema,
    make_pool,
    migrate,
    prepare,
    redact_dsn,
)
from memories_core.backends.sql import SQLDialect, SQLStore
from memories_core.backends.sql.schema import POSTGRES_MIGRATIONS, POSTGRES_SCHEMA_VERSION
from memories_core.errors import BackendError
from memories_core.interfaces import Filter
from memories_core.types import check_user_id

if TYPE_CHECKING:
    from memories_core.artifacts import ArtifactStore
    from memories_core.interfaces import Clock

__all__ = ["POSTGRES", "PostgresRecordStore", "postgres_storage"]

logger = logging.getLogger(__name__)

#: Migration ``i`` brings the store to version ``i + 1`` (see
#: :mod:`memories_core.backends.sql.schema`).
MIGRATIONS = POSTGRES_MIGRATIONS
SCHEMA_VERSION = POSTGRES_SCHEMA_VERSION

#: PostgreSQL's dialect: ``%s`` placeholders, id lists bound as arrays (``= ANY``), ``json``
#: columns read as ``::text``, identity columns for insertion order, real booleans, ``"C"``
#: collation for code-point order, ``FOR UPDATE`` row locks with ``SKIP LOCKED``, and no NUL
#: characters in text.
POSTGRES = SQLDialect(
    name="postgres",
    title="PostgreSQL",
    placeholder="%s",
    id_match="{column} = ANY(?)",
    encode_list=list,
    json_cast="::text",
    order_columns={"jobs": "jseq", "graph_nodes": "gseq", "graph_edges": "gseq"},
    false="FALSE",
    encode_bool=bool,
    collate=' COLLATE "C"',
    row_lock=" FOR UPDATE",
    skip_locked=" SKIP LOCKED",
    refuses_nul=True,
)


class PostgresRecordStore(SQLStore):
    """An :class:`~memories_core.interfaces.EngineStore` on PostgreSQL, for many processes.

    Setup:
        ``pip install 'llm-memories[postgres]'`` (psycopg 3 and psycopg-pool). The role needs
        ``CREATE`` on the database (the schema and tables are created on first open) or an
        existing schema it owns.

    Key init args:
        dsn: libpq connection string or URI. Credentials come from it or from the libpq
            environment (``PGPASSWORD``, ``~/.pgpass``); they are never logged, and ``repr``
            and error messages show ``user@host:port/dbname`` only.
        schema: Schema of the tables (created if missing). Memories that must not see each
            other's data (tests, tenants) use different schemas.
        pool_size: Maximum connections of this process's pool (one per concurrently
            writing thread; reads take one briefly).
        timeout: Seconds to wait for a connection (at open and from the pool).
        artifacts_path: Folder for artifact bytes, shared by every worker (a mounted
            volume); ``None`` keeps them in a per-process temporary folder.

    Instantiate:
        .. code-block:: python

            from memories_core import HistoryMemory
            from memories_core.backends.pgvector_index import PgVectorIndex
            from memories_core.backends.postgres import PostgresRecordStore

            dsn = "postgresql://app@db:5432/app"
            memory = HistoryMemory(
                store=PostgresRecordStore(dsn), index=PgVectorIndex(dsn, dimension=384)
            )

    Transactions and concurrency:
        :meth:`transaction` binds one pooled connection to the calling thread; calls made
        inside by that thread join it, and it commits or rolls back as a whole (READ
        COMMITTED). Every call that names a user inside a transaction (and every write
        outside one) first takes that user's transaction-level advisory lock
        (``pg_advisory_xact_lock``), so a read-then-write sequence of one user inside one
        transaction (session routing) is serialized across processes, as ``BEGIN
        IMMEDIATE`` serializes it in SQLite, while different users run in parallel. A
        mechanism's read-modify-write that spans several transactions runs under
        ``engine.user_lock``, which takes :meth:`user_lock` (a session-level advisory lock
        of the user). Jobs are claimed with a lease: ``claim_job`` locks the
        job row with ``FOR UPDATE SKIP LOCKED`` and sets ``claimed_until`` (and
        ``claimed_by``, the owner process: a dead owner's claim is taken over at once by a
        process of the same host, :mod:`memories_core.backends.claims`) only if no live
        lease exists; ``finish_job`` deletes it in the transaction that stores what it
        derived, so a job whose lease expired and was run elsewhere is rolled back, never
        committed twice.

    Async:
        The engine is synchronous; its async twins (``asave``, ``arecall``, ...) run the
        sync calls in a worker thread (``asyncio.to_thread``), where each thread takes its
        own pooled connection, so the event loop never waits on PostgreSQL.

    Lexical search:
        ``search_text`` ORs the query's terms (:func:`~memories_core.backends.sqlite_store.
        query_terms`: stopwords and one-letter tokens dropped) into a
        ``websearch_to_tsquery('english', ...)`` and ranks the user's matching records by
        ``ts_rank(tsv, query, 1)``: term frequency weighted by Postgres's rank, divided by
        ``1 + log(document length)`` (a length normalisation like BM25's), ties by insertion
        order. Scores are positive, higher is better; they are not comparable to SQLite's
        BM25 values (fusion uses ranks).

    Artifacts:
        The registry (name, size, checksum, folder) lives in table ``artifacts``, in the
        same transactions as the records; the bytes live in files under ``artifacts_path``,
        because mechanisms load artifacts (LoRA adapters) from a folder. Workers share that
        folder (a volume); unregistered folders younger than an hour are left alone on open,
        so one worker's clean-up never removes another's write in flight.

    Erasure:
        ``delete_user`` deletes every row of the user in one transaction and then runs
        ``VACUUM`` on the tables, so dead rows are pruned from the heap and indexes;
        ``vacuum()`` runs ``VACUUM FULL`` (rewrites the tables). WAL segments and backups
        keep old data for as long as the server's retention says: that is the DBA's part.

    Limits:
        PostgreSQL ``text`` cannot hold NUL characters: text, kinds, session ids and
        metadata containing NUL are refused with :class:`InvalidInputError`.
    """

    dialect = POSTGRES

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "llm_memories",
        pool_size: int = 4,
        min_pool_size: int = 1,
        timeout: float = 30.0,
        artifacts_path: str | Path | None = None,
    ) -> None:
        self.schema = check_schema(schema)
        self._dsn_redacted = redact_dsn(dsn)
        self.artifacts_path = Path(artifacts_path) if artifacts_path is not None else None
        self._local = threading.local()
        self._closed = False
        self._pool = make_pool(
            dsn,
            schema=schema,
            min_size=min_pool_size,
            max_size=pool_size,
            timeout=timeout,
            name=f"llm-memories-store-{schema}",
        )
        prepare(
            self._pool,
            lambda conn: migrate(conn, schema=schema, component="store", migrations=MIGRATIONS),
            what=f"schema {schema!r} at {self._dsn_redacted}",
        )

    def __repr__(self) -> str:
        return f"PostgresRecordStore({self._dsn_redacted!r}, schema={self.schema!r})"

    # -- plumbing ---------------------------------------------------------------------------

    def _lock_users(self, conn: Any, users: Iterable[str]) -> None:
        locked: set[str] = self._local.locked
        for user in sorted(set(users) - locked):
            conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"llm-memories:{self.schema}:user:{user}",),
            )
            locked.add(user)

    @contextmanager
    def _conn(self, *, write: bool = False, users: Iterable[str] = ()) -> Iterator[Any]:
        """A connection: the thread's open transaction, a new one (``write``), or a plain one.

        Inside a transaction, ``users`` are locked (advisory, until it ends); a write outside
        one becomes its own transaction and locks them too.
        """
        import psycopg

        self._ensure_open()
        local = self._local
        current = getattr(local, "conn", None)
        if current is not None:
            with self._joined(local, current, psycopg.Error, "PostgreSQL call failed", users):
                yield current
            return
        try:
            with self._borrow() as conn:
                if not write:
                    try:
                        yield conn
                    except psycopg.Error as exc:
                        raise BackendError(f"PostgreSQL read failed: {exc}") from exc
                    return
                local.conn, local.depth, local.locked = conn, 1, set()
                try:
                    with conn.transaction():
                        self._lock_users(conn, users)
                        yield conn
                except psycopg.Error as exc:
                    raise BackendError(f"PostgreSQL write failed: {exc}") from exc
                finally:
                    local.conn, local.depth, local.locked = None, 0, set()
        except psycopg.Error as exc:  # the pool itself (connection lost, timeout)
            raise BackendError(f"PostgreSQL connection failed: {type(exc).__name__}") from exc
        except Exception as exc:
            from psycopg_pool import PoolTimeout

            if isinstance(exc, PoolTimeout):
                raise BackendError("no PostgreSQL connection free in the pool in time") from exc
            raise

    @contextmanager
    def _borrow(self) -> Iterator[Any]:
        """The connection pinned to this thread by :meth:`user_lock`, else one from the pool."""
        pinned = getattr(self._local, "pinned", None)
        if pinned is not None:
            yield pinned
            return
        with self._pool.connection() as conn:
            yield conn

    @contextmanager
    def user_lock(self, user_id: str) -> Iterator[None]:
        """Hold ``user_id``'s lock, across every process on this schema, for the block.

        What :meth:`MemoryEngine.user_lock <memories_core.engine.MemoryEngine.user_lock>`
        takes after its in-process lock: a mechanism's read-modify-write of one user
        (reads, then a transaction that writes what they decided) runs in one process at a
        time. Outside a transaction it is a session-level ``pg_advisory_lock`` on a pooled
        connection that stays pinned to the thread until the block ends, so the block's own
        reads and transactions run on that same connection (a lock wait is then always
        between two server sessions, where PostgreSQL detects deadlocks). Inside a
        transaction it is a transaction-level lock on the same key, released at commit.
        Its key is not the one of the per-transaction user lock (``_lock_users``): a save of
        the user in another process does not wait for the block, only another block does.
        Re-entrant per thread. Never call a model while holding it.

        Raises:
            BackendError: if PostgreSQL fails (the lock is then not held).
        """
        import psycopg

        check_user_id(user_id)
        self._ensure_open()
        local = self._local
        held: dict[str, int] = local.__dict__.setdefault("held", {})
        if held.get(user_id):
            with self._held_again(held, user_id):
                yield
            return
        key = (f"llm-memories:{self.schema}:user-lock:{user_id}",)
        current = getattr(local, "conn", None)
        if current is not None:  # inside a transaction: until it ends
            try:
                current.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", key)
            except psycopg.Error as exc:
                raise BackendError(f"PostgreSQL user lock failed: {exc}") from exc
            held[user_id] = 1
            try:
                yield
            finally:
                held.pop(user_id, None)
            return
        outer = getattr(local, "pinned", None)
        with contextlib.ExitStack() as stack:
            conn = outer
            if conn is None:
                try:
                    conn = stack.enter_context(self._pool.connection())
                except psycopg.Error as exc:
                    raise BackendError(f"PostgreSQL connection failed: {exc}") from exc
            try:
                conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", key)
            except psycopg.Error as exc:
                raise BackendError(f"PostgreSQL user lock failed: {exc}") from exc
            local.pinned, held[user_id] = conn, 1
            try:
                yield
            finally:
                held.pop(user_id, None)
                local.pinned = outer
                try:
                    conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", key)
                except psycopg.Error:
                    # The session still holds the lock: close it so the server drops it
                    # (the pool discards a closed connection).
                    with suppress(Exception):
                        conn.close()

    def _read(self, users: Iterable[str] = ()) -> Any:
        return self._conn(write=False, users=users)

    def _write(self, users: Iterable[str] = ()) -> Any:
        return self._conn(write=True, users=users)

    def _in_transaction(self) -> bool:
        return getattr(self._local, "conn", None) is not None

    def _executemany(self, conn: Any, statement: str, rows: Sequence[Sequence[Any]]) -> int:
        with conn.cursor() as cur:
            cur.executemany(statement, rows)
            return int(cur.rowcount)

    def _insert_records(self, conn: Any, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert new records; ``seq`` is an identity."""
        self._many(
            conn,
            "INSERT INTO records (kind, text, created_at, session_id, metadata, source_ids, "
            "index_state, id, user_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )

    # -- lexical search and maintenance -----------------------------------------------------

    def search_text(
        self, query: str, *, user_id: str, k: int, where: Filter | None = None
    ) -> builtins.list[tuple[str, float]]:
        """Full-text search over ``user_id``'s records (ranking: see the class docstring).

        Returns:
            Up to ``k`` ``(id, score)`` pairs, best first; ``[]`` if the query has no terms.
        """
        terms = self._query_terms(query, user_id=user_id, k=k)
        if not terms:
            return []
        clause, params = self._filter_sql(where)
        sql = (
            "SELECT r.id, ts_rank(r.tsv, q.query, 1) AS score "
            "FROM websearch_to_tsquery('english', ?) AS q (query), records AS r "
            "LEFT JOIN record_state AS s ON s.seq = r.seq "
            f"WHERE r.user_id = ? AND r.tsv @@ q.query{clause} "
            "ORDER BY score DESC, r.seq LIMIT ?"
        )
        with self._read([user_id]) as conn:
            rows = self._run(conn, sql, [" or ".join(terms), user_id, *params, k]).fetchall()
        return [(rid, float(score)) for rid, score in rows]

    def compact(self) -> None:
        """``VACUUM`` the tables (prunes deleted rows); skipped inside a transaction."""
        if self._in_transaction():
            return
        with self._read() as conn:
            for table in ("records", *self.user_tables):
                conn.execute(f"VACUUM {table}")

    def vacuum(self) -> None:
        """``VACUUM FULL`` every table (rewrites them; takes exclusive locks, run on request)."""
        with self._read() as conn:
            for table in ("records", *self.user_tables):
                conn.execute(f"VACUUM FULL {table}")

    def disk_bytes(self) -> int:
        """Bytes used by this store's tables and their indexes."""
        with self._read() as conn:
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class AS c "
                "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r'",
                (self.schema,),
            ).fetchone()
        return int(row[0])

    def artifact_store(self, clock: Clock) -> ArtifactStore:
        """The engine's artifact store: bytes under :attr:`artifacts_path`, registry here.

        Folders without a registry entry are removed on open only when older than an hour
        (another worker may be writing one right now).
        """
        from memories_core.artifacts import ArtifactStore

        if self.artifacts_path is None:
            logger.info(
                "PostgresRecordStore has no artifacts_path: artifact bytes stay in a "
                "per-process temporary folder"
            )
        return ArtifactStore(self, self.artifacts_path, clock, keep_younger_than=3600.0)

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the pool; further calls raise :class:`BackendError`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with suppress(Exception):
            self._pool.close()


def postgres_storage(
    dsn: str,
    *,
    dimension: int,
    schema: str = "llm_memories",
    pool_size: int = 4,
    artifacts_path: str | Path | None = None,
    chroma_host: str | None = None,
    chroma_port: int = 8000,
) -> dict[str, Any]:
    """``store=`` and ``index=`` of a memory in PostgreSQL, to pass to a mechanism or engine.

    Records in :class:`PostgresRecordStore`; vectors in
    :class:`~memories_core.backends.pgvector_index.PgVectorIndex` (same database and schema),
    or in a Chroma server when ``chroma_host`` is given (one collection per user, prefixed
    with ``schema``).

    .. code-block:: python

        memory = HistoryMemory(**postgres_storage(dsn, dimension=384))

    Args:
        dsn: libpq connection string or URI (credentials are never logged).
        dimension: The embedder's dimension (for pgvector).
        schema: Schema of the tables.
        pool_size: Connections per pool (store and index each have one).
        artifacts_path: Folder of artifact bytes shared by the workers.
        chroma_host: Host of a Chroma server for the vectors instead of pgvector.
        chroma_port: Its port.
    """
    from memories_core.backends.pgvector_index import PgVectorIndex

    store = PostgresRecordStore(
        dsn, schema=schema, pool_size=pool_size, artifacts_path=artifacts_path
    )
    try:
        index: Any
        if chroma_host is not None:
            from memories_core.backends.chroma_index import ChromaIndex

            index = ChromaIndex(host=chroma_host, port=chroma_port, collection=schema)
        else:
            index = PgVectorIndex(dsn, dimension=dimension, schema=schema, pool_size=pool_size)
    except BaseException:
        store.close()
        raise
    return {"store": store, "index": index}
