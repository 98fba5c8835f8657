"""The SQL store, written once over a small dialect object and split by table family.

* :mod:`~memories_core.backends.sql.dialect`: :class:`SQLDialect`, what differs between SQL
  databases (placeholders, id lists, JSON casts, order columns, booleans, row locks, hints).
* :mod:`~memories_core.backends.sql.base`: :class:`SQLBase`, what a backend provides
  (connections, transactions, user locks) and the statement helpers.
* table families: :mod:`~memories_core.backends.sql.records` (records, neighbours, vector
  index state), :mod:`~memories_core.backends.sql.state` (key/value state, record state and
  history), :mod:`~memories_core.backends.sql.jobs` (jobs and claims),
  :mod:`~memories_core.backends.sql.graph`, :mod:`~memories_core.backends.sql.artifacts`,
  :mod:`~memories_core.backends.sql.tombstones`;
* :mod:`~memories_core.backends.sql.schema`: each dialect's tables and migrations;
* :mod:`~memories_core.backends.sql.rows` and :mod:`~memories_core.backends.sql.text`: row
  codecs and lexical query terms.

:class:`SQLStore` joins the families; :class:`~memories_core.backends.SQLiteRecordStore` and
:class:`~memories_core.backends.PostgresRecordStore` are its backends.
"""

from __future__ import annotations

from memories_core.backends.sql.base import SQLBase
from memories_core.backends.sql.dialect import SQLDialect
from memories_core.backends.sql.store import EngineTables, SQLStore

__all__ = ["EngineTables", "SQLBase", "SQLDialect", "SQLStore"]
