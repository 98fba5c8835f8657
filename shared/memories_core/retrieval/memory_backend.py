"""An in-memory reference :class:`~memories_core.retrieval.RecallBackend` for tests and benchmarks.

Records live in a list per user with their vectors in a numpy matrix; every :meth:`add`
call is one save call and gets one ``batch_id``, as the engine will store it. BM25 runs in
an in-memory :class:`~memories_core.backends.SQLiteRecordStore` (the library's own FTS5
scoring, so lexical results equal the engine's), and neighbours come from the pure rule in
:mod:`memories_core.retrieval.context`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

import numpy as np
import numpy.typing as npt

from memories_core.backends import SQLiteRecordStore
from memories_core.errors import InvalidInputError
from memories_core.interfaces import Clock, Embedder
from memories_core.retrieval.base import Where, filters_match
from memories_core.retrieval.context import adjacent_rows, rows_of
from memories_core.retrieval.fusion import Ranking
from memories_core.retrieval.store_backend import merge_rankings, split_kinds
from memories_core.types import MemoryRecord, new_id

__all__ = ["InMemoryBackend"]


class _UserPart:
    def __init__(self) -> None:
        self.records: list[MemoryRecord] = []
        self.vectors: list[npt.NDArray[np.float32]] = []
        self.matrix: npt.NDArray[np.float32] | None = None
        self.neighbours: dict[timedelta | None, dict[str, tuple[str | None, str | None]]] = {}


class InMemoryBackend:
    """Records + vectors in memory; implements the recall backend protocol and ``vectors``.

    Instantiate:
        .. code-block:: python

            backend = InMemoryBackend(HashingEmbedder())
            backend.add(turns_of_one_save_call)            # one batch
            backend.add([turn], batch=False)               # no save-call id: links by time
            Pipeline().run(RecallRequest("q", user_id="alice", k=5), backend)

    Args:
        embedder: Embeds queries, and records added without vectors.
        clock: Source of "now" for a pipeline run given no ``now`` (default: the wall clock).
    """

    def __init__(self, embedder: Embedder, *, clock: Clock | None = None) -> None:
        self.embedder = embedder
        self.clock = clock
        self._store = SQLiteRecordStore(None)
        self._parts: dict[str, _UserPart] = {}
        self._by_id: dict[str, MemoryRecord] = {}
        self._batches: dict[str, str] = {}

    def close(self) -> None:
        """Release the in-memory SQLite database."""
        self._store.close()

    def add(
        self,
        records: Sequence[MemoryRecord],
        vectors: npt.ArrayLike | None = None,
        *,
        batch: bool = True,
        batch_id: str | None = None,
    ) -> str | None:
        """Store ``records`` as one save call; returns its ``batch_id`` (``None`` if none).

        Args:
            records: New records (ids must be unused).
            vectors: Their embeddings, one row each; embedded with ``embedder`` if omitted.
            batch: Give the records a shared save-call id (as the engine does).
            batch_id: That id; a fresh one by default.
        """
        records = list(records)
        if not records:
            return None
        ids = [r.id for r in records]
        if len(set(ids)) != len(ids) or any(i in self._by_id for i in ids):
            raise InvalidInputError("record ids must be new and unique")
        if vectors is None:
            matrix = self.embedder.embed_documents([r.text for r in records])
        else:
            matrix = np.asarray(vectors, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[0] != len(records):
            raise InvalidInputError("need one vector per record")
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        matrix = (matrix / np.where(norms > 0, norms, 1.0)).astype(np.float32)
        self._store.add(records)
        label = (batch_id or new_id()) if batch else None
        for record, vector in zip(records, matrix, strict=True):
            part = self._parts.setdefault(record.user_id, _UserPart())
            part.records.append(record)
            part.vectors.append(vector)
            part.matrix = None
            part.neighbours.clear()
            self._by_id[record.id] = record
            if label is not None:
                self._batches[record.id] = label
        return label

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """The embedder's query vector."""
        return self.embedder.embed_query(text)

    def dense(
        self, vector: npt.NDArray[np.float32], *, user_id: str, depth: int, where: Where | None
    ) -> Ranking:
        """Cosine top ``depth`` of ``user_id``'s records matching ``where`` (stable on ties)."""
        part = self._parts.get(user_id)
        if part is None or not part.records:
            return []
        if part.matrix is None:
            part.matrix = np.stack(part.vectors)
        scores = part.matrix @ np.asarray(vector, dtype=np.float32)
        keep = np.array([filters_match(r, where) for r in part.records], dtype=bool)
        rows = [int(i) for i in np.argsort(-scores, kind="stable") if keep[i]][:depth]
        return [(part.records[i].id, float(scores[i])) for i in rows]

    def lexical(self, query: str, *, user_id: str, depth: int, where: Where | None) -> Ranking:
        """BM25 top ``depth`` (FTS5, the library's tokenizer and scoring)."""
        return merge_rankings(
            [
                self._store.search_text(query, user_id=user_id, k=depth, where=part)
                for part in split_kinds(where)
            ],
            depth,
        )

    def has_kind(self, user_id: str, kind: str) -> bool:
        """Whether ``user_id`` has a record of ``kind``."""
        part = self._parts.get(user_id)
        return part is not None and any(r.kind == kind for r in part.records)

    def load(self, ids: Sequence[str], *, user_id: str) -> dict[str, MemoryRecord]:
        """Records of ``user_id`` among ``ids``."""
        found = (self._by_id.get(item) for item in ids)
        return {r.id: r for r in found if r is not None and r.user_id == user_id}

    def adjacent(
        self, ids: Sequence[str], *, user_id: str, gap: timedelta | None
    ) -> dict[str, tuple[str | None, str | None]]:
        """Neighbours by :func:`~memories_core.retrieval.context.linked` (cached per gap)."""
        part = self._parts.get(user_id)
        if part is None:
            return {}
        if gap not in part.neighbours:
            part.neighbours[gap] = adjacent_rows(rows_of(part.records, self._batches), gap=gap)
        table = part.neighbours[gap]
        return {item: table[item] for item in ids if item in table}

    def vectors(self, ids: Sequence[str], *, user_id: str) -> dict[str, npt.NDArray[np.float32]]:
        """Stored unit vectors of ``user_id``'s records among ``ids`` (for MMR)."""
        part = self._parts.get(user_id)
        if part is None:
            return {}
        position = {r.id: i for i, r in enumerate(part.records)}
        return {item: part.vectors[position[item]] for item in ids if item in position}
