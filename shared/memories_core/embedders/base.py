"""The embedder template: validation, normalisation and usage counting live here once.

Subclasses implement only :meth:`BaseEmbedder._embed`; the public methods check the input,
skip the model for empty batches, L2-normalise the rows and count every call, so every
embedder in the package meets the :class:`~memories_core.interfaces.Embedder` contract the
same way.
"""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence, Sized

import numpy as np
import numpy.typing as npt

from memories_core.errors import InvalidInputError
from memories_core.usage import Usage, UsageCounter, estimate_tokens

__all__ = ["BaseEmbedder"]


def _check_texts(texts: Sequence[str]) -> list[str]:
    """Return ``texts`` as a new list, rejecting anything that is not a sequence of str."""
    # A bare string is a Sequence[str] too; embedding it character by character is never
    # what the caller meant, so it is rejected rather than silently accepted.
    if isinstance(texts, (str, bytes)):
        raise InvalidInputError("texts must be a sequence of strings, not a single string")
    try:
        items = list(texts)
    except TypeError as exc:
        raise InvalidInputError(
            f"texts must be a sequence of strings, got {type(texts).__name__}"
        ) from exc
    for i, text in enumerate(items):
        if not isinstance(text, str):
            raise InvalidInputError(f"texts[{i}] must be a str, got {type(text).__name__}")
    return items


def l2_normalise(matrix: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Scale every row of ``matrix`` to unit length; all-zero rows stay zero."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    # Rows with no features (empty text) have norm 0: dividing by 1 keeps them zero instead
    # of producing NaNs that would poison every dot product later.
    norms[norms == 0.0] = 1.0
    return (matrix / norms).astype(np.float32, copy=False)


class BaseEmbedder(ABC):
    """Base class of every embedder: subclasses implement :meth:`_embed` only.

    The public methods return L2-normalised ``float32`` arrays, so cosine similarity is a
    dot product, and count calls, texts and estimated tokens in :attr:`usage`.

    Example:
        >>> from memories_core.embedders import HashingEmbedder
        >>> emb = HashingEmbedder(dimension=64)
        >>> emb.embed_documents(["hello world"]).shape
        (1, 64)
        >>> emb.usage.items
        1
    """

    def __init__(self) -> None:
        self._usage = UsageCounter()
        self._known_dimension: int | None = None
        self._dimension_lock = threading.Lock()

    def _probe_dimension(self, probe: Callable[[], Sized]) -> int:
        """Return the vector length, calling ``probe`` once (thread-safe) if it is unknown.

        For wrappers of models whose dimension is only known by embedding something; set
        ``self._known_dimension`` in the constructor when the caller gives it.
        """
        with self._dimension_lock:
            if self._known_dimension is None:
                self._known_dimension = len(probe())
            return self._known_dimension

    @property
    @abstractmethod
    def name(self) -> str:
        """Identity of the model, stored with an index to detect a changed embedder."""

    @property
    @abstractmethod
    def dimension(self) -> int:
        """Length of every vector."""

    @property
    def usage(self) -> Usage:
        """Calls, texts and estimated tokens embedded so far."""
        return self._usage.snapshot()

    def reset_usage(self) -> None:
        """Set the usage counters back to zero."""
        self._usage.reset()

    @abstractmethod
    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """Embed a non-empty batch; return shape ``(len(texts), dimension)``.

        The rows need not be normalised; the caller normalises them.
        """

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed texts to be stored.

        Args:
            texts: The texts. An empty sequence returns shape ``(0, dimension)`` without
                calling the model.

        Returns:
            A ``float32`` array of shape ``(len(texts), dimension)`` with L2-normalised rows
            (a text without any feature gives a zero row).

        Raises:
            InvalidInputError: if ``texts`` is a single string or holds a non-string.
        """
        items = _check_texts(texts)
        if not items:
            return np.zeros((0, self.dimension), dtype=np.float32)
        try:
            raw = self._embed(items)
        except BaseException:
            self._usage.record(failures=1)
            raise
        matrix = np.asarray(raw, dtype=np.float32)
        if matrix.shape != (len(items), self.dimension):
            self._usage.record(failures=1)
            raise RuntimeError(
                f"{type(self).__name__}._embed returned shape {matrix.shape}, "
                f"expected {(len(items), self.dimension)}"
            )
        self._usage.record(
            calls=1,
            items=len(items),
            prompt_tokens=sum(estimate_tokens(t) for t in items),
        )
        return l2_normalise(matrix)

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """Embed a query.

        Args:
            text: The query text.

        Returns:
            A ``float32`` array of shape ``(dimension,)``, L2-normalised (zero if the text has
            no feature).

        Raises:
            InvalidInputError: if ``text`` is not a string.
        """
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        return self.embed_documents([text])[0]

    async def aembed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Async twin of :meth:`embed_documents` (runs it in a worker thread)."""
        return await asyncio.to_thread(self.embed_documents, texts)

    async def aembed_query(self, text: str) -> npt.NDArray[np.float32]:
        """Async twin of :meth:`embed_query` (runs it in a worker thread)."""
        return await asyncio.to_thread(self.embed_query, text)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, dimension={self.dimension})"
