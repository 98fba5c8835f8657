"""Versioned schemas: ordered, idempotent upgrade steps run in one transaction at open.

A store's schema has a version (an integer, 1 for the first release). Each
:class:`Migration` upgrades version ``n - 1`` to ``n`` and carries its SQL per dialect
(``"sqlite"``, ``"postgres"``), so one ordered step list describes a schema change for every
backend and the list is the record of what each release changed. :func:`migrate` runs at
open:

1. it starts a transaction that excludes every other migrator (SQLite: ``BEGIN IMMEDIATE``,
   the database's write lock; Postgres: ``pg_advisory_xact_lock``), so several processes
   opening an old store at once upgrade it once;
2. it reads the version *inside* that transaction (another process may have just upgraded);
3. it runs the steps above that version in order and records each (version, description,
   time) in ``schema_migrations``;
4. it commits: all steps or none. A step that fails rolls everything back, the store stays at
   its old version and the error names the step.

Steps are also written to be idempotent (``CREATE ... IF NOT EXISTS``), so a store whose
version was lost or a step re-run by hand does no harm. A store newer than this release is
refused with :class:`~memories_core.errors.SchemaVersionError` (never opened half-understood).

A backend plugs in with a :class:`SchemaDriver`: its dialect name, how to open the exclusive
transaction, how to read and record the version, and how to run a script. This module ships
:class:`SQLiteSchemaDriver` and :class:`PostgresSchemaDriver` (a psycopg 3 connection; psycopg
is not imported here).
"""

from __future__ import annotations

import logging
import re
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Protocol

from memories_core.errors import ConfigurationError, SchemaVersionError

__all__ = [
    "MIGRATIONS_TABLE",
    "Migration",
    "PostgresSchemaDriver",
    "SQLiteSchemaDriver",
    "SchemaDriver",
    "as_migrations",
    "check_migrations",
    "latest_version",
    "migrate",
    "split_sqlite_script",
    "sqlite_history",
]

logger = logging.getLogger(__name__)

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

#: Table where each applied step is recorded (version, description, applied_at in seconds).
MIGRATIONS_TABLE = "schema_migrations"


@dataclass(frozen=True)
class Migration:
    """One schema step: upgrades version ``version - 1`` to ``version``.

    Attributes:
        version: The version this step produces (1 creates the first schema).
        description: What the step changes (kept in ``schema_migrations``).
        sql: Script per dialect (``{"sqlite": "...", "postgres": "..."}``). Statements are
            separated by ``;``; write them so that running them twice does no harm.
        run: Optional Python step run after the script, ``run(connection, dialect)``, for
            data changes SQL cannot express; it runs inside the same transaction.
    """

    version: int
    description: str
    sql: Mapping[str, str] = field(default_factory=dict)
    run: Callable[[Any, str], None] | None = None


class SchemaDriver(Protocol):
    """What :func:`migrate` needs from a backend's connection."""

    dialect: str

    def exclusive(self) -> Any:
        """Context manager: a transaction no other migrator can run beside (commit on exit)."""
        ...

    def version(self) -> int:
        """The store's schema version (0: empty store). Called inside :meth:`exclusive`."""
        ...

    def record(self, migration: Migration) -> None:
        """Set the version to ``migration.version`` and log the step (inside the transaction)."""
        ...

    def execute_script(self, script: str) -> None:
        """Run the statements of ``script`` in order (inside the transaction)."""
        ...

    @property
    def connection(self) -> Any:
        """The connection handed to :attr:`Migration.run`."""
        ...


def check_migrations(migrations: Sequence[Migration]) -> None:
    """Check that the steps are numbered 1, 2, ... in order.

    Raises:
        ConfigurationError: on a gap, a repeat or a wrong order.
    """
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise ConfigurationError(
                f"migration {migration.description!r} has version {migration.version}; "
                f"expected {expected} (steps must be numbered 1, 2, ... in order)"
            )


def latest_version(migrations: Sequence[Migration]) -> int:
    """The version a store has after every step of ``migrations`` (0 for none)."""
    return migrations[-1].version if migrations else 0


def migrate(
    driver: SchemaDriver, migrations: Sequence[Migration], *, target: int | None = None
) -> list[int]:
    """Upgrade a store to ``target`` (default: the last step) in one transaction.

    Args:
        driver: The backend's connection wrapper.
        migrations: Every step, numbered from 1 (:func:`check_migrations`).
        target: Stop at this version (tests build old stores with it).

    Returns:
        The versions applied now (``[]`` if the store was up to date).

    Raises:
        SchemaVersionError: if the store is newer than ``migrations`` know, or a step failed
            (nothing of the upgrade is kept).
        ConfigurationError: if the steps are misnumbered or lack SQL for the dialect.
    """
    check_migrations(migrations)
    newest = latest_version(migrations)
    goal = newest if target is None else target
    if not 0 <= goal <= newest:
        raise ConfigurationError(f"target version {goal} is not between 0 and {newest}")
    for migration in migrations[:goal]:
        if driver.dialect not in migration.sql and migration.run is None:
            raise ConfigurationError(
                f"migration {migration.version} ({migration.description}) has no step for "
                f"{driver.dialect!r}"
            )
    applied: list[int] = []
    with driver.exclusive():
        current = driver.version()
        if current > newest:
            raise SchemaVersionError(
                f"the store has schema version {current}; this release of llm-memories reads "
                f"up to {newest}. Upgrade llm-memories to open it.",
                found=current,
                supported=newest,
            )
        for migration in migrations[current:goal]:
            logger.info(
                "schema %s: version %d (%s)",
                driver.dialect,
                migration.version,
                migration.description,
            )
            try:
                script = migration.sql.get(driver.dialect)
                if script:
                    driver.execute_script(script)
                if migration.run is not None:
                    migration.run(driver.connection, driver.dialect)
                driver.record(migration)
            except SchemaVersionError:
                raise
            except Exception as exc:
                raise SchemaVersionError(
                    f"upgrading the store from schema version {current} failed at step "
                    f"{migration.version} ({migration.description}): {exc}; nothing was "
                    "changed",
                    found=current,
                    supported=newest,
                ) from exc
            applied.append(migration.version)
    return applied


def split_sqlite_script(script: str) -> list[str]:
    """Split a script into complete statements (a trigger's ``BEGIN ... END`` stays whole)."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip():
        statements.append(buffer.strip())
    return statements


class SQLiteSchemaDriver:
    """:class:`SchemaDriver` of a ``sqlite3`` connection opened with ``isolation_level=None``.

    The version lives in ``PRAGMA user_version`` (where releases before the migration
    framework kept it, so their stores are recognised), which SQLite writes in the
    transaction like any page. ``BEGIN IMMEDIATE`` takes the database's write lock, waiting
    up to the connection's busy timeout for another process's upgrade to finish.
    """

    dialect = "sqlite"

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._conn = connection

    @property
    def connection(self) -> sqlite3.Connection:
        """The wrapped connection."""
        return self._conn

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on an error)."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            with suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def version(self) -> int:
        """``PRAGMA user_version``."""
        return int(self._conn.execute("PRAGMA user_version").fetchone()[0])

    def record(self, migration: Migration) -> None:
        """Log the step and set ``PRAGMA user_version``."""
        self._conn.execute(
            f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} (version INTEGER PRIMARY KEY, "
            "description TEXT NOT NULL, applied_at REAL NOT NULL)"
        )
        self._conn.execute(
            f"INSERT OR REPLACE INTO {MIGRATIONS_TABLE} (version, description, applied_at) "
            "VALUES (?, ?, ?)",
            (migration.version, migration.description, time.time()),
        )
        # PRAGMA takes no parameters; the version is an int from the step list.
        self._conn.execute(f"PRAGMA user_version = {int(migration.version)}")

    def execute_script(self, script: str) -> None:
        """Run each complete statement of ``script`` in the open transaction."""
        # Not executescript(): it would commit the open transaction first.
        for statement in split_sqlite_script(script):
            self._conn.execute(statement)


class PostgresSchemaDriver:
    """:class:`SchemaDriver` of a psycopg 3 connection (duck-typed; psycopg not imported).

    Versions are rows of ``<schema>.schema_version (component, version, applied_at)``: one
    schema may hold several components (the record store, the pgvector index) that upgrade
    independently. A transaction-scoped advisory lock keyed by the schema keeps other
    migrators out until commit; DDL in Postgres is transactional, so a failed step leaves
    nothing behind.

    Args:
        connection: A psycopg ``Connection`` in autocommit mode (``transaction()`` opens the
            block).
        schema: Schema of the tables (created if missing; a plain identifier).
        component: Name the versions are recorded under.
    """

    dialect = "postgres"

    def __init__(self, connection: Any, *, schema: str, component: str = "store") -> None:
        if not _IDENTIFIER.fullmatch(schema):
            raise ConfigurationError(
                f"schema {schema!r} must be a plain identifier (letters, digits, _)"
            )
        self._conn = connection
        self._schema = schema
        self._component = component

    @property
    def connection(self) -> Any:
        """The wrapped connection."""
        return self._conn

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """A transaction holding the schema's advisory lock; creates the version table."""
        with self._conn.transaction():
            self._conn.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"llm-memories:migrate:{self._schema}",),
            )
            self._conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{self._schema}"')
            self._conn.execute(
                f'CREATE TABLE IF NOT EXISTS "{self._schema}".schema_version ('
                " component text NOT NULL, version integer NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now(),"
                " PRIMARY KEY (component, version))"
            )
            yield

    def version(self) -> int:
        """The component's largest recorded version (0 for a new schema)."""
        row = self._conn.execute(
            f'SELECT coalesce(max(version), 0) FROM "{self._schema}".schema_version '
            "WHERE component = %s",
            (self._component,),
        ).fetchone()
        return int(row[0])

    def record(self, migration: Migration) -> None:
        """Log the step (its version becomes the component's largest)."""
        self._conn.execute(
            f'INSERT INTO "{self._schema}".schema_version (component, version) '
            "VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (self._component, migration.version),
        )

    def execute_script(self, script: str) -> None:
        """Run ``script`` (several statements) in the open transaction, in the schema."""
        self._conn.execute(f'SET LOCAL search_path TO "{self._schema}", public')
        # psycopg runs several statements in one call when no parameters are bound.
        self._conn.execute(script)


def _dialect_free(step: Callable[[Any], None]) -> Callable[[Any, str], None]:
    def run(connection: Any, dialect: str) -> None:
        step(connection)

    return run


def as_migrations(
    steps: Sequence[str | Callable[[Any], None]], *, dialect: str, name: str = "step"
) -> list[Migration]:
    """Number a plain list of steps (SQL, or ``step(connection)``) as :class:`Migration` s.

    Step ``i`` (from 0) produces version ``i + 1``.
    """
    out: list[Migration] = []
    for number, step in enumerate(steps, start=1):
        if isinstance(step, str):
            out.append(Migration(number, f"{name} {number}", {dialect: step}))
        else:
            out.append(Migration(number, f"{name} {number}", run=_dialect_free(step)))
    return out


def sqlite_history(connection: sqlite3.Connection) -> list[tuple[int, str]]:
    """``(version, description)`` of the steps recorded in a SQLite store, oldest first."""
    try:
        rows = connection.execute(
            f"SELECT version, description FROM {MIGRATIONS_TABLE} ORDER BY version"
        ).fetchall()
    except sqlite3.OperationalError:
        return []
    return [(int(v), str(d)) for v, d in rows]
