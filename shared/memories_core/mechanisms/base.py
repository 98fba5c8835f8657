"""Plumbing shared by every mechanism: storage, indexing, scoping, cost and async twins.

A mechanism subclasses :class:`MemoryBase` and writes only its own rules: what it derives
from stored turns (:meth:`MemoryBase._derive`) and how it renders a recall
(:meth:`MemoryBase._render`). The base class keeps the principles of DESIGN.md:

* the raw turns are written to the record store, in one transaction, before anything is
  derived from them ("a turn is never lost");
* the vector index is derived state: records are marked pending in the same transaction and
  indexed afterwards, so a crash or an index failure heals on the next search, and
  :meth:`MemoryBase.reindex` rebuilds the index from the records;
* every read and write is scoped to one ``user_id``, enforced inside the backends.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from memories_core.clock import SystemClock
from memories_core.errors import ConfigurationError, EmbedderMismatchError, InvalidInputError
from memories_core.types import MemoryRecord, Recall, Scope, ScoredRecord, Turn, new_id

if TYPE_CHECKING:
    from memories_core.interfaces import LLM, Clock, Embedder, Filter, RecordStore, VectorIndex
    from memories_core.retrieval import FusionConfig, HybridRetriever
    from memories_core.usage import MemoryUsage

__all__ = ["MemoryBase", "turn_from_record"]

logger = logging.getLogger(__name__)

_EMBEDDER_STATE_KEY = "embedder"


def turn_from_record(record: MemoryRecord) -> Turn:
    """Rebuild the :class:`Turn` a ``"turn"`` record was stored from."""
    meta = dict(record.metadata)
    role = str(meta.pop("role", "user"))
    speaker = meta.pop("speaker", None)
    label = speaker or role
    prefix = f"{label}: "
    content = record.text[len(prefix) :] if record.text.startswith(prefix) else record.text
    return Turn(
        role=role,
        content=content,
        speaker=speaker,
        timestamp=record.created_at,
        metadata=meta,
    )


class MemoryBase:
    """Base class of every mechanism: see the module docstring.

    Args:
        path: Directory that holds this memory (SQLite records in ``records.sqlite3`` and an
            embedded Chroma index in ``chroma/``). ``None`` keeps everything in memory
            (SQLite ``:memory:`` and a numpy index), which suits tests and notebooks.
        embedder: Turns texts into vectors. Default: all-MiniLM-L6-v2, bundled and offline.
        store: A record store to use instead of the one ``path`` would build.
        index: A vector index to use instead of the one ``path`` would build (e.g. a
            ``ChromaIndex(host=...)`` for a Chroma server).
        fusion: How dense and lexical rankings are fused (default: the library's tuned default).
        k: Records a recall returns when the caller does not say.
        clock: Source of "now" for turns without a timestamp.
        allow_embedder_change: Accept an embedder that differs from the one the existing store
            was built with, and rebuild the vector index with it. Otherwise such a change
            raises :class:`~memories_core.errors.EmbedderMismatchError`.

    Raises:
        ConfigurationError: on contradictory arguments (``path`` together with both ``store``
            and ``index``, or ``k < 1``).
        EmbedderMismatchError: if ``embedder`` differs from the store's.
    """

    #: Record kinds this mechanism recalls.
    recall_kinds: ClassVar[tuple[str, ...]] = ()
    #: Whether raw turn records go into the vector index.
    index_turns: ClassVar[bool] = False
    #: Name of the LLM-derived product, for failure counts.
    derivation: ClassVar[str] = ""

    def __init__(
        self,
        *,
        path: str | Path | None = None,
        embedder: Embedder | None = None,
        store: RecordStore | None = None,
        index: VectorIndex | None = None,
        fusion: FusionConfig | None = None,
        k: int = 3,
        clock: Clock | None = None,
        llm: LLM | None = None,
        allow_embedder_change: bool = False,
    ) -> None:
        if path is not None and store is not None and index is not None:
            raise ConfigurationError("give either path= or both store= and index=, not all three")
        if not isinstance(k, int) or k < 1:
            raise ConfigurationError(f"k must be a positive int, got {k!r}")
        self.path = Path(path) if path is not None else None
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)
        self.default_k = k
        self.clock: Clock = clock or SystemClock()
        self.llm = llm
        self.embedder: Embedder = embedder or _default_embedder()
        self.store: RecordStore = store or _default_store(self.path)
        self.index: VectorIndex = index or _default_index(self.path)
        self._failures: Counter[str] = Counter()
        self._lock = threading.RLock()
        from memories_core.retrieval import HybridRetriever

        self.retriever: HybridRetriever = HybridRetriever(
            self.store, self.index, self.embedder, fusion=fusion
        )
        self._check_embedder(allow_embedder_change)
        if self.index.count() == 0:
            # A fresh or in-memory index over an existing store: rebuild it from the records.
            self.store.mark_all_pending()

    # ------------------------------------------------------------------ public contract
    def save(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Store ``turns`` for ``scope``, then derive this mechanism's records from them.

        The turns are written first, in one transaction; a failure of anything derived
        afterwards (vector index, LLM summary, ...) is logged, counted in :attr:`usage` and
        retried later, and never loses a turn.

        Raises:
            InvalidInputError: if ``turns`` is not a sequence of :class:`Turn` (nothing stored).
            MissingUserError: if ``scope`` has no user.
        """
        scope = _check_scope(scope)
        turns = _check_turns(turns)
        if not turns:
            return
        with self._lock:
            records = self._store_turns(turns, scope)
            self._index_now()
            self._derive(records, scope)

    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Return the ``k`` records most relevant to ``query`` for ``scope.user_id``.

        Raises:
            InvalidInputError: on an empty query or ``k < 1``.
            MissingUserError: if ``scope`` has no user.
        """
        scope = _check_scope(scope)
        hits = self._search(query, scope, k=self.default_k if k is None else k)
        return Recall(query=query, records=tuple(hits), context=self._render(hits))

    def clear(self, scope: Scope) -> None:
        """Forget ``scope.user_id``'s memories: one session's if ``scope.session_id`` is set."""
        scope = _check_scope(scope)
        with self._lock:
            if scope.session_id is None:
                self.delete_user(scope.user_id)
                return
            ids = [
                r.id
                for r in self.store.list(
                    user_id=scope.user_id, where={"session_id": scope.session_id}
                )
            ]
            self.index.delete(ids, user_id=scope.user_id)
            self.store.delete(ids, user_id=scope.user_id)

    def end_session(self, scope: Scope) -> None:
        """Mark the end of a dialogue session (hook; a no-op unless the mechanism summarises).

        Adapters call it when a conversation is over (e.g. LlamaIndex ``MemoryBlock.flush``),
        so that mechanisms such as :class:`~memories_core.mechanisms.summary.SummaryMemory`
        can derive their session-level records without waiting for the next session.
        """
        _check_scope(scope)

    async def aend_session(self, scope: Scope) -> None:
        """Async twin of :meth:`end_session`."""
        await asyncio.to_thread(self.end_session, scope)

    def delete_user(self, user_id: str) -> None:
        """Remove everything of ``user_id``: records, vectors and mechanism state."""
        scope = _check_scope(Scope(user_id))
        with self._lock:
            self.index.delete_user(scope.user_id)
            self.store.delete_user(scope.user_id)

    async def asave(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Async twin of :meth:`save` (runs in a worker thread)."""
        await asyncio.to_thread(self.save, turns, scope)

    async def arecall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Async twin of :meth:`recall` (runs in a worker thread)."""
        return await asyncio.to_thread(self.recall, query, scope, k=k, now=now)

    async def aclear(self, scope: Scope) -> None:
        """Async twin of :meth:`clear`."""
        await asyncio.to_thread(self.clear, scope)

    def turns(self, scope: Scope) -> list[Turn]:
        """Every stored turn of ``scope.user_id`` (of one session if set), oldest first."""
        scope = _check_scope(scope)
        where: dict[str, str] = {"kind": "turn"}
        if scope.session_id is not None:
            where["session_id"] = scope.session_id
        return [turn_from_record(r) for r in self.store.list(user_id=scope.user_id, where=where)]

    def reindex(self, *, progress: bool = True) -> int:
        """Rebuild the vector index from the record store; returns the records indexed."""
        with self._lock:
            count = self.retriever.reindex(progress=progress)
            self.store.set_state(_EMBEDDER_STATE_KEY, self._embedder_identity())
            return count

    @property
    def usage(self) -> MemoryUsage:
        """LLM and embedder usage, and failed derivations, of this memory so far."""
        from memories_core.usage import MemoryUsage

        return MemoryUsage(
            llm=self.llm.usage if self.llm is not None else None,
            embedder=self.embedder.usage,
            failures=dict(self._failures),
        )

    def close(self) -> None:
        """Close the record store (and the index, if it has ``close``)."""
        self.store.close()
        close = getattr(self.index, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> MemoryBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ hooks
    def _derive(self, records: list[MemoryRecord], scope: Scope) -> None:
        """Derive this mechanism's records from freshly stored turn records (hook)."""

    def _render(self, hits: Sequence[ScoredRecord]) -> str:
        """Render recalled records as one prompt block (hook); one record a line."""
        return "\n".join(hit.record.text for hit in hits)

    # ------------------------------------------------------------------ helpers
    def _search(
        self, query: str, scope: Scope, *, k: int, where: Filter | None = None
    ) -> list[ScoredRecord]:
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError("query is empty or only whitespace")
        hits: list[ScoredRecord] = []
        for kind in self.recall_kinds:
            hits.extend(
                self.retriever.search(
                    query, user_id=scope.user_id, k=k, where={**(where or {}), "kind": kind}
                )
            )
        hits.sort(key=lambda h: h.score, reverse=True)
        return hits[:k]

    def _store_turns(self, turns: Sequence[Turn], scope: Scope) -> list[MemoryRecord]:
        now = self.clock.now()
        records = [
            MemoryRecord(
                id=new_id(),
                user_id=scope.user_id,
                kind="turn",
                text=turn.render(),
                created_at=turn.timestamp or now,
                session_id=scope.session_id,
                metadata=_turn_metadata(turn),
            )
            for turn in turns
        ]
        self.store.add(records, indexed=self.index_turns)
        return records

    def _add_derived(self, records: Sequence[MemoryRecord]) -> None:
        """Store LLM-derived records (after their sources) and index them."""
        self.store.add(records, indexed=True)
        self._index_now()

    def _index_now(self) -> None:
        # Documented fallback: an index failure leaves the records pending; the next search
        # indexes them. The records themselves are already committed.
        try:
            self.retriever.index_pending()
        except Exception:
            self._failures["index"] += 1
            logger.warning("vector indexing failed; records stay pending", exc_info=True)

    def _count_failure(self, name: str) -> None:
        self._failures[name] += 1

    def _embedder_identity(self) -> dict[str, Any]:
        return {"name": self.embedder.name, "dimension": self.embedder.dimension}

    def _check_embedder(self, allow_change: bool) -> None:
        stored = self.store.get_state(_EMBEDDER_STATE_KEY)
        current = self._embedder_identity()
        if stored is None:
            self.store.set_state(_EMBEDDER_STATE_KEY, current)
            return
        if stored == current:
            return
        if not allow_change:
            raise EmbedderMismatchError(
                f"this memory was built with embedder {stored['name']!r} "
                f"(dimension {stored['dimension']}), not {current['name']!r} "
                f"(dimension {current['dimension']}); open it with the original embedder, or "
                "pass allow_embedder_change=True to re-embed every record"
            )
        self.reindex(progress=False)


def _check_scope(scope: Scope) -> Scope:
    if not isinstance(scope, Scope):
        raise InvalidInputError(f"scope must be a Scope, got {type(scope).__name__}")
    return scope


def _check_turns(turns: Iterable[Turn]) -> list[Turn]:
    if isinstance(turns, Turn):
        return [turns]
    if isinstance(turns, (str, bytes)):
        raise InvalidInputError("turns must be a sequence of Turn, not a string")
    out = list(turns)
    for turn in out:
        if not isinstance(turn, Turn):
            raise InvalidInputError(f"turns must be Turn objects, got {type(turn).__name__}")
    return out


def _turn_metadata(turn: Turn) -> dict[str, Any]:
    meta: dict[str, Any] = dict(turn.metadata)
    meta["role"] = turn.role
    if turn.speaker:
        meta["speaker"] = turn.speaker
    return meta


def _default_embedder() -> Embedder:
    from memories_core.embedders import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder()


def _default_store(path: Path | None) -> RecordStore:
    from memories_core.backends import SQLiteRecordStore

    return SQLiteRecordStore(path / "records.sqlite3" if path is not None else None)


def _default_index(path: Path | None) -> VectorIndex:
    if path is None:
        from memories_core.backends import NumpyIndex

        return NumpyIndex()
    from memories_core.backends import ChromaIndex

    return ChromaIndex(path=path / "chroma")
