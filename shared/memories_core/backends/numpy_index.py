"""In-memory vector index on numpy: exact cosine search, partitioned by user.

Each user owns one contiguous ``float32`` matrix, so a search multiplies only that user's rows
and another user's vectors are never even read. The index is derived state: it lives in memory
and is rebuilt from the record store (``reindex``) when a process starts.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from memories_core.errors import EmbedderMismatchError, InvalidInputError, MissingUserError
from memories_core.filters import MISSING, FilterExpr, compile_filter, index_prefilter
from memories_core.interfaces import Filter
from memories_core.types import check_user_id

__all__ = ["NumpyIndex", "check_metadata", "matches_filter", "metadata_matcher"]

Metadata = Mapping[str, str | int | float | bool]

_INITIAL_CAPACITY = 64

# Default search depth of ``probe``, how many probe vectors go in one batch, and how much lower
# a score may be and still count as a tie with a probed vector's own score.
PROBE_DEPTH = 10
_PROBE_BATCH = 256
_TIE = 1e-5


def matches_filter(metadata: Metadata, where: Filter | FilterExpr | None) -> bool:
    """Whether a vector's ``metadata`` satisfies the part of ``where`` an index can check.

    The filter language and its typing rules live in :mod:`memories_core.filters`. Only the
    conjuncts a vector's metadata can answer (:func:`~memories_core.filters.index_prefilter`:
    ``kind``, ``session_id``, scalar metadata) are checked, so the result is a superset of
    the full filter's matches; the caller re-checks the full filter on the loaded records.

    Raises:
        InvalidInputError: if ``where`` is not a valid filter.
    """
    return metadata_matcher(where)(metadata)


def metadata_matcher(where: Filter | FilterExpr | None) -> Callable[[Metadata], bool]:
    """:func:`matches_filter` for many vectors: ``where`` is read once, not per vector.

    Raises:
        InvalidInputError: if ``where`` is not a valid filter.
    """
    usable = index_prefilter(where)
    if usable is None:
        return lambda metadata: True
    return lambda metadata: usable.matches(_metadata_getter(metadata))


def _metadata_getter(metadata: Metadata, vid: str | None = None) -> Callable[[str], Any]:
    """Value getter over index metadata (plus the vector's id when known)."""

    def get(key: str) -> Any:
        if key == "id" and vid is not None:
            return vid
        return metadata.get(key, MISSING)

    return get


# Chroma reserves these key prefixes (``#document``, ``$and``, ``chroma:document``); a key it
# rejects or silently drops would make a record unindexable, so every index rejects them.
_RESERVED_KEY_PREFIXES = ("$", "#", "chroma:")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def check_metadata(metadata: Metadata) -> dict[str, str | int | float | bool]:
    """Validate one vector's metadata and return a plain copy.

    The rules are the same for every index, so a metadata one index accepts every index
    stores unchanged: keys are non-empty strings without NUL that do not start with ``$``,
    ``#`` or ``chroma:`` (Chroma rejects or silently drops those keys); values are ``str``,
    ``bool``, 64-bit ``int`` or finite ``float`` (Chroma drops NaN/inf and turns larger ints
    into floats). Nothing is written when this raises.

    Raises:
        MissingUserError: if ``user_id`` is missing or empty.
        InvalidInputError: if ``kind`` is missing, a key is reserved or malformed, or a value
            is not an allowed scalar.
    """
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"metadata must be a mapping, got {type(metadata).__name__}")
    user_id = metadata.get("user_id")
    if not isinstance(user_id, str) or not user_id.strip():
        raise MissingUserError("every vector's metadata needs a non-empty string user_id")
    if not isinstance(metadata.get("kind"), str):
        raise InvalidInputError("every vector's metadata needs a string kind")
    out: dict[str, str | int | float | bool] = {}
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise InvalidInputError(f"metadata keys must be strings, got {key!r}")
        if not key or "\x00" in key or key.startswith(_RESERVED_KEY_PREFIXES):
            raise InvalidInputError(
                f"metadata key {key!r} is reserved: keys must be non-empty, without NUL, and "
                "not start with '$', '#' or 'chroma:'"
            )
        if not isinstance(value, (str, int, float, bool)):
            raise InvalidInputError(
                f"metadata value for {key!r} must be str, int, float or bool, "
                f"got {type(value).__name__}"
            )
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidInputError(f"metadata value for {key!r} is not finite: {value!r}")
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and not _INT64_MIN <= value <= _INT64_MAX
        ):
            raise InvalidInputError(f"metadata value for {key!r} does not fit in 64 bits")
        out[key] = value
    return out


def check_filter(where: Filter | FilterExpr | None) -> FilterExpr | None:
    """Validate ``where`` (see :func:`memories_core.filters.compile_filter`) and compile it.

    Raises:
        InvalidInputError: on an invalid filter, e.g. a ``user_id`` key (it is an argument).
    """
    return compile_filter(where)


def as_matrix(vectors: npt.ArrayLike, rows: int) -> npt.NDArray[np.float32]:
    """Return ``vectors`` as a finite C-contiguous ``(rows, d)`` float32 matrix.

    Raises:
        InvalidInputError: on a wrong shape or non-finite values.
    """
    matrix = np.ascontiguousarray(vectors, dtype=np.float32)
    if matrix.ndim != 2 or matrix.shape[0] != rows:
        raise InvalidInputError(
            f"expected {rows} vectors as a 2-d array, got shape {np.shape(vectors)}"
        )
    if matrix.shape[1] == 0:
        raise InvalidInputError("vectors have dimension 0")
    if not np.isfinite(matrix).all():
        raise InvalidInputError("vectors contain NaN or infinite values")
    return matrix


def checked_batch(
    ids: Sequence[str], vectors: npt.ArrayLike, metadatas: Sequence[Metadata]
) -> tuple[npt.NDArray[np.float32], list[dict[str, str | int | float | bool]]] | None:
    """Validate a batch of every index's ``add`` before anything of it is written.

    Returns:
        The vectors as :func:`as_matrix` and the metadatas as :func:`check_metadata`
        return them, or ``None`` for an empty batch (nothing to add).

    Raises:
        InvalidInputError: on mismatched lengths, bad shapes or invalid metadata.
    """
    if len(ids) != len(metadatas):
        raise InvalidInputError(f"{len(ids)} ids but {len(metadatas)} metadatas")
    if not ids:
        return None
    return as_matrix(vectors, len(ids)), [check_metadata(meta) for meta in metadatas]


def as_query(vector: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """Return a query as a finite 1-d float32 vector (a ``(1, d)`` array is accepted).

    Raises:
        InvalidInputError: on a wrong shape or non-finite values.
    """
    query = np.asarray(vector, dtype=np.float32)
    if query.ndim == 2 and query.shape[0] == 1:
        query = query[0]
    if query.ndim != 1 or query.shape[0] == 0:
        raise InvalidInputError(f"expected one query vector, got shape {np.shape(vector)}")
    if not np.isfinite(query).all():
        raise InvalidInputError("query vector contains NaN or infinite values")
    return query


@dataclass
class _Partition:
    """One user's vectors: rows ``[0, size)`` of ``matrix`` are live."""

    matrix: npt.NDArray[np.float32]
    size: int = 0
    ids: list[str] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    metadatas: list[dict[str, str | int | float | bool]] = field(default_factory=list)

    def put(
        self, vid: str, vector: npt.NDArray[np.float32], meta: dict[str, str | int | float | bool]
    ) -> None:
        row = self.rows.get(vid)
        if row is None:
            if self.size == self.matrix.shape[0]:
                # Capacity doubling keeps appends amortised O(1) and the matrix contiguous.
                grown = np.empty((self.matrix.shape[0] * 2, self.matrix.shape[1]), np.float32)
                grown[: self.size] = self.matrix[: self.size]
                self.matrix = grown
            row = self.size
            self.size += 1
            self.rows[vid] = row
            self.ids.append(vid)
            self.metadatas.append(meta)
        else:
            self.metadatas[row] = meta
        self.matrix[row] = vector

    def remove(self, vid: str) -> bool:
        row = self.rows.pop(vid, None)
        if row is None:
            return False
        last = self.size - 1
        if row != last:
            # Move the last row into the hole so live rows stay a prefix of the matrix.
            moved = self.ids[last]
            self.matrix[row] = self.matrix[last]
            self.ids[row] = moved
            self.metadatas[row] = self.metadatas[last]
            self.rows[moved] = row
        self.ids.pop()
        self.metadatas.pop()
        self.size = last
        return True


class NumpyIndex:
    """Exact in-memory :class:`~memories_core.interfaces.VectorIndex` on numpy.

    Vectors are expected L2-normalised (as every embedder of this package returns them), so
    the cosine similarity is a dot product. Search is exact (no approximation), which suits
    tests, notebooks and memories up to some hundred thousand vectors per user.

    Instantiate:
        .. code-block:: python

            from memories_core.backends import NumpyIndex

            index = NumpyIndex()
            index.add(["r1"], vectors, [{"user_id": "alice", "kind": "turn"}])
            index.search(query_vector, user_id="alice", k=5)   # [("r1", 0.83)]

    The dimension is fixed by the first :meth:`add` (and forgotten by :meth:`reset`); a vector
    of another length raises :class:`~memories_core.errors.EmbedderMismatchError`.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._parts: dict[str, _Partition] = {}
        self._owner: dict[str, str] = {}
        self._dimension: int | None = None

    def __repr__(self) -> str:
        return f"NumpyIndex(vectors={self.count()}, dimension={self._dimension})"

    @property
    def dimension(self) -> int | None:
        """Length of the stored vectors, or ``None`` while the index is empty."""
        return self._dimension

    def _check_dimension(self, dimension: int) -> None:
        if self._dimension is not None and dimension != self._dimension:
            raise EmbedderMismatchError(
                f"vectors have dimension {dimension} but this index holds dimension "
                f"{self._dimension}; use the original embedder or reindex"
            )

    def add(
        self,
        ids: Sequence[str],
        vectors: npt.NDArray[np.float32],
        metadatas: Sequence[Mapping[str, str | int | float | bool]],
    ) -> None:
        """Add or replace vectors (an id given again replaces its vector and metadata).

        Raises:
            InvalidInputError: on mismatched lengths, bad shapes or non-scalar metadata.
            MissingUserError: if a metadata has no ``user_id``.
            EmbedderMismatchError: if the dimension differs from the stored vectors'.
        """
        batch = checked_batch(ids, vectors, metadatas)
        if batch is None:
            return
        matrix, metas = batch
        with self._lock:
            self._check_dimension(matrix.shape[1])
            self._dimension = matrix.shape[1]
            for vid, vector, meta in zip(ids, matrix, metas, strict=True):
                user_id = str(meta["user_id"])
                previous = self._owner.get(vid)
                if previous is not None and previous != user_id:
                    self._remove(vid, previous)
                part = self._parts.get(user_id)
                if part is None:
                    part = _Partition(np.empty((_INITIAL_CAPACITY, matrix.shape[1]), np.float32))
                    self._parts[user_id] = part
                part.put(vid, vector, meta)
                self._owner[vid] = user_id

    def search(
        self, vector: npt.NDArray[np.float32], *, user_id: str, k: int, where: Filter | None = None
    ) -> list[tuple[str, float]]:
        """Return up to ``k`` ``(id, cosine)`` pairs of ``user_id``'s vectors, best first.

        ``where`` is any filter of :mod:`memories_core.filters`. Its top-level conjuncts on
        ``id``, ``kind``, ``session_id`` and metadata are applied exactly; conjuncts on keys
        the index does not hold (``created_at``, state, ``attrs.*``) or testing
        ``$exists: True`` on metadata (lists and ``None`` are not indexed) are skipped
        (:func:`~memories_core.filters.index_prefilter`), so the caller must re-check the
        full filter on the loaded records.

        Raises:
            InvalidInputError: if ``k < 1``, the vector is malformed or the filter invalid.
            EmbedderMismatchError: if the query's dimension differs from the index's.
        """
        check_user_id(user_id)
        if k < 1:
            raise InvalidInputError("k must be >= 1")
        # Keys the index does not hold (state, created_at) are left to the caller's re-check.
        usable = index_prefilter(check_filter(where), with_id=True)
        query = as_query(vector)
        with self._lock:
            part = self._parts.get(user_id)
            if part is None or part.size == 0:
                return []
            self._check_dimension(query.shape[0])
            # einsum's own loop rather than BLAS, as the Chroma exact search scores: BLAS
            # threads wait on each other on a busy machine (see ``chroma_exact``).
            scores = np.einsum("ij,j->i", part.matrix[: part.size], query)
            order = (
                _top(scores, k) if usable is None else self._filtered_top(part, scores, k, usable)
            )
            return [(part.ids[row], float(scores[row])) for row in order]

    @staticmethod
    def _filtered_top(
        part: _Partition, scores: npt.NDArray[np.float32], k: int, where: FilterExpr
    ) -> list[int]:
        # Over-fetch the best rows and filter them; only if too few pass, fall back to the
        # full ranking. Filters are usually loose (a kind), so the first round suffices.
        fetch = min(part.size, max(4 * k, 64))
        while True:
            candidates = _top(scores, fetch)
            kept = [
                row
                for row in candidates
                if where.matches(_metadata_getter(part.metadatas[row], part.ids[row]))
            ]
            if len(kept) >= k or fetch >= part.size:
                return kept[:k]
            fetch = min(part.size, fetch * 4)

    def delete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Delete vectors by id; ids of other users are left alone."""
        with self._lock:
            for vid in ids:
                if self._owner.get(vid) == user_id:
                    self._remove(vid, user_id)

    def _remove(self, vid: str, user_id: str) -> None:
        part = self._parts[user_id]
        part.remove(vid)
        del self._owner[vid]
        if part.size == 0:
            del self._parts[user_id]

    def delete_user(self, user_id: str) -> None:
        """Delete every vector of ``user_id``."""
        with self._lock:
            part = self._parts.pop(user_id, None)
            if part is not None:
                for vid in part.ids:
                    del self._owner[vid]

    def count(self, user_id: str | None = None) -> int:
        """Number of vectors, of one user or of all."""
        with self._lock:
            if user_id is None:
                return len(self._owner)
            part = self._parts.get(user_id)
            return 0 if part is None else part.size

    # -- verification (compare with the record store; repair stale or lost vectors) --------

    def ids(self, user_id: str) -> set[str]:
        """Every id of ``user_id``'s vectors (empty if the user has none)."""
        with self._lock:
            part = self._parts.get(user_id)
            return set() if part is None else set(part.ids[: part.size])

    def users(self) -> set[str]:
        """Every user with at least one vector."""
        with self._lock:
            return {user for user, part in self._parts.items() if part.size}

    def vectors(self, ids: Sequence[str], *, user_id: str) -> dict[str, npt.NDArray[np.float32]]:
        """The stored vectors of those ``ids`` that ``user_id`` has (copies)."""
        with self._lock:
            part = self._parts.get(user_id)
            if part is None:
                return {}
            return {
                vid: part.matrix[part.rows[vid]].astype(np.float32, copy=True)
                for vid in ids
                if vid in part.rows
            }

    def probe(self, ids: Sequence[str], *, user_id: str, k: int = PROBE_DEPTH) -> set[str]:
        """The ids among ``ids`` that a search with their own stored vector does not return.

        An id counts as reachable when a ``k``-neighbour search with its stored vector
        returns it, or when ``k`` other vectors tie with its own score (exact duplicates,
        which may legitimately crowd it out). Ids this index does not hold for
        ``user_id`` are ignored (compare :meth:`ids` with the record store to find them).
        Exact search always finds a stored row, so here the set is empty unless the index
        is corrupt; :class:`~memories_core.backends.ChromaIndex` can lose HNSW links.
        """
        if k < 1:
            raise InvalidInputError("k must be >= 1")
        with self._lock:
            part = self._parts.get(user_id)
            if part is None:
                return set()
            rows = [part.rows[vid] for vid in dict.fromkeys(ids) if vid in part.rows]
            lost: set[str] = set()
            for start in range(0, len(rows), _PROBE_BATCH):
                chunk = rows[start : start + _PROBE_BATCH]
                scores = part.matrix[chunk] @ part.matrix[: part.size].T
                for offset, row in enumerate(chunk):
                    own = scores[offset]
                    top = _top(own, k)
                    if row in top:
                        continue
                    # Not returned: reachable only if k others tie with its own score (a
                    # unit vector scores highest with itself; beaten means a corrupt row).
                    if not (len(top) >= k and abs(own[top[-1]] - own[row]) <= _TIE):
                        lost.add(part.ids[row])
            return lost

    def reset(self) -> None:
        """Delete every vector of every user and forget the dimension."""
        with self._lock:
            self._parts.clear()
            self._owner.clear()
            self._dimension = None


def _top(scores: npt.NDArray[np.float32], k: int) -> list[int]:
    """Indices of the ``k`` largest scores, best first (ties broken by row)."""
    n = scores.shape[0]
    if k >= n:
        return [int(i) for i in np.argsort(-scores, kind="stable")]
    part = np.argpartition(-scores, k - 1)[:k]
    return [int(i) for i in part[np.argsort(-scores[part], kind="stable")]]
