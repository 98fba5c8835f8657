"""The one search path every mechanism shares: dense + lexical (BM25) retrieval, fused.

A query runs twice, against the vector index (cosine similarity of embeddings) and against
the record store's full-text index (BM25), each restricted to one ``user_id`` inside the
backend query. The two rankings are fused (:func:`zscore_fuse` or :func:`rrf_fuse`), and the
winners are loaded from the record store, which stays the record of truth.

The vector index is derived state. Records are written to the store as *pending* and indexed
by :meth:`HybridRetriever.index_pending`, which every search calls first: if a process dies
between the store write and the index write, or the index fails, the records are indexed on
the next search instead of being lost to dense retrieval.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from memories_core.errors import ConfigurationError, InvalidInputError, MissingUserError
from memories_core.filters import compile_filter, record_getter
from memories_core.interfaces import Embedder, Filter, RecordStore, VectorIndex
from memories_core.types import MemoryRecord, ScoredRecord

__all__ = [
    "FusionConfig",
    "HybridRetriever",
    "Ranking",
    "SearchMode",
    "index_metadata",
    "rrf_fuse",
    "spread_context",
    "zscore_fuse",
]

#: One ranked list of ``(id, score)`` pairs, best first, higher score = better.
Ranking = Sequence[tuple[str, float]]

SearchMode = Literal["hybrid", "dense", "lexical"]


@dataclass(frozen=True)
class FusionConfig:
    """How the dense and lexical rankings are fused.

    The defaults were chosen by measurement on LoCoMo (the locally available half, raw
    dialogue turns, all-MiniLM-L6-v2 embeddings; see ``benchmarks/locomo_retrieval.py`` and
    BENCHMARKS.md): z-score fusion with BM25 weighted above the small embedding model, which
    on dialogue memories is the weaker signal, plus conversation context (below).

    Conversation context: in a dialogue the turn that holds a fact often only makes sense
    next to the turn before it ("What pet do you have?" / "A cat named Bailey"). After
    fusion, a record therefore also inherits a share of its neighbours' scores: its own
    (shifted so the weakest candidate scores 0) plus ``previous_context_weight`` times the
    score of the record just before it and ``next_context_weight`` times the one just after
    it. Neighbours are records of the same user, ``session_id`` and ``kind``, in
    ``created_at`` order; records without a ``session_id`` have none. Set both weights to 0
    to switch this off. It applies to ``mode="hybrid"`` only.

    Attributes:
        method: ``"zscore"`` (standardise each ranking's scores, then add them weighted) or
            ``"rrf"`` (reciprocal rank fusion: add ``weight / (rrf_k + rank)``).
        dense_weight: Weight of the vector ranking.
        lexical_weight: Weight of the BM25 ranking.
        candidates: How many results each side fetches before fusing; ``None`` means
            ``max(min_candidates, candidate_factor * k)``.
        min_candidates: Floor of the automatic candidate depth.
        candidate_factor: Multiple of ``k`` of the automatic candidate depth.
        rrf_k: The rank offset of RRF (60 in Cormack et al., 2009).
        previous_context_weight: Share of the preceding record's score a record inherits.
        next_context_weight: Share of the following record's score a record inherits.
        context_depth: Neighbours are looked up for this many of the best fused candidates
            (at least ``k``); only the best candidates can lift a neighbour into the top.
        context_kinds: Record kinds whose neighbours share scores. Only dialogue turns by
            default: derived records (summaries, conditional notes) already carry their
            context, and on LoCoMo the boost lowered such records' recall.
    """

    method: Literal["zscore", "rrf"] = "zscore"
    dense_weight: float = 0.35
    lexical_weight: float = 0.65
    candidates: int | None = None
    min_candidates: int = 50
    candidate_factor: int = 3
    rrf_k: int = 60
    previous_context_weight: float = 0.4
    next_context_weight: float = 0.3
    context_depth: int = 20
    context_kinds: tuple[str, ...] = ("turn",)

    def __post_init__(self) -> None:
        if self.method not in ("zscore", "rrf"):
            raise ConfigurationError(f"unknown fusion method {self.method!r}")
        for name in (
            "dense_weight",
            "lexical_weight",
            "previous_context_weight",
            "next_context_weight",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ConfigurationError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.dense_weight == 0 and self.lexical_weight == 0:
            raise ConfigurationError("dense_weight and lexical_weight cannot both be 0")
        if self.candidates is not None and self.candidates < 1:
            raise ConfigurationError("candidates must be >= 1 or None")
        if self.min_candidates < 1 or self.candidate_factor < 1:
            raise ConfigurationError("min_candidates and candidate_factor must be >= 1")
        if self.rrf_k < 0:
            raise ConfigurationError("rrf_k must be >= 0")
        if self.context_depth < 1:
            raise ConfigurationError("context_depth must be >= 1")

    @property
    def uses_context(self) -> bool:
        """Whether neighbouring records share scores (either context weight is above 0)."""
        return self.previous_context_weight > 0 or self.next_context_weight > 0

    def candidate_count(self, k: int) -> int:
        """How many results each side fetches for a search of ``k`` results."""
        if self.candidates is not None:
            return max(self.candidates, k)
        return max(self.min_candidates, self.candidate_factor * k)

    def fuse(self, dense: Ranking, lexical: Ranking) -> list[tuple[str, float]]:
        """Fuse a dense and a lexical ranking with this configuration."""
        weights = (self.dense_weight, self.lexical_weight)
        if self.method == "rrf":
            return rrf_fuse((dense, lexical), weights, k=self.rrf_k)
        return zscore_fuse((dense, lexical), weights)


def zscore_fuse(rankings: Sequence[Ranking], weights: Sequence[float]) -> list[tuple[str, float]]:
    """Fuse rankings by weighted sums of standardised scores.

    Each ranking's scores are turned into z-scores (``(score - mean) / std`` over that
    ranking's candidates), which puts cosine similarities and unbounded BM25 scores on one
    scale. An item a ranking did not return gets that ranking's lowest z-score: it was not
    among the candidates, so it is taken to be no better than the worst one. A ranking whose
    scores are all equal contributes 0; an empty ranking contributes nothing.

    Args:
        rankings: Ranked ``(id, score)`` lists, higher score = better.
        weights: One weight per ranking.

    Returns:
        ``(id, fused score)`` pairs, best first; ties keep first-seen order.

    Raises:
        InvalidInputError: if the numbers of rankings and weights differ.
    """
    if len(rankings) != len(weights):
        raise InvalidInputError(f"{len(rankings)} rankings but {len(weights)} weights")
    standardised: list[tuple[dict[str, float], float, float]] = []
    order: dict[str, int] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        if not ranking:
            continue
        scores = [float(score) for _, score in ranking]
        mean = sum(scores) / len(scores)
        std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores))
        z: dict[str, float] = {}
        for item, score in ranking:
            value = (float(score) - mean) / std if std > 0 else 0.0
            # A duplicate id keeps its best score.
            z[item] = max(value, z.get(item, -math.inf))
            order.setdefault(item, len(order))
        standardised.append((z, min(z.values()), float(weight)))
    fused = {
        item: sum(weight * z.get(item, floor) for z, floor, weight in standardised)
        for item in order
    }
    return sorted(fused.items(), key=lambda pair: (-pair[1], order[pair[0]]))


def rrf_fuse(
    rankings: Sequence[Ranking], weights: Sequence[float], *, k: int = 60
) -> list[tuple[str, float]]:
    """Fuse rankings by weighted reciprocal rank fusion (Cormack et al., 2009).

    An item scores ``sum(weight / (k + rank))`` over the rankings that returned it, with
    ``rank`` starting at 1. Scores are ignored; only positions count.

    Args:
        rankings: Ranked ``(id, score)`` lists, best first.
        weights: One weight per ranking.
        k: Rank offset; larger values flatten the difference between top and lower ranks.

    Returns:
        ``(id, fused score)`` pairs, best first; ties keep first-seen order.

    Raises:
        InvalidInputError: if the numbers of rankings and weights differ.
    """
    if len(rankings) != len(weights):
        raise InvalidInputError(f"{len(rankings)} rankings but {len(weights)} weights")
    fused: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights, strict=True):
        seen: set[str] = set()
        for rank, (item, _) in enumerate(ranking, start=1):
            if item in seen:
                continue
            seen.add(item)
            fused[item] = fused.get(item, 0.0) + float(weight) / (k + rank)
    order = {item: i for i, item in enumerate(fused)}
    return sorted(fused.items(), key=lambda pair: (-pair[1], order[pair[0]]))


def spread_context(
    ranking: Ranking,
    neighbours: Mapping[str, tuple[str | None, str | None]],
    *,
    previous_weight: float,
    next_weight: float,
    own_score_only: frozenset[str] = frozenset(),
) -> list[tuple[str, float]]:
    """Let records inherit a share of their neighbours' scores (conversation context).

    Scores are first shifted so that the lowest one is 0 (a record outside the ranking also
    counts 0). Then every record ``x`` of the ranking, and every neighbour named in
    ``neighbours``, scores ``s(x) + previous_weight * s(prev(x)) + next_weight * s(next(x))``.

    Args:
        ranking: ``(id, score)`` pairs, higher = better.
        neighbours: For some ids, ``(previous id, next id)`` (``None`` where there is none).
            A link is known from either side: if ``b`` is ``a``'s next, ``a`` is ``b``'s
            previous.
        previous_weight: Share of the preceding record's score.
        next_weight: Share of the following record's score.
        own_score_only: Ids that keep their own score and inherit nothing (the retriever
            passes a chat assistant's replies: they restate, so they must match on their
            own; otherwise a short chat memory floods with replies next to a good match).

    Returns:
        ``(id, score)`` pairs, best first; ties keep ranking order, then discovery order.
    """
    if not ranking:
        return []
    floor = min(float(score) for _, score in ranking)
    base: dict[str, float] = {}
    for item, score in ranking:
        base.setdefault(item, float(score) - floor)
    before: dict[str, str] = {}
    after: dict[str, str] = {}
    for item, (prev_id, next_id) in neighbours.items():
        if prev_id is not None:
            before[item] = prev_id
            after[prev_id] = item
        if next_id is not None:
            after[item] = next_id
            before[next_id] = item
    order: dict[str, int] = {}
    for item in [*base, *before, *after]:
        order.setdefault(item, len(order))
    scores = {
        item: base.get(item, 0.0)
        + (
            0.0
            if item in own_score_only
            else previous_weight * base.get(before.get(item, ""), 0.0)
            + next_weight * base.get(after.get(item, ""), 0.0)
        )
        for item in order
    }
    return sorted(scores.items(), key=lambda pair: (-pair[1], order[pair[0]]))


def index_metadata(record: MemoryRecord) -> dict[str, str | int | float | bool]:
    """The metadata a record's vector carries in the index, for ``where`` filters.

    ``user_id`` and ``kind`` always; ``session_id`` when set; plus every scalar value of the
    record's metadata (lists, dicts and ``None`` are left out: vector indexes filter on
    scalars only). The record fields win over metadata keys of the same name.
    """
    meta: dict[str, str | int | float | bool] = {
        key: value
        for key, value in record.metadata.items()
        if isinstance(key, str) and isinstance(value, (str, int, float, bool))
    }
    meta["user_id"] = record.user_id
    meta["kind"] = record.kind
    if record.session_id is not None:
        meta["session_id"] = record.session_id
    else:
        meta.pop("session_id", None)
    return meta


class HybridRetriever:
    """Dense + lexical search over a record store and a vector index, scoped by user.

    Key init args:
        store: The record store (record of truth; provides BM25 search).
        index: The vector index derived from the store.
        embedder: Embeds records when indexing and queries when searching.
        fusion: How the two rankings are fused (default: :class:`FusionConfig`).

    Instantiate:
        .. code-block:: python

            from memories_core.backends import NumpyIndex, SQLiteRecordStore
            from memories_core.embedders import HashingEmbedder
            from memories_core.retrieval import HybridRetriever

            retriever = HybridRetriever(SQLiteRecordStore(), NumpyIndex(), HashingEmbedder())

    Search:
        .. code-block:: python

            store.add(records)                       # records are pending for the index
            hits = retriever.search("where does she work", user_id="alice", k=5)
            hits[0].record.text, hits[0].score       # best first

    Every search is restricted to ``user_id`` in both backends' own queries, and any record
    of another user that still came back is dropped (defence in depth).
    """

    def __init__(
        self,
        store: RecordStore,
        index: VectorIndex,
        embedder: Embedder,
        *,
        fusion: FusionConfig | None = None,
    ) -> None:
        self.store = store
        self.index = index
        self.embedder = embedder
        self.fusion = fusion if fusion is not None else FusionConfig()
        # One indexer at a time: concurrent searches would otherwise embed the same pending
        # records twice (harmless, as adds are upserts, but wasted work).
        self._index_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"HybridRetriever(store={self.store!r}, index={self.index!r}, "
            f"embedder={getattr(self.embedder, 'name', self.embedder)!r}, fusion={self.fusion!r})"
        )

    def index_pending(self, batch_size: int = 256, progress: bool = False) -> int:
        """Embed and index every record the store holds as pending; returns how many.

        Records are processed in batches: embed, add to the index, then confirm in the
        store. If anything fails, the exception propagates and the unconfirmed records stay
        pending for the next call.

        Args:
            batch_size: Records embedded per call to the embedder.
            progress: Show a ``tqdm`` progress bar.

        Raises:
            InvalidInputError: if ``batch_size < 1``.
        """
        if batch_size < 1:
            raise InvalidInputError("batch_size must be >= 1")
        with self._index_lock:
            bar = self._progress_bar() if progress else None
            done = 0
            seen: set[str] = set()
            try:
                while True:
                    batch = self.store.pending_index(limit=batch_size)
                    fresh = [record for record in batch if record.id not in seen]
                    if not fresh:
                        # Nothing pending, or the store keeps returning records it could
                        # not mark (e.g. rewritten meanwhile): stop rather than spin.
                        break
                    vectors = self.embedder.embed_documents([r.text for r in fresh])
                    self.index.add(
                        [r.id for r in fresh], vectors, [index_metadata(r) for r in fresh]
                    )
                    self.store.mark_indexed([r.id for r in fresh])
                    seen.update(r.id for r in fresh)
                    done += len(fresh)
                    if bar is not None:
                        bar.update(len(fresh))
            finally:
                if bar is not None:
                    bar.close()
            return done

    def _progress_bar(self) -> Any:
        from tqdm.auto import tqdm

        count = getattr(self.store, "pending_count", None)
        total = count() if callable(count) else None
        return tqdm(total=total, desc="indexing", unit="record")

    def reindex(self, progress: bool = True) -> int:
        """Rebuild the vector index from the store (e.g. after changing the embedder).

        Returns:
            How many records were indexed.
        """
        self.index.reset()
        self.store.mark_all_pending()
        return self.index_pending(progress=progress)

    def search(
        self,
        query: str,
        *,
        user_id: str,
        k: int,
        where: Filter | None = None,
        mode: SearchMode = "hybrid",
    ) -> list[ScoredRecord]:
        """Return ``user_id``'s ``k`` records that best match ``query``, best first.

        Args:
            query: Free text.
            user_id: Owner; only this user's records can come back.
            k: Number of results.
            where: Equality filter on ``kind``, ``session_id`` or metadata keys.
            mode: ``"hybrid"`` (fused; score = fused score), ``"dense"`` (score = cosine)
                or ``"lexical"`` (score = BM25).

        Raises:
            InvalidInputError: on an empty query, ``k < 1`` or an unknown mode.
            MissingUserError: without a ``user_id``.
        """
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError("query is empty or only whitespace")
        if not isinstance(user_id, str) or not user_id.strip():
            raise MissingUserError("user_id is required and must be a non-empty string")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise InvalidInputError(f"k must be an int >= 1, got {k!r}")
        if mode not in ("hybrid", "dense", "lexical"):
            raise InvalidInputError(f"unknown search mode {mode!r}")
        self.index_pending()
        depth = self.fusion.candidate_count(k)
        dense: list[tuple[str, float]] = []
        lexical: list[tuple[str, float]] = []
        if mode != "lexical":
            vector = self.embedder.embed_query(query)
            dense = self.index.search(vector, user_id=user_id, k=depth, where=where)
        if mode != "dense":
            lexical = self.store.search_text(query, user_id=user_id, k=depth, where=where)
        if mode == "dense":
            ranked = dense
        elif mode == "lexical":
            ranked = lexical
        else:
            ranked = self.fusion.fuse(dense, lexical)
            if self.fusion.uses_context and ranked:
                ranked = self._with_context(ranked, user_id=user_id, k=k)
        return self._load(ranked, user_id=user_id, k=k, where=where)

    def _with_context(self, ranked: Ranking, *, user_id: str, k: int) -> list[tuple[str, float]]:
        """Apply :func:`spread_context` around the best ``context_depth`` candidates."""
        top = [item for item, _ in ranked[: max(k, self.fusion.context_depth)]]
        adjacent = getattr(self.store, "adjacent", None)
        if callable(adjacent):
            neighbours = adjacent(top, user_id=user_id)
        else:
            neighbours = _adjacent_via_list(self.store, top, user_id=user_id)
        linked = {n for pair in neighbours.values() for n in pair if n is not None}
        candidates = list(dict.fromkeys([*top, *linked]))
        records = {r.id: r for r in self.store.get(candidates, user_id=user_id)}
        neighbours = {
            item: pair
            for item, pair in neighbours.items()
            if item in records and records[item].kind in self.fusion.context_kinds
        }
        replies = frozenset(
            item for item, record in records.items() if record.metadata.get("role") == "assistant"
        )
        return spread_context(
            ranked,
            neighbours,
            previous_weight=self.fusion.previous_context_weight,
            next_weight=self.fusion.next_context_weight,
            own_score_only=replies,
        )

    def _load(
        self, ranked: Ranking, *, user_id: str, k: int, where: Filter | None
    ) -> list[ScoredRecord]:
        """Load the ranked ids from the store, keeping order; skip stale or foreign ids."""
        if not ranked:
            return []
        scores = dict(ranked)
        ids = [item for item, _ in ranked]
        hits: list[ScoredRecord] = []
        # Load in two steps: the best candidates usually suffice, but an index may hold
        # stale vectors of deleted records, and those must not shrink the result below k.
        first = max(2 * k, k + 10)
        for chunk in (ids[:first], ids[first:]):
            if len(hits) >= k or not chunk:
                break
            hits += [
                ScoredRecord(record=record, score=float(scores[record.id]))
                for record in self.store.get(chunk, user_id=user_id)
                if record.user_id == user_id and _matches(record, where)
            ]
        return hits[:k]


def _adjacent_via_list(
    store: RecordStore, ids: Sequence[str], *, user_id: str
) -> dict[str, tuple[str | None, str | None]]:
    """Neighbours through the plain :class:`RecordStore` protocol (lists whole sessions).

    Used for stores without an ``adjacent`` method; costs one ``list`` call per distinct
    ``(session_id, kind)`` among ``ids``.
    """
    records = store.get(ids, user_id=user_id)
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


def _matches(record: MemoryRecord, where: Filter | None) -> bool:
    """Whether a loaded record satisfies the full ``where``.

    Re-checked here because an index may be stale and pre-filters only on the keys it holds.
    """
    expr = compile_filter(where)
    return expr is None or expr.matches(record_getter(record))
