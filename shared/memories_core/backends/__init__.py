"""Storage backends: the SQLite record store and the vector indexes.

* :class:`SQLiteRecordStore`: the record of truth, with BM25 full-text search (FTS5).
* :class:`NumpyIndex`: exact in-memory vector index (tests, notebooks, small memories).
* :class:`ChromaIndex`: Chroma vector index, embedded on disk, ephemeral, or a server.
* :class:`PostgresRecordStore` / :class:`PgVectorIndex`: PostgreSQL records and pgvector
  vectors for many processes (extra ``postgres``).

Importing this package imports neither ``chromadb`` nor ``psycopg``; each backend imports
its client when it is built.
"""

from __future__ import annotations

from memories_core.backends.chroma_index import ChromaIndex
from memories_core.backends.numpy_index import NumpyIndex
from memories_core.backends.pgvector_index import PgVectorIndex
from memories_core.backends.postgres import PostgresRecordStore, postgres_storage
from memories_core.backends.sqlite_store import SQLiteRecordStore

__all__ = [
    "ChromaIndex",
    "NumpyIndex",
    "PgVectorIndex",
    "PostgresRecordStore",
    "SQLiteRecordStore",
    "postgres_storage",
]
