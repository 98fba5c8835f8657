"""MaxSim, the late-interaction score (ColBERT §3.3), of one record or of a recall's pool.

:func:`maxsim_pool` scores a pool in blocks of at most :data:`BLOCK_COLUMNS` token columns:
each block's int8 rows are converted to one float32 matrix, multiplied by the query once and
reduced per record. A block's matrix (about 1 MB at the bundled encoder's 128 dimensions)
and its products are written into buffers the calling thread keeps, so a recall allocates
neither anew; one matrix for a whole pool of 250 turns (about 47 tokens each) would be
about 6 MB at 128 dimensions (18 MB at 384).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import numpy.typing as npt

from memories_core.retrieval.late_encoder import DEFAULT_LATE_DIM
from memories_core.token_vectors import TokenVectors

logger = logging.getLogger(__name__)

__all__ = ["BLOCK_COLUMNS", "maxsim", "maxsim_pool", "one_blas_thread", "prepare_maxsim"]

#: Token columns converted and multiplied at once by :func:`maxsim_pool`. Chosen by a
#: measurement of a synthetic pool like a recall's (250 records of 30-64 tokens, 384
#: dimensions, a 10-token query; 40 rounds): 4.2 ms p50 at 2048 against 5.6 ms for one
#: matrix of the whole pool, 4.1 ms at 1024, 4.5 at 512 and 4.6 at 4096. A block's matrix
#: (3.1 MB at 384 dimensions) also stays below the 4 MB from which numpy asks the kernel
#: for huge pages. At the bundled encoder's default 128 dimensions the same measurement
#: gave 2.4 ms at 2048 and 2.3 ms at 4096 (level), 2.6 ms for one matrix.
BLOCK_COLUMNS = 2048


_BLAS_LOCK = threading.Lock()
#: The threadpoolctl controller (found once; ``False`` when threadpoolctl is missing or
#: fails), the limit in force, how many callers are inside :func:`one_blas_thread`, and
#: whether :func:`prepare_maxsim` has scored its synthetic block in this process.
_BLAS: dict[str, Any] = {"controller": None, "limit": None, "inside": 0, "prepared": False}


def _controller() -> Any:
    """The threadpoolctl controller, found on first use (``False`` if none); lock held."""
    if _BLAS["controller"] is None:
        try:
            from threadpoolctl import ThreadpoolController

            _BLAS["controller"] = ThreadpoolController()
        except Exception:  # missing, or a library it cannot read: leave BLAS alone
            logger.debug("threadpoolctl unavailable; BLAS threads left as set", exc_info=True)
            _BLAS["controller"] = False
    return _BLAS["controller"]


def prepare_maxsim() -> bool:
    """Pay MaxSim's once-per-process costs now; whether numpy's BLAS can be limited.

    Finds numpy's BLAS for :func:`one_blas_thread` (threadpoolctl reads the process's
    libraries) and scores one synthetic block of :data:`BLOCK_COLUMNS` zero tokens at the
    bundled encoder's default width (``DEFAULT_LATE_DIM``; a narrower encoder's blocks fit
    in the buffers it leaves, a wider one grows them on first use) with a 32-token query:
    numpy's and the BLAS library's first calls at that size, and this thread's buffers, are
    then made here, once per process (a later call only answers). Measured in fresh
    processes (torch and onnxruntime loaded) on a 250-record pool at 384 dimensions: this
    took 11-13 ms, and the first score after it 4.2-5.4 ms, against 13.7-17.8 ms without
    it. The late-interaction reranker calls this when it is built, with the model load, not
    in the first recall.
    """
    with _BLAS_LOCK:
        found = _controller() is not False
        if _BLAS["prepared"]:
            return found
        _BLAS["prepared"] = True
    block = np.zeros((BLOCK_COLUMNS, DEFAULT_LATE_DIM), dtype=np.int8)
    maxsim_pool(
        np.zeros((32, DEFAULT_LATE_DIM), dtype=np.float32),
        [TokenVectors("warm", "0" * 32, "0" * 32, block, 1.0)],
    )
    return found


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Hold numpy's BLAS to one thread inside the block, and restore its setting after.

    The setting is process-wide, so concurrent callers share one limit: the first in sets
    it and the last out restores what was there before. Without ``threadpoolctl`` (a
    dependency of scikit-learn, which sentence-transformers installs), or where it fails to
    read or set the thread count, nothing changes: the scores are the same either way.
    """
    with _BLAS_LOCK:
        if _controller() is not False and _BLAS["inside"] == 0:
            try:
                _BLAS["limit"] = _BLAS["controller"].limit(limits=1, user_api="blas")
            except Exception:
                logger.debug("could not limit BLAS threads", exc_info=True)
                _BLAS["controller"] = False
        _BLAS["inside"] += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS["inside"] -= 1
            if _BLAS["inside"] == 0 and _BLAS["limit"] is not None:
                _BLAS["limit"].restore_original_limits()
                _BLAS["limit"] = None


def maxsim(query: npt.NDArray[np.float32], text: npt.NDArray[np.floating]) -> float:
    """Sum over query tokens of the best cosine with a text token (ColBERT §3.3)."""
    return float((query @ np.asarray(text, dtype=np.float32).T).max(axis=1).sum())


def maxsim_pool(
    query: npt.NDArray[np.float32], pool: Sequence[TokenVectors]
) -> npt.NDArray[np.float64]:
    """:func:`maxsim` of ``query`` with every record of ``pool``, block by block.

    A block is consecutive records of at most :data:`BLOCK_COLUMNS` tokens in all (a longer
    record is a block alone). Its int8 rows are concatenated into one float32 matrix (one
    conversion per block, not one per record), multiplied by the query once, and each
    record's segment of columns is reduced by ``np.maximum.reduceat``. A record's scale is
    applied to its maxima: ``max(q . (s k)) = s max(q . k)`` for ``s > 0``.
    """
    count = len(pool)
    if not count:
        return np.zeros(0, dtype=np.float64)
    query32 = np.asarray(query, dtype=np.float32)
    sizes = [item.tokens for item in pool]
    best = np.empty(count, dtype=np.float64)
    with one_blas_thread():
        _score_blocks(query32, pool, sizes, best)
    scales = np.fromiter((item.scale for item in pool), dtype=np.float64, count=count)
    return best * scales


_SCRATCH = threading.local()
#: Floats a thread's buffer may keep (16 MB); a larger request (a record of thousands of
#: tokens) gets an array of its own, freed after the block. A bound on memory, not a tuned
#: value: five times a full block's matrix at 384 dimensions.
_KEEP_FLOATS = 4 * 2**20


def _scratch(name: str, size: int) -> npt.NDArray[np.float32]:
    """The first ``size`` floats of this thread's buffer ``name``, grown when too small.

    A block's matrix and products are written into buffers each thread keeps (about 1 MB
    at 128 dimensions, 3 MB at 384), so that a recall does not allocate them anew:
    allocated per block, they were page-faulted again on every recall over a new process's
    first ten recalls (about 500 faults, MaxSim 11 ms against 4 later; blocks of 4,096
    columns then).
    """
    if size > _KEEP_FLOATS:
        return np.empty(size, dtype=np.float32)
    held: npt.NDArray[np.float32] | None = getattr(_SCRATCH, name, None)
    if held is None or held.size < size:
        held = np.empty(size, dtype=np.float32)
        setattr(_SCRATCH, name, held)
    return held[:size]


def _score_blocks(
    query: npt.NDArray[np.float32],
    pool: Sequence[TokenVectors],
    sizes: list[int],
    best: npt.NDArray[np.float64],
) -> None:
    """Write each record's unscaled MaxSim into ``best``, block by block."""
    count = len(pool)
    start = 0
    while start < count:
        end, columns = start + 1, sizes[start]
        while end < count and columns + sizes[end] <= BLOCK_COLUMNS:
            columns += sizes[end]
            end += 1
        block = pool[start:end]
        matrix = _scratch("matrix", columns * query.shape[1]).reshape(columns, query.shape[1])
        np.concatenate([item.data for item in block], axis=0, out=matrix)
        offsets = np.cumsum([0, *sizes[start : end - 1]])
        products = _scratch("products", query.shape[0] * columns).reshape(-1, columns)
        np.matmul(query, matrix.T, out=products)
        maxima = np.maximum.reduceat(products, offsets, axis=1)
        best[start:end] = maxima.sum(axis=0, dtype=np.float64)
        start = end
