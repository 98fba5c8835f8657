"""Protocols between the core's parts.

Semantics that every implementation keeps:

* **Scores**: higher means more similar / more relevant, for every index and every search.
* **Ids**: the record store owns ids; mechanisms create them with
  :func:`~memories_core.types.new_id`, and vector indexes store vectors under the same id as
  their record.
* **Scope**: every read and write takes a ``user_id`` (directly or through a
  :class:`~memories_core.types.Scope`), and implementations apply it inside their own query,
  never as a relevance hint after the fact.
* **Vectors**: embedders return L2-normalised ``float32`` arrays, so cosine = dot product.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from memories_core.types import ChatMessage, MemoryRecord, Recall, Scope, Turn
from memories_core.usage import Usage

__all__ = [
    "LLM",
    "Clock",
    "Embedder",
    "Filter",
    "LLMRouter",
    "Mechanism",
    "RecordStore",
    "VectorIndex",
]

#: Equality filter on record fields and metadata, e.g. ``{"kind": "turn", "topic": "food"}``.
#: Keys ``kind`` and ``session_id`` refer to record fields; any other key to ``metadata``.
Filter = Mapping[str, str | int | float | bool]

Vector = npt.NDArray[np.float32]


@runtime_checkable
class LLM(Protocol):
    """A chat model. Implementations count every call in :attr:`usage`."""

    @property
    def usage(self) -> Usage:
        """Calls, failures and tokens so far."""
        ...

    def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
    ) -> str:
        """Return the model's reply to ``messages``.

        Raises:
            LLMError: if the model or its server fails.
        """
        ...

    async def agenerate(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
    ) -> str:
        """Async twin of :meth:`generate`."""
        ...


#: The ``llm_for`` hook: the model that serves a scope (e.g. a per-user fine-tuned model), or
#: ``None`` to use the memory's default model. Called by the engine before every LLM-backed
#: derivation or reflection; it must be cheap and thread-safe.
LLMRouter = Callable[[Scope], "LLM | None"]


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised vectors. Counts every call in :attr:`usage`."""

    @property
    def name(self) -> str:
        """Identity of the model, stored with an index to detect a changed embedder."""
        ...

    @property
    def dimension(self) -> int:
        """Length of every vector."""
        ...

    @property
    def usage(self) -> Usage:
        """Calls and texts embedded so far."""
        ...

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed texts to be stored; returns shape ``(len(texts), dimension)``."""
        ...

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """Embed a query; returns shape ``(dimension,)``."""
        ...


@runtime_checkable
class VectorIndex(Protocol):
    """A derived, rebuildable index of record vectors, partitioned by user."""

    def add(
        self,
        ids: Sequence[str],
        vectors: npt.NDArray[np.float32],
        metadatas: Sequence[Mapping[str, str | int | float | bool]],
    ) -> None:
        """Add or replace vectors. Every metadata holds at least ``user_id`` and ``kind``."""
        ...

    def search(
        self, vector: npt.NDArray[np.float32], *, user_id: str, k: int, where: Filter | None = None
    ) -> list[tuple[str, float]]:
        """Return up to ``k`` ``(id, cosine)`` pairs of ``user_id``'s vectors, best first."""
        ...

    def delete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Delete vectors by id (only those of ``user_id``)."""
        ...

    def delete_user(self, user_id: str) -> None:
        """Delete every vector of ``user_id``."""
        ...

    def count(self, user_id: str | None = None) -> int:
        """Number of vectors, of one user or of all."""
        ...

    def reset(self) -> None:
        """Delete every vector of every user (used by ``reindex``)."""
        ...


@runtime_checkable
class RecordStore(Protocol):
    """The record of truth. Every write is one transaction."""

    def add(self, records: Sequence[MemoryRecord], *, indexed: bool = True) -> None:
        """Insert records atomically (all or none). ``indexed`` marks them for the vector index."""
        ...

    def get(self, ids: Sequence[str], *, user_id: str) -> list[MemoryRecord]:
        """Return the records with these ids that belong to ``user_id`` (in the given order)."""
        ...

    def list(
        self,
        *,
        user_id: str,
        where: Filter | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
    ) -> builtins.list[MemoryRecord]:
        """Return ``user_id``'s records matching ``where``, oldest first."""
        ...

    def search_text(
        self, query: str, *, user_id: str, k: int, where: Filter | None = None
    ) -> builtins.list[tuple[str, float]]:
        """Lexical (BM25) search; returns ``(id, score)`` pairs, higher is better."""
        ...

    def delete(self, ids: Sequence[str], *, user_id: str) -> None:
        """Delete records by id (only those of ``user_id``)."""
        ...

    def delete_user(self, user_id: str) -> None:
        """Delete every record and state entry of ``user_id``."""
        ...

    def users(self) -> builtins.list[str]:
        """Every user id with at least one record."""
        ...

    def pending_index(self, limit: int | None = None) -> builtins.list[MemoryRecord]:
        """Records marked for the vector index whose vectors are not confirmed yet."""
        ...

    def mark_indexed(self, ids: Iterable[str]) -> None:
        """Confirm that these records' vectors are in the vector index."""
        ...

    def mark_all_pending(self) -> int:
        """Mark every indexed record pending again (``reindex``); returns how many."""
        ...

    def get_state(self, key: str, *, user_id: str | None = None) -> Any:
        """Read a JSON value from the per-user (or global, ``user_id=None``) state table."""
        ...

    def set_state(self, key: str, value: Any, *, user_id: str | None = None) -> None:
        """Write a JSON value into the state table (``None`` deletes the key)."""
        ...

    def close(self) -> None:
        """Close the store; further calls raise."""
        ...


@runtime_checkable
class Clock(Protocol):
    """Source of the current time; injected so time-dependent rules are testable."""

    def now(self) -> datetime:
        """Return the current aware UTC datetime."""
        ...


@runtime_checkable
class Mechanism(Protocol):
    """The one contract every memory mechanism meets (DESIGN.md)."""

    def save(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Write path, after an exchange. Raw turns are stored before anything derived."""
        ...

    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Read path, before the model."""
        ...

    def clear(self, scope: Scope) -> None:
        """Forget everything of ``scope.user_id``."""
        ...

    async def asave(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Async twin of :meth:`save`."""
        ...

    async def arecall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Async twin of :meth:`recall`."""
        ...

    async def aclear(self, scope: Scope) -> None:
        """Async twin of :meth:`clear`."""
        ...
