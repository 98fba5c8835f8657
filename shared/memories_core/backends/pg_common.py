"""Connection plumbing shared by the PostgreSQL record store and the pgvector index.

* a :class:`psycopg_pool.ConnectionPool` whose connections are in autocommit mode and have
  ``search_path`` set to the memory's schema (then ``public``, where extensions usually
  live), so several memories can share one database in separate schemas;
* a redacted form of the DSN for ``repr`` and error messages: credentials come from the DSN
  or the libpq environment (``PGPASSWORD``, ``~/.pgpass``) and are never logged or shown;
* versioned schemas: table ``schema_version`` holds one row per applied migration of each
  component (``store``, ``pgvector``); migrations run in order, in one transaction, under a
  transaction-level advisory lock, so that workers starting together migrate once.

``psycopg`` and ``psycopg_pool`` are imported only when a store or index is built (extra
``postgres``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from memories_core.errors import BackendError, ConfigurationError, MissingExtraError

__all__ = ["SCHEMA_NAME", "make_pool", "migrate", "prepare", "redact_dsn"]

#: Schema names accepted (quoted as identifiers anyway; this keeps them readable).
SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def redact_dsn(dsn: str) -> str:
    """``user@host:port/dbname`` of a DSN, without password or other options."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        parts = conninfo_to_dict(dsn)
    except Exception:
        return "<unparseable dsn>"
    host = str(parts.get("host") or "localhost")
    if host.startswith("/"):
        host = "unix-socket"
    port = parts.get("port")
    user = parts.get("user")
    where = f"{host}:{port}" if port else host
    login = f"{user}@" if user else ""
    return f"{login}{where}/{parts.get('dbname') or ''}"


def check_schema(schema: Any) -> str:
    """Validate a schema name (raises :class:`ConfigurationError`)."""
    if not isinstance(schema, str) or not SCHEMA_NAME.fullmatch(schema):
        raise ConfigurationError(
            f"schema {schema!r} must be 1-63 characters of [A-Za-z0-9_], not starting with a digit"
        )
    return schema


def make_pool(
    dsn: str,
    *,
    schema: str,
    min_size: int,
    max_size: int,
    timeout: float,
    name: str,
) -> Any:
    """An open :class:`psycopg_pool.ConnectionPool` on ``dsn`` with ``search_path`` set.

    Raises:
        MissingExtraError: if the ``postgres`` extra is not installed.
        ConfigurationError: if the DSN is empty or the sizes are invalid.
        BackendError: if no connection can be made within ``timeout`` seconds (the message
            names the redacted DSN only).
    """
    if not isinstance(dsn, str) or not dsn.strip():
        raise ConfigurationError("dsn must be a non-empty PostgreSQL connection string")
    if not 1 <= min_size <= max_size:
        raise ConfigurationError("pool sizes must satisfy 1 <= min_size <= pool_size")
    try:
        import psycopg
        from psycopg import sql
        from psycopg_pool import ConnectionPool
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise MissingExtraError("psycopg", "postgres") from exc
    # The memory's schema, then public, then wherever the vector extension lives.
    search_path = sql.SQL(
        "SELECT set_config('search_path', {} || ', public' || coalesce(("
        "SELECT ', ' || quote_ident(n.nspname) FROM pg_extension AS e "
        "JOIN pg_namespace AS n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'vector' AND n.nspname <> 'public'), ''), false)"
    ).format(sql.Literal(sql.Identifier(schema).as_string()))

    def configure(conn: psycopg.Connection[Any]) -> None:
        conn.execute(search_path)

    pool = ConnectionPool(
        conninfo=dsn,
        min_size=min_size,
        max_size=max_size,
        kwargs={"autocommit": True},
        configure=configure,
        timeout=timeout,
        name=name,
        open=False,
    )
    try:
        pool.open(wait=True, timeout=timeout)
    except Exception as exc:
        pool.close()
        raise BackendError(
            f"cannot connect to PostgreSQL at {redact_dsn(dsn)} within {timeout:g} s "
            f"({type(exc).__name__})"
        ) from None
    return pool


def prepare(pool: Any, step: Callable[[Any], object], *, what: str) -> None:
    """Run ``step(connection)`` on a pooled connection at open; close the pool if it fails.

    Raises:
        BackendError: if the step fails (its own :class:`BackendError`, or one naming
            ``what``); the pool is closed then.
    """
    try:
        with pool.connection() as conn:
            step(conn)
    except BackendError:
        pool.close()
        raise
    except Exception as exc:
        pool.close()
        raise BackendError(f"cannot prepare {what}: {exc}") from exc


def migrate(
    conn: Any,
    *,
    schema: str,
    component: str,
    migrations: Sequence[str | Callable[[Any], None]],
) -> int:
    """Bring ``component``'s tables in ``schema`` to the latest version; returns it.

    Args:
        conn: An autocommit connection whose ``search_path`` starts with ``schema``.
        schema: The schema (created if missing).
        component: Name under which versions are recorded.
        migrations: Migration ``i`` brings the component to version ``i + 1``: SQL, or a
            callable that receives the connection.

    Raises:
        BackendError: if the stored version is newer than this code knows.
    """
    from psycopg import sql

    latest = len(migrations)
    with conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"llm-memories:migrate:{schema}",),
        )
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_version ("
            " component text NOT NULL, version integer NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (component, version))"
        )
        row = conn.execute(
            "SELECT coalesce(max(version), 0) FROM schema_version WHERE component = %s",
            (component,),
        ).fetchone()
        current = int(row[0])
        if current > latest:
            raise BackendError(
                f"schema {schema!r} holds {component} version {current}; this version of "
                f"llm-memories reads up to {latest}"
            )
        for version in range(current + 1, latest + 1):
            step = migrations[version - 1]
            if callable(step):
                step(conn)
            else:
                conn.execute(step)
            conn.execute(
                "INSERT INTO schema_version (component, version) VALUES (%s, %s)",
                (component, version),
            )
    return latest
