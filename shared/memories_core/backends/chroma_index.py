"""Chroma vector index: embedded persistent (default), ephemeral, or a Chroma server.

``chromadb`` is imported when an index is built, never at import time of this module, so
``import memories_core.backends`` stays light.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from memories_core.backends.numpy_index import as_matrix, as_query, check_filter, check_metadata
from memories_core.errors import (
    BackendError,
    ConfigurationError,
    EmbedderMismatchError,
    InvalidInputError,
    MissingUserError,
)
from memories_core.interfaces import Filter

__all__ = ["ChromaIndex"]

# Chroma caps how many items one call may write; used when the client cannot tell us.
_FALLBACK_BATCH = 5000


class ChromaIndex:
    """A :class:`~memories_core.interfaces.VectorIndex` on Chroma.

    Setup:
        ``chromadb`` is a core dependency. Telemetry is switched off for clients built here.

    Key init args (give at most one of ``client``, ``host``, ``path``):
        path: Folder of an embedded, persistent Chroma database.
        client: A Chroma client built by the caller (its settings are the caller's).
        host: Host of a Chroma server (``chroma run``); with ``port``, ``ssl``, ``headers``.
        collection: Collection name. Without ``client``/``host``/``path`` the index is
            ephemeral and in-process, and a unique suffix keeps two instances apart.

    Instantiate:
        .. code-block:: python

            from memories_core.backends import ChromaIndex

            index = ChromaIndex(path="memory/chroma")               # embedded, on disk
            index = ChromaIndex()                                    # ephemeral, in memory
            index = ChromaIndex(host="127.0.0.1", port=8000)         # a Chroma server

    Search:
        Every query carries ``where={"user_id": ...}`` (combined with the caller's filter
        by ``$and``), so scoping happens inside Chroma. The collection uses cosine space and
        scores are returned as cosine similarity (``1 - distance``). Chroma's HNSW search is
        approximate; :class:`~memories_core.backends.NumpyIndex` is exact.

    Raises:
        ConfigurationError: on contradictory arguments, or if the collection is not in
            cosine space.
        BackendError: if the client cannot be built or Chroma fails later.
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
    ) -> None:
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
        self._mode = given[0] if given else "ephemeral"
        self._client = (
            client
            if client is not None
            else self._build_client(path=path, host=host, port=port, ssl=ssl, headers=headers)
        )
        self._dimension: int | None = None
        self._collection = self._open_collection()
        self._batch = self._max_batch()

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

    def _open_collection(self) -> Any:
        try:
            collection = self._client.get_or_create_collection(
                self._name,
                configuration={"hnsw": {"space": "cosine"}},
                embedding_function=None,
            )
        except Exception as exc:
            raise BackendError(f"cannot open Chroma collection {self._name!r}: {exc}") from exc
        space = _space_of(collection)
        if space is not None and space != "cosine":
            raise ConfigurationError(
                f"Chroma collection {self._name!r} uses {space!r} distance; this index needs "
                "cosine (use another collection name)"
            )
        return collection

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
        """Name of the Chroma collection (with its unique suffix when ephemeral)."""
        return self._name

    # -- dimension --------------------------------------------------------------------------

    def _stored_dimension(self) -> int | None:
        if self._dimension is None:
            got = self._collection.get(limit=1, include=["embeddings"])
            embeddings = got.get("embeddings")
            if embeddings is not None and len(embeddings) > 0:
                self._dimension = len(embeddings[0])
        return self._dimension

    def _check_dimension(self, dimension: int) -> None:
        stored = self._stored_dimension()
        if stored is not None and stored != dimension:
            raise EmbedderMismatchError(
                f"vectors have dimension {dimension} but Chroma collection {self._name!r} "
                f"holds dimension {stored}; use the original embedder or reindex"
            )

    # -- VectorIndex ------------------------------------------------------------------------

    def add(
        self,
        ids: Sequence[str],
        vectors: npt.NDArray[np.float32],
        metadatas: Sequence[Mapping[str, str | int | float | bool]],
    ) -> None:
        """Add or replace vectors (Chroma ``upsert``), in batches Chroma accepts.

        Raises:
            InvalidInputError: on mismatched lengths, bad shapes or non-scalar metadata.
            MissingUserError: if a metadata has no ``user_id``.
            EmbedderMismatchError: if the dimension differs from the stored vectors'.
            BackendError: if Chroma fails (earlier batches may already be written; the
                record store keeps such records pending, so they are re-added later).
        """
        if len(ids) != len(metadatas):
            raise InvalidInputError(f"{len(ids)} ids but {len(metadatas)} metadatas")
        if not ids:
            return
        matrix = as_matrix(vectors, len(ids))
        metas = [check_metadata(meta) for meta in metadatas]
        id_list = [str(i) for i in ids]
        with self._lock:
            self._guard(self._check_dimension, matrix.shape[1])
            for start in range(0, len(id_list), self._batch):
                stop = start + self._batch
                self._guard(
                    self._collection.upsert,
                    ids=id_list[start:stop],
                    embeddings=matrix[start:stop],
                    metadatas=metas[start:stop],
                )
            self._dimension = matrix.shape[1]

    def search(
        self, vector: npt.NDArray[np.float32], *, user_id: str, k: int, where: Filter | None = None
    ) -> list[tuple[str, float]]:
        """Return up to ``k`` ``(id, cosine)`` pairs of ``user_id``'s vectors, best first.

        Raises:
            InvalidInputError: if ``k < 1``, the vector is malformed or the filter invalid.
            EmbedderMismatchError: if the query's dimension differs from the index's.
            BackendError: if Chroma fails.
        """
        if not isinstance(user_id, str) or not user_id.strip():
            raise MissingUserError("user_id is required")
        if k < 1:
            raise InvalidInputError("k must be >= 1")
        check_filter(where)
        query = as_query(vector)
        clauses: list[dict[str, Any]] = [{"user_id": user_id}]
        clauses += [{key: value} for key, value in (where or {}).items()]
        chroma_where = clauses[0] if len(clauses) == 1 else {"$and": clauses}
        with self._lock:
            if self._guard(self._stored_dimension) is None:
                return []
            self._guard(self._check_dimension, query.shape[0])
            result = self._guard(
                self._collection.query,
                query_embeddings=[query],
                n_results=k,
                where=chroma_where,
                include=["distances"],
            )
        ids = result["ids"][0] if result["ids"] else []
        distances = result["distances"][0] if result.get("distances") else []
        return [(vid, 1.0 - float(dist)) for vid, dist in zip(ids, distances, strict=True)]

    def delete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Delete vectors by id; ids of other users are left alone."""
        if not ids:
            return
        id_list = [str(i) for i in ids]
        with self._lock:
            for start in range(0, len(id_list), self._batch):
                self._guard(
                    self._collection.delete,
                    ids=id_list[start : start + self._batch],
                    where={"user_id": user_id},
                )

    def delete_user(self, user_id: str) -> None:
        """Delete every vector of ``user_id``."""
        with self._lock:
            self._guard(self._collection.delete, where={"user_id": user_id})

    def count(self, user_id: str | None = None) -> int:
        """Number of vectors, of one user or of all."""
        with self._lock:
            if user_id is None:
                return int(self._guard(self._collection.count))
            got = self._guard(self._collection.get, where={"user_id": user_id}, include=[])
            return len(got["ids"])

    def reset(self) -> None:
        """Delete every vector of every user (drops and recreates the collection)."""
        with self._lock:
            self._guard(self._client.delete_collection, self._name)
            self._dimension = None
            self._collection = self._open_collection()

    def close(self) -> None:
        """Release the index; an ephemeral index also drops its collection."""
        with self._lock:
            if self._ephemeral:
                # Already gone is fine when closing.
                with suppress(Exception):
                    self._client.delete_collection(self._name)

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


def _space_of(collection: Any) -> str | None:
    """Distance space of a Chroma collection, from its configuration or legacy metadata."""
    config = getattr(collection, "configuration", None)
    if isinstance(config, Mapping):
        hnsw = config.get("hnsw")
        if isinstance(hnsw, Mapping) and hnsw.get("space"):
            return str(hnsw["space"])
    metadata = getattr(collection, "metadata", None)
    if isinstance(metadata, Mapping) and metadata.get("hnsw:space"):
        return str(metadata["hnsw:space"])
    return None
