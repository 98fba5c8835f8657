"""Retrieval metrics over ranked id lists, and choosing a setting by cross-validation.

Each metric takes the ranked ids a system returned (best first) and the set of relevant
ids, and returns a number in ``[0, 1]``. :func:`leave_one_out` chooses among settings
measured on several groups (conversations, users) without scoring a choice on the data it
was made on. Pure functions, no dependencies.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

__all__ = ["hit_at_k", "leave_one_out", "mean", "mrr", "ndcg_at_k", "precision_at_k", "recall_at_k"]


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


def leave_one_out(scores: Mapping[str, Mapping[str, Sequence[float]]]) -> dict[str, Any]:
    """Choose a setting by leave-one-group-out cross-validation.

    ``scores[setting][group]`` are one setting's per-item scores (e.g. each question's F1) on
    one group (e.g. a conversation); every setting must be measured on the same groups. Each
    fold holds one group out, picks the setting with the best mean over the other groups'
    items (ties keep the first setting in ``scores``' order, so put the current default
    first) and scores that choice on the held-out group alone.

    Returns:
        ``{"folds": {group: {"chosen", "train", "held_out", "n"}}, "held_out": mean over
        every held-out item of its fold's choice, "n", "agree": whether every fold chose
        the same setting, "best_on_all": the best setting on all groups,
        "means": {setting: mean over all items}}``. With one group there are no folds
        (``held_out`` is ``nan``).

    Raises:
        ValueError: on no settings, or settings measured on different groups.
    """
    if not scores:
        raise ValueError("leave_one_out needs at least one setting")
    settings = list(scores)
    groups = list(scores[settings[0]])
    for setting in settings:
        if set(scores[setting]) != set(groups):
            raise ValueError(f"setting {setting!r} is not measured on the same groups")

    def pooled(setting: str, keep: Collection[str]) -> float:
        return mean(x for group in groups if group in keep for x in scores[setting][group])

    folds: dict[str, dict[str, Any]] = {}
    held: list[float] = []
    for out in groups if len(groups) > 1 else ():
        train = [g for g in groups if g != out]
        chosen = max(settings, key=lambda s: (_finite(pooled(s, train)), -settings.index(s)))
        values = list(scores[chosen][out])
        held += values
        folds[out] = {
            "chosen": chosen,
            "train": pooled(chosen, train),
            "held_out": mean(values),
            "n": len(values),
        }
    means = {s: pooled(s, groups) for s in settings}
    best = max(settings, key=lambda s: (_finite(means[s]), -settings.index(s)))
    return {
        "folds": folds,
        "held_out": mean(held),
        "n": len(held),
        "agree": len({f["chosen"] for f in folds.values()}) == 1,
        "best_on_all": best,
        "means": means,
    }


def _finite(value: float) -> float:
    """``value``, with ``nan`` (no items) ranked below every number."""
    return -math.inf if math.isnan(value) else value
