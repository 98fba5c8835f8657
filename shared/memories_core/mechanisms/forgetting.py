"""MemoryBank's Ebbinghaus forgetting curve as pure functions (Zhong et al., §2.3).

Retention ``R = exp(-t / S)``: ``t`` is the time since the memory was last recalled (else
since it was formed), ``S`` its strength, which starts at 1 and grows by 1 on every recall
(which also resets ``t``). These functions know nothing of storage: the MemoryBank mechanism,
the LlamaIndex :class:`~llamaindex_memories.ForgettingCurvePostprocessor` and the LangChain
:class:`~langchain_memories.ForgettingCurveRetriever` all use them.

A note on the original code: MemoryBank's release computes ``math.exp(-t / 5*S)``, which
Python reads as ``exp(-(t / 5) * S)``: there a *stronger* memory fades *faster*, the opposite
of §2.3. :func:`retention` implements the curve the paper states; ``scale`` keeps the
intended slowing (``scale=5`` gives ``exp(-t / (5 * S))``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from memories_core.clock import metadata_time, parse_time
from memories_core.errors import ConfigurationError, InvalidInputError
from memories_core.types import MemoryRecord, ensure_utc

__all__ = [
    "ForgetPolicy",
    "ForgettingCurve",
    "Reweighted",
    "apply_forgetting",
    "choose_forgotten",
    "retention",
]

#: ``"stochastic"``: forget with probability ``1 - R`` (the paper's release);
#: ``"threshold"``: forget when ``R`` is below a fixed threshold (deterministic).
ForgetPolicy = Literal["stochastic", "threshold"]


def retention(t: float, strength: float, *, scale: float = 1.0) -> float:
    """Ebbinghaus retention ``exp(-t / (scale * S))`` (§2.3).

    Args:
        t: Time since the memory was last recalled (or formed), in the curve's unit;
            negative values (a memory from the future) count as 0.
        strength: Memory strength ``S`` (1 when formed, +1 per recall); ``S <= 0`` means
            nothing is retained once any time has passed.
        scale: Stretches the curve (``scale=5``: the release's intended ``exp(-t / 5S)``).

    Returns:
        ``R`` in ``[0, 1]``; ``R(0) = 1``, decreasing in ``t``, increasing in ``S``.

    Raises:
        InvalidInputError: on non-finite input or ``scale <= 0``.
    """
    if not all(math.isfinite(v) for v in (t, strength, scale)):
        raise InvalidInputError("t, strength and scale must be finite numbers")
    if scale <= 0:
        raise InvalidInputError("scale must be > 0")
    t = max(float(t), 0.0)
    if t == 0:
        return 1.0
    if strength <= 0:
        return 0.0
    return math.exp(-t / (scale * float(strength)))


@dataclass(frozen=True)
class ForgettingCurve:
    """The curve with its unit and scale; callable as ``(record, now) -> R``.

    It fits :class:`~memories_core.retrieval.TimeDecay` as its ``factor``, so forgetting at
    query time is ``score x R`` (§2.3 applied without archiving).

    Attributes:
        unit: What one unit of ``t`` is (default: a day).
        scale: Curve stretch; see :func:`retention`.
        kinds: Record kinds that decay (``None``: every kind); others keep ``R = 1``.
    """

    unit: timedelta = timedelta(days=1)
    scale: float = 1.0
    kinds: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.unit <= timedelta(0):
            raise ConfigurationError("unit must be > 0")
        if not math.isfinite(self.scale) or self.scale <= 0:
            raise ConfigurationError("scale must be a finite number > 0")
        if self.kinds is not None:
            object.__setattr__(self, "kinds", frozenset(self.kinds))

    def elapsed(self, since: datetime, now: datetime) -> float:
        """``now - since`` in units (never negative)."""
        return max((ensure_utc(now) - ensure_utc(since)) / self.unit, 0.0)

    def of(
        self,
        *,
        created_at: datetime,
        now: datetime,
        strength: float = 1.0,
        last_recalled_at: datetime | None = None,
    ) -> float:
        """Retention of a memory given its times and strength."""
        t = self.elapsed(last_recalled_at or created_at, now)
        return retention(t, strength, scale=self.scale)

    def __call__(self, record: MemoryRecord, now: datetime) -> float:
        """Retention of a stored record at ``now`` (from its state)."""
        if self.kinds is not None and record.kind not in self.kinds:
            return 1.0
        state = record.state
        return self.of(
            created_at=record.created_at,
            now=now,
            strength=state.strength,
            last_recalled_at=state.last_recalled_at,
        )

    def of_metadata(self, metadata: Mapping[str, Any], now: datetime) -> float | None:
        """Retention from a node's or document's metadata; ``None`` without a timestamp.

        Reads ``last_recalled_at`` (else ``created_at``, else ``timestamp``) as a datetime,
        an ISO-8601 string or a Unix timestamp, and ``strength`` (default 1).
        """
        created = metadata_time(metadata)
        recalled = parse_time(metadata.get("last_recalled_at"))
        if created is None and recalled is None:
            return None
        raw = metadata.get("strength", 1.0)
        try:
            strength = float(raw) if raw is not None else 1.0
        except (TypeError, ValueError):
            strength = 1.0
        if not math.isfinite(strength):
            strength = 1.0
        since = recalled or created
        assert since is not None
        return retention(self.elapsed(since, now), strength, scale=self.scale)


def choose_forgotten(
    retentions: Iterable[tuple[str, float]],
    *,
    policy: ForgetPolicy = "stochastic",
    seed: int | None = None,
    threshold: float = 0.1,
) -> list[str]:
    """Which memories to forget, given each one's retention (§2.3).

    ``"stochastic"`` forgets a memory when a uniform draw exceeds its retention (probability
    ``1 - R``), as MemoryBank's release does; the draws come from ``random.Random(seed)`` in
    id order, so a fixed seed forgets the same memories whatever order they are given in.
    ``"threshold"`` forgets every memory with ``R < threshold``.

    Returns:
        The ids to forget, in id order.

    Raises:
        ConfigurationError: on an unknown policy or a threshold outside ``[0, 1]``.
    """
    if policy not in ("stochastic", "threshold"):
        raise ConfigurationError(f"policy must be 'stochastic' or 'threshold', got {policy!r}")
    if not 0 <= threshold <= 1:
        raise ConfigurationError("threshold must be in [0, 1]")
    items: Sequence[tuple[str, float]] = sorted(retentions)
    if policy == "threshold":
        return [item for item, r in items if r < threshold]
    rng = random.Random(seed)
    return [item for item, r in items if rng.random() > r]


@dataclass(frozen=True)
class Reweighted:
    """One item kept by :func:`apply_forgetting`.

    Attributes:
        index: Position of the item in the input.
        score: The new score (``score x R`` when re-weighting), ``None`` if it had none.
        retention: ``R``, or ``None`` when the item carries no timestamp (kept as it is).
    """

    index: int
    score: float | None
    retention: float | None


def apply_forgetting(
    items: Sequence[tuple[float | None, Mapping[str, Any]]],
    *,
    curve: ForgettingCurve,
    now: datetime,
    reweight: bool = True,
    min_retention: float = 0.0,
) -> list[Reweighted]:
    """Forgetting at query time over retrieved items of any store (§2.3, without archiving).

    Each item is ``(score, metadata)``; retention comes from the metadata
    (:meth:`ForgettingCurve.of_metadata`). Items with ``R < min_retention`` are dropped; with
    ``reweight`` the others' scores become ``score x R`` and they are re-sorted (stable).
    An item without a timestamp
    is kept unchanged. Scores are taken to be relevances (higher is better, ``>= 0``); an
    item without a score gets ``1 - position / n`` so that re-weighting can still reorder.

    Returns:
        The kept items, best first.

    Raises:
        ConfigurationError: if ``min_retention`` is outside ``[0, 1]``.
    """
    if not 0 <= min_retention <= 1:
        raise ConfigurationError("min_retention must be in [0, 1]")
    n = max(len(items), 1)
    kept: list[Reweighted] = []
    for index, (score, metadata) in enumerate(items):
        r = curve.of_metadata(metadata, now)
        if r is not None and r < min_retention:
            continue
        if reweight:
            base = float(score) if score is not None else 1.0 - index / n
            score = base * r if r is not None else base
        kept.append(Reweighted(index, score, r))
    if reweight:
        kept.sort(key=lambda item: -(item.score or 0.0))
    return kept
