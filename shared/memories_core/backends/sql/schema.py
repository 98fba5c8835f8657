"""Schemas of the SQL store and their migrations, one ordered step list per dialect.

Both dialects hold the same tables (see each table family's module in this package):
``records`` (with a full-text index: FTS5 in SQLite, a generated ``tsvector`` with a GIN
index in PostgreSQL), ``state``, ``record_state``, ``record_history``, ``jobs``,
``graph_nodes`` / ``graph_edges``, ``artifacts`` and ``deletions``. SQLite adds ``users``,
each user's range of rowids (``slot``) and the next free rowid in it, so that a full-text
query can be restricted to one user inside FTS5 itself; PostgreSQL adds identity columns
where SQLite uses the rowid for insertion order.

Steps are appended, never edited: a store written by an earlier release is upgraded at open
in one transaction (:mod:`memories_core.backends.migrations` for SQLite, whose version is
``PRAGMA user_version``; :func:`memories_core.backends.pg_common.migrate` for PostgreSQL,
whose versions are rows of ``schema_version`` under the component ``store``).
"""

from __future__ import annotations

from typing import Any

from memories_core.backends.migrations import Migration, latest_version

__all__ = [
    "ENGINE_SCHEMA",
    "POSTGRES_MIGRATIONS",
    "POSTGRES_SCHEMA_VERSION",
    "SQLITE_MIGRATIONS",
    "SQLITE_SCHEMA_VERSION",
]

# -- SQLite ------------------------------------------------------------------------------------

_SQLITE_RECORDS = """
CREATE TABLE IF NOT EXISTS users (
    user_id TEXT PRIMARY KEY,
    slot INTEGER NOT NULL UNIQUE,
    next_seq INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    user_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    session_id TEXT,
    metadata TEXT NOT NULL DEFAULT '{}',
    source_ids TEXT NOT NULL DEFAULT '[]',
    index_state INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS records_user_kind_time ON records (user_id, kind, created_at);
CREATE INDEX IF NOT EXISTS records_user_time ON records (user_id, created_at);
CREATE INDEX IF NOT EXISTS records_session_order
    ON records (user_id, session_id, kind, created_at);
CREATE INDEX IF NOT EXISTS records_pending ON records (index_state) WHERE index_state = 1;
CREATE TABLE IF NOT EXISTS state (
    user_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (user_id, key)
);
CREATE VIRTUAL TABLE IF NOT EXISTS records_fts USING fts5(
    text, content = 'records', content_rowid = 'seq', tokenize = 'porter unicode61'
);
CREATE TRIGGER IF NOT EXISTS records_fts_insert AFTER INSERT ON records BEGIN
    INSERT INTO records_fts (rowid, text) VALUES (new.seq, new.text);
END;
CREATE TRIGGER IF NOT EXISTS records_fts_delete AFTER DELETE ON records BEGIN
    INSERT INTO records_fts (records_fts, rowid, text) VALUES ('delete', old.seq, old.text);
END;
CREATE TRIGGER IF NOT EXISTS records_fts_update AFTER UPDATE OF text ON records BEGIN
    INSERT INTO records_fts (records_fts, rowid, text) VALUES ('delete', old.seq, old.text);
    INSERT INTO records_fts (rowid, text) VALUES (new.seq, new.text);
END;
"""

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


def _add_claim_owner(connection: Any, dialect: str) -> None:
    """Migration step: ``jobs.claimed_by`` (the claim's owner process), if missing."""
    columns = {row[1] for row in connection.execute("PRAGMA table_info(jobs)")}
    if "claimed_by" not in columns:
        connection.execute("ALTER TABLE jobs ADD COLUMN claimed_by TEXT")


#: Late-interaction token vectors, one row per record (deleted with it): see
#: :mod:`memories_core.backends.sql.token_vectors`.
_SQLITE_TOKEN_VECTORS = """
CREATE TABLE IF NOT EXISTS token_vectors (
    seq INTEGER PRIMARY KEY REFERENCES records (seq) ON DELETE CASCADE,
    user_id TEXT NOT NULL,
    encoder TEXT NOT NULL,
    digest TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    dim INTEGER NOT NULL,
    scale REAL NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS token_vectors_user ON token_vectors (user_id, encoder);
"""

#: The SQLite store's schema history. A store written by an earlier release is upgraded at
#: open, in one transaction.
SQLITE_MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1, "records, users' rowid ranges, state, full-text index", {"sqlite": _SQLITE_RECORDS}
    ),
    Migration(
        2,
        "engine tables: record state and history, jobs, graphs, artifacts, deletions",
        {"sqlite": ENGINE_SCHEMA},
    ),
    Migration(
        3,
        "migration log; jobs ordered by creation for workers that drain every user's queue",
        {"sqlite": "CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created_at);"},
    ),
    Migration(
        4,
        "job claims name their owner process, so a dead worker's claim is taken over at once",
        run=_add_claim_owner,
    ),
    Migration(
        5,
        "late-interaction token vectors per record, kept with it",
        {"sqlite": _SQLITE_TOKEN_VECTORS},
    ),
)
#: Schema version of SQLite stores written by this release.
SQLITE_SCHEMA_VERSION = latest_version(SQLITE_MIGRATIONS)

# -- PostgreSQL --------------------------------------------------------------------------------

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

#: Migration ``i`` brings the PostgreSQL store to version ``i + 1``; append, never edit.
POSTGRES_MIGRATIONS: tuple[str, ...] = (
    _V1,
    # 2: job claims name their owner process (memories_core.backends.claims), so a dead
    # worker's claim is taken over at once by a process of the same host.
    "ALTER TABLE jobs ADD COLUMN IF NOT EXISTS claimed_by text",
    # 3: late-interaction token vectors per record (memories_core.backends.sql.token_vectors).
    """
    CREATE TABLE IF NOT EXISTS token_vectors (
        seq bigint PRIMARY KEY REFERENCES records (seq) ON DELETE CASCADE,
        user_id text NOT NULL,
        encoder text NOT NULL,
        digest text NOT NULL,
        tokens integer NOT NULL,
        dim integer NOT NULL,
        scale double precision NOT NULL,
        data bytea NOT NULL
    );
    CREATE INDEX IF NOT EXISTS token_vectors_user ON token_vectors (user_id, encoder);
    """,
)
#: Schema version of PostgreSQL stores written by this release.
POSTGRES_SCHEMA_VERSION = len(POSTGRES_MIGRATIONS)
