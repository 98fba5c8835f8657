"""Conversation context: which records are neighbours, and how they share scores.

In a dialogue the turn that holds a fact often only makes sense next to the turn before it
("What pet do you have?" / "A cat named Bailey"). :class:`ContextSpreading` lets a record
inherit a share of its neighbours' scores (:func:`spread_context`).

Who is a neighbour is decided by one pure rule (:func:`linked`, applied by
:func:`adjacent_rows`), so every backend computes the same links:

* records are ordered by ``created_at`` (storage order among equal times) per user and kind;
* two records that both carry a ``session_id`` are neighbours when it is the same session
  (the next record of the same session, however far away in time, as before);
* two records without a ``session_id`` are neighbours when they were written by the same
  save call (the same ``batch_id``), or when they lie within ``gap`` of each other;
* a record with a session and one without are never neighbours.

So context spreading works for callers that never pass session ids: a save call is a
natural unit, and turns saved one by one are linked by time. On LoCoMo dev the default
``gap`` of 30 minutes gives the same recall as session ids (BENCHMARKS.md, "Retrieval
pipeline").
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from memories_core.errors import ConfigurationError

if TYPE_CHECKING:
    from memories_core.retrieval.base import RecallContext, RecallRequest
    from memories_core.types import MemoryRecord

from memories_core.retrieval.fusion import Ranking

__all__ = [
    "DEFAULT_AFTER_QUESTION_WEIGHT",
    "DEFAULT_CONTEXT_GAP",
    "DEFAULT_QUESTION_WEIGHT",
    "ContextSpreading",
    "NeighbourRow",
    "Neighbours",
    "adjacent_rows",
    "asks",
    "check_question_weights",
    "linked",
    "only_asks",
    "rows_of",
    "spread_context",
]

#: Records without a session id and without a shared save call are neighbours up to this far
#: apart. Chosen on LoCoMo dev with turns 30 s apart saved one by one: 1 minute to 2 days
#: all match the recall with session ids (BENCHMARKS.md, "Retrieval pipeline").
DEFAULT_CONTEXT_GAP = timedelta(minutes=30)

#: Share of a question's score that the record right after it inherits (instead of the
#: ordinary ``previous_weight``): the answer to "What pet do you have?" is the next turn, "A
#: cat named Bailey", which shares no word with the question a user later asks. Chosen on
#: LoCoMo dev by leave-one-conversation-out cross-validation (BENCHMARKS.md, "Retrieval
#: quality", "Question-answer context").
DEFAULT_AFTER_QUESTION_WEIGHT = 0.8
#: Factor on the own score of a record that only asks (every sentence ends with "?"): such a
#: turn repeats the words of a later question but holds no answer (same measurement).
DEFAULT_QUESTION_WEIGHT = 0.5

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def check_question_weights(after_question_weight: object, question_weight: object) -> None:
    """Validate the question rule's two knobs (:class:`ContextSpreading`, ``FusionConfig``).

    Raises:
        ConfigurationError: unless ``after_question_weight`` is ``None`` or a finite number
            >= 0 and ``question_weight`` a number from 0 to 1.
    """
    answer = after_question_weight
    if answer is not None and (
        isinstance(answer, bool)
        or not isinstance(answer, (int, float))
        or not math.isfinite(answer)
        or answer < 0
    ):
        raise ConfigurationError("after_question_weight must be a finite number >= 0 or None")
    weight = question_weight
    if isinstance(weight, bool) or not (isinstance(weight, (int, float)) and 0 <= weight <= 1):
        raise ConfigurationError("question_weight must be a number from 0 to 1")


def _body(text: str) -> str:
    """``text`` without trailing whitespace and without a trailing ``[...]`` note."""
    body = text.rstrip()
    if body.endswith("]"):
        start = body.rfind("[")
        if start != -1 and "]" not in body[start:-1]:
            body = body[:start].rstrip()
    return body


def asks(text: str) -> bool:
    """Whether a record's text ends with a question (its last sentence ends with "?").

    A trailing bracketed note, such as an image caption ``"[shares a photo of ...]"``, is
    ignored. In conversation analysis a question opens an *adjacency pair* whose second part,
    the answer, is the next turn (Schegloff & Sacks, 1973, "Opening up closings", §2).
    """
    return _body(text).endswith("?")


def only_asks(text: str) -> bool:
    """Whether every sentence of a record's text ends with "?" (a turn that only asks)."""
    body = _body(text)
    if not body.endswith("?"):  # cheap test first: most turns do not end with a question
        return False
    return all(part.endswith("?") for part in _SENTENCE_END.split(body) if part.strip())


#: ``{id: (previous id, next id)}``, ``None`` where a record has no such neighbour.
Neighbours = Mapping[str, tuple[str | None, str | None]]


@dataclass(frozen=True)
class NeighbourRow:
    """The columns the neighbour rule needs of one record.

    Attributes:
        id: Record id.
        created_at: When the record was formed.
        session_id: The record's session, if any.
        batch_id: Id of the save call that wrote the record, if known.
        kind: Record kind; only records of one kind are neighbours.
    """

    id: str
    created_at: datetime
    session_id: str | None = None
    batch_id: str | None = None
    kind: str = "turn"


def linked(earlier: NeighbourRow, later: NeighbourRow, *, gap: timedelta | None) -> bool:
    """Whether two records that follow each other in time order are neighbours.

    Args:
        earlier: The earlier record (by ``created_at``, then storage order).
        later: The record right after it among records of the same kind and the same
            session-or-no-session (see :func:`adjacent_rows`).
        gap: Largest ``created_at`` distance linking two records without a session id that
            came from different save calls; ``None`` links such records only by batch.
    """
    if earlier.kind != later.kind:
        return False
    if earlier.session_id is not None or later.session_id is not None:
        return earlier.session_id == later.session_id
    if earlier.batch_id is not None and earlier.batch_id == later.batch_id:
        return True
    return gap is not None and abs(later.created_at - earlier.created_at) <= gap


def adjacent_rows(
    rows: Sequence[NeighbourRow], *, gap: timedelta | None
) -> dict[str, tuple[str | None, str | None]]:
    """Every row's neighbours among ``rows`` (all records of one user, in storage order).

    Rows are grouped by ``(kind, session_id)`` (``None`` is one group: the records without a
    session), each group is ordered by ``created_at`` with storage order breaking ties, and
    each pair of consecutive rows is linked if :func:`linked` says so.

    A SQL backend need not load every row: the previous row of ``x`` is the last row of
    the same user, kind and session (``IS`` comparison, so both ``NULL`` match) before ``x``
    in ``(created_at, seq)`` order, the next one likewise; then apply :func:`linked`.

    Returns:
        ``{id: (previous id, next id)}`` for every row.
    """
    groups: dict[tuple[str, str | None], list[tuple[int, NeighbourRow]]] = {}
    for position, row in enumerate(rows):
        groups.setdefault((row.kind, row.session_id), []).append((position, row))
    result: dict[str, tuple[str | None, str | None]] = {row.id: (None, None) for row in rows}
    for members in groups.values():
        members.sort(key=lambda pair: (pair[1].created_at, pair[0]))
        for (_, earlier), (_, later) in itertools.pairwise(members):
            if linked(earlier, later, gap=gap):
                result[earlier.id] = (result[earlier.id][0], later.id)
                result[later.id] = (earlier.id, result[later.id][1])
    return result


def spread_context(
    ranking: Ranking,
    neighbours: Neighbours,
    *,
    previous_weight: float,
    next_weight: float,
    own_score_only: frozenset[str] = frozenset(),
    questions: frozenset[str] = frozenset(),
    after_question_weight: float | None = None,
    question_only: frozenset[str] = frozenset(),
    question_weight: float = 1.0,
) -> list[tuple[str, float]]:
    """Let records inherit a share of their neighbours' scores (conversation context).

    Scores are first shifted so that the lowest one is 0 (a record outside the ranking also
    counts 0). Then every record ``x`` of the ranking, and every neighbour named in
    ``neighbours``, scores ``s(x) + previous_weight * s(prev(x)) + next_weight * s(next(x))``.
    A record whose previous record is in ``questions`` inherits ``after_question_weight``
    of it instead (the answer of a question-answer pair), and a record in ``question_only``
    keeps ``question_weight`` times its own score.

    Args:
        ranking: ``(id, score)`` pairs, higher = better.
        neighbours: For some ids, ``(previous id, next id)`` (``None`` where there is none).
            A link is known from either side: if ``b`` is ``a``'s next, ``a`` is ``b``'s
            previous.
        previous_weight: Share of the preceding record's score.
        next_weight: Share of the following record's score.
        own_score_only: Ids that keep their own score and inherit nothing (a chat
            assistant's replies: they restate, so they must match on their own; otherwise a
            short chat memory floods with replies next to a good match).
        questions: Ids of records that end with a question (:func:`asks`).
        after_question_weight: Share of a question's score the record after it inherits;
            ``None``: ``previous_weight``.
        question_only: Ids of records that only ask (:func:`only_asks`).
        question_weight: Factor on the own score of the records in ``question_only``.

    Returns:
        ``(id, score)`` pairs, best first; ties keep ranking order, then discovery order.
    """
    if not ranking:
        return []
    floor = min(float(score) for _, score in ranking)
    base: dict[str, float] = {}
    for item, score in ranking:
        base.setdefault(item, float(score) - floor)
    before: dict[str, str] = {}
    after: dict[str, str] = {}
    for item, (prev_id, next_id) in neighbours.items():
        if prev_id is not None:
            before[item] = prev_id
            after[prev_id] = item
        if next_id is not None:
            after[item] = next_id
            before[next_id] = item
    order: dict[str, int] = {}
    for item in [*base, *before, *after]:
        order.setdefault(item, len(order))
    answer_weight = previous_weight if after_question_weight is None else after_question_weight
    scores: dict[str, float] = {}
    for item in order:
        own = base.get(item, 0.0) * (question_weight if item in question_only else 1.0)
        if item in own_score_only:
            scores[item] = own
            continue
        prev = before.get(item, "")
        share = answer_weight if prev in questions else previous_weight
        scores[item] = (
            own + share * base.get(prev, 0.0) + next_weight * base.get(after.get(item, ""), 0.0)
        )
    return sorted(scores.items(), key=lambda pair: (-pair[1], order[pair[0]]))


@dataclass(frozen=True)
class ContextSpreading:
    """Reranker: records inherit a share of their neighbours' scores.

    After fusion, a record scores its own (shifted so the weakest candidate scores 0) plus
    ``previous_weight`` times the score of the record just before it and ``next_weight``
    times the one just after it (neighbours as in the module docstring). On LoCoMo dev raw
    turns this lifts R@5 from 0.58 to 0.66 (BENCHMARKS.md).

    Questions and answers: a turn after a question (:func:`asks`) inherits
    ``after_question_weight`` of it instead of ``previous_weight`` (the answer of the pair
    is the next turn; Schegloff & Sacks, 1973, §2), and a turn that only asks
    (:func:`only_asks`) keeps ``question_weight`` of its own score, unless the turn after it
    is a reply that keeps its own score (``own_score_roles``: a chat assistant's answer cannot
    inherit, so the user's question must still match on its own). On LoCoMo dev this
    raises R@5 from 0.679 to 0.702 and R@10 from 0.775 to 0.791 (BENCHMARKS.md,
    "Question-answer context").

    Cost: one ``backend.adjacent`` call for the best ``depth`` candidates and one load of
    them and their neighbours (cached for the load stage). On a SQL store that call is an
    indexed query of two seeks per candidate, so the cost is bounded by ``depth``, not by
    the length of the session.

    Attributes:
        previous_weight: Share of the preceding record's score a record inherits.
        next_weight: Share of the following record's score a record inherits.
        depth: Neighbours are looked up for this many of the best candidates. Fixed, not
            tied to ``k``, so that a smaller ``k`` returns a prefix of a larger one.
        kinds: Record kinds whose neighbours share scores. Only dialogue turns by default:
            derived records (summaries, notes) already carry their context.
        gap: Time gap linking records without a session id (:func:`linked`).
        own_score_roles: Records whose metadata ``role`` is one of these keep their own
            score (a chat assistant's replies restate; they must match on their own).
        after_question_weight: Share of a question's score the record right after it
            inherits; ``None``: ``previous_weight`` (no question rule).
        question_weight: Factor (0 to 1) on the own score of a record that only asks.
    """

    previous_weight: float = 0.4
    next_weight: float = 0.3
    depth: int = 20
    kinds: tuple[str, ...] = ("turn",)
    gap: timedelta | None = DEFAULT_CONTEXT_GAP
    own_score_roles: tuple[str, ...] = ("assistant",)
    after_question_weight: float | None = DEFAULT_AFTER_QUESTION_WEIGHT
    question_weight: float = DEFAULT_QUESTION_WEIGHT

    name = "context"

    def __post_init__(self) -> None:
        for value in (self.previous_weight, self.next_weight):
            if not isinstance(value, (int, float)) or not value >= 0 or value == float("inf"):
                raise ConfigurationError("context weights must be finite numbers >= 0")
        if self.depth < 1:
            raise ConfigurationError("depth must be >= 1")
        if self.gap is not None and self.gap < timedelta(0):
            raise ConfigurationError("gap must be >= 0 or None")
        check_question_weights(self.after_question_weight, self.question_weight)

    def rerank(
        self, ranking: Ranking, request: RecallRequest, ctx: RecallContext
    ) -> list[tuple[str, float]]:
        """Spread scores around the best ``depth`` candidates of ``ranking``."""
        if not ranking or (self.previous_weight == 0 and self.next_weight == 0):
            return list(ranking)
        top = list(dict.fromkeys(item for item, _ in ranking[: self.depth]))
        neighbours = ctx.adjacent(top, user_id=request.user_id, gap=self.gap)
        linked_ids = [n for pair in neighbours.values() for n in pair if n is not None]
        records = ctx.load(list(dict.fromkeys([*top, *linked_ids])), user_id=request.user_id)
        kept = {
            item: pair
            for item, pair in neighbours.items()
            if item in records and records[item].kind in self.kinds
        }
        replies = frozenset(
            item
            for item, record in records.items()
            if record.metadata.get("role") in self.own_score_roles
        )
        turns = {item: r for item, r in records.items() if r.kind in self.kinds}
        asking = self.after_question_weight not in (None, self.previous_weight)
        # A question answered by a reply that keeps its own score (an assistant's) is not
        # demoted: its answer cannot inherit from it, so the question must match on its own.
        answered_by: dict[str, str] = {}
        for item, (prev_id, next_id) in kept.items():
            if next_id is not None:
                answered_by[item] = next_id
            if prev_id is not None:
                answered_by.setdefault(prev_id, item)
        return spread_context(
            ranking,
            kept,
            previous_weight=self.previous_weight,
            next_weight=self.next_weight,
            own_score_only=replies,
            questions=frozenset(i for i, r in turns.items() if asking and asks(r.text)),
            after_question_weight=self.after_question_weight,
            question_only=frozenset(
                i
                for i, r in turns.items()
                if self.question_weight != 1
                and answered_by.get(i) not in replies
                and only_asks(r.text)
            ),
            question_weight=self.question_weight,
        )


def rows_of(
    records: Iterable[MemoryRecord], batches: Mapping[str, str] | None = None
) -> list[NeighbourRow]:
    """:class:`NeighbourRow` of records, in the given (storage) order.

    Args:
        records: The records.
        batches: Save-call id per record id, where known (the engine stores it per record
            as ``batch_id``); records without one link by session or time gap only.
    """
    batches = batches or {}
    return [
        NeighbourRow(r.id, r.created_at, r.session_id, batches.get(r.id), r.kind) for r in records
    ]
