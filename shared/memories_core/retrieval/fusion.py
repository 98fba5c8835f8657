"""Fusion: several ranked candidate lists into one ranking on one score scale.

Two rules: weighted z-score fusion (:func:`zscore_fuse`, the default) and weighted
reciprocal rank fusion (:func:`rrf_fuse`, Cormack et al., 2009). :class:`Fusion` is the
pipeline stage that picks one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from memories_core.errors import ConfigurationError, InvalidInputError, check_count

__all__ = [
    "DEFAULT_EXHAUSTED_MARGIN",
    "DEFAULT_MISSING_MARGIN",
    "Fusion",
    "Ranking",
    "rrf_fuse",
    "zscore_fuse",
]

#: One ranked list of ``(id, score)`` pairs, best first, higher score = better.
Ranking = Sequence[tuple[str, float]]

#: How far below a full ranking's weakest candidate (in standard deviations) an item the
#: ranking did not return is placed by :func:`zscore_fuse`. On LoCoMo dev (BENCHMARKS.md,
#: "Retrieval pipeline") R@5 is 0.661 / 0.653 / 0.639 / 0.634 for 0.5 / 1 / 2 / 3: a deep
#: ranking's cut-off says little, so a miss is only a little worse than the weakest hit.
DEFAULT_MISSING_MARGIN = 0.5

#: The same gap for a ranking that returned fewer than ``depth`` candidates: the source ran
#: out of matches, so an unreturned item does not match at all. 2 makes the only lexical hit
#: for a rare word rank first in 200 of 200 exact-token recalls (0.5 misses 6-8, the old
#: rule, a gap of 0, missed 17-21).
DEFAULT_EXHAUSTED_MARGIN = 2.0


def zscore_fuse(
    rankings: Sequence[Ranking],
    weights: Sequence[float],
    *,
    missing_margin: float = DEFAULT_MISSING_MARGIN,
    depth: int | None = None,
    exhausted_margin: float = DEFAULT_EXHAUSTED_MARGIN,
) -> list[tuple[str, float]]:
    """Fuse rankings by weighted sums of standardised scores.

    Each ranking's scores are turned into z-scores (``(score - mean) / std`` over that
    ranking's candidates), which puts cosine similarities and unbounded BM25 scores on one
    scale. An item a ranking did not return was not among its candidates, so it is placed
    ``missing_margin`` standard deviations *below* the ranking's weakest candidate, or
    ``exhausted_margin`` below it when the ranking is shorter than ``depth`` (the source had
    no more matches). A ranking whose scores are all equal (one hit, say) gives its items
    z = 0 and misses a negative value: being returned is evidence. (Placing misses *at* the
    weakest candidate, as before, gave the only lexical hit for a rare word no credit at
    all, so it could rank last.) An empty ranking contributes nothing.

    Args:
        rankings: Ranked ``(id, score)`` lists, higher score = better.
        weights: One weight per ranking.
        missing_margin: Gap between the weakest candidate and an unreturned item, in
            standard deviations; must be > 0.
        depth: How many candidates each ranking was asked for; ``None``: unknown (every
            ranking counts as full).
        exhausted_margin: The gap for a ranking shorter than ``depth``; must be > 0.

    Returns:
        ``(id, fused score)`` pairs, best first; ties keep first-seen order.

    Raises:
        InvalidInputError: if the numbers of rankings and weights differ, or a margin is
            not > 0.
    """
    if len(rankings) != len(weights):
        raise InvalidInputError(f"{len(rankings)} rankings but {len(weights)} weights")
    if not (missing_margin > 0 and exhausted_margin > 0):
        raise InvalidInputError("missing_margin and exhausted_margin must be > 0")
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
        full = depth is None or len(ranking) >= depth
        margin = missing_margin if full else exhausted_margin
        standardised.append((z, min(z.values()) - margin, float(weight)))
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


@dataclass(frozen=True)
class Fusion:
    """The fusion stage of a :class:`~memories_core.retrieval.Pipeline`.

    Attributes:
        method: ``"zscore"`` (:func:`zscore_fuse`) or ``"rrf"`` (:func:`rrf_fuse`).
        missing_margin: z-score only: where unreturned items sit below the weakest candidate.
        exhausted_margin: z-score only: the same for a ranking shorter than the depth.
        rrf_k: RRF only: the rank offset (60 in Cormack et al., 2009).
    """

    method: Literal["zscore", "rrf"] = "zscore"
    missing_margin: float = DEFAULT_MISSING_MARGIN
    exhausted_margin: float = DEFAULT_EXHAUSTED_MARGIN
    rrf_k: int = 60

    def __post_init__(self) -> None:
        if self.method not in ("zscore", "rrf"):
            raise ConfigurationError(f"unknown fusion method {self.method!r}")
        for margin in (self.missing_margin, self.exhausted_margin):
            if not (isinstance(margin, (int, float)) and margin > 0):
                raise ConfigurationError("missing_margin and exhausted_margin must be > 0")
        object.__setattr__(self, "rrf_k", check_count("rrf_k", self.rrf_k, minimum=0))

    def fuse(
        self, rankings: Sequence[Ranking], weights: Sequence[float], *, depth: int | None = None
    ) -> list[tuple[str, float]]:
        """Fuse ``rankings`` (one weight each, asked for ``depth`` items) into one ranking."""
        if self.method == "rrf":
            return rrf_fuse(rankings, weights, k=self.rrf_k)
        return zscore_fuse(
            rankings,
            weights,
            missing_margin=self.missing_margin,
            depth=depth,
            exhausted_margin=self.exhausted_margin,
        )
