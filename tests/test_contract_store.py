"""The record store contract of :mod:`memories_core.testing` on SQLite (in memory and a file).

The same contract runs on PostgreSQL in ``tests/test_contract_postgres.py``: store semantics
are checked once per backend here, not once per mechanism and backend.
"""

from __future__ import annotations

from pathlib import Path

from memories_core.backends import SQLiteRecordStore
from memories_core.interfaces import EngineStore
from memories_core.testing import StoreContract


class TestSQLiteStoreContract(StoreContract):
    def make_store(self, path: Path | None) -> EngineStore:
        return SQLiteRecordStore(None if path is None else path / "records.sqlite3")
