"""Chroma vector index: embedded persistent (default), ephemeral, or a Chroma server.

``chromadb`` is imported when an index is built, never at import time of this module, so
``import memories_core.backends`` stays light.
"""

from __future__ import annotations

import hashlib
import logging
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from memories_core.backends.chroma_erasure import ChromaErasure
from memories_core.backends.chroma_exact import _MIRRORS, _key_of
from memories_core.backends.chroma_filtered import ChromaFiltering, KindReader
from memories_core.backends.chroma_reach import ChromaReachability
from memories_core.backends.chroma_results import (
    _dimension_of,
    _local_folder,
    _space_of,
)
from memories_core.backends.chroma_verify import (
    ChromaVerification,
    _is_not_found,
    _is_stale,
)
from memories_core.backends.folder_lock import FolderLock
from memories_core.backends.numpy_index import (
    as_query,
    check_filter,
    checked_batch,
)
from memories_core.errors import (
    BackendError,
    ConfigurationError,
    EmbedderMismatchError,
    InvalidInputError,
)
from memories_core.interfaces import Filter
from memories_core.types import check_user_id

__all__ = ["ChromaIndex"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

# Users with at most this many vectors are searched exactly (in-process mirror, brute force)
# instead of through the HNSW graph, which can lose records (see chroma_exact.py).
_EXACT_BELOW = 2000
# A mirror the process already holds (loaded, or started empty with the user's first write
# here) is kept and searched exactly up to this many vectors: it costs memory, not a read.
# Searching a 10k mirror exactly is one in-process matrix product, while a graph query goes
# through Chroma's client; recall figures per store: BENCHMARKS.md, "Latency and save
# throughput".
_KEEP_EXACT_BELOW = 20_000
# Records whose reachability a large collection's first open in a process checks.
_OPEN_CHECK = 200
# Deletes of at least this many ids of a large user are followed by a sampled check.
_BULK_DELETE = 32

# HNSW search breadth of new collections. Chroma's default (10) missed a record's own vector
# in 2.2% of self-queries at 20k hashed vectors, 50 in 1.0%, 100 in 0.5%, at about the same
# query time (1.6-3 ms on a busy 2-core machine); existing collections keep their setting.
_EF_SEARCH = 100

# Chroma caps how many items one call may write; used when the client cannot tell us.
_FALLBACK_BATCH = 5000
# File times of coarse filesystems may round a write after the open to before it.
_MTIME_SLACK_S = 2.0

# Each user's collection is named ``<base>-<first 16 hex digits of sha1(user_id)>``.
_USER_SUFFIX_LEN = 16
# Chroma names: 3-512 characters of [a-zA-Z0-9._-], starting and ending alphanumeric, no "..".
_BASE_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9._-]*")
_MAX_BASE_LEN = 512 - 1 - _USER_SUFFIX_LEN


class ChromaIndex(ChromaFiltering, ChromaReachability, ChromaVerification, ChromaErasure):
    """A :class:`~memories_core.interfaces.VectorIndex` on Chroma.

    Setup:
        ``chromadb`` is a core dependency. Telemetry is switched off for clients built here.

    Key init args (give at most one of ``client``, ``host``, ``path``):
        path: Folder of an embedded, persistent Chroma database.
        client: A Chroma client built by the caller (its settings are the caller's).
        host: Host of a Chroma server (``chroma run``); with ``port``, ``ssl``, ``headers``.
        collection: Base name of the collections. Each user gets a collection named
            ``<collection>-<sha1(user_id)[:16]>``. Without ``client``/``host``/``path`` the
            index is ephemeral and in-process, and a unique suffix on the base name keeps
            two instances apart.
        exact_below: Users with at most this many vectors are searched exactly (see
            "Reachability"); ``0`` searches every user through HNSW. Embedded, ephemeral and
            caller-built persistent clients only; a Chroma server always uses HNSW.
        open_check: How many records of a larger user a reachability check samples when
            the user's collection is first opened in the process (``0``: no check).
        open_check_background: Run that check in a background thread (default), so the
            first search after a reopen does not wait for it; ``False`` makes the first
            search wait. :meth:`wait_checks` waits for running checks.

    Instantiate:
        .. code-block:: python

            from memories_core.backends import ChromaIndex

            index = ChromaIndex(path="memory/chroma")               # embedded, on disk
            index = ChromaIndex()                                    # ephemeral, in memory
            index = ChromaIndex(host="127.0.0.1", port=8000)         # a Chroma server

    Search:
        Every user has their own Chroma collection, created on the user's first ``add``.
        Scoping by collection replaces a ``where={"user_id": ...}`` pre-filter on one shared
        collection, whose cost grows with the rows it matches: at 200k rows (one user
        holding 100k) an unfiltered query took 1.3 ms, ``where user_id`` 378-449 ms and
        ``$and`` of ``user_id`` and ``kind`` 672 ms. A query with a caller's filter first
        runs without ``where``, over-fetching neighbours (``4 * k + 20`` for a filter new to
        the collection, then ``k`` over the share of hits that passed it last time, with a
        margin: :mod:`~memories_core.backends.chroma_filtered`) and filtering their
        metadata in Python (with the equality rules of ``NumpyIndex`` and the SQLite
        store); only if fewer than ``k`` pass and the collection holds more, one more query
        passes the filter to Chroma as ``where``. Collections use cosine space and scores
        are returned as cosine similarity (``1 - distance``). Chroma's HNSW search is
        approximate; :class:`~memories_core.backends.NumpyIndex` is exact.

    Reachability:
        chromadb 1.5.9's embedded HNSW graph can leave a stored record out of reach: with
        near-duplicate vectors, after a record is deleted and added again, or after a close
        and reopen, a query with the record's own vector may not return it (measured in
        BENCHMARKS.md, "Embedded Chroma"). A user with at most ``exact_below`` vectors is
        therefore searched by brute force over an in-process mirror of their vectors and
        metadata (loaded with one ``get`` on the user's first search in the process, then
        kept current by this index's writes; :mod:`memories_core.backends.chroma_exact`),
        so every stored record is reachable. A mirror the process holds already (loaded,
        or started empty when the user's first vector was written here) is kept and
        searched exactly until the user passes 20,000 vectors (or ``exact_below`` if
        larger), since keeping it costs only memory. For a larger user, the first open in a
        process probes ``open_check`` sampled records (in a background thread by default,
        so that first search does not wait: 8.5 s at 100k records), every ``add`` probes the
        records it wrote, and a delete of 32 ids or more probes a sample again; a record
        found unreachable is *pinned*: every later search of the user scores it exactly and
        merges it into the graph's answer, so the repair holds whatever the graph does.
        Records the sample misses are found by :meth:`probe` (``MemoryEngine.verify``),
        which pins them too. Mirrors live in process memory; pinned ids are also kept in
        the folder's pins file and re-pinned on the next open.

    Deletion and erasure:
        On an embedded persistent store (``path=``, or a caller's ``PersistentClient``),
        :meth:`delete_user` and :meth:`reset` also erase the dropped data from the files
        (:meth:`erase_deleted`: segment folders, leftover rows, ``VACUUM``), so no id,
        metadata value or vector of a deleted user is readable in any file under the path.
        :meth:`delete` leaves deleted vectors in Chroma's files (HNSW only marks them
        deleted) unless ``erase=True``. A Chroma server erases nothing through this class.

    Several instances:
        Collections another instance drops or recreates (one in this process on the same
        path, or any client of the same Chroma server) are re-resolved:
        a call that meets a stale cached collection drops it from the cache and retries
        once. :meth:`ids`, :meth:`users` and :meth:`probe` let a caller compare the index
        with the record store and find vectors HNSW cannot reach.

    One process per embedded folder:
        An embedded persistent store (``path=`` or a caller's ``PersistentClient``) keeps its
        HNSW graphs in process memory; two processes writing one folder corrupt it (measured:
        see :mod:`memories_core.backends.folder_lock`). The first process to open a folder
        holds an OS lock on it until its last index on the folder is closed; another process
        gets :class:`~memories_core.errors.StoreInUseError` at open, which names the server
        setup (``host=``, or pgvector). Several instances in one process share the lock.

    Layout:
        Vectors written by the former single-collection layout (one collection named
        ``collection``) are neither read nor counted, so such an index looks empty and
        ``MemoryBase`` rebuilds it from the record store; the old collection is left as is.

    Raises:
        ConfigurationError: on contradictory arguments, a collection name Chroma cannot
            use, or if a user's collection is not in cosine space.
        BackendError: if the client cannot be built or Chroma fails later.
        StoreInUseError: if another process has the embedded folder open.
    """

    def __init__(
        self,
        *,
        path: str | Path | None = None,
        client: Any | None = None,
        host: str | None = None,
        port: int = 8000,
        collection: str = "memories",
        ssl: bool = False,
        headers: Mapping[str, str] | None = None,
        exact_below: int = _EXACT_BELOW,
        open_check: int = _OPEN_CHECK,
        open_check_background: bool = True,
    ) -> None:
        for name, value in (("exact_below", exact_below), ("open_check", open_check)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"{name} must be an int >= 0, got {value!r}")
        given = [
            name
            for name, value in (("path", path), ("client", client), ("host", host))
            if value is not None
        ]
        if len(given) > 1:
            raise ConfigurationError(
                f"give at most one of path=, client=, host= (got {', '.join(given)})"
            )
        if host is None and (port != 8000 or ssl or headers):
            raise ConfigurationError("port=, ssl= and headers= only apply together with host=")
        if not isinstance(collection, str) or not collection:
            raise ConfigurationError("collection must be a non-empty string")
        self._lock = threading.RLock()
        self._ephemeral = not given
        # In-process ephemeral clients share one store; a unique name keeps indexes apart.
        self._name = f"{collection}-{uuid.uuid4().hex[:12]}" if self._ephemeral else collection
        if (
            not _BASE_NAME.fullmatch(self._name)
            or ".." in self._name
            or len(self._name) > _MAX_BASE_LEN
        ):
            raise ConfigurationError(
                f"collection {collection!r} must be at most {_MAX_BASE_LEN} characters of "
                "[a-zA-Z0-9._-], start with a letter or digit and contain no '..'"
            )
        self._own_name = re.compile(re.escape(self._name) + rf"-[0-9a-f]{{{_USER_SUFFIX_LEN}}}")
        self._mode = given[0] if given else "ephemeral"
        # One process per embedded folder (folder_lock.py): taken before Chroma touches it.
        self._folder_lock: FolderLock | None = (
            FolderLock(path, what="embedded Chroma index") if path is not None else None
        )
        try:
            self._client = (
                client
                if client is not None
                else self._build_client(path=path, host=host, port=port, ssl=ssl, headers=headers)
            )
        except BaseException:
            self._release_folder()
            raise
        # A client this index built is released on close (a caller's is left open): Chroma
        # keeps one system per folder per process, and a stale one answers "Failed to get
        # segments" to a new memory made where a deleted one was.
        self._owns_client = client is None
        # The folder of an embedded persistent store, whose files erasure cleans.
        self._folder: Path | None = Path(path) if path is not None else _local_folder(client)
        if self._folder_lock is None and self._folder is not None:
            # A caller's PersistentClient: its folder is just as unsafe in two processes.
            self._folder_lock = FolderLock(self._folder, what="embedded Chroma index")
        self._erase_on_close = False
        # HNSW files Chroma writes from now on may carry this process's stale memory.
        self._opened_at = time.time()
        with suppress(BackendError):  # best effort on open; a delete_user repeats it
            for late in self._orphan_segment_folders():
                shutil.rmtree(late, ignore_errors=True)
        self._dimension: int | None = None
        # user_id -> that user's Chroma collection, filled as collections are opened.
        self._collections: dict[str, Any] = {}
        self._batch = self._max_batch()
        # Mirrors need every write to pass through this process: not for a Chroma server.
        self._local = self._folder is not None or self._ephemeral
        self._exact_below = exact_below if self._local else 0
        # Size past which a held mirror is dropped (the user then goes through the graph).
        self._keep_exact = max(self._exact_below, _KEEP_EXACT_BELOW) if self._exact_below else 0
        self._open_check = open_check
        # Collections (by UUID) whose reachability this instance has checked on open.
        self._checked: set[str] = set()
        self._open_check_background = bool(open_check_background)
        self._check_threads: list[threading.Thread] = []
        self._closing = False
        self._init_filtering()

    # -- construction -----------------------------------------------------------------------

    @staticmethod
    def _build_client(
        *,
        path: str | Path | None,
        host: str | None,
        port: int,
        ssl: bool,
        headers: Mapping[str, str] | None,
    ) -> Any:
        import chromadb
        from chromadb.config import Settings

        settings = Settings(anonymized_telemetry=False)
        try:
            if host is not None:
                return chromadb.HttpClient(
                    host=host,
                    port=port,
                    ssl=ssl,
                    headers=dict(headers) if headers else None,
                    settings=settings,
                )
            if path is not None:
                folder = Path(path)
                folder.mkdir(parents=True, exist_ok=True)
                return chromadb.PersistentClient(path=str(folder), settings=settings)
            return chromadb.EphemeralClient(settings=settings)
        except ValueError as exc:
            # Chroma allows one in-process system per location with one set of settings.
            raise ConfigurationError(f"cannot build a Chroma client: {exc}") from exc
        except Exception as exc:
            raise BackendError(f"cannot build a Chroma client: {exc}") from exc

    def _user_collection_name(self, user_id: str) -> str:
        digest = hashlib.sha1(user_id.encode("utf-8"), usedforsecurity=False).hexdigest()
        return f"{self._name}-{digest[:_USER_SUFFIX_LEN]}"

    def _collection_for(self, user_id: str, *, create: bool) -> Any | None:
        """The user's collection (opened once, then cached); ``None`` if absent and not created."""
        cached = self._collections.get(user_id)
        if cached is not None:
            return cached
        name = self._user_collection_name(user_id)
        try:
            if create:
                collection = self._client.get_or_create_collection(
                    name,
                    configuration={"hnsw": {"space": "cosine", "ef_search": _EF_SEARCH}},
                    embedding_function=None,
                )
            else:
                collection = self._client.get_collection(name, embedding_function=None)
        except Exception as exc:
            if not create and _is_not_found(exc):
                return None
            raise BackendError(f"cannot open Chroma collection {name!r}: {exc}") from exc
        space = _space_of(collection)
        if space is not None and space != "cosine":
            raise ConfigurationError(
                f"Chroma collection {name!r} uses {space!r} distance; this index needs "
                "cosine (use another collection name)"
            )
        self._collections[user_id] = collection
        return collection

    def _on_collection(self, user_id: str, create: bool, op: Callable[[Any], _T], absent: _T) -> _T:
        """Run ``op`` on ``user_id``'s collection; ``absent`` if it does not exist.

        Another process on the same path may drop (``delete_user``, ``reset``) or drop and
        recreate a collection this process has cached; the cached object then fails with
        "does not exist". The cache entry is dropped and the collection resolved once more,
        so a stale collection never outlives one call and never touches other users.
        """
        for attempt in range(2):
            collection = self._collection_for(user_id, create=create)
            if collection is None:
                return absent
            try:
                return op(collection)
            except BackendError as exc:
                if attempt or not _is_stale(exc):
                    raise
                if self._collections.get(user_id) is collection:
                    del self._collections[user_id]
        raise AssertionError("unreachable")  # pragma: no cover

    def _open_by_name(self, name: str) -> Any | None:
        """A collection by name, or ``None`` if it was dropped meanwhile."""
        try:
            return self._client.get_collection(name, embedding_function=None)
        except Exception as exc:
            if _is_not_found(exc):
                return None
            raise BackendError(f"cannot open Chroma collection {name!r}: {exc}") from exc

    def _own_collection_names(self) -> list[str]:
        """Names of every per-user collection of this index present in the client."""
        listed = self._guard(self._client.list_collections)
        # chromadb >= 0.6 returns Collection objects; older clients returned names.
        names = [item if isinstance(item, str) else str(item.name) for item in listed]
        return [name for name in names if self._own_name.fullmatch(name)]

    def _drop_collection(self, name: str) -> None:
        try:
            self._client.delete_collection(name)
        except Exception as exc:
            if not _is_not_found(exc):
                raise BackendError(f"cannot delete Chroma collection {name!r}: {exc}") from exc

    def _max_batch(self) -> int:
        try:
            size = int(self._client.get_max_batch_size())
        except Exception:
            # Older clients and some servers do not report it; Chroma's own cap is larger.
            return _FALLBACK_BATCH
        return max(1, size)

    def __repr__(self) -> str:
        return f"ChromaIndex(mode={self._mode!r}, collection={self._name!r})"

    @property
    def collection_name(self) -> str:
        """Base name of the per-user collections (with its unique suffix when ephemeral)."""
        return self._name

    def user_collection_name(self, user_id: str) -> str:
        """Name of the Chroma collection that holds ``user_id``'s vectors."""
        return self._user_collection_name(user_id)

    # -- dimension --------------------------------------------------------------------------

    def _stored_dimension(self, first: Any | None = None) -> int | None:
        """Dimension of the stored vectors, index-wide: from ``first``, else any user's.

        Cached once seen; only :meth:`reset` forgets it.
        """
        if self._dimension is None:
            if first is not None:
                self._dimension = _dimension_of(first)
            if self._dimension is None:
                for name in self._own_collection_names():
                    collection = self._open_by_name(name)
                    if collection is None:
                        continue
                    try:
                        self._dimension = _dimension_of(collection)
                    except Exception as exc:
                        if _is_not_found(exc):  # dropped meanwhile
                            continue
                        raise
                    if self._dimension is not None:
                        break
        return self._dimension

    def _check_dimension(self, dimension: int, first: Any | None = None) -> None:
        stored = self._stored_dimension(first)
        if stored is not None and stored != dimension:
            raise EmbedderMismatchError(
                f"vectors have dimension {dimension} but the Chroma collections "
                f"{self._name!r}-* hold dimension {stored}; use the original embedder or reindex"
            )

    # -- VectorIndex ------------------------------------------------------------------------

    def add(
        self,
        ids: Sequence[str],
        vectors: npt.NDArray[np.float32],
        metadatas: Sequence[Mapping[str, str | int | float | bool]],
    ) -> None:
        """Add or replace vectors (Chroma ``upsert``) in each user's collection, in batches.

        Every input is validated before anything is written (the metadata rules of
        :func:`~memories_core.backends.numpy_index.check_metadata`, shared with
        ``NumpyIndex``), so a key Chroma would reject never leaves a half-written batch.

        Raises:
            InvalidInputError: on mismatched lengths, bad shapes, a reserved metadata key
                (empty, ``$...``, ``#...``, ``chroma:...``, NUL) or a non-scalar value.
            MissingUserError: if a metadata has no ``user_id``.
            EmbedderMismatchError: if the dimension differs from the stored vectors'.
            BackendError: if Chroma fails (earlier batches may already be written; the
                record store keeps such records pending, so they are re-added later).
        """
        batch = checked_batch(ids, vectors, metadatas)
        if batch is None:
            return
        matrix, metas = batch
        id_list = [str(i) for i in ids]
        rows_of: dict[str, list[int]] = {}
        for row, meta in enumerate(metas):
            rows_of.setdefault(str(meta["user_id"]), []).append(row)

        def upsert_rows(rows: list[int]) -> Callable[[Any], None]:
            def run(collection: Any) -> None:
                # Upserts are idempotent: a retry on a re-resolved collection rewrites all.
                key = _key_of(collection)
                self._seed_mirror(collection)
                for start in range(0, len(rows), self._batch):
                    chunk = rows[start : start + self._batch]
                    chunk_ids = [id_list[row] for row in chunk]
                    chunk_metas = [metas[row] for row in chunk]
                    try:
                        self._guard(
                            collection.upsert,
                            ids=chunk_ids,
                            embeddings=matrix[chunk],
                            metadatas=chunk_metas,
                        )
                    except BaseException:
                        _MIRRORS.invalidate(key)  # a failed batch may be half-written: reload
                        raise
                    _MIRRORS.written(
                        key,
                        upserted=(chunk_ids, matrix[chunk], chunk_metas),
                        limit=self._keep_exact,
                    )
                if self._local and (self._exact_below == 0 or _MIRRORS.is_large(key)):
                    self._pin_lost(collection, [id_list[row] for row in rows])

            return run

        with self._lock:
            self._guard(self._check_dimension, matrix.shape[1])
            for user_id, rows in rows_of.items():
                self._on_collection(user_id, True, upsert_rows(rows), None)
                self._dimension = matrix.shape[1]

    def search(
        self,
        vector: npt.NDArray[np.float32],
        *,
        user_id: str,
        k: int,
        where: Filter | None = None,
        kinds_of: KindReader | None = None,
    ) -> list[tuple[str, float]]:
        """Return up to ``k`` ``(id, cosine)`` pairs of ``user_id``'s vectors, best first.

        ``kinds_of`` reads the kinds of ``user_id``'s records (the engine passes its record
        store's); a filter on ``kind`` alone is then checked with it instead of Chroma's
        metadata (:data:`~memories_core.backends.chroma_filtered.KindReader`).

        Raises:
            InvalidInputError: if ``k < 1``, the vector is malformed or the filter invalid.
            EmbedderMismatchError: if the query's dimension differs from the index's.
            BackendError: if Chroma fails.
        """
        check_user_id(user_id)
        if k < 1:
            raise InvalidInputError("k must be >= 1")
        check_filter(where)
        query = as_query(vector)
        with self._lock:
            return self._on_collection(
                user_id, False, lambda c: self._search_in(c, query, k, where, kinds_of), []
            )

    def delete(self, ids: Sequence[str], *, user_id: str, erase: bool = False) -> None:
        """Delete vectors by id from ``user_id``'s collection; other users' are left alone.

        Args:
            ids: Ids to delete; unknown ids are ignored.
            user_id: Owner of the vectors.
            erase: Also make the deleted ids, metadata and vectors unrecoverable from the
                raw files (embedded persistent store only): the user's collection is rebuilt
                from its remaining vectors (HNSW only marks deleted vectors, it keeps them
                in its files) and Chroma's SQLite file is vacuumed. This costs a rewrite of
                the user's vectors and of the whole SQLite file, so batch deletions and
                erase once (or call :meth:`erase_deleted` after several deletes).
        """
        id_list = [str(i) for i in ids]
        with self._lock:
            if id_list:

                def run(collection: Any) -> None:
                    key = _key_of(collection)
                    try:
                        for start in range(0, len(id_list), self._batch):
                            self._guard(collection.delete, ids=id_list[start : start + self._batch])
                    finally:
                        _MIRRORS.written(key, removed=id_list, limit=self._keep_exact)
                        self._forget_pins(key, id_list)
                    # A bulk delete can cut the graph's paths to other records: check a sample.
                    bulk = len(id_list) >= _BULK_DELETE
                    if bulk and self._local and self._exact(collection) is None:
                        self._check_sample(collection)

                self._on_collection(user_id, False, run, None)
            if erase:
                self._rebuild_user(user_id)
                self.erase_deleted()

    def delete_user(self, user_id: str) -> None:
        """Delete every vector of ``user_id`` and erase them from the files.

        Drops the user's collection. On an embedded persistent store the dropped data is
        then erased from the files under the path (see :meth:`erase_deleted`): the user's
        HNSW segment folder is removed, rows Chroma left behind are purged and the SQLite
        file is vacuumed, so neither the ids, the metadata (``user_id`` included) nor the
        vectors can be read back from the raw files. Safe to repeat: a call after a crash
        finishes the erasure of an earlier one.

        Raises:
            BackendError: if Chroma fails, or the SQLite file stays locked by another
                process for longer than a minute (the vectors are gone but not yet erased;
                call again).
        """
        with self._lock:
            name = self._user_collection_name(user_id)
            dropped = self._collections.pop(user_id, None) or self._open_by_name(name)
            if dropped is not None:
                _MIRRORS.forget(_key_of(dropped))  # no deleted vector stays in memory
                self._forget_pins(_key_of(dropped))  # nor a pinned id on disk
                self._forget_shares(_key_of(dropped))
            self._drop_collection(self._user_collection_name(user_id))
            self.erase_deleted()
            self._sweep_late_segment_folders()
            self._erase_on_close = self._folder is not None

    def warm(self, user_id: str) -> bool:
        """Load ``user_id``'s collection for searching now, ahead of their first search.

        Chroma reads a collection's HNSW graph from disk on its first query in a process;
        a small user's exact mirror is read on first use too. One query with one of the
        user's own vectors does both. Measured on a 100k-record user within one process
        (where Chroma may keep the graph loaded), the first recall after it gained little
        (BENCHMARKS.md, "Retrieval quality"). Returns ``False`` when the user has no vectors.
        """
        check_user_id(user_id)

        def load(collection: Any) -> bool:
            if self._exact(collection) is not None:
                return True
            got = self._guard(collection.get, limit=1, include=["embeddings"])
            vectors = got.get("embeddings")
            if vectors is None or len(vectors) == 0:
                return False
            query = np.asarray(vectors[0], dtype=np.float32)
            self._guard(collection.query, query_embeddings=[query], n_results=1, include=[])
            return True

        with self._lock:
            return self._on_collection(user_id, False, load, False)

    def count(self, user_id: str | None = None) -> int:
        """Number of vectors, of one user or of all."""
        with self._lock:
            if user_id is not None:
                return self._on_collection(user_id, False, lambda c: int(self._guard(c.count)), 0)
            total = 0
            for name in self._own_collection_names():
                collection = self._open_by_name(name)
                if collection is None:
                    continue
                try:
                    total += int(self._guard(collection.count))
                except BackendError as exc:
                    if not _is_stale(exc):  # else dropped meanwhile
                        raise
            return total

    def reset(self) -> None:
        """Delete every vector of every user (drops every per-user collection)."""
        with self._lock:
            for dropped in self._collections.values():
                _MIRRORS.forget(_key_of(dropped))
            self._write_pins({})  # every collection goes: so do their pinned ids
            with self._shares_lock:
                self._shares.clear()
            self._collections.clear()
            self._dimension = None
            for name in self._own_collection_names():
                self._drop_collection(name)
            self.erase_deleted()

    def _release_folder(self) -> None:
        lock, self._folder_lock = self._folder_lock, None
        if lock is not None:
            lock.release()

    def stop_background(self, timeout: float | None = 60.0) -> bool:
        """Stop the background open checks at their next step and wait for them.

        ``close()`` calls it, and so does the engine's exit hook for an index left open: a
        check still inside Chroma when the interpreter finalizes crashed the process
        (SIGSEGV) after the caller's last line. Searches work on; no new check starts.

        Returns:
            Whether no check is left running after ``timeout`` seconds.
        """
        self._closing = True
        return self.wait_checks(timeout=timeout)

    def close(self) -> None:
        """Release the index; an ephemeral index also drops its collections.

        If users were deleted meanwhile, the erasure runs once more: Chroma may write a
        dropped collection's HNSW files from a background thread after the drop returned
        (seen at 1,500 vectors), and those files hold ids and vectors. Once a client this
        index built is closed, the HNSW files written since the open have the unused part of
        their buffer zeroed (it is uninitialised memory of this process). An embedded folder's
        process lock is released last (another process may open the folder after that).
        """
        self.stop_background()
        try:
            self._close()
        finally:
            self._release_folder()

    def _close(self) -> None:
        with self._lock:
            self._flush_reports(self._collections.values())
            self._write_shares()
            self._collections.clear()
            scrub_all = self._erase_on_close
            if self._erase_on_close:
                self._erase_on_close = False
                self.erase_deleted()
                self._sweep_late_segment_folders()
                if not self._owns_client:  # else once, below, after the client is closed
                    self._scrub_unused_capacity()
            if self._ephemeral:
                # Already gone is fine when closing.
                with suppress(Exception):
                    for name in self._own_collection_names():
                        self._drop_collection(name)
            if self._owns_client:
                self._owns_client = False
                closer = getattr(self._client, "close", None)  # chromadb >= 1.1
                if callable(closer):
                    with suppress(Exception):
                        closer()
                # Chroma may persist a live user's HNSW files with the unused part of their
                # buffer holding whatever this process's memory held, another user's deleted
                # texts included (seen after a reopen in the process that had written them).
                # With the client closed nothing writes those files any more.
                # After a delete every file is scrubbed (an error is the caller's, as for
                # the rest of the erasure), else those written since the open.
                if scrub_all:
                    self._scrub_unused_capacity()
                else:
                    with suppress(OSError):
                        self._scrub_unused_capacity(since=self._opened_at - _MTIME_SLACK_S)

    # -- helpers ----------------------------------------------------------------------------

    @staticmethod
    def _guard(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``call(*args, **kwargs)``; turn Chroma's errors into the package's errors."""
        try:
            return call(*args, **kwargs)
        except (EmbedderMismatchError, InvalidInputError):
            raise
        except Exception as exc:
            message = str(exc)
            if "dimension" in message.lower():
                raise EmbedderMismatchError(f"Chroma rejected the vectors: {message}") from exc
            raise BackendError(f"Chroma call failed: {message}") from exc
