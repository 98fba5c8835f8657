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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from memories_core.clock import resolve_now
from memories_core.errors import ConfigurationError, InvalidInputError
from memories_core.retrieval.fusion import Fusion, Ranking
from memories_core.types import MemoryRecord, ScoredRecord, check_user_id, ensure_utc

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
]

#: A filter as the pipeline passes it on (the filter language of ``memories_core.filters``).
Where = Mapping[str, Any]

#: Candidates each source fetches (at least ``k``). Fixed, so that ``k`` does not change
#: the fusion statistics and a smaller ``k`` returns a prefix of a larger one.
DEFAULT_DEPTH = 50

#: Called with the returned hits and the request's ``now`` after every non-empty recall.
OnRecalled = Callable[[Sequence[ScoredRecord], datetime], None]


@dataclass(frozen=True)
class RecallRequest:
    """One recall.

    Attributes:
        query: Free text; must not be empty.
        user_id: Owner; only this user's records can come back.
        k: Number of results, >= 1.
        where: Filter on record fields or metadata (``memories_core.filters`` language).
        now: The time recency and decay are measured against; ``None`` means "now" (the
            pipeline fills it in once, so every stage sees the same instant).
        kinds: Record kinds to search, all on one score scale; ``None`` means every kind.
            Cannot be combined with a ``kind`` key in ``where``.
    """

    query: str
    user_id: str
    k: int
    where: Where | None = None
    now: datetime | None = None
    kinds: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.query, str) or not self.query.strip():
            raise InvalidInputError("query is empty or only whitespace")
        check_user_id(self.user_id)
        if isinstance(self.k, bool) or not isinstance(self.k, int) or self.k < 1:
            raise InvalidInputError(f"k must be an int >= 1, got {self.k!r}")
        if self.now is not None:
            object.__setattr__(self, "now", ensure_utc(self.now))
        if self.kinds is not None:
            kinds = (self.kinds,) if isinstance(self.kinds, str) else tuple(self.kinds)
            if not kinds or not all(isinstance(kind, str) and kind for kind in kinds):
                raise InvalidInputError("kinds must be a non-empty list of kind names")
            if self.where and "kind" in self.where:
                raise InvalidInputError("give kinds or a 'kind' filter, not both")
            object.__setattr__(self, "kinds", tuple(dict.fromkeys(kinds)))

    @property
    def filter(self) -> Where | None:
        """``where`` with the ``kinds`` restriction added (what the backend receives)."""
        if self.kinds is None:
            return self.where
        kind: Any = self.kinds[0] if len(self.kinds) == 1 else {"$in": list(self.kinds)}
        return {**(self.where or {}), "kind": kind}


@runtime_checkable
class RecallBackend(Protocol):
    """What the pipeline needs from storage; the engine implements it.

    Every method is restricted to ``user_id`` inside the backend's own query. Rankings are
    ``(id, score)`` lists, best first, higher = better, at most ``depth`` long; equal scores
    in a stable order (e.g. storage order).
    """

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """The query's embedding."""
        ...

    def dense(
        self, vector: npt.NDArray[np.float32], *, user_id: str, depth: int, where: Where | None
    ) -> Ranking:
        """Nearest records by cosine similarity to ``vector``."""
        ...

    def lexical(self, query: str, *, user_id: str, depth: int, where: Where | None) -> Ranking:
        """Best records by BM25 (score = negated FTS5 ``bm25()``, higher = better)."""
        ...

    def load(self, ids: Sequence[str], *, user_id: str) -> dict[str, MemoryRecord]:
        """The records of ``user_id`` among ``ids`` (unknown ids are left out)."""
        ...

    def adjacent(
        self, ids: Sequence[str], *, user_id: str, gap: timedelta | None
    ) -> dict[str, tuple[str | None, str | None]]:
        """Each record's ``(previous id, next id)`` by the rule of ``context.linked``."""
        ...


class CandidateSource(Protocol):
    """A source of candidates (dense, lexical, a graph walk, an LLM choosing options).

    Attributes:
        name: Short label (used in reports).
        weight: Weight in fusion; a source with weight 0 is not queried.
    """

    @property
    def name(self) -> str:
        """Short label."""
        ...

    @property
    def weight(self) -> float:
        """Fusion weight (>= 0)."""
        ...

    def candidates(self, request: RecallRequest, backend: RecallBackend, depth: int) -> Ranking:
        """Up to ``depth`` ``(id, score)`` pairs for ``request``, best first."""
        ...


class Reranker(Protocol):
    """A stage that rewrites the fused ranking (may add ids, e.g. neighbours)."""

    def rerank(self, ranking: Ranking, request: RecallRequest, ctx: RecallContext) -> Ranking:
        """Return the new ranking, best first."""
        ...


@dataclass(frozen=True)
class DenseSource:
    """Candidates by embedding similarity (cosine), through ``backend.dense``."""

    weight: float = 0.35
    name: str = "dense"

    def candidates(self, request: RecallRequest, backend: RecallBackend, depth: int) -> Ranking:
        """Embed the query and return the nearest records."""
        vector = backend.embed_query(request.query)
        return backend.dense(vector, user_id=request.user_id, depth=depth, where=request.filter)


@dataclass(frozen=True)
class LexicalSource:
    """Candidates by BM25 over the records' text, through ``backend.lexical``.

    The default weights (lexical 0.65 over dense 0.35) were measured on LoCoMo, where the
    small embedding model is the weaker signal on dialogue memories (BENCHMARKS.md).
    """

    weight: float = 0.65
    name: str = "lexical"

    def candidates(self, request: RecallRequest, backend: RecallBackend, depth: int) -> Ranking:
        """Return the best BM25 matches."""
        return backend.lexical(
            request.query, user_id=request.user_id, depth=depth, where=request.filter
        )


class RecallContext:
    """One run's view of the backend: caches the query vector and loaded records.

    It implements :class:`RecallBackend` itself (sources receive it as their backend), so
    a record loaded by a reranker is not loaded again by the load stage.

    Attributes:
        request: The request being served (``now`` filled in).
        backend: The underlying backend.
    """

    def __init__(self, request: RecallRequest, backend: RecallBackend) -> None:
        self.request = request
        self.backend = backend
        self._vectors: dict[str, npt.NDArray[np.float32]] = {}
        self._records: dict[str, MemoryRecord | None] = {}
        #: Record id -> cosine of the query, for the records the dense source returned.
        self.similarity: dict[str, float] = {}

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """The query's embedding (computed once per text)."""
        if text not in self._vectors:
            self._vectors[text] = self.backend.embed_query(text)
        return self._vectors[text]

    def query_vector(self) -> npt.NDArray[np.float32]:
        """The embedding of the request's query."""
        return self.embed_query(self.request.query)

    def dense(
        self, vector: npt.NDArray[np.float32], *, user_id: str, depth: int, where: Where | None
    ) -> Ranking:
        """Forwarded to the backend."""
        return self.backend.dense(vector, user_id=user_id, depth=depth, where=where)

    def lexical(self, query: str, *, user_id: str, depth: int, where: Where | None) -> Ranking:
        """Forwarded to the backend."""
        return self.backend.lexical(query, user_id=user_id, depth=depth, where=where)

    def remember(self, records: Iterable[MemoryRecord]) -> None:
        """Take records already loaded for this run's user; :meth:`load` then reads them here.

        Records of another user are ignored.
        """
        for record in records:
            if record.user_id == self.request.user_id:
                self._records[record.id] = record

    def load(self, ids: Sequence[str], *, user_id: str) -> dict[str, MemoryRecord]:
        """Records of ``ids`` (cached; ids the backend did not return stay unknown)."""
        if user_id != self.request.user_id:
            raise InvalidInputError("a recall context serves one user")
        missing = [item for item in dict.fromkeys(ids) if item not in self._records]
        if missing:
            found = self.backend.load(missing, user_id=user_id)
            for item in missing:
                record = found.get(item)
                # Defence in depth: a record of another user is treated as unknown.
                self._records[item] = record if record and record.user_id == user_id else None
        return {item: r for item in ids if (r := self._records.get(item)) is not None}

    def adjacent(
        self, ids: Sequence[str], *, user_id: str, gap: timedelta | None
    ) -> dict[str, tuple[str | None, str | None]]:
        """Forwarded to the backend."""
        return self.backend.adjacent(ids, user_id=user_id, gap=gap)


def filters_match(record: MemoryRecord, where: Where | None) -> bool:
    """Whether a loaded record satisfies ``where`` (re-checked: an index may be stale).

    The one place the pipeline evaluates a filter in Python, with the evaluator of
    :mod:`memories_core.filters` (the same semantics as every backend's translation).
    """
    from memories_core.filters import compile_filter, record_getter

    expr = compile_filter(where)
    return expr is None or expr.matches(record_getter(record))


def _default_sources() -> tuple[CandidateSource, ...]:
    return (DenseSource(), LexicalSource())


def _default_rerankers() -> tuple[Reranker, ...]:
    # The engine's default (FusionConfig): context spreading plus the query-side boosts
    # whose cross-validated weights are above 0.
    from memories_core.retrieval.hybrid import FusionConfig

    return FusionConfig().pipeline().rerankers


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
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise ConfigurationError("depth must be an int >= 1")

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

    def candidate_depth(self, k: int) -> int:
        """How many candidates each source fetches for ``k`` results."""
        return max(self.depth, k)

    def rank(self, request: RecallRequest, backend: RecallBackend) -> tuple[Ranking, RecallContext]:
        """Run sources, fusion and rerankers; return the ranking and the run's context.

        A request without ``now`` is given the backend's clock time (the engine's injected
        clock), once, so every stage and ``on_recalled`` see the same instant; the wall clock
        only for a backend without a ``clock``.
        """
        if request.now is None:
            request = replace(request, now=resolve_now(None, getattr(backend, "clock", None)))
        ctx = RecallContext(request, backend)
        depth = self.candidate_depth(request.k)
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
    from memories_core.filters import compile_filter, record_getter

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
