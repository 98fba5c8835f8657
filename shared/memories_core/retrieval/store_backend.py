""":class:`StoreBackend`: a :class:`~memories_core.retrieval.RecallBackend` over today's parts.

It adapts a :class:`~memories_core.interfaces.RecordStore` (BM25, records, session
neighbours), a :class:`~memories_core.interfaces.VectorIndex` and an
:class:`~memories_core.interfaces.Embedder`, which is what
:class:`~memories_core.retrieval.HybridRetriever` searches through. The engine replaces it
with a native implementation (one SQL query per method, a ``batch_id`` column).
"""

from __future__ import annotations

import heapq
import inspect
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from memories_core.interfaces import Clock, Embedder, Filter, RecordStore, VectorIndex
from memories_core.retrieval.base import Where
from memories_core.retrieval.context import adjacent_rows, rows_of
from memories_core.retrieval.fusion import Ranking
from memories_core.types import MemoryRecord

__all__ = ["StoreBackend", "merge_rankings", "split_kinds"]

_MICROSECOND = timedelta(microseconds=1)


def split_kinds(where: Where | None) -> list[Filter | None]:
    """Equality-only filters whose union is ``where`` (expands ``kind: {"$in": [...]}``).

    Stores that only understand equality filters run one query per kind; raw cosine and
    BM25 scores of one query are comparable across kinds, so the per-kind lists merge into
    the global ranking (:func:`merge_rankings`).
    """
    if not where:
        return [None]
    kind = where.get("kind")
    if isinstance(kind, dict) and set(kind) == {"$in"}:
        rest = {key: value for key, value in where.items() if key != "kind"}
        return [cast(Filter, {**rest, "kind": value}) for value in dict.fromkeys(kind["$in"])]
    return [cast(Filter, where)]


def merge_rankings(rankings: Sequence[Ranking], depth: int) -> list[tuple[str, float]]:
    """The best ``depth`` of several rankings with comparable scores (stable on ties)."""
    if len(rankings) == 1:
        return list(rankings[0])[:depth]
    pairs = (pair for ranking in rankings for pair in ranking)
    flat = [(float(score), n, item) for n, (item, score) in enumerate(pairs)]
    best = heapq.nlargest(depth, flat, key=lambda t: (t[0], -t[1]))
    return [(item, score) for score, _, item in best]


class StoreBackend:
    """A recall backend over a record store, a vector index and an embedder.

    Neighbours: through the store's ``adjacent`` when it takes ``gap``
    (:class:`~memories_core.interfaces.NeighbourStore`, as the SQL stores do: indexed
    seeks, bounded by the number of ids); otherwise records with a session through the
    store's ``adjacent`` (or its ``list``), and records without one by time gap through
    ``list(since=, until=)``, a window of ``2 * gap`` per record. These stores keep no
    save-call id, so batches do not link.

    Args:
        store: Record store (record of truth, BM25).
        index: Vector index.
        embedder: Embeds queries.
        before_search: Called before every dense search (the retriever indexes pending
            records there).
        clock: Source of "now" for a pipeline run given no ``now`` (the engine's clock).
    """

    def __init__(
        self,
        store: RecordStore,
        index: VectorIndex,
        embedder: Embedder,
        *,
        before_search: Callable[[], Any] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.clock = clock
        self.store = store
        self.index = index
        self.embedder = embedder
        self.before_search = before_search
        # An index that filters on ``kind`` through the store's kinds (the Chroma index) is
        # given them: the store is the record of truth and reads them faster.
        self._reads_kinds = callable(getattr(store, "kinds", None)) and _takes(
            getattr(index, "search", None), "kinds_of"
        )

    def _kinds_of(self, user_id: str) -> dict[str, Any]:
        """``kinds_of=`` for the index's searches of ``user_id`` (empty: it takes none)."""
        if not self._reads_kinds:
            return {}
        read = self.store.kinds  # type: ignore[attr-defined]  # checked in __init__
        return {"kinds_of": lambda ids: read(list(ids), user_id=user_id)}

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """The embedder's query vector."""
        return self.embedder.embed_query(text)

    def dense(
        self, vector: npt.NDArray[np.float32], *, user_id: str, depth: int, where: Where | None
    ) -> Ranking:
        """Nearest vectors of ``user_id`` (one index query per kind of a ``kinds`` request)."""
        if self.before_search is not None:
            self.before_search()
        return merge_rankings(
            [
                self.index.search(
                    vector, user_id=user_id, k=depth, where=part, **self._kinds_of(user_id)
                )
                for part in split_kinds(where)
            ],
            depth,
        )

    def dense_many(
        self,
        vector: npt.NDArray[np.float32],
        *,
        user_id: str,
        depth: int,
        wheres: Sequence[Where],
    ) -> list[Ranking]:
        """:meth:`dense` once per filter of ``wheres`` (search keys: records, then keys).

        One index query serves every filter when the index has ``search_many`` (the Chroma
        index) and no filter needs a query per kind; each ranking equals :meth:`dense`'s.
        """
        search_many = getattr(self.index, "search_many", None)
        if not callable(search_many) or any(
            not where or len(split_kinds(where)) != 1 for where in wheres
        ):
            return [self.dense(vector, user_id=user_id, depth=depth, where=w) for w in wheres]
        if self.before_search is not None:
            self.before_search()
        found = search_many(
            vector, user_id=user_id, k=depth, wheres=list(wheres), **self._kinds_of(user_id)
        )
        return [list(ranking)[:depth] for ranking in found]

    def lexical(self, query: str, *, user_id: str, depth: int, where: Where | None) -> Ranking:
        """BM25 matches of ``user_id`` (one store query per kind of a ``kinds`` request)."""
        return merge_rankings(
            [
                self.store.search_text(query, user_id=user_id, k=depth, where=part)
                for part in split_kinds(where)
            ],
            depth,
        )

    def load(self, ids: Sequence[str], *, user_id: str) -> dict[str, MemoryRecord]:
        """Records of ``user_id`` among ``ids``."""
        return {r.id: r for r in self.store.get(list(ids), user_id=user_id) if r.user_id == user_id}

    def texts(self, ids: Sequence[str], *, user_id: str) -> dict[str, str]:
        """Texts of ``user_id``'s records among ``ids`` (the store's text-only read if any)."""
        read = getattr(self.store, "texts", None)
        if callable(read):
            return dict(read(list(ids), user_id=user_id))
        return {item: record.text for item, record in self.load(ids, user_id=user_id).items()}

    def has_kind(self, user_id: str, kind: str) -> bool:
        """Whether ``user_id`` has a record of ``kind`` (one indexed lookup)."""
        return bool(self.store.list(user_id=user_id, where={"kind": kind}, limit=1))

    def adjacent(
        self, ids: Sequence[str], *, user_id: str, gap: timedelta | None
    ) -> dict[str, tuple[str | None, str | None]]:
        """Neighbours by :func:`~memories_core.retrieval.context.linked`."""
        if not ids:
            return {}
        by_session = getattr(self.store, "adjacent", None)
        if callable(by_session) and _takes_gap(by_session):
            # The store's indexed query (a NeighbourStore): a bounded number of index seeks
            # per id, whatever the length of the session.
            return dict(by_session(list(ids), user_id=user_id, gap=gap))
        if callable(by_session):
            result: dict[str, tuple[str | None, str | None]] = dict(
                by_session(list(ids), user_id=user_id)
            )
        else:
            result = adjacent_via_list(self.store, ids, user_id=user_id)
        if gap is None:
            return result
        for record in self.store.get([i for i in ids if i not in result], user_id=user_id):
            if record.session_id is not None or record.user_id != user_id:
                continue
            window = self.store.list(
                user_id=user_id,
                where={"kind": record.kind},
                since=record.created_at - gap,
                until=record.created_at + gap + _MICROSECOND,
            )
            loose = [r for r in window if r.session_id is None]
            result[record.id] = adjacent_rows(rows_of(loose), gap=gap).get(record.id, (None, None))
        return result


def _takes_gap(method: Callable[..., Any]) -> bool:
    """Whether a store's ``adjacent`` takes ``gap`` (links records without a session)."""
    return _takes(method, "gap")


def _takes(method: object, name: str) -> bool:
    """Whether ``method`` is callable with a parameter called ``name``."""
    if not callable(method):
        return False
    try:
        return name in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def adjacent_via_list(
    store: RecordStore, ids: Sequence[str], *, user_id: str
) -> dict[str, tuple[str | None, str | None]]:
    """Session neighbours through the plain :class:`RecordStore` protocol.

    Used for stores without an ``adjacent`` method; costs one ``list`` call per distinct
    ``(session_id, kind)`` among ``ids``.
    """
    records = store.get(list(ids), user_id=user_id)
    groups = {(r.session_id, r.kind) for r in records if r.session_id is not None}
    position: dict[str, tuple[str | None, str | None]] = {}
    for session_id, kind in groups:
        assert session_id is not None  # filtered above; narrows the type
        session = store.list(user_id=user_id, where={"session_id": session_id, "kind": kind})
        for i, record in enumerate(session):
            position[record.id] = (
                session[i - 1].id if i > 0 else None,
                session[i + 1].id if i + 1 < len(session) else None,
            )
    return {r.id: position[r.id] for r in records if r.id in position}
