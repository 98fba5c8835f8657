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
  ``artifacts``, ``deletions``, ``state``: as in
  :mod:`memories_core.backends.sqlite_tables`, with ``identity`` columns where SQLite uses
  the rowid for order.

Every statement that reads or writes a user's rows names ``user_id`` in its ``WHERE`` (or
inserts it), except the statements keyed by a job id (``claim_job``, ``finish_job``,
``fail_job``, ``update_job``; job ids are only ever handed out per user) and the all-user
maintenance queries (``pending_index``, ``mark_*`` by record ids, ``users``, ``compact``).
"""

from __future__ import annotations

import builtins
import contextlib
import json
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memories_core.backends.claims import current_owner, owner_is_dead
from memories_core.backends.pg_common import check_schema, make_pool, migrate, redact_dsn
from memories_core.backends.sqlite_store import query_terms
from memories_core.backends.sqlite_tables import (
    _JOB_COLUMNS,
    _STATE_DEFAULTS,
    _changed,
    _dumps,
    _state_change,
    from_micros,
    state_from_row,
    to_micros,
    unclaimed_jobs,
)
from memories_core.errors import BackendError, InvalidInputError
from memories_core.filters import ColumnType, compile_filter
from memories_core.interfaces import Filter
from memories_core.types import (
    GraphEdge,
    GraphNode,
    Job,
    JobSpec,
    MemoryRecord,
    RecordState,
    StateChange,
    check_user_id,
    ensure_utc,
    new_id,
)

if TYPE_CHECKING:
    from memories_core.artifacts import ArtifactStore
    from memories_core.interfaces import Clock

__all__ = ["PostgresRecordStore", "postgres_storage"]

logger = logging.getLogger(__name__)

_NOT_INDEXED, _PENDING, _INDEXED, _FAILED = 0, 1, 2, 3

_V1 = """
CREATE TABLE records (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id text NOT NULL UNIQUE,
    user_id text NOT NULL,
    kind text NOT NULL,
    text text NOT NULL,
    created_at bigint NOT NULL,
    session_id text,
    metadata json NOT NULL DEFAULT '{}',
    source_ids json NOT NULL DEFAULT '[]',
    index_state smallint NOT NULL DEFAULT 1,
    tsv tsvector GENERATED ALWAYS AS (to_tsvector('english'::regconfig, text)) STORED
);
CREATE INDEX records_user_kind_time ON records (user_id, kind, created_at);
CREATE INDEX records_user_time ON records (user_id, created_at, seq);
CREATE INDEX records_session_order ON records (user_id, session_id, kind, created_at, seq);
CREATE INDEX records_pending ON records (seq) WHERE index_state = 1;
CREATE INDEX records_tsv ON records USING gin (tsv);
CREATE TABLE record_state (
    seq bigint PRIMARY KEY REFERENCES records (seq) ON DELETE CASCADE,
    user_id text NOT NULL,
    strength double precision,
    recall_count bigint,
    last_recalled_at bigint,
    tier text,
    valid_from bigint,
    valid_until bigint,
    archived boolean,
    attrs json
);
CREATE INDEX record_state_user ON record_state (user_id);
CREATE TABLE record_history (
    hseq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id text NOT NULL,
    record_id text NOT NULL,
    at bigint NOT NULL,
    old json NOT NULL,
    new json NOT NULL,
    reason text
);
CREATE INDEX record_history_user ON record_history (user_id, record_id, hseq);
CREATE TABLE jobs (
    jseq bigint GENERATED ALWAYS AS IDENTITY,
    id text PRIMARY KEY,
    user_id text NOT NULL,
    mechanism text NOT NULL,
    kind text NOT NULL,
    key text NOT NULL,
    payload json NOT NULL DEFAULT '{}',
    attempts integer NOT NULL DEFAULT 0,
    last_error text,
    next_attempt_at bigint NOT NULL,
    claimed_until bigint,
    created_at bigint NOT NULL,
    UNIQUE (user_id, mechanism, key)
);
CREATE INDEX jobs_due ON jobs (user_id, next_attempt_at);
CREATE TABLE graph_nodes (
    gseq bigint GENERATED ALWAYS AS IDENTITY,
    user_id text NOT NULL,
    id text NOT NULL,
    kind text NOT NULL,
    label text NOT NULL,
    data json NOT NULL DEFAULT '{}',
    PRIMARY KEY (user_id, id)
);
CREATE TABLE graph_edges (
    gseq bigint GENERATED ALWAYS AS IDENTITY,
    user_id text NOT NULL,
    id text NOT NULL,
    source text NOT NULL,
    target text NOT NULL,
    relation text NOT NULL,
    record_id text,
    data json NOT NULL DEFAULT '{}',
    PRIMARY KEY (user_id, id),
    FOREIGN KEY (user_id, source) REFERENCES graph_nodes (user_id, id) ON DELETE CASCADE,
    FOREIGN KEY (user_id, target) REFERENCES graph_nodes (user_id, id) ON DELETE CASCADE
);
CREATE INDEX graph_edges_source ON graph_edges (user_id, source);
CREATE INDEX graph_edges_target ON graph_edges (user_id, target);
CREATE INDEX graph_edges_record ON graph_edges (user_id, record_id);
CREATE TABLE artifacts (
    user_id text NOT NULL,
    name text NOT NULL,
    folder text NOT NULL,
    size bigint NOT NULL,
    sha256 text NOT NULL,
    created_at bigint NOT NULL,
    meta json NOT NULL DEFAULT '{}',
    PRIMARY KEY (user_id, name)
);
CREATE TABLE deletions (
    user_id text PRIMARY KEY,
    started_at bigint NOT NULL
);
CREATE TABLE state (
    user_id text NOT NULL,
    key text NOT NULL,
    value json NOT NULL,
    PRIMARY KEY (user_id, key)
);
"""

#: Migration ``i`` brings the store to version ``i + 1``; append, never edit.
MIGRATIONS: tuple[str, ...] = (
    _V1,
    # 2: job claims name their owner process (memories_core.backends.claims), so a dead
    # worker's claim is taken over at once by a process of the same host.
    "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS claimed_by text",
)
SCHEMA_VERSION = len(MIGRATIONS)

_USER_TABLES = (
    "record_state",
    "record_history",
    "jobs",
    "graph_edges",
    "graph_nodes",
    "artifacts",
    "state",
    "deletions",
)

_STATE_COLUMNS = (
    "s.strength, s.recall_count, s.last_recalled_at, s.tier, s.valid_from, s.valid_until, "
    "s.archived, s.attrs::text"
)
_COLUMNS = (
    "r.id, r.user_id, r.kind, r.text, r.created_at, r.session_id, r.metadata::text, "
    "r.source_ids::text"
)
_STATEFUL = (
    f"SELECT {_COLUMNS}, {_STATE_COLUMNS} FROM records AS r "
    "LEFT JOIN record_state AS s ON s.seq = r.seq"
)
_JOB_SELECT = _JOB_COLUMNS.replace("payload", "payload::text")

#: Filter fields of a query joining ``records AS r`` with ``record_state AS s``.
_STATE_FILTER_COLUMNS: dict[str, tuple[str, ColumnType]] = {
    "id": ("r.id", "text"),
    "kind": ("r.kind", "text"),
    "session_id": ("r.session_id", "text"),
    "created_at": ("r.created_at", "datetime"),
    "strength": ("COALESCE(s.strength, 1.0)", "real"),
    "recall_count": ("COALESCE(s.recall_count, 0)", "int"),
    "last_recalled_at": ("s.last_recalled_at", "datetime"),
    "tier": ("s.tier", "text"),
    "valid_from": ("s.valid_from", "datetime"),
    "valid_until": ("s.valid_until", "datetime"),
    "archived": ("COALESCE(s.archived, FALSE)", "bool"),
}


def _filter_sql(where: Filter | None) -> tuple[str, list[Any]]:
    expr = compile_filter(where)
    if expr is None:
        return "", []
    sql, params = expr.to_sql(
        _STATE_FILTER_COLUMNS,
        metadata_column="r.metadata",
        attrs_column="s.attrs",
        dialect="postgres",
    )
    return f" AND {sql}", params


def _opt_micros(value: datetime | None) -> int | None:
    return None if value is None else to_micros(value)


def _state_values(state: RecordState) -> tuple[Any, ...]:
    return (
        state.strength,
        state.recall_count,
        _opt_micros(state.last_recalled_at),
        state.tier,
        _opt_micros(state.valid_from),
        _opt_micros(state.valid_until),
        bool(state.archived),
        _dumps(dict(state.attrs)),
    )


def _no_nul(value: str | None, what: str) -> None:
    # PostgreSQL text cannot hold NUL, and json cannot extract a \u0000 escape.
    if value is not None and ("\x00" in value or "\\u0000" in value):
        raise InvalidInputError(f"{what} contains a NUL character, which PostgreSQL cannot store")


class PostgresRecordStore:
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
        try:
            with self._pool.connection() as conn:
                migrate(conn, schema=schema, component="store", migrations=MIGRATIONS)
        except BackendError:
            self._pool.close()
            raise
        except Exception as exc:
            self._pool.close()
            raise BackendError(
                f"cannot prepare schema {schema!r} at {self._dsn_redacted}: {exc}"
            ) from exc

    def __repr__(self) -> str:
        return f"PostgresRecordStore({self._dsn_redacted!r}, schema={self.schema!r})"

    # -- plumbing ---------------------------------------------------------------------------

    def _ensure_open(self) -> None:
        if self._closed:
            raise BackendError("the record store is closed")

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
            local.depth += 1
            try:
                self._lock_users(current, users)
                yield current
            except psycopg.Error as exc:
                raise BackendError(f"PostgreSQL call failed: {exc}") from exc
            finally:
                local.depth -= 1
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
            held[user_id] += 1
            try:
                yield
            finally:
                held[user_id] -= 1
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

    def transaction(self) -> Any:
        """One transaction around several calls: all of them commit, or none.

        Calls made inside by the same thread join it; see the class docstring for locking.
        Keep model calls out of it.
        """
        return self._conn(write=True)

    def _read(self, users: Iterable[str] = ()) -> Any:
        return self._conn(write=False, users=users)

    def _write(self, users: Iterable[str] = ()) -> Any:
        return self._conn(write=True, users=users)

    def _in_transaction(self) -> bool:
        return getattr(self._local, "conn", None) is not None

    @staticmethod
    def _row_to_record(row: Sequence[Any]) -> MemoryRecord:
        rid, user_id, kind, text, created, session_id, metadata, source_ids = row[:8]
        record = MemoryRecord(
            id=rid,
            user_id=user_id,
            kind=kind,
            text=text,
            created_at=from_micros(created),
            session_id=session_id,
            metadata=json.loads(metadata),
            source_ids=tuple(json.loads(source_ids)),
        )
        if len(row) > 8:
            object.__setattr__(record, "state", state_from_row(row[8:]))
        return record

    # -- records ----------------------------------------------------------------------------

    def add(self, records: Sequence[MemoryRecord], *, indexed: bool = True) -> None:
        """Insert records atomically (all or none); an existing id of the same user is replaced.

        Raises:
            InvalidInputError: if metadata is not JSON-serialisable, holds NUL, or an id
                belongs to another user.
            BackendError: if PostgreSQL fails; nothing is written.
        """
        self._ensure_open()
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
                _no_nul(value, what)
            rows.append(
                (
                    record.kind,
                    record.text,
                    to_micros(record.created_at),
                    record.session_id,
                    metadata,
                    sources,
                    _PENDING if indexed else _NOT_INDEXED,
                    record.id,
                    record.user_id,
                )
            )
        if not rows:
            return
        users = {row[8] for row in rows}
        with self._write(users) as conn:
            owners: dict[str, str] = dict(
                conn.execute(
                    "SELECT id, user_id FROM records WHERE id = ANY(%s)",
                    ([row[7] for row in rows],),
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
                    updates.append(row)
                else:
                    raise InvalidInputError(f"record id {rid!r} belongs to another user")
            with conn.cursor() as cur:
                if inserts:
                    cur.executemany(
                        "INSERT INTO records (kind, text, created_at, session_id, metadata, "
                        "source_ids, index_state, id, user_id) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                        inserts,
                    )
                if updates:
                    cur.executemany(
                        "UPDATE records SET kind = %s, text = %s, created_at = %s, "
                        "session_id = %s, metadata = %s, source_ids = %s, index_state = %s "
                        "WHERE id = %s AND user_id = %s",
                        updates,
                    )

    def get(self, ids: Sequence[str], *, user_id: str) -> builtins.list[MemoryRecord]:
        """The records with these ids that belong to ``user_id``, in the given order."""
        self._ensure_open()
        check_user_id(user_id)
        if not ids:
            return []
        with self._read([user_id]) as conn:
            rows = conn.execute(
                f"{_STATEFUL} WHERE r.user_id = %s AND r.id = ANY(%s)", (user_id, list(ids))
            ).fetchall()
        by_id = {row[0]: self._row_to_record(row) for row in rows}
        result: builtins.list[MemoryRecord] = []
        seen: set[str] = set()
        for rid in ids:
            if rid in by_id and rid not in seen:
                seen.add(rid)
                result.append(by_id[rid])
        return result

    def list(
        self,
        *,
        user_id: str,
        where: Filter | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
    ) -> builtins.list[MemoryRecord]:
        """``user_id``'s records matching ``where``, oldest first (insertion order on ties)."""
        check_user_id(user_id)
        sql = f"{_STATEFUL} WHERE r.user_id = %s"
        params: builtins.list[Any] = [user_id]
        if since is not None:
            sql += " AND r.created_at >= %s"
            params.append(to_micros(since))
        if until is not None:
            sql += " AND r.created_at < %s"
            params.append(to_micros(until))
        clause, extra = _filter_sql(where)
        sql += clause + " ORDER BY r.created_at, r.seq"
        params += extra
        if limit is not None:
            if limit < 0:
                raise InvalidInputError("limit must be >= 0")
            sql += " LIMIT %s"
            params.append(limit)
        with self._read([user_id]) as conn:
            return [self._row_to_record(row) for row in conn.execute(sql, params)]

    def search_text(
        self, query: str, *, user_id: str, k: int, where: Filter | None = None
    ) -> builtins.list[tuple[str, float]]:
        """Full-text search over ``user_id``'s records (ranking: see the class docstring).

        Returns:
            Up to ``k`` ``(id, score)`` pairs, best first; ``[]`` if the query has no terms.
        """
        self._ensure_open()
        check_user_id(user_id)
        if k < 1:
            raise InvalidInputError("k must be >= 1")
        terms = query_terms(query)
        if not terms:
            return []
        clause, params = _filter_sql(where)
        sql = (
            "SELECT r.id, ts_rank(r.tsv, q.query, 1) AS score "
            "FROM websearch_to_tsquery('english', %s) AS q (query), records AS r "
            "LEFT JOIN record_state AS s ON s.seq = r.seq "
            f"WHERE r.user_id = %s AND r.tsv @@ q.query{clause} "
            "ORDER BY score DESC, r.seq LIMIT %s"
        )
        with self._read([user_id]) as conn:
            rows = conn.execute(sql, [" or ".join(terms), user_id, *params, k]).fetchall()
        return [(rid, float(score)) for rid, score in rows]

    def adjacent(
        self, ids: Sequence[str], *, user_id: str
    ) -> dict[str, tuple[str | None, str | None]]:
        """Each record's neighbours in its conversation: ``{id: (previous id, next id)}``.

        Same user, ``session_id`` and ``kind``, by ``created_at`` then insertion order.
        """
        self._ensure_open()
        check_user_id(user_id)
        if not ids:
            return {}
        sql = """
            SELECT c.id,
                (SELECT p.id FROM records AS p
                 WHERE p.user_id = c.user_id AND p.session_id = c.session_id
                   AND p.kind = c.kind AND (p.created_at, p.seq) < (c.created_at, c.seq)
                 ORDER BY p.created_at DESC, p.seq DESC LIMIT 1),
                (SELECT n.id FROM records AS n
                 WHERE n.user_id = c.user_id AND n.session_id = c.session_id
                   AND n.kind = c.kind AND (n.created_at, n.seq) > (c.created_at, c.seq)
                 ORDER BY n.created_at, n.seq LIMIT 1)
            FROM records AS c
            WHERE c.user_id = %s AND c.session_id IS NOT NULL AND c.id = ANY(%s)
        """
        with self._read([user_id]) as conn:
            rows = conn.execute(sql, (user_id, list(ids))).fetchall()
        return {rid: (prev_id, next_id) for rid, prev_id, next_id in rows}

    def delete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Delete records by id (only those of ``user_id``; other ids are ignored)."""
        self._ensure_open()
        check_user_id(user_id)
        if not ids:
            return
        with self._write([user_id]) as conn:
            conn.execute(
                "DELETE FROM records WHERE user_id = %s AND id = ANY(%s)", (user_id, list(ids))
            )

    def delete_user(self, user_id: str) -> None:
        """Delete every row of ``user_id`` in every table, then :meth:`compact`."""
        check_user_id(user_id)
        self.purge_user(user_id)
        self.compact()

    def edit_text(self, record_id: str, text: str, *, user_id: str) -> str | None:
        """Replace a record's text (its vector becomes pending); returns the old text."""
        check_user_id(user_id)
        _no_nul(text, "text")
        with self._write([user_id]) as conn:
            row = conn.execute(
                "SELECT text, index_state FROM records WHERE id = %s AND user_id = %s FOR UPDATE",
                (record_id, user_id),
            ).fetchone()
            if row is None:
                return None
            state = _PENDING if row[1] != _NOT_INDEXED else _NOT_INDEXED
            conn.execute(
                "UPDATE records SET text = %s, index_state = %s WHERE id = %s AND user_id = %s",
                (text, state, record_id, user_id),
            )
            return str(row[0])

    def compact(self) -> None:
        """``VACUUM`` the tables (prunes deleted rows); skipped inside a transaction."""
        if self._in_transaction():
            return
        with self._read() as conn:
            for table in ("records", *_USER_TABLES):
                conn.execute(f"VACUUM {table}")

    def vacuum(self) -> None:
        """``VACUUM FULL`` every table (rewrites them; takes exclusive locks, run on request)."""
        with self._read() as conn:
            for table in ("records", *_USER_TABLES):
                conn.execute(f"VACUUM FULL {table}")

    def users(self) -> builtins.list[str]:
        """Every user id with at least one record, sorted (code-point order)."""
        with self._read() as conn:
            rows = conn.execute('SELECT DISTINCT user_id COLLATE "C" FROM records ORDER BY 1')
            return [row[0] for row in rows]

    def count(self, user_id: str | None = None) -> int:
        """Number of records, of one user or of all."""
        with self._read() as conn:
            if user_id is None:
                return int(conn.execute("SELECT count(*) FROM records").fetchone()[0])
            check_user_id(user_id)
            row = conn.execute("SELECT count(*) FROM records WHERE user_id = %s", (user_id,))
            return int(row.fetchone()[0])

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

    # -- vector index bookkeeping -----------------------------------------------------------

    def pending_index(self, limit: int | None = None) -> builtins.list[MemoryRecord]:
        """Records marked for the vector index whose vectors are not confirmed yet."""
        sql = (
            "SELECT r.id, r.user_id, r.kind, r.text, r.created_at, r.session_id, "
            "r.metadata::text, r.source_ids::text FROM records AS r "
            f"WHERE r.index_state = {_PENDING} ORDER BY r.seq"
        )
        params: builtins.list[Any] = []
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)
        with self._read() as conn:
            return [self._row_to_record(row) for row in conn.execute(sql, params)]

    def pending_count(self) -> int:
        """Number of records waiting for the vector index."""
        with self._read() as conn:
            row = conn.execute(f"SELECT count(*) FROM records WHERE index_state = {_PENDING}")
            return int(row.fetchone()[0])

    def mark_indexed(self, ids: Iterable[str]) -> None:
        """Confirm that these records' vectors are in the vector index."""
        self._ensure_open()
        id_list = list(ids)
        if not id_list:
            return
        with self._write() as conn:
            conn.execute(
                f"UPDATE records SET index_state = {_INDEXED} "
                f"WHERE index_state = {_PENDING} AND id = ANY(%s)",
                (id_list,),
            )

    def mark_index_failed(self, ids: Iterable[str]) -> None:
        """Set records the vector index refused aside."""
        id_list = list(ids)
        if not id_list:
            return
        with self._write() as conn:
            conn.execute(
                f"UPDATE records SET index_state = {_FAILED} "
                f"WHERE index_state = {_PENDING} AND id = ANY(%s)",
                (id_list,),
            )

    def index_states(self, user_id: str) -> dict[str, str]:
        """``{id: "pending" | "indexed" | "failed"}`` of ``user_id``'s indexable records."""
        check_user_id(user_id)
        names = {_PENDING: "pending", _INDEXED: "indexed", _FAILED: "failed"}
        with self._read([user_id]) as conn:
            rows = conn.execute(
                "SELECT id, index_state FROM records WHERE user_id = %s AND index_state <> 0",
                (user_id,),
            ).fetchall()
        return {rid: names[state] for rid, state in rows}

    def mark_pending(self, ids: Iterable[str], *, user_id: str) -> None:
        """Mark records of ``user_id`` pending for the vector index."""
        id_list = list(ids)
        if not id_list:
            return
        with self._write([user_id]) as conn:
            conn.execute(
                f"UPDATE records SET index_state = {_PENDING} WHERE user_id = %s "
                f"AND index_state <> {_NOT_INDEXED} AND id = ANY(%s)",
                (user_id, id_list),
            )

    def include_in_index(self, *, user_id: str | None = None, kind: str) -> int:
        """Mark unindexed records of ``kind`` pending for the vector index; returns how many."""
        sql = f"UPDATE records SET index_state = {_PENDING} WHERE index_state = {_NOT_INDEXED} "
        sql += "AND kind = %s"
        params: builtins.list[Any] = [kind]
        users: builtins.list[str] = []
        if user_id is not None:
            sql += " AND user_id = %s"
            params.append(user_id)
            users.append(user_id)
        with self._write(users) as conn:
            return int(conn.execute(sql, params).rowcount)

    def mark_all_pending(self) -> int:
        """Mark every indexed (or refused) record pending again; returns how many."""
        with self._write() as conn:
            cursor = conn.execute(
                f"UPDATE records SET index_state = {_PENDING} "
                f"WHERE index_state IN ({_INDEXED}, {_FAILED})"
            )
            return int(cursor.rowcount)

    # -- key/value state --------------------------------------------------------------------

    def get_state(self, key: str, *, user_id: str | None = None) -> Any:
        """Read a JSON value of the per-user (or global, ``user_id=None``) state table."""
        scope = "" if user_id is None else check_user_id(user_id)
        with self._read([scope] if scope else []) as conn:
            row = conn.execute(
                "SELECT value::text FROM state WHERE user_id = %s AND key = %s", (scope, key)
            ).fetchone()
        return None if row is None else json.loads(row[0])

    def set_state(self, key: str, value: Any, *, user_id: str | None = None) -> None:
        """Write a JSON value into the state table (``None`` deletes the key)."""
        scope = "" if user_id is None else check_user_id(user_id)
        if not isinstance(key, str) or not key:
            raise InvalidInputError("state key must be a non-empty string")
        _no_nul(key, "state key")
        users = [scope] if scope else []
        if value is None:
            with self._write(users) as conn:
                conn.execute("DELETE FROM state WHERE user_id = %s AND key = %s", (scope, key))
            return
        try:
            encoded = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"state value for {key!r} is not JSON-serialisable") from exc
        _no_nul(encoded, f"state value for {key!r}")
        with self._write(users) as conn:
            conn.execute(
                "INSERT INTO state (user_id, key, value) VALUES (%s, %s, %s) "
                "ON CONFLICT (user_id, key) DO UPDATE SET value = excluded.value",
                (scope, key, encoded),
            )

    # -- record state -----------------------------------------------------------------------

    def update_state(
        self,
        user_id: str,
        changes: Mapping[str, Mapping[str, Any]],
        *,
        at: datetime,
        reason: str | None = None,
    ) -> builtins.list[StateChange]:
        """Change the mutable state of ``user_id``'s records and append the history.

        Raises:
            InvalidInputError: on an unknown field or a wrongly typed value (nothing written).
        """
        if not changes:
            return []
        at_micros = to_micros(at)
        with self._write([user_id]) as conn:
            rows = conn.execute(
                f"SELECT r.seq, r.id, {_STATE_COLUMNS} FROM records AS r "
                "LEFT JOIN record_state AS s ON s.seq = r.seq "
                "WHERE r.user_id = %s AND r.id = ANY(%s) FOR UPDATE OF r",
                (user_id, builtins.list(changes)),
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
            with conn.cursor() as cur:
                if upserts:
                    cur.executemany(
                        "INSERT INTO record_state (seq, user_id, strength, recall_count, "
                        "last_recalled_at, tier, valid_from, valid_until, archived, attrs) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT (seq) DO UPDATE SET "
                        "strength = excluded.strength, recall_count = excluded.recall_count, "
                        "last_recalled_at = excluded.last_recalled_at, tier = excluded.tier, "
                        "valid_from = excluded.valid_from, valid_until = excluded.valid_until, "
                        "archived = excluded.archived, attrs = excluded.attrs",
                        upserts,
                    )
                if history:
                    cur.executemany(
                        "INSERT INTO record_history (user_id, record_id, at, old, new, reason) "
                        "VALUES (%s, %s, %s, %s, %s, %s)",
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
        with self._write([user_id]) as conn:
            conn.execute(
                "INSERT INTO record_history (user_id, record_id, at, old, new, reason) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                (user_id, record_id, to_micros(at), _dumps(dict(old)), _dumps(dict(new)), reason),
            )

    def history(
        self, user_id: str, *, record_id: str | None = None, limit: int | None = None
    ) -> builtins.list[StateChange]:
        """``user_id``'s update history, oldest first (of one record if ``record_id``)."""
        sql = (
            "SELECT hseq, user_id, record_id, at, old::text, new::text, reason "
            "FROM record_history WHERE user_id = %s"
        )
        params: builtins.list[Any] = [user_id]
        if record_id is not None:
            sql += " AND record_id = %s"
            params.append(record_id)
        sql += " ORDER BY hseq"
        if limit is not None:
            sql += " LIMIT %s"
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
                for row in conn.execute(sql, params)
            ]

    # -- pending work -----------------------------------------------------------------------

    def add_jobs(self, user_id: str, specs: Sequence[JobSpec], *, now: datetime) -> int:
        """Enqueue jobs (a job whose ``(mechanism, key)`` exists already is skipped)."""
        if not specs:
            return 0
        micros = to_micros(now)
        added = 0
        with self._write([user_id]) as conn:
            for spec in specs:
                cursor = conn.execute(
                    "INSERT INTO jobs (id, user_id, mechanism, kind, key, payload, "
                    "next_attempt_at, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                    "ON CONFLICT DO NOTHING",
                    (
                        new_id(),
                        user_id,
                        spec.mechanism,
                        spec.kind,
                        spec.key,
                        _dumps(dict(spec.payload)),
                        micros,
                        micros,
                    ),
                )
                added += cursor.rowcount
        return added

    def jobs(
        self,
        *,
        user_id: str | None = None,
        mechanisms: Sequence[str] | None = None,
        due_at: datetime | None = None,
        key: str | None = None,
        limit: int | None = None,
    ) -> builtins.list[Job]:
        """Stored jobs, oldest first (see :meth:`SQLiteRecordStore.jobs`)."""
        sql = f"SELECT {_JOB_SELECT}, claimed_until, claimed_by FROM jobs WHERE TRUE"
        params: builtins.list[Any] = []
        users: builtins.list[str] = []
        if user_id is not None:
            sql += " AND user_id = %s"
            params.append(user_id)
            users.append(user_id)
        if mechanisms is not None:
            sql += " AND mechanism = ANY(%s)"
            params.append(builtins.list(mechanisms))
        if key is not None:
            sql += " AND key = %s"
            params.append(key)
        if due_at is not None:
            micros = to_micros(due_at)
            # Claimed jobs whose owner is known are checked after (a dead owner frees them).
            sql += (
                " AND next_attempt_at <= %s AND (claimed_until IS NULL OR claimed_until < %s"
                " OR claimed_by IS NOT NULL)"
            )
            params += [micros, micros]
        sql += " ORDER BY created_at, jseq"
        if limit is not None and due_at is None:
            sql += " LIMIT %s"
            params.append(limit)
        with self._read(users) as conn:
            rows = conn.execute(sql, params).fetchall()
        return unclaimed_jobs(rows, None if due_at is None else to_micros(due_at), limit)

    def claim_job(self, job_id: str, *, now: datetime, lease: timedelta) -> bool:
        """Claim a job for ``lease``; ``False`` if gone, claimed by a live lease, or locked.

        The job row is locked with ``FOR UPDATE SKIP LOCKED``: a row another transaction is
        finishing (deleting) right now counts as taken instead of being waited for.
        """
        micros, until, owner = to_micros(now), to_micros(now + lease), current_owner()
        with self._write() as conn:
            cursor = conn.execute(
                "UPDATE jobs SET claimed_until = %s, claimed_by = %s WHERE id = ("
                "  SELECT id FROM jobs WHERE id = %s "
                "  AND (claimed_until IS NULL OR claimed_until < %s) FOR UPDATE SKIP LOCKED)",
                (until, owner, job_id, micros),
            )
            if cursor.rowcount == 1:
                return True
            # A live lease: taken over at once if its owner is a dead process of this host.
            row = conn.execute(
                "SELECT claimed_by FROM jobs WHERE id = %s FOR UPDATE SKIP LOCKED", (job_id,)
            ).fetchone()
            if row is None or not owner_is_dead(row[0]):
                return False
            cursor = conn.execute(
                "UPDATE jobs SET claimed_until = %s, claimed_by = %s "
                "WHERE id = %s AND claimed_by = %s",
                (until, owner, job_id, row[0]),
            )
            return bool(cursor.rowcount == 1)

    def finish_job(self, job_id: str) -> bool:
        """Delete a done job; ``False`` if it was gone (the caller must roll back)."""
        with self._write() as conn:
            # The user's lock before the job's row lock: the order every other transaction
            # takes them in (a save holds the user's lock when it enqueues a job whose key
            # may collide with this row), so the two can never wait on each other.
            owner = conn.execute("SELECT user_id FROM jobs WHERE id = %s", (job_id,)).fetchone()
            if owner is None:
                return False
            self._lock_users(conn, [owner[0]])
            return bool(conn.execute("DELETE FROM jobs WHERE id = %s", (job_id,)).rowcount == 1)

    def fail_job(self, job_id: str, *, error: str, retry_at: datetime) -> None:
        """Count a failed attempt, keep the error, release the claim, retry after ``retry_at``."""
        with self._write() as conn:
            conn.execute(
                "UPDATE jobs SET attempts = attempts + 1, last_error = %s, "
                "next_attempt_at = %s, claimed_until = NULL, claimed_by = NULL WHERE id = %s",
                (error[:2000].replace("\x00", "\ufffd"), to_micros(retry_at), job_id),
            )

    def update_job(self, job_id: str, payload: Mapping[str, Any]) -> None:
        """Replace a job's payload."""
        encoded = _dumps(dict(payload))
        _no_nul(encoded, "job payload")
        with self._write() as conn:
            conn.execute("UPDATE jobs SET payload = %s WHERE id = %s", (encoded, job_id))

    def release_job(self, job_id: str) -> None:
        """Release a claim without counting a failure."""
        with self._write() as conn:
            conn.execute(
                "UPDATE jobs SET claimed_until = NULL, claimed_by = NULL WHERE id = %s", (job_id,)
            )

    def restore_jobs(self, user_id: str, jobs: Sequence[Job]) -> int:
        """Write jobs exactly as given, skipping existing ids and keys; returns how many."""
        added = 0
        with self._write([user_id]) as conn:
            for job in jobs:
                cursor = conn.execute(
                    "INSERT INTO jobs (id, user_id, mechanism, kind, key, payload, attempts, "
                    "last_error, next_attempt_at, created_at) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
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
                    ),
                )
                added += cursor.rowcount
        return added

    # -- import / export --------------------------------------------------------------------

    def user_state(self, user_id: str) -> dict[str, Any]:
        """Every key of ``user_id``'s state table."""
        with self._read([user_id]) as conn:
            rows = conn.execute(
                'SELECT key, value::text FROM state WHERE user_id = %s ORDER BY key COLLATE "C"',
                (user_id,),
            ).fetchall()
        return {key: json.loads(value) for key, value in rows}

    def restore_state(self, user_id: str, states: Mapping[str, RecordState]) -> None:
        """Write records' state exactly, without history entries (import)."""
        rows = [
            (*_state_values(new), rid, user_id)
            for rid, new in states.items()
            if new != _STATE_DEFAULTS
        ]
        if not rows:
            return
        with self._write([user_id]) as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO record_state (seq, user_id, strength, recall_count, "
                "last_recalled_at, tier, valid_from, valid_until, archived, attrs) "
                "SELECT seq, user_id, %s, %s, %s, %s, %s, %s, %s, %s FROM records "
                "WHERE id = %s AND user_id = %s "
                "ON CONFLICT (seq) DO UPDATE SET "
                "strength = excluded.strength, recall_count = excluded.recall_count, "
                "last_recalled_at = excluded.last_recalled_at, tier = excluded.tier, "
                "valid_from = excluded.valid_from, valid_until = excluded.valid_until, "
                "archived = excluded.archived, attrs = excluded.attrs",
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
            InvalidInputError: if an edge names a node the user does not have.
        """
        node_rows = [(user_id, n.id, n.kind, n.label, _dumps(dict(n.data))) for n in nodes]
        edge_rows = [
            (user_id, e.id, e.source, e.target, e.relation, e.record_id, _dumps(dict(e.data)))
            for e in edges
        ]
        with self._write([user_id]) as conn:
            with conn.cursor() as cur:
                if node_rows:
                    cur.executemany(
                        "INSERT INTO graph_nodes (user_id, id, kind, label, data) "
                        "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (user_id, id) DO UPDATE SET "
                        "kind = excluded.kind, label = excluded.label, data = excluded.data",
                        node_rows,
                    )
            ends = sorted({e.source for e in edges} | {e.target for e in edges})
            if ends:
                known = {
                    row[0]
                    for row in conn.execute(
                        "SELECT id FROM graph_nodes WHERE user_id = %s AND id = ANY(%s)",
                        (user_id, ends),
                    )
                }
                unknown = [end for end in ends if end not in known]
                if unknown:
                    raise InvalidInputError(
                        f"edges name nodes this user does not have: {unknown[:5]}"
                    )
            with conn.cursor() as cur:
                if edge_rows:
                    cur.executemany(
                        "INSERT INTO graph_edges (user_id, id, source, target, relation, "
                        "record_id, data) VALUES (%s, %s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT (user_id, id) DO UPDATE SET "
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
        with self._write([user_id]) as conn:
            conn.execute(
                "DELETE FROM graph_edges WHERE user_id = %s AND id = ANY(%s)",
                (user_id, builtins.list(edge_ids)),
            )
            conn.execute(
                "DELETE FROM graph_nodes WHERE user_id = %s AND id = ANY(%s)",
                (user_id, builtins.list(node_ids)),
            )

    def graph_nodes(self, user_id: str, *, kind: str | None = None) -> builtins.list[GraphNode]:
        """``user_id``'s nodes (of one kind if given), in insertion order."""
        sql = "SELECT id, kind, label, data::text FROM graph_nodes WHERE user_id = %s"
        params: builtins.list[Any] = [user_id]
        if kind is not None:
            sql += " AND kind = %s"
            params.append(kind)
        with self._read([user_id]) as conn:
            return [
                GraphNode(id=row[0], kind=row[1], label=row[2], data=json.loads(row[3]))
                for row in conn.execute(sql + " ORDER BY gseq", params)
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
            "SELECT id, source, target, relation, record_id, data::text FROM graph_edges "
            "WHERE user_id = %s"
        )
        params: builtins.list[Any] = [user_id]
        if node_id is not None:
            sql += " AND (source = %s OR target = %s)"
            params += [node_id, node_id]
        if record_id is not None:
            sql += " AND record_id = %s"
            params.append(record_id)
        with self._read([user_id]) as conn:
            return [
                GraphEdge(
                    id=row[0],
                    source=row[1],
                    target=row[2],
                    relation=row[3],
                    record_id=row[4],
                    data=json.loads(row[5]),
                )
                for row in conn.execute(sql + " ORDER BY gseq", params)
            ]

    # -- artifacts --------------------------------------------------------------------------

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
        with self._write([user_id]) as conn:
            conn.execute(
                "INSERT INTO artifacts (user_id, name, folder, size, sha256, created_at, meta) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (user_id, name) DO UPDATE SET "
                "folder = excluded.folder, size = excluded.size, sha256 = excluded.sha256, "
                "created_at = excluded.created_at, meta = excluded.meta",
                (user_id, name, folder, size, sha256, to_micros(at), _dumps(dict(meta or {}))),
            )

    def artifact_rows(self, user_id: str | None = None) -> builtins.list[dict[str, Any]]:
        """Registry entries (of one user, or all), by user then name."""
        sql = "SELECT user_id, name, folder, size, sha256, created_at, meta::text FROM artifacts"
        params: builtins.list[Any] = []
        users: builtins.list[str] = []
        if user_id is not None:
            sql += " WHERE user_id = %s"
            params.append(user_id)
            users.append(user_id)
        with self._read(users) as conn:
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
                for row in conn.execute(
                    sql + ' ORDER BY user_id COLLATE "C", name COLLATE "C"', params
                )
            ]

    def unregister_artifact(self, user_id: str, name: str) -> None:
        """Remove an artifact's registry entry."""
        with self._write([user_id]) as conn:
            conn.execute("DELETE FROM artifacts WHERE user_id = %s AND name = %s", (user_id, name))

    # -- deletion ---------------------------------------------------------------------------

    def mark_deleting(self, user_id: str, *, at: datetime) -> None:
        """Write the tombstone that starts a ``delete_user``."""
        with self._write([user_id]) as conn:
            conn.execute(
                "INSERT INTO deletions (user_id, started_at) VALUES (%s, %s) "
                "ON CONFLICT DO NOTHING",
                (user_id, to_micros(at)),
            )

    def deleting_users(self) -> builtins.list[str]:
        """Users whose deletion started and has not finished."""
        with self._read() as conn:
            return [row[0] for row in conn.execute("SELECT user_id FROM deletions")]

    def is_deleting(self, user_id: str) -> bool:
        """Whether ``user_id`` has an unfinished deletion."""
        with self._read() as conn:
            row = conn.execute("SELECT 1 FROM deletions WHERE user_id = %s", (user_id,))
            return row.fetchone() is not None

    def purge_user(self, user_id: str) -> None:
        """Delete every row of ``user_id`` in every table, and the tombstone, atomically."""
        with self._write([user_id]) as conn:
            conn.execute("DELETE FROM records WHERE user_id = %s", (user_id,))
            for table in _USER_TABLES:
                conn.execute(f"DELETE FROM {table} WHERE user_id = %s", (user_id,))

    def iter_user_ids(self) -> Iterator[str]:
        """Every user id known to any table (records, state, jobs, graph, artifacts)."""
        with self._read() as conn:
            rows = conn.execute(
                "SELECT user_id FROM (SELECT user_id FROM records UNION SELECT user_id FROM jobs "
                "UNION SELECT user_id FROM graph_nodes UNION SELECT user_id FROM artifacts "
                "UNION SELECT user_id FROM state WHERE user_id <> '') AS known "
                'ORDER BY user_id COLLATE "C"'
            ).fetchall()
        yield from (row[0] for row in rows)

    # -- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Close the pool; further calls raise :class:`BackendError`. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with suppress(Exception):
            self._pool.close()

    def __enter__(self) -> PostgresRecordStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


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
