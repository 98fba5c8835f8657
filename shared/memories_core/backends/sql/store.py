"""The engine's SQL store, written once: every table family over one :class:`SQLDialect`."""

from __future__ import annotations

from typing import Any

from memories_core.backends.sql.artifacts import ArtifactsTable
from memories_core.backends.sql.graph import GraphTables
from memories_core.backends.sql.jobs import JobsTable
from memories_core.backends.sql.records import RecordsTable
from memories_core.backends.sql.state import StateTables
from memories_core.backends.sql.token_vectors import TokenVectorsTable
from memories_core.backends.sql.tombstones import TombstonesTable

__all__ = ["EngineTables", "SQLStore"]


class EngineTables(
    StateTables, JobsTable, GraphTables, ArtifactsTable, TombstonesTable, TokenVectorsTable
):
    """Every table family but the records.

    State and history, jobs, graph, artifacts, tombstones, token vectors.
    """


class SQLStore(RecordsTable, EngineTables):
    """An :class:`~memories_core.interfaces.EngineStore` over a SQL database.

    A backend subclasses it with its :class:`~memories_core.backends.sql.SQLDialect` and
    provides connections and transactions (``_read``, ``_write``, ``_executemany``, and
    ``_lock_users`` where it locks per user), the insertion of new records (their ``seq``),
    lexical search, ``compact``, ``vacuum`` and ``close``
    (:class:`~memories_core.backends.SQLiteRecordStore`,
    :class:`~memories_core.backends.PostgresRecordStore`).
    """

    def close(self) -> None:
        """Close the store; further calls raise :class:`~memories_core.errors.BackendError`."""
        raise NotImplementedError  # pragma: no cover

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
