"""Recall as a pipeline: candidate sources -> fusion -> rerankers -> load -> hook.

A :class:`Pipeline` is configuration, not a subclass: a mechanism that needs recency, a
graph walk or a cross-encoder configures its pipeline instead of overriding search.

.. code-block:: python

    from memories_core.retrieval import (
        ContextSpreading, DenseSource, LexicalSource, Pipeline, RecallRequest, TimeDecay,
    )
    from memories_core.retrieval.memory_backend import InMemoryBackend

    backend = InMemoryBackend(embedder)
    backend.add(records)                                  # one save call = one batch
    pipeline = Pipeline(rerankers=(ContextSpreading(), TimeDecay(half_life=timedelta(days=30))))
    hits = pipeline.run(RecallRequest("where does she work", user_id="alice", k=5), backend)

Stages:

1. Every :class:`CandidateSource` returns up to ``depth`` ``(id, score)`` pairs for the
   request. ``depth`` is ``max(pipeline.depth, k)``: it does not grow with ``k`` below
   ``pipeline.depth``, so for ``k <= depth`` a smaller ``k`` returns a prefix of a larger one.
2. :class:`~memories_core.retrieval.fusion.Fusion` puts the rankings on one score scale
   (a single active source passes through with its own scores).
3. Each :class:`Reranker` rewrites the ranking; it may load records through the context
   (cached, so the load stage reuses them). ``request.now`` is always set here.
4. The ranked ids are loaded; records of another user, or that no longer match the filter
   (a stale index), are dropped; the first ``k`` are returned.
5. ``on_recalled(hits, now)`` lets a mechanism reinforce what was recalled (e.g. raise
   ``strength`` and set ``last_recalled_at``, MemoryBank §3.3).

Ties are broken by first-seen order everywhere, so a fixed store gives a fixed result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from memories_core.clock import resolve_now
from memories_core.errors import ConfigurationError, check_count
from memories_core.filters import compile_filter, record_getter
from memories_core.retrieval.base import (
    DEFAULT_DEPTH,
    CandidateSource,
    DenseSource,
    LexicalSource,
    OnRecalled,
    RecallBackend,
    RecallContext,
    RecallRequest,
    Reranker,
    Where,
    filters_match,
)
from memories_core.retrieval.context import ContextSpreading
from memories_core.retrieval.entity import DEFAULT_ENTITY_WEIGHT, EntityBoost
from memories_core.retrieval.fusion import Fusion, Ranking
from memories_core.retrieval.temporal import DEFAULT_TEMPORAL_WEIGHT, TemporalBoost
from memories_core.types import MemoryRecord, ScoredRecord

__all__ = [
    "DEFAULT_DEPTH",
    "CandidateSource",
    "DenseSource",
    "LexicalSource",
    "OnRecalled",
    "Pipeline",
    "RecallBackend",
    "RecallContext",
    "RecallRequest",
    "Reranker",
    "Where",
    "filters_match",
    "hybrid_rerankers",
]


def _default_sources() -> tuple[CandidateSource, ...]:
    return (DenseSource(), LexicalSource())


def hybrid_rerankers(
    context: ContextSpreading | None,
    *,
    temporal_weight: float = DEFAULT_TEMPORAL_WEIGHT,
    entity_weight: float = DEFAULT_ENTITY_WEIGHT,
) -> tuple[Reranker, ...]:
    """The hybrid search's rerankers: context spreading, then each boost weighted above 0.

    :class:`~memories_core.retrieval.hybrid.FusionConfig` builds its pipeline with this,
    so the engine and ``Pipeline()`` agree on the order and the defaults.

    Args:
        context: Context spreading (``None``: none).
        temporal_weight: :class:`~memories_core.retrieval.temporal.TemporalBoost`'s weight.
        entity_weight: :class:`~memories_core.retrieval.entity.EntityBoost`'s name weight.
    """
    rerankers: tuple[Reranker, ...] = () if context is None else (context,)
    if temporal_weight > 0:
        rerankers += (TemporalBoost(weight=temporal_weight),)
    if entity_weight > 0:
        rerankers += (EntityBoost(name_weight=entity_weight),)
    return rerankers


def _default_rerankers() -> tuple[Reranker, ...]:
    # The engine's default: context spreading plus the query-side boosts whose
    # cross-validated weights are above 0.
    return hybrid_rerankers(ContextSpreading())


@dataclass(frozen=True)
class Pipeline:
    """Candidate sources -> fusion -> rerankers -> load -> ``on_recalled``.

    Key init args:
        sources: Candidate sources, fused with their ``weight``.
        fusion: How the sources' rankings are fused.
        rerankers: Applied in order to the fused ranking.
        depth: Candidates per source (``max(depth, k)``); see the module docstring.
        on_recalled: Hook called as ``on_recalled(hits, now)`` after a non-empty recall.

    Instantiate:
        .. code-block:: python

            Pipeline()                                           # dense + BM25, context
            Pipeline(sources=(DenseSource(),), rerankers=())     # plain vector search
            dataclasses.replace(pipeline, rerankers=(*pipeline.rerankers, Recency()))

    Invoke:
        .. code-block:: python

            hits = pipeline.run(RecallRequest(query, user_id="alice", k=5), backend)
            hits = await pipeline.arun(request, backend)
    """

    sources: tuple[CandidateSource, ...] = field(default_factory=_default_sources)
    fusion: Fusion = field(default_factory=Fusion)
    rerankers: tuple[Reranker, ...] = field(default_factory=_default_rerankers)
    depth: int = DEFAULT_DEPTH
    on_recalled: OnRecalled | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", tuple(self.sources))
        object.__setattr__(self, "rerankers", tuple(self.rerankers))
        if not self.sources:
            raise ConfigurationError("a pipeline needs at least one candidate source")
        for source in self.sources:
            weight = getattr(source, "weight", None)
            if not isinstance(weight, (int, float)) or not 0 <= weight < float("inf"):
                raise ConfigurationError(f"source {source!r} needs a finite weight >= 0")
        if all(source.weight == 0 for source in self.sources):
            raise ConfigurationError("every candidate source has weight 0")
        object.__setattr__(self, "depth", check_count("depth", self.depth))

    def _offering(self, method: str) -> list[Callable[..., Any]]:
        """The bound ``method`` of every source and reranker that has one."""
        found = (getattr(stage, method, None) for stage in (*self.sources, *self.rerankers))
        return [call for call in found if callable(call)]

    def forget_user(self, user_id: str) -> None:
        """Drop what any stage keeps of ``user_id`` between recalls.

        A source or reranker that caches per user (e.g. the token vectors of
        :class:`~memories_core.retrieval.late_interaction.LateInteractionReranker`) offers
        ``forget_user(user_id)``; a mechanism's ``delete_user`` and ``clear`` call this.
        """
        for forget in self._offering("forget_user"):
            forget(user_id)

    def prefetch(
        self,
        backend: RecallBackend,
        user_id: str,
        records: Sequence[MemoryRecord],
        *,
        progress: bool = False,
    ) -> int:
        """Let every stage that caches per record prepare ``user_id``'s ``records``.

        A stage offers ``prefetch(backend, user_id, records, progress=...)`` returning how
        many records it prepared (e.g. the token vectors of
        :class:`~memories_core.retrieval.late_interaction.LateInteractionReranker`);
        :meth:`MemoryEngine.prefetch <memories_core.engine.MemoryEngine.prefetch>` calls
        this with all of a user's records, already loaded. Returns the sum over stages.
        """
        return sum(
            int(prepare(backend, user_id, records, progress=progress))
            for prepare in self._offering("prefetch")
        )

    def candidate_depth(self, k: int, request: RecallRequest | None = None) -> int:
        """How many candidates each source fetches for ``k`` results.

        With ``request``, a reranker's ``depth_for(request)`` counts too (see
        :class:`~memories_core.retrieval.base.Reranker`): a stage that needs a deep pool
        asks for it only on the requests it acts on.
        """
        depth = max(self.depth, k)
        if request is not None:
            for need in self._offering("depth_for"):
                depth = max(depth, int(need(request)))
        return depth

    def rank(self, request: RecallRequest, backend: RecallBackend) -> tuple[Ranking, RecallContext]:
        """Run sources, fusion and rerankers; return the ranking and the run's context.

        A request without ``now`` is given the backend's clock time (the engine's injected
        clock), once, so every stage and ``on_recalled`` see the same instant; the wall clock
        only for a backend without a ``clock``.
        """
        if request.now is None:
            request = replace(request, now=resolve_now(None, getattr(backend, "clock", None)))
        ctx = RecallContext(request, backend)
        for stage in self.rerankers:  # query-only work overlaps the sources (Reranker docs)
            begin = getattr(stage, "begin", None)
            if callable(begin):
                begin(request, ctx)
        depth = self.candidate_depth(request.k, request)
        active = [source for source in self.sources if source.weight > 0]
        rankings = [source.candidates(request, ctx, depth) for source in active]
        for source, found in zip(active, rankings, strict=True):
            if isinstance(source, DenseSource):  # its scores are cosines (best first)
                for item, score in found:
                    ctx.similarity.setdefault(item, float(score))
        ranked: Ranking
        if len(active) == 1:
            # One source: its own scores; a duplicate id keeps its first (best) score.
            best: dict[str, float] = {}
            for item, score in rankings[0]:
                best.setdefault(item, float(score))
            ranked = sorted(best.items(), key=lambda pair: -pair[1])
        else:
            weights = [source.weight for source in active]
            ranked = self.fusion.fuse(rankings, weights, depth=depth)
        for reranker in self.rerankers:
            ranked = reranker.rerank(ranked, request, ctx)
        return ranked, ctx

    def run(
        self, request: RecallRequest, backend: RecallBackend, *, limit: int | None = None
    ) -> list[ScoredRecord]:
        """Return ``request.k`` records that best match, best first (then call the hook).

        Args:
            request: The recall.
            backend: Where the records are.
            limit: Return up to this many records of the same ranking instead of ``k``
                (the candidates are still those of ``k``, so the first ``k`` results do not
                change; the engine reads a little past ``k`` to drop archived records).
        """
        ranked, ctx = self.rank(request, backend)
        hits = _load(ranked, ctx, request.k if limit is None else limit)
        if hits and self.on_recalled is not None:
            now = ctx.request.now
            assert now is not None  # set by rank()
            self.on_recalled(hits, now)
        return hits

    async def arun(self, request: RecallRequest, backend: RecallBackend) -> list[ScoredRecord]:
        """Async :meth:`run` (in a worker thread until backends are natively async)."""
        return await asyncio.to_thread(self.run, request, backend)


def _load(ranked: Ranking, ctx: RecallContext, k: int) -> list[ScoredRecord]:
    """Load ranked ids in order; drop unknown, foreign and no-longer-matching records."""
    request = ctx.request
    expr = compile_filter(request.filter)  # once per recall (filters_match compiles per call)
    hits: list[ScoredRecord] = []
    ids = list(dict.fromkeys(item for item, _ in ranked))
    scores = dict(reversed(ranked))  # the first (best) score of a duplicate id wins
    # The best candidates usually suffice; a stale index must not shrink the result below k.
    first = max(2 * k, k + 10)
    for chunk in (ids[:first], ids[first:]):
        if len(hits) >= k or not chunk:
            break
        records = ctx.load(chunk, user_id=request.user_id)
        hits += [
            ScoredRecord(
                record=records[item],
                score=float(scores[item]),
                similarity=ctx.similarity.get(item),
            )
            for item in chunk
            if item in records and (expr is None or expr.matches(record_getter(records[item])))
        ]
    return hits[:k]
