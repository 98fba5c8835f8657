"""Rerankers that rewrite a fused ranking: time decay, recency, MMR, a cross-encoder.

(Context spreading lives in :mod:`memories_core.retrieval.context`.) Every reranker reads
``request.now`` for time, never the wall clock, so a recall is reproducible, and keeps ties
in their incoming order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from memories_core.errors import ConfigurationError
from memories_core.retrieval.base import RecallContext, RecallRequest
from memories_core.retrieval.fusion import Ranking
from memories_core.types import MemoryRecord

__all__ = [
    "MMR",
    "AgeFactor",
    "CrossEncoderReranker",
    "Recency",
    "TimeDecay",
    "VectorLookup",
    "forgetting_curve",
    "half_life_decay",
]

#: Maps a record and ``now`` to a retention factor in ``[0, 1]`` (1 = fully kept).
AgeFactor = Callable[[MemoryRecord, datetime], float]


def half_life_decay(half_life: timedelta) -> AgeFactor:
    """``0.5 ** (age / half_life)`` with ``age = now - created_at`` (0 for future records)."""
    if half_life <= timedelta(0):
        raise ConfigurationError("half_life must be > 0")

    def factor(record: MemoryRecord, now: datetime) -> float:
        age = max((now - record.created_at) / half_life, 0.0)
        return float(0.5**age)

    return factor


def forgetting_curve(unit: timedelta = timedelta(days=1)) -> AgeFactor:
    """Ebbinghaus retention ``R = exp(-t / S)`` as used by MemoryBank (Zhong et al., 2024, §3.3).

    ``t`` is the time since the record was last recalled (else since it was formed), in
    ``unit``; ``S`` is the record's ``state.strength`` (default 1.0), which a mechanism
    raises in its ``on_recalled`` hook. Records without a ``state`` use strength 1.
    """
    if unit <= timedelta(0):
        raise ConfigurationError("unit must be > 0")

    def factor(record: MemoryRecord, now: datetime) -> float:
        state = getattr(record, "state", None)
        strength = float(getattr(state, "strength", 1.0) or 0.0)
        since = getattr(state, "last_recalled_at", None) or record.created_at
        t = max((now - since) / unit, 0.0)
        return math.exp(-t / strength) if strength > 0 else 0.0

    return factor


def _factors(
    ranking: Ranking, request: RecallRequest, ctx: RecallContext, factor: AgeFactor
) -> list[float]:
    now = request.now
    assert now is not None  # the pipeline sets it
    records = ctx.load([item for item, _ in ranking], user_id=request.user_id)
    # An id that cannot be loaded is dropped by the load stage anyway; it keeps nothing.
    return [
        min(max(factor(records[item], now), 0.0), 1.0) if item in records else 0.0
        for item, _ in ranking
    ]


def _sorted(items: dict[str, float]) -> list[tuple[str, float]]:
    order = {item: i for i, item in enumerate(items)}
    return sorted(items.items(), key=lambda pair: (-pair[1], order[pair[0]]))


@dataclass(frozen=True)
class TimeDecay:
    """Reranker: scale relevance by a retention factor of the record's age.

    ``score' = (score - min score) * ((1 - weight) + weight * factor(record, now))``; the
    shift makes every relevance >= 0, so decay never turns a bad score into a good one.
    The factor is ``0.5 ** (age / half_life)`` by default; pass ``factor`` to plug in
    another curve, e.g. :func:`forgetting_curve` (MemoryBank's ``exp(-t/S)`` from the
    record state ``strength`` and ``last_recalled_at``).

    Cost: loads every candidate (cached for the load stage).

    Attributes:
        half_life: Age at which the factor is 0.5 (ignored when ``factor`` is given).
        weight: 1 = pure multiplication; 0 = off.
        factor: Custom retention function ``(record, now) -> [0, 1]``.
    """

    half_life: timedelta = timedelta(days=30)
    weight: float = 1.0
    factor: AgeFactor | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.weight <= 1:
            raise ConfigurationError("weight must be in [0, 1]")
        if self.factor is None and self.half_life <= timedelta(0):
            raise ConfigurationError("half_life must be > 0")

    def _factor(self) -> AgeFactor:
        return self.factor if self.factor is not None else half_life_decay(self.half_life)

    def rerank(
        self, ranking: Ranking, request: RecallRequest, ctx: RecallContext
    ) -> list[tuple[str, float]]:
        """Return the decayed ranking."""
        if not ranking:
            return []
        floor = min(float(score) for _, score in ranking)
        factors = _factors(ranking, request, ctx, self._factor())
        scaled: dict[str, float] = {}
        for (item, score), f in zip(ranking, factors, strict=True):
            scaled.setdefault(item, (float(score) - floor) * (1 - self.weight + self.weight * f))
        return _sorted(scaled)


@dataclass(frozen=True)
class Recency:
    """Reranker: add a recency term to relevance (Park et al., 2023, §4.1 "Retrieval").

    Relevance is min-max normalised to ``[0, 1]`` over the candidates, then
    ``score' = (1 - weight) * relevance + weight * 0.5 ** (age / half_life)``. Generative
    Agents weight the two equally and decay by 0.995 per hour (a half-life of ~138 hours);
    those are the defaults. ``factor`` replaces the decay curve as in :class:`TimeDecay`.
    """

    half_life: timedelta = timedelta(hours=138)
    weight: float = 0.5
    factor: AgeFactor | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.weight <= 1:
            raise ConfigurationError("weight must be in [0, 1]")
        if self.factor is None and self.half_life <= timedelta(0):
            raise ConfigurationError("half_life must be > 0")

    def rerank(
        self, ranking: Ranking, request: RecallRequest, ctx: RecallContext
    ) -> list[tuple[str, float]]:
        """Return the ranking by relevance plus recency."""
        if not ranking:
            return []
        scores = [float(score) for _, score in ranking]
        low, high = min(scores), max(scores)
        span = high - low
        factor = self.factor if self.factor is not None else half_life_decay(self.half_life)
        factors = _factors(ranking, request, ctx, factor)
        mixed: dict[str, float] = {}
        for (item, score), f in zip(ranking, factors, strict=True):
            relevance = (float(score) - low) / span if span > 0 else 1.0
            mixed.setdefault(item, (1 - self.weight) * relevance + self.weight * f)
        return _sorted(mixed)


@runtime_checkable
class VectorLookup(Protocol):
    """Optional backend method: the stored embeddings of records (used by :class:`MMR`)."""

    def vectors(self, ids: Sequence[str], *, user_id: str) -> dict[str, npt.NDArray[np.float32]]:
        """Unit-length embeddings of the records of ``user_id`` among ``ids``."""
        ...


@dataclass(frozen=True)
class MMR:
    """Reranker: maximal marginal relevance (Carbonell & Goldstein, 1998) for diversity.

    The best ``depth`` candidates are re-ordered greedily: each step takes the candidate
    maximising ``lambda_ * relevance - (1 - lambda_) * max cosine to those already taken``
    (relevance min-max normalised to ``[0, 1]``). The rest keep their order below them.
    Scores of the re-ordered block become ``rest's best + (depth - position)``; only the
    order is meaningful.

    Cost: embeddings of ``depth`` records (from the backend's stored vectors when it has
    ``vectors``, else ``embed(texts)`` re-embeds them: one embedder call per recall) and
    ``O(depth**2 * dimension)`` arithmetic; 20 x 384 is well under a millisecond, while
    re-embedding 20 texts with a local model costs tens of milliseconds.

    Attributes:
        lambda_: Trade-off; 1 = relevance only, 0 = diversity only.
        depth: Candidates re-ordered.
        embed: Fallback embedding function for backends without ``vectors``.
    """

    lambda_: float = 0.7
    depth: int = 20
    embed: Callable[[Sequence[str]], npt.NDArray[np.float32]] | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.lambda_ <= 1:
            raise ConfigurationError("lambda_ must be in [0, 1]")
        if self.depth < 1:
            raise ConfigurationError("depth must be >= 1")

    def _vectors(self, ids: list[str], ctx: RecallContext) -> dict[str, npt.NDArray[np.float32]]:
        user_id = ctx.request.user_id
        if isinstance(ctx.backend, VectorLookup):
            return ctx.backend.vectors(ids, user_id=user_id)
        if self.embed is None:
            raise ConfigurationError(
                "MMR needs stored vectors (a backend with .vectors) or an embed function"
            )
        records = ctx.load(ids, user_id=user_id)
        known = [item for item in ids if item in records]
        if not known:
            return {}
        matrix = np.asarray(self.embed([records[item].text for item in known]), np.float32)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        matrix = (matrix / np.where(norms > 0, norms, 1.0)).astype(np.float32)
        return dict(zip(known, matrix, strict=True))

    def rerank(
        self, ranking: Ranking, request: RecallRequest, ctx: RecallContext
    ) -> list[tuple[str, float]]:
        """Return the ranking with its head re-ordered for diversity."""
        items = list(dict.fromkeys(item for item, _ in ranking))
        scores = dict(reversed(ranking))
        head, rest = items[: self.depth], items[self.depth :]
        if len(head) < 2:
            return [(item, float(scores[item])) for item in items]
        vectors = self._vectors(head, ctx)
        relevance = np.array([float(scores[item]) for item in head])
        span = float(relevance.max() - relevance.min())
        relevance = (relevance - relevance.min()) / span if span > 0 else np.ones(len(head))
        dim = next(iter(vectors.values())).shape[0] if vectors else 1
        matrix = np.stack([vectors.get(item, np.zeros(dim, np.float32)) for item in head])
        similarity = matrix @ matrix.T
        chosen: list[int] = []
        closest = np.full(len(head), -np.inf)
        remaining = list(range(len(head)))
        while remaining:
            penalty = np.where(np.isfinite(closest), closest, 0.0)
            value = self.lambda_ * relevance - (1 - self.lambda_) * penalty
            best = max(remaining, key=lambda i: (value[i], -i))
            chosen.append(best)
            remaining.remove(best)
            closest = np.maximum(closest, similarity[best])
        top = max((float(scores[item]) for item in rest), default=0.0)
        ordered = [(head[i], top + len(head) - pos) for pos, i in enumerate(chosen)]
        return ordered + [(item, float(scores[item])) for item in rest]


#: Scores ``(query, texts)`` pairs, higher = more relevant (e.g. a cross-encoder model).
PairScorer = Callable[[str, Sequence[str]], Sequence[float]]


@dataclass(frozen=True)
class CrossEncoderReranker:
    """Reranker seam: re-score the best ``depth`` candidates with a pair scorer.

    ``score(query, texts)`` returns one relevance per text, e.g. a sentence-transformers
    ``CrossEncoder.predict`` over ``[(query, text), ...]``; no model ships with the library.
    The re-scored block takes the scorer's values; the rest keep their order below it.

    Attributes:
        score: The pair scorer.
        depth: Candidates re-scored (one scorer call with this many texts per recall).
    """

    score: PairScorer
    depth: int = 20

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ConfigurationError("depth must be >= 1")

    def rerank(
        self, ranking: Ranking, request: RecallRequest, ctx: RecallContext
    ) -> list[tuple[str, float]]:
        """Return the ranking with its head re-scored."""
        items = list(dict.fromkeys(item for item, _ in ranking))
        scores = dict(reversed(ranking))
        records = ctx.load(items[: self.depth], user_id=request.user_id)
        head = [item for item in items[: self.depth] if item in records]
        if not head:
            return [(item, float(scores[item])) for item in items]
        values = [float(v) for v in self.score(request.query, [records[i].text for i in head])]
        if len(values) != len(head):
            raise ConfigurationError(f"scorer returned {len(values)} scores for {len(head)}")
        rescored = _sorted(dict(zip(head, values, strict=True)))
        rest = [item for item in items if item not in set(head)]
        if not rest:
            return rescored
        # Shift the rest below the re-scored block, keeping their order and spacing.
        shift = min(values) - 1.0 - max(float(scores[item]) for item in rest)
        return rescored + [(item, float(scores[item]) + shift) for item in rest]
