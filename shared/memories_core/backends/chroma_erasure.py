"""Erasure of deleted data from an embedded, persistent Chroma store's files.

Chroma's deletes leave data readable: its SQLite file keeps deleted rows in the free space
of its pages (Chroma's connection runs without ``secure_delete``), a dropped collection's
HNSW segment folder stays on disk, Chroma may write a dropped collection's HNSW files from a
background thread after the drop returned, and the HNSW writer persists the unused part of
an index's preallocated buffer as uninitialised memory. :class:`ChromaErasure` removes all of
it, so that no id, metadata or vector of a deleted user can be read back from the raw files;
:class:`~memories_core.backends.ChromaIndex` runs it after ``delete_user``, ``reset`` and at
close. It works on the files only, through its own ``sqlite3`` connection with
``secure_delete`` on; it is a no-op for ephemeral, server and non-local clients.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import struct
import threading
import time
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import numpy as np

from memories_core.errors import BackendError

__all__ = ["ChromaErasure"]

# Chroma's embedded store: one SQLite file plus one folder (named by segment UUID) per HNSW
# vector segment.
_SQLITE_FILE = "chroma.sqlite3"
_SEGMENT_DIR = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
# How long erasure waits for other connections (other processes) to release the SQLite file.
_ERASE_BUSY_TIMEOUT_MS = 60_000
# How many vectors one ``get`` of a rebuild reads.
_READ_BATCH = 1000


class ChromaErasure:
    """Erasure of a Chroma folder's deleted data (mixed into the Chroma index).

    Attributes used:
        _folder: The embedded persistent store's folder, or ``None`` (nothing to erase).
        _lock: The index's lock, held while files are rewritten.
        _collections, _collection_for, ...: the index's access to its per-user collections
            (:meth:`_rebuild_user` rewrites a collection without its deleted vectors).
    """

    _folder: Path | None
    _lock: threading.RLock
    _batch: int
    _collections: dict[str, Any]
    _collection_for: Callable[..., Any]
    _user_collection_name: Callable[[str], str]
    _drop_collection: Callable[[str], None]
    _all_ids: Callable[[Any], set[str]]
    _guard: Callable[..., Any]

    def _rebuild_user(self, user_id: str) -> None:
        """Rewrite ``user_id``'s collection from its live vectors (drops HNSW tombstones).

        Not atomic: after a crash between the drop and the re-add the user's vectors are
        missing, which ``ids`` against the record store shows (re-add them as pending).
        """
        self._collections.pop(user_id, None)  # resolve afresh, never a stale object
        collection = self._collection_for(user_id, create=False)
        if collection is None:
            return
        name = self._user_collection_name(user_id)
        ids = sorted(self._all_ids(collection))
        rows: list[tuple[list[str], Any, list[Any]]] = []
        for start in range(0, len(ids), _READ_BATCH):
            got = self._guard(
                collection.get,
                ids=ids[start : start + _READ_BATCH],
                include=["embeddings", "metadatas"],
            )
            rows.append(
                (
                    [str(v) for v in got["ids"]],
                    np.asarray(got["embeddings"], dtype=np.float32),
                    list(got["metadatas"]),
                )
            )
        self._collections.pop(user_id, None)
        self._drop_collection(name)
        fresh: Any = self._collection_for(user_id, create=True)
        for chunk_ids, vectors, metas in rows:
            for start in range(0, len(chunk_ids), self._batch):
                stop = start + self._batch
                self._guard(
                    fresh.upsert,
                    ids=chunk_ids[start:stop],
                    embeddings=vectors[start:stop],
                    metadatas=metas[start:stop],
                )

    def erase_deleted(self) -> None:
        """Erase dropped collections' data from the files of an embedded persistent store.

        Chroma's deletes leave data readable: the SQLite file keeps deleted rows in free
        space of its pages (Chroma's connection runs without ``secure_delete``), and a
        dropped collection's HNSW segment folder stays on disk. This removes every segment
        folder no segment row refers to, purges rows Chroma left behind for dropped
        segments and collections (``embeddings``, ``embedding_metadata``, the full-text
        table, ``max_seq_id``, ``embeddings_queue``), optimises the full-text index, runs
        ``VACUUM`` (rewrites the file without free space) and truncates a WAL, through a
        separate ``sqlite3`` connection with ``secure_delete`` on. Live collections are
        untouched. Costs one rewrite of the SQLite file (about its size in I/O); a no-op for
        ephemeral, server and non-local clients.

        Raises:
            BackendError: if the SQLite file stays locked longer than a minute, or cannot
                be rewritten.
        """
        folder = self._folder
        if folder is None or not (folder / _SQLITE_FILE).is_file():
            return
        with self._lock:
            orphans = self._orphan_segment_folders()
            for entry in orphans:
                shutil.rmtree(entry, ignore_errors=True)
            try:
                with closing(
                    sqlite3.connect(
                        folder / _SQLITE_FILE,
                        timeout=_ERASE_BUSY_TIMEOUT_MS / 1000,
                        isolation_level=None,
                    )
                ) as conn:
                    conn.execute(f"PRAGMA busy_timeout = {_ERASE_BUSY_TIMEOUT_MS}")
                    conn.execute("PRAGMA secure_delete = ON")
                    _purge_orphan_rows(conn)
                    conn.execute("VACUUM")
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                raise BackendError(f"cannot erase deleted Chroma data: {exc}") from exc
            for entry in orphans:
                if entry.exists():
                    raise BackendError(f"cannot remove the dropped Chroma segment {entry}")

    def _orphan_segment_folders(self) -> list[Path]:
        """Segment folders that no segment row refers to (a dropped collection's files).

        Folders are listed before segment rows are read: Chroma writes a segment's row (when
        the collection is created) before its folder, so a folder listed whose row is absent
        belongs to a dropped segment, never to one being created.
        """
        folder = self._folder
        if folder is None or not (folder / _SQLITE_FILE).is_file():
            return []
        listed = [e for e in folder.iterdir() if e.is_dir() and _SEGMENT_DIR.fullmatch(e.name)]
        if not listed:
            return []
        try:
            with closing(
                sqlite3.connect(folder / _SQLITE_FILE, timeout=_ERASE_BUSY_TIMEOUT_MS / 1000)
            ) as conn:
                live = {str(row[0]) for row in conn.execute("SELECT id FROM segments")}
        except sqlite3.Error as exc:
            raise BackendError(f"cannot read Chroma's segments: {exc}") from exc
        return [entry for entry in listed if entry.name not in live]

    def _sweep_late_segment_folders(self, *, seconds: float = 3.0, quiet: int = 3) -> None:
        """Remove a dropped collection's files that Chroma writes after the drop returned.

        Under load, Chroma persisted a dropped collection's HNSW files (ids, vectors) from a
        background thread after ``delete_user`` and even after ``erase_deleted`` (its flush of
        an index above the sync threshold runs on after ``add`` returns). After a delete and at
        close, poll briefly until no such folder has appeared for ``quiet`` consecutive checks;
        opening the index sweeps once more, for files written after a process ended.
        """
        deadline = time.monotonic() + seconds
        calm = 0
        while calm < quiet and time.monotonic() < deadline:
            try:
                late = self._orphan_segment_folders()
            except BackendError:
                return
            for entry in late:
                shutil.rmtree(entry, ignore_errors=True)
            calm = 0 if late else calm + 1
            time.sleep(0.15)

    def _scrub_unused_capacity(self, since: float | None = None) -> int:
        """Zero the unused capacity of the live HNSW files; returns the files scrubbed.

        Chroma's HNSW writer persists an index's whole preallocated buffer, and the part past
        the stored elements is uninitialised memory: stale bytes of whatever the process
        handled, a deleted user's texts and ids included (seen in 2 of 30 delete_user runs).
        The header (version, level-0 offset, capacity, element count, bytes per element) says
        where the used part ends; a file whose sizes do not match the header is left alone.

        Args:
            since: Only files modified at or after this time (``time.time()``); ``None``: all.
        """
        folder = self._folder
        if folder is None:
            return 0
        scrubbed = 0
        for segment in folder.iterdir():
            if not (segment.is_dir() and _SEGMENT_DIR.fullmatch(segment.name)):
                continue
            try:
                header = (segment / "header.bin").read_bytes()
                _, _, capacity, count, per_element = struct.unpack_from("<i4Q", header, 0)
            except (OSError, struct.error):
                continue
            for name, width in (("data_level0.bin", per_element), ("length.bin", 4)):
                target = segment / name
                try:
                    stat = target.stat()
                except OSError:
                    continue
                if since is not None and stat.st_mtime < since:
                    continue
                size = stat.st_size
                used = count * width
                if not width or count > capacity or size != capacity * width or used >= size:
                    continue
                with target.open("r+b") as handle:
                    handle.seek(used)
                    handle.write(bytes(size - used))
                    handle.flush()
                    os.fsync(handle.fileno())
                scrubbed += 1
        return scrubbed


def _purge_orphan_rows(conn: sqlite3.Connection) -> None:
    """Delete rows of Chroma's SQLite file that belong to no live segment or collection."""
    tables = {str(row[0]) for row in conn.execute("SELECT name FROM sqlite_master")}
    orphan = "SELECT id FROM embeddings WHERE segment_id NOT IN (SELECT id FROM segments)"
    statements = [
        (
            "embedding_fulltext_search",
            f"DELETE FROM embedding_fulltext_search WHERE rowid IN ({orphan})",
        ),
        (
            "embedding_metadata_array",
            f"DELETE FROM embedding_metadata_array WHERE id IN ({orphan})",
        ),
        ("embedding_metadata", f"DELETE FROM embedding_metadata WHERE id IN ({orphan})"),
        ("embeddings", "DELETE FROM embeddings WHERE segment_id NOT IN (SELECT id FROM segments)"),
        ("max_seq_id", "DELETE FROM max_seq_id WHERE segment_id NOT IN (SELECT id FROM segments)"),
        (
            "embeddings_queue",
            # Topics are "<scheme>://<tenant>/<database>/<collection id>".
            "DELETE FROM embeddings_queue WHERE substr(topic, -36) NOT IN "
            "(SELECT id FROM collections)",
        ),
    ]
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, statement in statements:
            if table in tables:
                conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    if "embedding_fulltext_search" in tables:
        # FTS5 keeps deleted terms in its segments until they are merged.
        conn.execute(
            "INSERT INTO embedding_fulltext_search(embedding_fulltext_search) VALUES('optimize')"
        )
