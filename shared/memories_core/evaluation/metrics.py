"""Retrieval metrics over ranked id lists (pure functions, no dependencies).

Each metric takes the ranked ids a system returned (best first) and the set of relevant
ids, and returns a number in ``[0, 1]``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence

__all__ = ["hit_at_k", "mean", "mrr", "ndcg_at_k", "precision_at_k", "recall_at_k"]


def _check_k(k: int) -> None:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")


def recall_at_k(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Fraction of the relevant ids found among the first ``k`` ranked ids.

    Raises:
        ValueError: if ``relevant`` is empty (recall is undefined) or ``k < 1``.
    """
    _check_k(k)
    wanted = set(relevant)
    if not wanted:
        raise ValueError("recall is undefined without relevant ids")
    return len(wanted.intersection(ranked[:k])) / len(wanted)


def precision_at_k(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Fraction of the first ``k`` positions that hold a relevant id (``k`` is the divisor)."""
    _check_k(k)
    wanted = set(relevant)
    return sum(1 for item in ranked[:k] if item in wanted) / k


def hit_at_k(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """1.0 if any relevant id is among the first ``k`` ranked ids, else 0.0."""
    _check_k(k)
    wanted = set(relevant)
    return 1.0 if any(item in wanted for item in ranked[:k]) else 0.0


def mrr(ranked: Sequence[str], relevant: Collection[str]) -> float:
    """Reciprocal rank of the first relevant id (0.0 if none is ranked)."""
    wanted = set(relevant)
    for position, item in enumerate(ranked, start=1):
        if item in wanted:
            return 1.0 / position
    return 0.0


def ndcg_at_k(ranked: Sequence[str], relevant: Collection[str], k: int) -> float:
    """Normalised discounted cumulative gain with binary relevance.

    Raises:
        ValueError: if ``relevant`` is empty or ``k < 1``.
    """
    _check_k(k)
    wanted = set(relevant)
    if not wanted:
        raise ValueError("nDCG is undefined without relevant ids")
    gain = sum(
        1.0 / math.log2(position + 1)
        for position, item in enumerate(ranked[:k], start=1)
        if item in wanted
    )
    ideal = sum(1.0 / math.log2(position + 1) for position in range(1, min(k, len(wanted)) + 1))
    return gain / ideal


def mean(values: Iterable[float]) -> float:
    """Arithmetic mean; ``nan`` for no values (so an empty category is visible, not 0)."""
    items = list(values)
    return sum(items) / len(items) if items else math.nan
