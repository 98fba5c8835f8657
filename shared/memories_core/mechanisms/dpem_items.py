"""DPeM's items: the flag table's rules and the views of a user's memories.

Part of :mod:`memories_core.mechanisms.dpem` (Zhang et al., 2023, "DPeM Mechanism"): what
counts as a recurrence of a stored item and which short-term items a refresh drops
(executive process, memorizing), and the
:class:`KnowledgeItem` / :class:`DPeMStats` views that :class:`~memories_core.mechanisms.dpem.
DualProcessMemory` shows.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memories_core.errors import InvalidInputError, check_count
from memories_core.prompts.dpem import COMMON_SENSE, USER_SPECIFIC
from memories_core.types import MemoryRecord, ScoredRecord

__all__ = [
    "MERGE_THRESHOLD",
    "DPeMStats",
    "KnowledgeItem",
    "check_typed",
    "duplicate_score",
    "matching_item",
    "near_duplicate",
    "padded",
    "refreshed_stm",
    "similarity",
]

#: Default near-duplicate threshold of :func:`similarity` (0-100). Chosen on labelled pairs
#: (the project's DPeM test suite): trivial rephrasings (case, punctuation, articles, word
#: order) score 89-100; different facts that share most words (another token, another
#: condition) score at most 84.
MERGE_THRESHOLD = 88.0
#: Tiers (a record's state ``tier``): working memory, short-term and long-term memory.
WORKING, STM, LTM = "working", "stm", "ltm"

_DIGITS = re.compile(r"\d+")


def processed_text(text: str) -> str:
    from rapidfuzz import utils

    return str(utils.default_process(text))


def similarity(a: str, b: str) -> float:
    """How alike two items read, 0-100: the better of rapidfuzz's ratio and token-sort ratio.

    Both texts are lower-cased and stripped of punctuation first, so case, punctuation and
    word order alone never make two items differ.
    """
    from rapidfuzz import fuzz

    pa, pb = processed_text(a), processed_text(b)
    return float(max(fuzz.ratio(pa, pb), fuzz.token_sort_ratio(pa, pb)))


def duplicate_score(a: str, b: str) -> float:
    """:func:`similarity` of two items with the same numbers, 0 when their numbers differ.

    "is 45" and "is 46" are different facts however alike the rest reads.
    """
    if _DIGITS.findall(a) != _DIGITS.findall(b):
        return 0.0
    return similarity(a, b)


def near_duplicate(a: str, b: str, threshold: float = MERGE_THRESHOLD) -> bool:
    """Whether ``b`` is a trivial rephrasing of ``a`` (one flag-table entry, not two).

    ``duplicate_score(a, b) >= threshold``: alike enough, and the same numbers in both.
    """
    return duplicate_score(a, b) >= threshold


def matching_item(text: str, texts: dict[str, str], threshold: float) -> str | None:
    """The id of the stored item ``text`` recurs as (its most similar near-duplicate), if any.

    Zhang et al., 2023, "Executive Process": an item met again counts in the flag table
    instead of being stored twice. ``texts`` maps the stored STM and LTM items' ids to their
    text; the five most similar at ``threshold`` or above are checked with
    :func:`near_duplicate` (their numbers must agree).
    """
    if not texts:
        return None
    from rapidfuzz import process

    ids = list(texts)
    candidates = process.extract(
        text,
        [texts[i] for i in ids],
        scorer=lambda a, b, **kw: similarity(a, b),
        limit=5,
        score_cutoff=threshold,
    )
    for _, _, index in candidates:
        if near_duplicate(text, texts[ids[index]], threshold):
            return ids[index]
    return None


def refreshed_stm(
    round_no: int,
    tiers: dict[str, str],
    rounds: dict[str, set[int]],
    log: dict[str, Any],
    *,
    period: int,
    capacity: int,
) -> list[str]:
    """The short-term items to drop after ``round_no``; counts the refresh in ``log``.

    Zhang et al., 2023, Table 1: short-term memory is refreshed at the end of every period
    of ``period`` rounds (items not seen during it go, with their flag-table counts), and
    holds at most ``capacity`` items (the least frequent, then least recent, go first).

    Args:
        round_no: The round just memorized.
        tiers: Item id -> ``"stm"`` or ``"ltm"`` (long-term items are never dropped).
        rounds: Item id -> the rounds it was seen in.
        log: The user's DPeM counters (``last_refresh``, ``refreshes``, ``dropped``), updated.
        period: ``stm_refresh_rounds``.
        capacity: ``stm_capacity``.
    """
    dropped: list[str] = []
    if round_no % period == 0 and log.get("last_refresh", 0) < round_no:
        dropped = [
            item
            for item, tier in tiers.items()
            if tier == STM and max(rounds[item]) <= round_no - period
        ]
        log["refreshes"] = log.get("refreshes", 0) + 1
        log["last_refresh"] = round_no
    live = [item for item, tier in tiers.items() if tier == STM and item not in dropped]
    if len(live) > capacity:
        live.sort(key=lambda item: (len(rounds[item]), max(rounds[item])))
        dropped += live[: len(live) - capacity]
    log["dropped"] = log.get("dropped", 0) + len(dropped)
    return dropped


@dataclass(frozen=True)
class KnowledgeItem:
    """One entry of a user's working memory, STM or LTM, as :class:`DualProcessMemory` shows it.

    Attributes:
        id: Record id.
        text: The note or knowledge item.
        tier: ``"working"``, ``"stm"`` or ``"ltm"``.
        type: ``"user-specific"`` or ``"common-sense"`` (``None`` for working notes).
        count: Flag-table count: in how many iterations the item (or a near-duplicate) appeared.
        first_round: Iteration it first appeared in.
        last_round: Iteration it last appeared in.
        created_at: When the record was written.
    """

    id: str
    text: str
    tier: str
    type: str | None
    count: int
    first_round: int
    last_round: int
    created_at: datetime


@dataclass(frozen=True)
class DPeMStats:
    """A user's memory dynamics so far (for inspection and benchmarks).

    Attributes:
        rounds: Iterations saved.
        processed: Iterations whose job has finished memorizing.
        working: Notes in working memory.
        stm: Items in short-term memory.
        ltm: Items in long-term memory.
        merges: Items that were near-duplicates of a stored one (counted, not added).
        promotions: STM -> LTM moves.
        refreshes: STM refreshes done.
        dropped: STM items dropped by refreshes or by the capacity limit.
    """

    rounds: int
    processed: int
    working: int
    stm: int
    ltm: int
    merges: int
    promotions: int
    refreshes: int
    dropped: int


def knowledge_item(record: MemoryRecord) -> KnowledgeItem:
    attrs = record.state.attrs
    rounds = [int(r) for r in attrs.get("rounds", [])] or [int(attrs.get("round", 0))]
    kind = attrs.get("type", record.metadata.get("type"))
    return KnowledgeItem(
        id=record.id,
        text=record.text,
        tier=record.state.tier or "",
        type=None if kind is None else str(kind),
        count=int(attrs.get("count", len(rounds))),
        first_round=min(rounds),
        last_round=max(rounds),
        created_at=record.created_at,
    )


def padded(
    a: Sequence[ScoredRecord], b: Sequence[ScoredRecord]
) -> tuple[list[ScoredRecord | None], list[ScoredRecord | None]]:
    """Both hit lists padded with ``None`` to the longer one's length (to interleave them)."""
    size = max(len(a), len(b))
    return (
        [*a, *([None] * (size - len(a)))],
        [*b, *([None] * (size - len(b)))],
    )


def check_typed(user_id: str, round_no: int, typed: Sequence[tuple[str, str]]) -> None:
    """Validate one round's typed knowledge before it is memorized.

    Raises:
        InvalidInputError: on a round that is not a positive int, or an item that is not a
            non-empty string paired with ``"user-specific"`` or ``"common-sense"``.
    """
    round_no = check_count("round_no", round_no, error=InvalidInputError)
    for pair in typed:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise InvalidInputError(f"{user_id}: each item is an (item, type) pair, got {pair!r}")
        text, kind = pair
        if not isinstance(text, str) or not text.strip():
            raise InvalidInputError(f"{user_id}: an item must be non-empty text, got {text!r}")
        if kind not in (USER_SPECIFIC, COMMON_SENSE):
            raise InvalidInputError(
                f"{user_id}: a type is {USER_SPECIFIC!r} or {COMMON_SENSE!r}, got {kind!r}"
            )
