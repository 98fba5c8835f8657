"""Embeddings of the short texts EMG-RAG compares: entity and subclass names, relations, memories.

The editor (§4.2) and the walk (§4.3) compare the same names again and again, so their vectors
are kept in memory, least recently added first out, up to a capacity. The cache may hold a
user's texts: :meth:`EmbeddingCache.clear` runs when a user is deleted.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from memories_core.interfaces import Embedder

__all__ = ["EmbeddingCache"]


class EmbeddingCache:
    """Document embeddings of short texts, computed once per text and shared by threads.

    Args:
        embedder: Embeds the texts (``embed_documents``).
        capacity: Most vectors kept; the oldest entries go first.
    """

    def __init__(self, embedder: Embedder, *, capacity: int = 100_000) -> None:
        self.embedder = embedder
        self.capacity = capacity
        self._vectors: OrderedDict[str, npt.NDArray[np.float32]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._vectors)

    def vectors(self, texts: Sequence[str]) -> list[npt.NDArray[np.float32]]:
        """The embeddings of ``texts``, in order; the missing ones in one embedder call."""
        with self._lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        if missing:
            embedded = self.embedder.embed_documents(missing)
            with self._lock:
                for text, vector in zip(missing, embedded, strict=True):
                    self._vectors[text] = np.asarray(vector, dtype=np.float32)
                while len(self._vectors) > self.capacity:
                    self._vectors.popitem(last=False)
        with self._lock:
            out = []
            for text in texts:
                vector = self._vectors.get(text)
                if vector is None:  # evicted meanwhile by another thread
                    vector = np.asarray(self.embedder.embed_documents([text])[0], np.float32)
                out.append(vector)
            return out

    def clear(self) -> None:
        """Forget every vector (they may hold a deleted user's texts)."""
        with self._lock:
            self._vectors.clear()
