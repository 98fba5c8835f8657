""":class:`HybridRetriever`: dense + lexical (BM25) search over a store and an index.

A thin facade over the :class:`~memories_core.retrieval.Pipeline`: :class:`FusionConfig`
names the classic pipeline (dense + lexical sources, z-score or RRF fusion, context
spreading) and :class:`~memories_core.retrieval.store_backend.StoreBackend` adapts the
record store (record of truth, BM25) and the vector index to the pipeline's backend
protocol.

The vector index is derived state. Records are written to the store as *pending* and indexed
by :meth:`HybridRetriever.index_pending`, which every search calls first: if a process dies
between the store write and the index write, or the index fails, the records are indexed on
the next search instead of being lost to dense retrieval.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Literal

from memories_core.clock import resolve_now
from memories_core.errors import ConfigurationError, InvalidInputError, check_count
from memories_core.interfaces import Clock, Embedder, Filter, RecordStore, VectorIndex
from memories_core.retrieval.context import (
    DEFAULT_AFTER_QUESTION_WEIGHT,
    DEFAULT_CONTEXT_GAP,
    DEFAULT_QUESTION_WEIGHT,
    ContextSpreading,
    check_question_weights,
)
from memories_core.retrieval.entity import DEFAULT_ENTITY_WEIGHT
from memories_core.retrieval.fusion import DEFAULT_MISSING_MARGIN, Fusion, Ranking
from memories_core.retrieval.pipeline import (
    CandidateSource,
    DenseSource,
    LexicalSource,
    Pipeline,
    RecallRequest,
    hybrid_rerankers,
)
from memories_core.retrieval.store_backend import StoreBackend, adjacent_via_list
from memories_core.retrieval.temporal import DEFAULT_TEMPORAL_WEIGHT
from memories_core.types import (
    MAX_META_INT,
    MIN_META_INT,
    MemoryRecord,
    ScoredRecord,
    check_user_id,
)

__all__ = ["FusionConfig", "HybridRetriever", "SearchMode", "index_metadata"]

SearchMode = Literal["hybrid", "dense", "lexical"]

#: Kept for callers of the old private name.
_adjacent_via_list = adjacent_via_list


@dataclass(frozen=True)
class FusionConfig:
    """How the dense and lexical rankings are fused.

    The defaults were chosen by measurement on LoCoMo (the locally available half, raw
    dialogue turns, all-MiniLM-L6-v2 embeddings; BENCHMARKS.md, "Cross-validated choice of
    every knob"): z-score fusion with BM25 weighted above the small embedding model, which
    on dialogue memories is the weaker signal, plus conversation context (below).

    Conversation context: in a dialogue the turn that holds a fact often only makes sense
    next to the turn before it ("What pet do you have?" / "A cat named Bailey"). After
    fusion, a record therefore also inherits a share of its neighbours' scores: its own
    (shifted so the weakest candidate scores 0) plus ``previous_context_weight`` times the
    score of the record just before it and ``next_context_weight`` times the one just after
    it. Neighbours are records of the same user and ``kind`` in ``created_at`` order: of the
    same ``session_id``, or, for records without one, within ``context_gap`` of each other
    (:mod:`memories_core.retrieval.context`). Set both weights to 0 to switch this off. It
    applies to ``mode="hybrid"`` only.

    Attributes:
        method: ``"zscore"`` (standardise each ranking's scores, then add them weighted) or
            ``"rrf"`` (reciprocal rank fusion: add ``weight / (rrf_k + rank)``).
        dense_weight: Weight of the vector ranking.
        lexical_weight: Weight of the BM25 ranking.
        candidates: How many results each side fetches before fusing; ``None`` means
            ``max(min_candidates, candidate_factor * k)``. Below that depth, ``k`` does not
            change the candidates, so a smaller ``k`` returns a prefix of a larger one.
        min_candidates: Floor of the automatic candidate depth.
        candidate_factor: Multiple of ``k`` of the automatic candidate depth (1: a depth
            that grows with ``k`` would break the prefix property).
        rrf_k: The rank offset of RRF (60 in Cormack et al., 2009).
        previous_context_weight: Share of the preceding record's score a record inherits.
        next_context_weight: Share of the following record's score a record inherits.
        context_depth: Neighbours are looked up for this many of the best fused candidates
            (fixed, not tied to ``k``); only the best candidates can lift a neighbour.
        context_kinds: Record kinds whose neighbours share scores. Only dialogue turns by
            default: derived records (summaries, conditional notes) already carry their
            context, and on LoCoMo the boost lowered such records' recall.
        context_gap: Records without a session id are neighbours up to this far apart
            (``None``: never).
        missing_margin: z-score fusion: how far below a ranking's weakest candidate an
            item it did not return is placed (> 0).
        after_question_weight: Context spreading: share of a question's score the record
            right after it (the answer) inherits, instead of ``previous_context_weight``
            (:class:`~memories_core.retrieval.context.ContextSpreading`); ``None`` = no
            question rule.
        question_weight: Context spreading: factor (0 to 1) on the own score of a record
            that only asks (1 = no change).
        temporal_weight: Weight of :class:`~memories_core.retrieval.temporal.TemporalBoost`
            (a question naming a time boosts records written near it); 0 = off.
        entity_weight: Name weight of :class:`~memories_core.retrieval.entity.EntityBoost`
            (records containing the question's person names and quoted phrases); 0 = off.

    The defaults were chosen by leave-one-conversation-out cross-validation on LoCoMo dev
    (BENCHMARKS.md, "Retrieval quality").
    """

    method: Literal["zscore", "rrf"] = "zscore"
    dense_weight: float = 0.35
    lexical_weight: float = 0.65
    candidates: int | None = None
    min_candidates: int = 50
    candidate_factor: int = 1
    rrf_k: int = 60
    previous_context_weight: float = ContextSpreading.previous_weight
    next_context_weight: float = ContextSpreading.next_weight
    context_depth: int = ContextSpreading.depth
    context_kinds: tuple[str, ...] = ContextSpreading.kinds
    context_gap: timedelta | None = DEFAULT_CONTEXT_GAP
    missing_margin: float = DEFAULT_MISSING_MARGIN
    temporal_weight: float = DEFAULT_TEMPORAL_WEIGHT
    entity_weight: float = DEFAULT_ENTITY_WEIGHT
    after_question_weight: float | None = DEFAULT_AFTER_QUESTION_WEIGHT
    question_weight: float = DEFAULT_QUESTION_WEIGHT

    def __post_init__(self) -> None:
        if self.method not in ("zscore", "rrf"):
            raise ConfigurationError(f"unknown fusion method {self.method!r}")
        for name in (
            "dense_weight",
            "lexical_weight",
            "previous_context_weight",
            "next_context_weight",
            "temporal_weight",
            "entity_weight",
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
        if self.context_gap is not None and self.context_gap < timedelta(0):
            raise ConfigurationError("context_gap must be >= 0 or None")
        if not (isinstance(self.missing_margin, (int, float)) and self.missing_margin > 0):
            raise ConfigurationError("missing_margin must be a number > 0")
        check_question_weights(self.after_question_weight, self.question_weight)

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
        return self._fusion().fuse((dense, lexical), (self.dense_weight, self.lexical_weight))

    def _fusion(self) -> Fusion:
        return Fusion(method=self.method, missing_margin=self.missing_margin, rrf_k=self.rrf_k)

    def pipeline(self, mode: SearchMode = "hybrid") -> Pipeline:
        """The :class:`~memories_core.retrieval.Pipeline` this configuration describes.

        ``mode="dense"`` / ``"lexical"`` give one source with its raw scores, no rerankers.
        """
        depth = self.candidates if self.candidates is not None else self.min_candidates
        if mode == "dense":
            return Pipeline(sources=(DenseSource(),), rerankers=(), depth=depth)
        if mode == "lexical":
            return Pipeline(sources=(LexicalSource(),), rerankers=(), depth=depth)
        sources: tuple[CandidateSource, ...] = (
            DenseSource(weight=self.dense_weight),
            LexicalSource(weight=self.lexical_weight),
        )
        context = (
            ContextSpreading(
                previous_weight=self.previous_context_weight,
                next_weight=self.next_context_weight,
                depth=self.context_depth,
                kinds=self.context_kinds,
                gap=self.context_gap,
                after_question_weight=self.after_question_weight,
                question_weight=self.question_weight,
            )
            if self.uses_context
            else None
        )
        rerankers = hybrid_rerankers(
            context, temporal_weight=self.temporal_weight, entity_weight=self.entity_weight
        )
        return Pipeline(sources=sources, fusion=self._fusion(), rerankers=rerankers, depth=depth)


def _indexable_scalar(value: Any) -> bool:
    if isinstance(value, (str, bool)):
        return True
    if isinstance(value, int):
        return MIN_META_INT <= value <= MAX_META_INT
    return isinstance(value, float) and math.isfinite(value)


def index_metadata(record: MemoryRecord) -> dict[str, str | int | float | bool]:
    """The metadata a record's vector carries in the index, for ``where`` filters.

    ``user_id`` and ``kind`` always; ``session_id`` when set; plus every scalar value of the
    record's metadata (lists, dicts and ``None`` are left out: vector indexes filter on
    scalars only; so are integers outside the signed 64-bit range, which an index refuses,
    and non-finite floats). The record fields win over metadata keys of the same name.
    """
    meta: dict[str, str | int | float | bool] = {
        key: value
        for key, value in record.metadata.items()
        if isinstance(key, str) and _indexable_scalar(value)
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
        clock: Clock | None = None,
    ) -> None:
        self.store = store
        self.index = index
        self.embedder = embedder
        self.fusion = fusion if fusion is not None else FusionConfig()
        #: Source of "now" for recency and validity (the engine's injected clock).
        self.clock = clock
        # One indexer at a time: concurrent searches would otherwise embed the same pending
        # records twice (harmless, as adds are upserts, but wasted work).
        self._index_lock = threading.Lock()
        self.backend = StoreBackend(store, index, embedder, clock=clock)
        self._pipelines: dict[str, Pipeline] = {}

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
        check_user_id(user_id)
        k = check_count("k", k, error=InvalidInputError)
        if mode not in ("hybrid", "dense", "lexical"):
            raise InvalidInputError(f"unknown search mode {mode!r}")
        request = RecallRequest(
            query, user_id=user_id, k=k, where=where, now=resolve_now(None, self.clock)
        )
        pipeline = self._pipelines.get(mode)
        if pipeline is None:
            pipeline = self._pipelines[mode] = self.fusion.pipeline(mode)
        depth = self.fusion.candidate_count(k)
        if depth != pipeline.candidate_depth(k):
            pipeline = replace(pipeline, depth=depth)
        self.index_pending()
        return pipeline.run(request, self.backend)
