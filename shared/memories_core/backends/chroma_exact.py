"""Exact search beside Chroma's HNSW graph: in-process mirrors of small collections.

Embedded Chroma (chromadb 1.5.9) can leave records out of its HNSW graph: with near-duplicate
vectors, a record deleted and added again, or a collection closed and reopened, a query with
a record's own vector may not return it (measured: BENCHMARKS.md, "Embedded Chroma"). The
record is still stored (``get`` returns it) but recall cannot reach it, which to the user is
data loss. Two remedies live here, both used by
:class:`~memories_core.backends.ChromaIndex`:

* :class:`Mirror`: every vector and metadata of one small collection, held in process memory
  and searched by brute force (exact cosine). It is loaded with one ``get`` the first time a
  collection is searched in the process and kept current by the index's own writes, so the
  graph is never consulted for it.
* pinned vectors (:attr:`Mirror.pinned` of a large collection's entry): records a reachability
  check found unreachable; every search scores them exactly and merges them into the graph's
  answer, so they stay reachable whatever the graph does later.

Entries are keyed by the Chroma collection's UUID, which changes when a collection is dropped
and created again, and shared by every index in the process (one process per embedded folder:
:mod:`memories_core.backends.folder_lock`). A write bumps the entry's generation first, so a
mirror loaded concurrently with a write is discarded rather than kept stale. Writes made to
the collection through another Chroma client in the same process are not seen.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from memories_core.backends.numpy_index import _metadata_getter
from memories_core.filters import index_prefilter
from memories_core.interfaces import Filter

__all__ = ["Mirror", "MirrorRegistry", "exact_top"]

Meta = Mapping[str, Any]


@dataclass
class Mirror:
    """One collection's vectors (unit rows) and metadata, or its pinned records.

    Attributes:
        ids: Row ids, in row order.
        matrix: Unit-normalised vectors, one row per id.
        metas: Metadata per row.
        complete: Whether this holds the whole collection (exact search) or only pinned rows.
    """

    ids: list[str] = field(default_factory=list)
    matrix: npt.NDArray[np.float32] = field(
        default_factory=lambda: np.zeros((0, 0), dtype=np.float32)
    )
    metas: list[Meta] = field(default_factory=list)
    complete: bool = True

    def __len__(self) -> int:
        return len(self.ids)

    def upsert(
        self, ids: Sequence[str], vectors: npt.NDArray[np.float32], metas: Sequence[Meta]
    ) -> None:
        """Add or replace rows (vectors are normalised here)."""
        unit = _unit(vectors)
        position = {vid: row for row, vid in enumerate(self.ids)}
        fresh_rows: list[int] = []
        for i, vid in enumerate(ids):
            row = position.get(vid)
            if row is None:
                position[vid] = len(self.ids) + len(fresh_rows)
                fresh_rows.append(i)
            else:
                self.matrix[row] = unit[i]
                self.metas[row] = dict(metas[i])
        if fresh_rows:
            # A later duplicate of an id within one call replaces the earlier one.
            last: dict[str, int] = {}
            for i in fresh_rows:
                last[ids[i]] = i
            order = list(last.values())
            block = unit[order]
            self.matrix = block if not len(self.ids) else np.vstack([self.matrix, block])
            self.ids += [ids[i] for i in order]
            self.metas += [dict(metas[i]) for i in order]

    def remove(self, ids: Sequence[str]) -> None:
        """Drop rows by id; unknown ids are ignored."""
        gone = set(ids)
        keep = [row for row, vid in enumerate(self.ids) if vid not in gone]
        if len(keep) == len(self.ids):
            return
        self.ids = [self.ids[row] for row in keep]
        self.metas = [self.metas[row] for row in keep]
        self.matrix = self.matrix[keep] if keep else np.zeros((0, 0), dtype=np.float32)

    def search(
        self, query: npt.NDArray[np.float32], k: int, where: Filter | None
    ) -> list[tuple[str, float]]:
        """The ``k`` rows nearest ``query`` by cosine that match ``where``, best first."""
        return exact_top(self.ids, self.matrix, self.metas, query, k, where)


def _unit(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    matrix = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return (matrix / norms).astype(np.float32)


def exact_top(
    ids: Sequence[str],
    matrix: npt.NDArray[np.float32],
    metas: Sequence[Meta],
    query: npt.NDArray[np.float32],
    k: int,
    where: Filter | None,
) -> list[tuple[str, float]]:
    """Brute-force cosine top ``k`` over unit rows that match ``where``, ties broken by id.

    Every row is scored (one matrix product), then the filter is tested in score order on
    the best rows only, widening fourfold until ``k`` rows pass or every row was tested:
    the usual filter (a record kind) passes nearly every row, so a search tests about
    ``k`` metadata, not the whole collection. A widening round takes every row tying with
    the last one it takes, so the answer equals filtering every row first.
    """
    if not ids:
        return []
    usable = index_prefilter(where)  # compiled once per search, not once per row
    norm = float(np.linalg.norm(query)) or 1.0
    # einsum's own loop, not BLAS: BLAS threads wait on each other on a busy machine (10k x
    # 256 rows at load 6 on 2 cores: median 20 ms with ``@``, 1 ms with einsum).
    scores = np.einsum("ij,j->i", matrix, np.asarray(query, dtype=np.float32) / norm)
    total = len(ids)
    fetch = min(total, max(4 * k, 64))
    while True:
        rows = _best_rows(scores, fetch)
        ranked = sorted(rows, key=lambda row: (-float(scores[row]), ids[row]))
        kept: list[int] = []
        for row in ranked:
            if usable is None or usable.matches(_metadata_getter(metas[row])):
                kept.append(row)
                if len(kept) == k:
                    break
        if len(kept) >= k or len(rows) >= total:
            return [(ids[row], float(scores[row])) for row in kept]
        fetch = min(total, fetch * 4)


def _best_rows(scores: npt.NDArray[np.float32], fetch: int) -> list[int]:
    """The rows scoring at least the ``fetch``-th best score (ties with it included)."""
    if fetch >= scores.shape[0]:
        return list(range(scores.shape[0]))
    threshold = np.partition(scores, scores.shape[0] - fetch)[scores.shape[0] - fetch]
    return np.flatnonzero(scores >= threshold).tolist()


class MirrorRegistry:
    """The process's mirrors and pinned rows, by collection UUID, with a vector budget.

    Complete mirrors past ``budget`` vectors in total are evicted least recently used first
    (they are reloaded on the next search); pinned rows are never evicted.
    """

    def __init__(self, budget: int) -> None:
        self._lock = threading.Lock()
        self._budget = budget
        self._mirrors: OrderedDict[str, Mirror] = OrderedDict()
        self._pinned: dict[str, Mirror] = {}
        self._generation: dict[str, int] = {}
        # Collections known to be above the size limit (no mirror is loaded for them).
        self._large: set[str] = set()

    def generation(self, key: str) -> int:
        """The write generation of a collection (bumped by every write)."""
        with self._lock:
            return self._generation.get(key, 0)

    def get(self, key: str) -> Mirror | None:
        """The complete mirror of a collection, if loaded."""
        with self._lock:
            mirror = self._mirrors.get(key)
            if mirror is not None:
                self._mirrors.move_to_end(key)
            return mirror

    def is_large(self, key: str) -> bool:
        """Whether the collection was found above the size limit."""
        with self._lock:
            return key in self._large

    def mark_large(self, key: str, generation: int) -> None:
        """Remember a collection is above the limit (unless written meanwhile)."""
        with self._lock:
            if self._generation.get(key, 0) == generation:
                self._large.add(key)
                self._mirrors.pop(key, None)

    def put(self, key: str, mirror: Mirror, generation: int) -> bool:
        """Keep a freshly loaded mirror unless the collection was written since ``generation``."""
        with self._lock:
            if self._generation.get(key, 0) != generation:
                return False
            self._mirrors[key] = mirror
            self._mirrors.move_to_end(key)
            total = sum(len(m) for m in self._mirrors.values())
            while total > self._budget and len(self._mirrors) > 1:
                _, evicted = self._mirrors.popitem(last=False)
                total -= len(evicted)
            return True

    def written(
        self,
        key: str,
        *,
        upserted: tuple[Sequence[str], npt.NDArray[np.float32], Sequence[Meta]] | None = None,
        removed: Sequence[str] = (),
        limit: int,
    ) -> None:
        """Apply a write to the mirror and the pinned rows of a collection.

        A mirror that grows past ``limit`` is dropped and the collection marked large; a
        removal clears the large mark (the collection may fit again).
        """
        with self._lock:
            self._generation[key] = self._generation.get(key, 0) + 1
            mirror = self._mirrors.get(key)
            pinned = self._pinned.get(key)
            if upserted is not None:
                ids, vectors, metas = upserted
                if mirror is not None:
                    mirror.upsert(ids, vectors, metas)
                    if len(mirror) > limit:
                        self._mirrors.pop(key, None)
                        self._large.add(key)
                if pinned is not None:
                    # A pinned row rewritten keeps its pin, with the new vector.
                    held = set(pinned.ids)
                    rows = [i for i, vid in enumerate(ids) if vid in held]
                    if rows:
                        pinned.upsert(
                            [ids[i] for i in rows], vectors[rows], [metas[i] for i in rows]
                        )
            if removed:
                if mirror is not None:
                    mirror.remove(removed)
                if pinned is not None:
                    pinned.remove(removed)
                self._large.discard(key)

    def invalidate(self, key: str) -> None:
        """Drop a collection's mirror after a write that may have half failed (pins stay)."""
        with self._lock:
            self._generation[key] = self._generation.get(key, 0) + 1
            self._mirrors.pop(key, None)

    def pin(
        self, key: str, ids: Sequence[str], vectors: npt.NDArray[np.float32], metas: Sequence[Meta]
    ) -> None:
        """Score these rows exactly in every search of the collection from now on."""
        with self._lock:
            pinned = self._pinned.setdefault(key, Mirror(complete=False))
            pinned.upsert(ids, vectors, metas)

    def pinned(self, key: str) -> Mirror | None:
        """The pinned rows of a collection, if any."""
        with self._lock:
            pinned = self._pinned.get(key)
            return pinned if pinned is not None and len(pinned) else None

    def forget(self, key: str) -> None:
        """Drop everything held for a collection (it was dropped)."""
        with self._lock:
            self._generation[key] = self._generation.get(key, 0) + 1
            self._mirrors.pop(key, None)
            self._pinned.pop(key, None)
            self._large.discard(key)


# Vectors all mirrors of the process may hold together (least recently used evicted first).
_MIRROR_BUDGET = 200_000
#: The process's mirrors and pins, shared by every index instance of the process.
_MIRRORS = MirrorRegistry(_MIRROR_BUDGET)


def _key_of(collection: Any) -> str:
    """The collection's identity for mirrors and pins (its UUID; new when recreated)."""
    return str(getattr(collection, "id", None) or getattr(collection, "name", ""))
