"""SQLite record store: the record of truth, with BM25 full-text search.

Every memory record lives here first; vector indexes are derived from it and can be rebuilt
(:meth:`SQLiteRecordStore.mark_all_pending`). The store is the shared SQL store
(:mod:`memories_core.backends.sql`) on the SQLite dialect; this module holds only what is
SQLite's own: the connection and its transactions, the per-user file locks, the rowid ranges
per user, FTS5 search and the file's maintenance.

Schema (one file, ``records.sqlite3`` in a memory's directory; the DDL is in
:mod:`memories_core.backends.sql.schema`):

* ``records``: one row per record; ``id`` is the record's unique key. ``seq`` is an integer
  alias of the rowid (so the FTS table can point at it and it survives ``VACUUM``), taken from
  a range of rowids that belongs to the record's user (table ``users``), so that a full-text
  query can be restricted to one user inside FTS5 itself. ``created_at`` is stored as integer
  microseconds since the Unix epoch (exact round trip, sortable). ``index_state`` is 0 (not
  for the vector index), 1 (pending), 2 (indexed) or 3 (refused by the index).
* ``users``: each user's rowid range (``slot``) and the next free rowid in it.
* ``state``, ``record_state``, ``record_history``, ``jobs``, ``graph_nodes``,
  ``graph_edges``, ``artifacts``, ``deletions``: the engine's tables (each described in its
  table family's module of :mod:`memories_core.backends.sql`).
* ``records_fts``: an FTS5 external-content table over ``records.text`` (tokenizer
  ``porter unicode61``), kept in sync by triggers inside the writing transaction.
* ``schema_migrations``: the schema steps applied to the file (:data:`SQLITE_MIGRATIONS`);
  the version itself is ``PRAGMA user_version``. Opening a file written by an earlier
  release upgrades it in one transaction (:mod:`memories_core.backends.migrations`).
"""

from __future__ import annotations

import builtins
import hashlib
import os
import sqlite3
import threading
import types
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from memories_core.backends.migrations import SQLiteSchemaDriver, migrate, sqlite_history
from memories_core.backends.sql import SQLDialect, SQLStore
from memories_core.backends.sql.rows import state_filter_columns
from memories_core.backends.sql.schema import SQLITE_MIGRATIONS, SQLITE_SCHEMA_VERSION
from memories_core.backends.sql.text import ENGLISH_STOPWORDS, query_terms
from memories_core.errors import BackendError, SchemaVersionError
from memories_core.interfaces import Filter
from memories_core.types import check_user_id

__all__ = [
    "ENGLISH_STOPWORDS",
    "SCHEMA_VERSION",
    "SQLITE",
    "SQLITE_MIGRATIONS",
    "SQLiteRecordStore",
    "query_terms",
]

#: Schema version of stores written by this release.
SCHEMA_VERSION = SQLITE_SCHEMA_VERSION

#: SQLite's dialect: ``?`` placeholders, id lists as JSON arrays read by ``json_each``, the
#: rowid for insertion order, integer booleans, binary collation by default, no row locks
#: (a write holds the database's lock, ``BEGIN IMMEDIATE``), ``+column`` and ``INDEXED BY``
#: planner hints.
SQLITE = SQLDialect(
    name="sqlite", title="SQLite", index_hint="+", index_choice=" INDEXED BY {index}"
)

#: Filter fields of a query joining ``records AS r`` with ``record_state AS s``.
_STATE_FILTER_COLUMNS = state_filter_columns(SQLITE.false)

# Each user owns one range of rowids, [slot * _SLOT_SIZE, (slot + 1) * _SLOT_SIZE): room for
# 2**32 records per user and 2**31 users within SQLite's signed 64-bit rowid. Partitioning the
# rowid lets the FTS5 query skip other users' postings (see search_text).
_SLOT_SIZE = 1 << 32
_MAX_SLOTS = 1 << 31

#: Lock files of :meth:`SQLiteRecordStore.user_lock` (users are hashed into these).
_USER_LOCK_BUCKETS = 256


def _only_kind(conn: sqlite3.Connection, user_id: str, where: Filter | None) -> bool:
    """Whether ``where`` is ``{"kind": X}`` and every record of ``user_id`` is of kind ``X``.

    Then a full-text search can rank inside FTS5 and join only its top ``k`` instead of
    joining every match to its row to filter it: a memory of turns alone (``HistoryMemory``)
    searches its turns with that filter. At 100k records and 150 results: 14.7 against
    10.3 ms p50, the same results for 130 of 130 queries (BENCHMARKS.md, "Late-interaction
    vectors kept with the records"). Two seeks of the ``(user_id, kind)`` index.
    """
    if where is None or set(where) != {"kind"} or not isinstance(where["kind"], str):
        return False
    kind = where["kind"]
    other = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM records WHERE user_id = ? AND kind < ?) "
        "OR EXISTS (SELECT 1 FROM records WHERE user_id = ? AND kind > ?)",
        (user_id, kind, user_id, kind),
    ).fetchone()
    return not other[0]


class SQLiteRecordStore(SQLStore):
    """The default :class:`~memories_core.interfaces.RecordStore`, on SQLite with FTS5.

    Setup:
        Nothing beyond the standard library; SQLite must have FTS5 (CPython's does).

    Key init args:
        path: File of the database (parent folders are created), or ``None`` for an
            in-memory store that vanishes when closed.

    Instantiate:
        .. code-block:: python

            from memories_core.backends import SQLiteRecordStore

            store = SQLiteRecordStore("memory/records.sqlite3")

    Write and search:
        .. code-block:: python

            from datetime import datetime, timezone
            from memories_core.types import MemoryRecord, new_id

            store.add([MemoryRecord(new_id(), "alice", "turn", "I adopted a puppy",
                                    datetime.now(timezone.utc))])
            store.search_text("puppy", user_id="alice", k=5)   # [(id, bm25 score)]

    Beyond the protocol:
        :meth:`adjacent` (a record's neighbours in its session, used for conversation
        context by :class:`~memories_core.retrieval.HybridRetriever`), :meth:`count` and
        :meth:`pending_count`.

    Durability and concurrency:
        The file runs in WAL mode with ``synchronous=FULL``: a committed write survives a
        power cut, not only a process crash. Writes happen once per exchange (not in hot
        loops), so the extra fsync is cheap next to the model call, and "a turn is never lost"
        is the package's first promise. Each write is one ``BEGIN IMMEDIATE`` transaction,
        so a read-then-write sequence is atomic even when another process shares the file.
        One connection is shared by all threads behind a lock; async callers use threads.
        :meth:`transaction` groups several calls into one transaction. Several processes may
        share the file on a local disk (WAL needs shared memory, which network file systems
        lack): a writer waits up to 5 s for another's transaction (``busy_timeout``), and the
        engine claims jobs with a lease; four processes saving for one user at once lost and
        duplicated nothing (``tests/test_multiprocess.py``). The embedded Chroma index next
        to it is one process only (:class:`~memories_core.errors.StoreInUseError`).

    Schema versions:
        The file records its schema version; opening a file written by an earlier release
        upgrades it in one exclusive transaction (:data:`SQLITE_MIGRATIONS`); a file from a
        newer release is refused with :class:`~memories_core.errors.SchemaVersionError`.

    Erasure:
        ``secure_delete`` is on, so deleted rows are overwritten, not left in free pages;
        :meth:`compact` (called by the engine after ``delete_user``) merges the full-text
        index so that no token of deleted text survives in its segments, and truncates the
        WAL. :meth:`vacuum` rewrites the whole file on request.
    """

    dialect = SQLITE
    user_tables = (*SQLStore.user_tables, "users")
    owners_table = "users"

    def __init__(self, path: str | Path | None = None) -> None:
        self._lock = threading.RLock()
        self._closed = False
        # Nesting of _write() in the thread holding the lock.
        self._nesting = types.SimpleNamespace(depth=0)
        self._threads = threading.local()  # user_lock's held buckets, per thread
        if path is None:
            target = ":memory:"
        else:
            file = Path(path)
            try:
                file.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise BackendError(f"cannot create folder for {file}: {exc}") from exc
            target = str(file)
        self.path: Path | None = None if path is None else Path(path)
        try:
            # isolation_level=None: transactions are opened explicitly (see _write), instead
            # of the sqlite3 module's implicit BEGIN that only precedes DML statements.
            self._conn = sqlite3.connect(target, check_same_thread=False, isolation_level=None)
            self._conn.execute("PRAGMA busy_timeout = 5000")
            if path is not None:
                self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute("PRAGMA synchronous = FULL")
            # Up to 64 MiB of page cache (the default is 2 MiB): full-text ranking reads many
            # pages per query, and measured queries at 110k records ran ~25% faster.
            self._conn.execute("PRAGMA cache_size = -65536")
            self._conn.execute("PRAGMA foreign_keys = ON")
            # Deleted content is overwritten with zeros: deletion must be erasure.
            self._conn.execute("PRAGMA secure_delete = ON")
            # Upgrade an older store (or create a new one) in one exclusive transaction.
            #: Schema versions applied by this open ([] if the file was up to date).
            self.applied_migrations: list[int] = migrate(
                SQLiteSchemaDriver(self._conn), SQLITE_MIGRATIONS
            )
        except SchemaVersionError as exc:
            self._conn.close()
            raise SchemaVersionError(
                f"{target}: {exc}", found=exc.found, supported=exc.supported
            ) from exc
        except sqlite3.Error as exc:
            raise BackendError(f"cannot open SQLite store at {target}: {exc}") from exc

    # -- plumbing ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"SQLiteRecordStore(path={str(self.path) if self.path else None!r})"

    @contextmanager
    def user_lock(self, user_id: str) -> Iterator[None]:
        """Hold ``user_id``'s lock, across processes sharing this file, for the block.

        What :meth:`MemoryEngine.user_lock <memories_core.engine.MemoryEngine.user_lock>`
        takes after its in-process lock, for when several processes share the file (with
        a Chroma server for the vectors): an exclusive ``flock`` on one of
        ``_USER_LOCK_BUCKETS`` empty files in ``<file>.user-locks/`` chosen by a hash of the
        user id (fixed names: nothing on disk names a user; two users in one bucket only
        wait for each other). The OS drops it if the process dies. An in-memory store, or a
        platform without ``fcntl``, needs none: one process has the store. Re-entrant per
        thread. Never call a model while holding it.
        """
        check_user_id(user_id)
        self._ensure_open()
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            fcntl = None  # type: ignore[assignment]
        if self.path is None or fcntl is None:
            yield
            return
        digest = hashlib.blake2b(user_id.encode("utf-8", "surrogatepass"), digest_size=4)
        bucket = int.from_bytes(digest.digest(), "big") % _USER_LOCK_BUCKETS
        held: dict[int, int] = self._threads.__dict__.setdefault("buckets", {})
        if held.get(bucket):
            with self._held_again(held, bucket):
                yield
            return
        folder = self.path.with_name(self.path.name + ".user-locks")
        try:
            folder.mkdir(exist_ok=True)
            fd = os.open(folder / f"{bucket:03d}", os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise BackendError(f"cannot open the user lock of {self.path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held[bucket] = 1
            try:
                yield
            finally:
                held.pop(bucket, None)
        finally:
            os.close(fd)  # releases the flock

    @contextmanager
    def _read(self, users: Iterable[str] = ()) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if self._closed:
                raise BackendError("the record store is closed")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise BackendError(f"SQLite read failed: {exc}") from exc

    @contextmanager
    def _write(self, users: Iterable[str] = ()) -> Iterator[sqlite3.Connection]:
        # One connection and BEGIN IMMEDIATE: a write holds the database's lock, which
        # covers every user (``users`` needs no lock of its own).
        with self._lock:
            if self._closed:
                raise BackendError("the record store is closed")
            if self._nesting.depth:
                # Inside transaction(): join it.
                with self._joined(self._nesting, self._conn, sqlite3.Error, "SQLite write failed"):
                    yield self._conn
                return
            try:
                self._conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise BackendError(f"SQLite write failed to start: {exc}") from exc
            self._nesting.depth = 1
            try:
                yield self._conn
            except BaseException as exc:
                # The original error is the one worth reporting, not a failed rollback.
                with suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
                if isinstance(exc, sqlite3.Error):
                    raise BackendError(f"SQLite write failed: {exc}") from exc
                raise
            else:
                try:
                    self._conn.execute("COMMIT")
                except sqlite3.Error as exc:
                    self._conn.execute("ROLLBACK")
                    raise BackendError(f"SQLite commit failed: {exc}") from exc
            finally:
                self._nesting.depth = 0

    def _executemany(
        self, conn: sqlite3.Connection, statement: str, rows: Sequence[Sequence[Any]]
    ) -> int:
        return int(conn.executemany(statement, rows).rowcount)

    def _insert_records(self, conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """Insert new records, numbering each from its user's range of rowids."""
        per_user: dict[str, int] = {}
        for row in rows:
            per_user[row[8]] = per_user.get(row[8], 0) + 1
        next_seq = {user: self._allocate(conn, user, n) for user, n in per_user.items()}
        numbered = []
        for row in rows:
            seq = next_seq[row[8]]
            next_seq[row[8]] = seq + 1
            numbered.append((seq, *row))
        conn.executemany(
            "INSERT INTO records (seq, kind, text, created_at, session_id, metadata, "
            "source_ids, index_state, id, user_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            numbered,
        )

    @staticmethod
    def _allocate(conn: sqlite3.Connection, user_id: str, count: int) -> int:
        """Reserve ``count`` rowids in ``user_id``'s range; returns the first one."""
        row = conn.execute(
            "SELECT slot, next_seq FROM users WHERE user_id = ?", (user_id,)
        ).fetchone()
        if row is None:
            slot = conn.execute("SELECT coalesce(max(slot) + 1, 0) FROM users").fetchone()[0]
            if slot >= _MAX_SLOTS:
                raise BackendError("the store has no room for another user")
            conn.execute(
                "INSERT INTO users (user_id, slot, next_seq) VALUES (?, ?, 0)", (user_id, slot)
            )
            row = (slot, 0)
        slot, offset = row
        if offset + count > _SLOT_SIZE:
            raise BackendError(f"user {user_id!r} has used up its {_SLOT_SIZE} record ids")
        conn.execute("UPDATE users SET next_seq = ? WHERE user_id = ?", (offset + count, user_id))
        return int(slot * _SLOT_SIZE + offset)

    def search_text(
        self, query: str, *, user_id: str, k: int, where: Filter | None = None
    ) -> builtins.list[tuple[str, float]]:
        """Lexical BM25 search over ``user_id``'s records.

        The query is split into terms with :func:`query_terms`; each term is quoted (so any
        input is valid FTS5 syntax) and the terms are OR-ed, so a record needs only one of
        them. Both the user and ``where`` restrictions run inside the SQL query.

        Args:
            query: Free text.
            user_id: Owner.
            k: Number of results.
            where: A filter (:mod:`memories_core.filters`).

        Returns:
            Up to ``k`` ``(id, score)`` pairs, best first; the score is the negated FTS5
            ``bm25()`` value, so higher is better. ``[]`` if the query has no terms.
        """
        terms = self._query_terms(query, user_id=user_id, k=k)
        if not terms:
            return []
        any_term = " OR ".join(f'"{term}"' for term in terms)
        clause, params = self._filter_sql(where)
        with self._read() as conn:
            slot = conn.execute("SELECT slot FROM users WHERE user_id = ?", (user_id,)).fetchone()
            if slot is None:
                return []
            low = slot[0] * _SLOT_SIZE
            high = low + _SLOT_SIZE - 1
            if clause and _only_kind(conn, user_id, where):
                clause, params = "", []  # every record of the user passes the filter
            # The rowid range goes into FTS5 itself, which then skips other users' postings
            # instead of scoring them; r.user_id = ? keeps the result exact regardless.
            if clause:
                # A filter must run before the LIMIT, so every match is joined to its row.
                sql = (
                    "SELECT r.id, -bm25(records_fts) AS score "
                    "FROM records_fts JOIN records AS r ON r.seq = records_fts.rowid "
                    "LEFT JOIN record_state AS s ON s.seq = r.seq "
                    "WHERE records_fts MATCH ? AND records_fts.rowid BETWEEN ? AND ? "
                    f"AND r.user_id = ?{clause} "
                    "ORDER BY bm25(records_fts) LIMIT ?"
                )
                args = [any_term, low, high, user_id, *params, k]
            else:
                # Without a filter, rank inside FTS5 and join only the top k (measured ~20%
                # less CPU for a user with 99k records).
                sql = (
                    "SELECT r.id, -s.score FROM ("
                    "  SELECT rowid, bm25(records_fts) AS score FROM records_fts"
                    "  WHERE records_fts MATCH ? AND rowid BETWEEN ? AND ?"
                    "  ORDER BY score LIMIT ?"
                    ") AS s JOIN records AS r ON r.seq = s.rowid "
                    "WHERE r.user_id = ? ORDER BY s.score"
                )
                args = [any_term, low, high, k, user_id]
            cursor = conn.execute(sql, args)
            return [(rid, float(score)) for rid, score in cursor]

    def compact(self) -> None:
        """Merge the full-text index (dropping deleted tokens) and truncate the WAL.

        Its cost grows with the index (about a second per 100k records here); the engine runs
        it after a ``delete_user``.
        """
        with self._write() as conn:
            conn.execute("INSERT INTO records_fts (records_fts) VALUES ('optimize')")
        with self._read() as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def schema_version(self) -> int:
        """The file's schema version (:data:`SCHEMA_VERSION` once opened by this release)."""
        with self._read() as conn:
            return int(conn.execute("PRAGMA user_version").fetchone()[0])

    def schema_history(self) -> builtins.list[tuple[int, str]]:
        """``(version, description)`` of each schema step applied to this file, oldest first.

        Steps applied by releases before the migration log (versions 1 and 2) are not listed.
        """
        with self._read() as conn:
            return sqlite_history(conn)

    def check_integrity(self) -> builtins.list[str]:
        """Run SQLite's and FTS5's integrity checks.

        Returns:
            Problems found (``[]`` when the file and the full-text index are consistent).
        """
        problems: list[str] = []
        with self._read() as conn:
            rows = [row[0] for row in conn.execute("PRAGMA integrity_check")]
            problems += [row for row in rows if row != "ok"]
            try:
                conn.execute("INSERT INTO records_fts (records_fts) VALUES ('integrity-check')")
            except sqlite3.DatabaseError as exc:
                problems.append(f"full-text index: {exc}")
        return problems

    def vacuum(self) -> None:
        """Rewrite the whole database file (reclaims space; run on request)."""
        with self._read() as conn:
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def close(self) -> None:
        """Close the store; further calls raise :class:`BackendError`. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._conn.close()
            except sqlite3.Error as exc:
                raise BackendError(f"closing the SQLite store failed: {exc}") from exc
