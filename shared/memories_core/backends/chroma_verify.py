"""Verification of a Chroma index against the record store: which vectors it holds.

``MemoryEngine.verify`` compares the record store with the index: :meth:`~ChromaVerification.ids`
and :meth:`~ChromaVerification.users` list what the index holds, :meth:`~ChromaVerification.vectors`
reads stored vectors back, and :meth:`~ChromaVerification.probe` finds stored vectors that a
search with their own vector does not return (HNSW is approximate, and a crash can leave a
vector without links), so that they can be re-added.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from memories_core.backends.numpy_index import PROBE_DEPTH
from memories_core.errors import BackendError, InvalidInputError

__all__ = ["ChromaVerification"]

# Cosine distance up to which the neighbours at the probe's depth may tie with the probed
# vector's own distance (0): the search then looks deeper for the id.
_PROBE_TIE = 1e-5
# How far past the probed id's own distance the depth's last neighbour may lie and still crowd
# it out legitimately (float error of equal vectors). Near-duplicates 1e-6 apart do not.
_TIE_EPS = 1e-7
# How many ids one ``get`` of ``ids``/``probe`` reads.
_READ_BATCH = 1000
#: Ids per page when only ids are listed (no vectors, no metadata).
_ID_PAGE = 100_000


def _is_not_found(exc: Exception) -> bool:
    """Whether Chroma raised because a collection does not exist."""
    # chromadb.errors.NotFoundError (embedded and HTTP clients); older versions raise a
    # ValueError / InvalidCollectionException saying the collection does not exist.
    if any(cls.__name__ == "NotFoundError" for cls in type(exc).__mro__):
        return True
    return "does not exist" in str(exc).lower()


def _is_stale(exc: BaseException) -> bool:
    """Whether a wrapped Chroma error says the collection no longer exists."""
    cause = exc.__cause__
    return isinstance(cause, Exception) and _is_not_found(cause)


class ChromaVerification:
    """What the index holds, read back (mixed into the Chroma index).

    Attributes used:
        _lock: The index's lock.
        _on_collection, _open_by_name, _own_collection_names, _guard: the index's access
            to its per-user collections.
        _probe_searched: the reachability probe (exact users report nothing; see
            :mod:`memories_core.backends.chroma_reach`).
    """

    _lock: threading.RLock
    _on_collection: Callable[..., Any]
    _open_by_name: Callable[[str], Any]
    _own_collection_names: Callable[[], list[str]]
    _guard: Callable[..., Any]
    _probe_searched: Callable[[Any, list[str], int], set[str]]

    def vectors(self, ids: Sequence[str], *, user_id: str) -> dict[str, npt.NDArray[np.float32]]:
        """The stored vectors of those ``ids`` that ``user_id`` has, read in batches."""
        wanted = list(dict.fromkeys(ids))
        if not wanted:
            return {}

        def fetch(collection: Any) -> dict[str, npt.NDArray[np.float32]]:
            found: dict[str, npt.NDArray[np.float32]] = {}
            for start in range(0, len(wanted), _READ_BATCH):
                got = self._guard(
                    collection.get, ids=wanted[start : start + _READ_BATCH], include=["embeddings"]
                )
                embeddings = got.get("embeddings")
                if embeddings is None:
                    continue
                for vid, vector in zip(got.get("ids") or [], embeddings, strict=False):
                    found[str(vid)] = np.asarray(vector, dtype=np.float32)
            return found

        with self._lock:
            return self._on_collection(user_id, False, fetch, {})

    def ids(self, user_id: str) -> set[str]:
        """Every id of ``user_id``'s vectors (empty if the user has none), read in pages."""
        with self._lock:
            return self._on_collection(user_id, False, self._all_ids, set())

    def _all_ids(self, collection: Any) -> set[str]:
        # Large pages: Chroma skips an offset row by row, so 1,000-id pages made listing
        # quadratic (8.2 s for 100k ids; one 100k page takes 0.32 s).
        found: set[str] = set()
        offset = 0
        while True:
            got = self._guard(collection.get, include=[], limit=_ID_PAGE, offset=offset)
            page = [str(vid) for vid in got.get("ids") or []]
            found.update(page)
            if len(page) < _ID_PAGE:
                return found
            offset += len(page)

    def users(self) -> set[str]:
        """Every user with at least one vector.

        Collection names hold only a hash of the user id, so each collection's first
        metadata is read (one small ``get`` per collection).
        """
        found: set[str] = set()
        with self._lock:
            for name in self._own_collection_names():
                collection = self._open_by_name(name)
                if collection is None:
                    continue
                try:
                    got = self._guard(collection.get, limit=1, include=["metadatas"])
                except BackendError as exc:
                    if _is_stale(exc):  # dropped meanwhile
                        continue
                    raise
                metas = got.get("metadatas") or []
                if metas and metas[0] and isinstance(metas[0].get("user_id"), str):
                    found.add(str(metas[0]["user_id"]))
        return found

    def probe(self, ids: Sequence[str], *, user_id: str, k: int = PROBE_DEPTH) -> set[str]:
        """The ids among ``ids`` that a search with their own stored vector does not return.

        Each id's vector is read back from Chroma (``get(include=["embeddings"])``) and the
        vectors are queried in batches for ``k`` neighbours. An id counts as reachable when
        it is returned, or when ``k`` neighbours tie with its own distance (exact duplicates
        may crowd it out: such ids are queried again, deeper, until decided). Ids Chroma
        does not hold for ``user_id`` are ignored (compare :meth:`ids` with the record
        store to find them). HNSW is approximate, and a crash can leave a stored vector
        without links, so a returned id should be deleted and re-added.

        A user searched exactly (at most ``exact_below`` vectors) has no unreachable id. On
        a local store the ids the graph misses are returned once *and* pinned (searched
        exactly from then on, and logged), so a later probe no longer reports them.

        Raises:
            InvalidInputError: if ``k < 1``.
            BackendError: if Chroma fails.
        """
        if k < 1:
            raise InvalidInputError("k must be >= 1")
        wanted = list(dict.fromkeys(str(i) for i in ids))
        if not wanted:
            return set()
        with self._lock:
            return self._on_collection(
                user_id, False, lambda c: self._probe_searched(c, wanted, k), set()
            )

    def _probe_in(self, collection: Any, wanted: list[str], k: int) -> set[str]:
        """Ids among ``wanted`` that the HNSW graph does not return for their own vector."""
        total = int(self._guard(collection.count))
        lost: set[str] = set()
        for start in range(0, len(wanted), _READ_BATCH):
            got = self._guard(
                collection.get, ids=wanted[start : start + _READ_BATCH], include=["embeddings"]
            )
            held = [str(vid) for vid in got.get("ids") or []]
            if not held:
                continue
            vectors = np.asarray(got["embeddings"], dtype=np.float32)
            depth = min(k, total)
            result = self._guard(
                collection.query,
                query_embeddings=vectors,
                n_results=depth,
                include=["distances"],
            )
            for row, vid in enumerate(held):
                found = [str(x) for x in result["ids"][row]]
                dists = [float(d) for d in result["distances"][row]]
                if vid in found:
                    continue
                if not self._crowded_out(collection, vectors[row], vid, found, dists, depth, total):
                    lost.add(vid)
        return lost

    def _crowded_out(
        self,
        collection: Any,
        vector: npt.NDArray[np.float32],
        vid: str,
        found: list[str],
        dists: list[float],
        depth: int,
        total: int,
    ) -> bool:
        """Whether ``vid``, missing from the ``depth`` neighbours of its own vector, only tied.

        Equal vectors may crowd the id out of the first ``depth`` legitimately; the search
        looks deeper until the id shows or a worse neighbour does. The id is reachable only if
        the neighbours at ``depth`` were no farther than its own distance (within float error):
        a graph that returns near-duplicates 1e-6 away while the id itself lies at 6e-8 has
        lost it, however deep a second search finds it.
        """
        if len(found) < depth or not dists or dists[-1] > _PROBE_TIE:
            return False
        edge = dists[-1]
        deeper = depth
        while deeper < total:
            deeper = min(total, deeper * 4)
            again = self._guard(
                collection.query,
                query_embeddings=vector[None, :],
                n_results=deeper,
                include=["distances"],
            )
            ids = [str(x) for x in again["ids"][0]]
            far = [float(d) for d in again["distances"][0]]
            if vid in ids:
                return edge <= far[ids.index(vid)] + _TIE_EPS
            if len(ids) < deeper or not far or far[-1] > _PROBE_TIE:
                return False
        return False
