"""The in-process accelerator of late-interaction token vectors: an LRU bounded in bytes.

:class:`~memories_core.retrieval.late_interaction.LateInteractionReranker` keeps a
record's token vectors with the record in the store; this cache sits in front of a store
that reads vectors apart from the pool's links, and is the only copy where the store keeps
none (the in-memory backend). Entries are int8 with a per-record scale, as the store keeps
them (:func:`~memories_core.token_vectors.quantize`), so a cached and a stored row score
alike.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from memories_core.errors import check_count
from memories_core.token_vectors import TokenVectors, quantize

__all__ = ["DEFAULT_CACHE_BYTES", "TokenVectorCache"]

#: Bytes of token vectors a default cache keeps: int8, about 9 KB per LoCoMo turn encoded
#: with its previous turn (~73 word pieces x 128), so about 7,000 records.
DEFAULT_CACHE_BYTES = 64 * 1024 * 1024
#: Encoder and digest tag of vectors given to the cache as floats (not stored).
_NO_TAG = "0" * 32


class TokenVectorCache:
    """Per-record token vectors (int8 with a scale, as stored), LRU, bounded in bytes.

    An optional accelerator in front of a store that reads vectors apart from the pool's
    links (see the module docstring), and the only copy where the store keeps none:
    entries are keyed by ``(user id, record id)`` and tagged with the digest of the encoder
    name and the text that was encoded; :meth:`get` with another digest drops the entry
    (the record or its context changed) and misses. Thread-safe.

    Args:
        max_bytes: Bytes of vectors kept; the least recently used entries go first.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.max_bytes = check_count("max_bytes", max_bytes)
        self._entries: OrderedDict[tuple[str, str], tuple[str, TokenVectors]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, user_id: str, record_id: str, digest: str) -> TokenVectors | None:
        """The vectors of ``record_id`` if they were computed from the same text."""
        key = (user_id, record_id)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] == digest:
                self._entries.move_to_end(key)
                self.hits += 1
                return entry[1]
            if entry is not None:
                self._drop(key)
            self.misses += 1
            return None

    def put(
        self,
        user_id: str,
        record_id: str,
        digest: str,
        vectors: npt.NDArray[np.floating] | TokenVectors,
    ) -> TokenVectors:
        """Keep ``vectors`` for ``record_id`` (floats are quantized as the store keeps them)."""
        if isinstance(vectors, TokenVectors):
            kept = vectors
        else:
            kept = quantize(record_id, _NO_TAG, _NO_TAG, vectors)
        kept.data.setflags(write=False)
        key = (user_id, record_id)
        with self._lock:
            if key in self._entries:
                self._drop(key)
            self._entries[key] = (digest, kept)
            self._bytes += kept.data.nbytes
            while self._bytes > self.max_bytes and len(self._entries) > 1:
                self._drop(next(iter(self._entries)))
        return kept

    def _drop(self, key: tuple[str, str]) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= entry[1].data.nbytes

    def invalidate(self, user_id: str, record_ids: Sequence[str]) -> int:
        """Drop the vectors of ``record_ids`` of ``user_id``; returns how many were kept."""
        with self._lock:
            found = [(user_id, r) for r in record_ids if (user_id, r) in self._entries]
            for key in found:
                self._drop(key)
            return len(found)

    def forget_user(self, user_id: str) -> int:
        """Drop every entry of ``user_id``; returns how many there were."""
        with self._lock:
            found = [key for key in self._entries if key[0] == user_id]
            for key in found:
                self._drop(key)
            return len(found)

    def clear(self) -> None:
        """Drop everything."""
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes of vectors held."""
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries
