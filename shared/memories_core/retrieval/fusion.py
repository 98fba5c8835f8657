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

from memories_core.errors import ConfigurationError, InvalidInputError

__all__ = ["DEFAULT_MISSING_MARGIN", "Fusion", "Ranking", "rrf_fuse", "zscore_fuse"]

#: One ranked list of ``(id, score)`` pairs, best first, higher score = better.
Ranking = Sequence[tuple[str, float]]

#: How far below a ranking's weakest candidate (in standard deviations) an item the ranking
#: did not return is placed by :func:`zscore_fuse`. Measured on LoCoMo dev (BENCHMARKS.md,
#: "Retrieval pipeline"): 0.5, 1 and 2 are within noise of each other; any value above 0
#: fixes defect 9 (the only lexical hit used to get the same weight as a miss).
DEFAULT_MISSING_MARGIN = 1.0


def zscore_fuse(
    rankings: Sequence[Ranking],
    weights: Sequence[float],
    *,
    missing_margin: float = DEFAULT_MISSING_MARGIN,
) -> list[tuple[str, float]]:
    """Fuse rankings by weighted sums of standardised scores.

    Each ranking's scores are turned into z-scores (``(score - mean) / std`` over that
    ranking's candidates), which puts cosine similarities and unbounded BM25 scores on one
    scale. An item a ranking did not return was not among its candidates, so it is placed
    ``missing_margin`` standard deviations *below* the ranking's weakest candidate. A ranking
    whose scores are all equal (one hit, say) gives its items z = 0 and misses
    ``-missing_margin``: being returned is evidence. (Placing misses *at* the weakest
    candidate, as before, gave the only lexical hit for a rare word no credit at all, so it
    could rank last; defect 9.) An empty ranking contributes nothing.

    Args:
        rankings: Ranked ``(id, score)`` lists, higher score = better.
        weights: One weight per ranking.
        missing_margin: Gap between the weakest candidate and an unreturned item, in
            standard deviations; must be > 0.

    Returns:
        ``(id, fused score)`` pairs, best first; ties keep first-seen order.

    Raises:
        InvalidInputError: if the numbers of rankings and weights differ, or
            ``missing_margin <= 0``.
    """
    if len(rankings) != len(weights):
        raise InvalidInputError(f"{len(rankings)} rankings but {len(weights)} weights")
    if not missing_margin > 0:
        raise InvalidInputError(f"missing_margin must be > 0, got {missing_margin!r}")
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
        standardised.append((z, min(z.values()) - missing_margin, float(weight)))
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
        rrf_k: RRF only: the rank offset (60 in Cormack et al., 2009).
    """

    method: Literal["zscore", "rrf"] = "zscore"
    missing_margin: float = DEFAULT_MISSING_MARGIN
    rrf_k: int = 60

    def __post_init__(self) -> None:
        if self.method not in ("zscore", "rrf"):
            raise ConfigurationError(f"unknown fusion method {self.method!r}")
        if not (isinstance(self.missing_margin, (int, float)) and self.missing_margin > 0):
            raise ConfigurationError("missing_margin must be a number > 0")
        if isinstance(self.rrf_k, bool) or not isinstance(self.rrf_k, int) or self.rrf_k < 0:
            raise ConfigurationError("rrf_k must be an int >= 0")

    def fuse(
        self, rankings: Sequence[Ranking], weights: Sequence[float]
    ) -> list[tuple[str, float]]:
        """Fuse ``rankings`` (one weight each) into one ranking, best first."""
        if self.method == "rrf":
            return rrf_fuse(rankings, weights, k=self.rrf_k)
        return zscore_fuse(rankings, weights, missing_margin=self.missing_margin)
