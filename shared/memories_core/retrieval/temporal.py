"""Temporal reranking: a question that names a time boosts records stored near that time.

"What did Maria donate in December 2023?", "Who did she have dinner with on May 3, 2023?",
"What did I say yesterday?": the question names a period, and the records written in or
shortly after it are the likely evidence (a conversation reports an event on the day or in
the days after it: "I went to a support group yesterday"). Hybrid memory systems for
long conversations add such a temporal-proximity boost; LoCoMo's temporal questions are the case
(Maharana et al., 2024, §4, "temporal reasoning" questions).

:func:`parse_time_window` finds the period, without a model: absolute dates ("3 May 2023",
"May 3, 2023", "2023-05-03"), months ("May 2023", "in May"), years ("in 2023"), and times
relative to the question's own time, the recall's ``now`` ("yesterday", "last week",
"last month", "last year", "last weekend", "3 days ago", "two weeks ago", "this month").
:class:`TemporalBoost` then adds a bonus to candidates whose ``created_at`` is near the
window. A question that names no time is left untouched, so the stage costs nothing there.
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from memories_core.errors import ConfigurationError
from memories_core.retrieval.base import RecallContext, RecallRequest
from memories_core.retrieval.fusion import Ranking

__all__ = ["DEFAULT_TEMPORAL_WEIGHT", "TemporalBoost", "TimeWindow", "parse_time_window"]

_MONTHS = {name.lower(): n for n, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name.lower(): n for n, name in enumerate(calendar.month_abbr) if name})
_MONTHS["sept"] = 9
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_NUMBERS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "few": 3,
    "couple of": 2,
}
_COUNT = r"(?P<count>\d{1,3}|" + "|".join(_NUMBERS) + r")"

_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("iso", re.compile(r"\b(?P<year>\d{4})-(?P<m>\d{1,2})-(?P<day>\d{1,2})\b")),
    (
        "day_month_year",
        re.compile(
            rf"\b(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH},?\s+(?P<year>\d{{4}})\b",
            re.I,
        ),
    ),
    (
        "month_day_year",
        re.compile(
            rf"\b{_MONTH}\s+(?P<day>\d{{1,2}})(?:st|nd|rd|th)?,?\s+(?P<year>\d{{4}})\b", re.I
        ),
    ),
    ("month_year", re.compile(rf"\b{_MONTH},?\s+(?:of\s+)?(?P<year>\d{{4}})\b", re.I)),
    (
        "day_month",
        re.compile(rf"\b(?:on\s+)?(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}\b", re.I),
    ),
    ("month_day", re.compile(rf"\bon\s+{_MONTH}\s+(?P<day>\d{{1,2}})(?:st|nd|rd|th)?\b", re.I)),
    ("in_month", re.compile(rf"\b(?:in|during|since|early|late|mid)[\s-]+{_MONTH}\b", re.I)),
    ("year", re.compile(r"\b(?:in|during|of|since)\s+(?P<year>(?:19|20)\d{2})\b", re.I)),
    ("ago", re.compile(rf"\b{_COUNT}\s+(?P<unit>day|week|month|year)s?\s+ago\b", re.I)),
    (
        "last",
        re.compile(
            r"\b(?P<which>last|past|previous|this|next)\s+(?P<unit>weekend|week|month|year)\b", re.I
        ),
    ),
    ("yesterday", re.compile(r"\b(?:yesterday|last night)\b", re.I)),
    ("today", re.compile(r"\b(?:today|tonight|this morning)\b", re.I)),
]


@dataclass(frozen=True)
class TimeWindow:
    """A period a question names: ``[start, end)`` in UTC, and the words that named it."""

    start: datetime
    end: datetime
    text: str


def _day(year: int, month: int, day: int) -> tuple[datetime, datetime] | None:
    try:
        start = datetime(year, month, day, tzinfo=timezone.utc)
    except ValueError:
        return None
    return start, start + timedelta(days=1)


def _month(year: int, month: int) -> tuple[datetime, datetime]:
    start = datetime(year, month, 1, tzinfo=timezone.utc)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=timezone.utc)
    return start, end


def _latest_year(month: int, day: int, now: datetime) -> int:
    """The year of the most recent ``month``/``day`` not after ``now``."""
    return now.year if (month, day) <= (now.month, now.day) else now.year - 1


def _shift_months(moment: datetime, months: int) -> datetime:
    index = moment.year * 12 + moment.month - 1 - months
    return moment.replace(year=index // 12, month=index % 12 + 1, day=1)


def _window(kind: str, match: re.Match[str], now: datetime) -> tuple[datetime, datetime] | None:
    groups = match.groupdict()
    month = _MONTHS.get((groups.get("month") or "").lower().rstrip("."), 0)
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if kind == "iso":
        return _day(int(groups["year"]), int(groups["m"]), int(groups["day"]))
    if kind in ("day_month_year", "month_day_year"):
        return _day(int(groups["year"]), month, int(groups["day"]))
    if kind == "month_year":
        return _month(int(groups["year"]), month)
    if kind in ("day_month", "month_day"):
        day = int(groups["day"])
        return _day(_latest_year(month, day, now), month, day)
    if kind == "in_month":
        return _month(_latest_year(month, 1, now), month)
    if kind == "year":
        year = int(groups["year"])
        return datetime(year, 1, 1, tzinfo=timezone.utc), datetime(
            year + 1, 1, 1, tzinfo=timezone.utc
        )
    if kind == "yesterday":
        return today - timedelta(days=1), today
    if kind == "today":
        return today, today + timedelta(days=1)
    unit = (groups.get("unit") or "").lower()
    if kind == "ago":
        raw = groups["count"].lower()
        count = int(raw) if raw.isdigit() else _NUMBERS.get(raw, 1)
        if unit == "day":
            start = today - timedelta(days=count)
            return start, start + timedelta(days=1)
        if unit == "week":
            start = today - timedelta(weeks=count, days=today.weekday())
            return start, start + timedelta(weeks=1)
        if unit == "month":
            start = _shift_months(today, count)
            return start, _shift_months(today, count - 1)
        year = today.year - count
        return datetime(year, 1, 1, tzinfo=timezone.utc), datetime(
            year + 1, 1, 1, tzinfo=timezone.utc
        )
    if kind == "last":
        which = groups["which"].lower()
        offset = {"this": 0, "next": -1}.get(which, 1)
        if unit == "weekend":
            saturday = today - timedelta(days=(today.weekday() - 5) % 7 or 7) if offset else today
            return saturday, saturday + timedelta(days=2)
        if unit == "week":
            start = today - timedelta(days=today.weekday(), weeks=offset)
            return start, start + timedelta(weeks=1)
        if unit == "month":
            start = _shift_months(today, offset)
            return start, _shift_months(today, offset - 1)
        year = today.year - offset
        return datetime(year, 1, 1, tzinfo=timezone.utc), datetime(
            year + 1, 1, 1, tzinfo=timezone.utc
        )
    return None


def parse_time_window(query: str, now: datetime) -> TimeWindow | None:
    """The period ``query`` names, relative to ``now`` where it is relative; else ``None``.

    The most specific expression wins (a full date before a month before a year before a
    relative time); among equals, the first in the question.

    Args:
        query: The question.
        now: The question's own time (the recall's ``now``).
    """
    for kind, pattern in _PATTERNS:
        for match in pattern.finditer(query):
            window = _window(kind, match, now)
            if window is not None:
                return TimeWindow(window[0], window[1], match.group(0).strip())
    return None


#: Weight of the temporal boost in the default pipeline (``FusionConfig.temporal_weight``).
#: Chosen on LoCoMo dev by leave-one-conversation-out cross-validation over 0 / 0.25 / 0.5 /
#: 1 / 2 (every fold picked 1 under the no-category-worse rule; held-out R@5 0.661 -> 0.681,
#: R@10 0.742 -> 0.759; BENCHMARKS.md, "Retrieval quality").
DEFAULT_TEMPORAL_WEIGHT = 1.0


@dataclass(frozen=True)
class TemporalBoost:
    """Reranker: boost candidates written near the period the question names.

    A candidate written inside ``[start - before, end + after]`` of the window
    (:func:`parse_time_window`, relative times measured from ``request.now``) gets
    ``weight * spread`` added to its score, where ``spread`` is the score range of the best
    ``depth`` candidates; outside, the bonus halves every ``half_life`` of distance. So the
    bonus is on the scale of the fused scores, and a weight of 1 can lift the weakest
    candidate to the best one. ``after`` is larger than ``before`` because conversations
    report events in the days after they happen (on LoCoMo dev 7, 14 and 30 days gave the
    same recall within 0.003). Questions naming no time are unchanged.

    Cost: parses the question; loads the ``depth`` best candidates (cached for the load
    stage) only when it names a time.

    Attributes:
        weight: Bonus as a share of the candidates' score range; 0 = off.
        before: Slack before the window.
        after: Slack after the window.
        half_life: Decay of the bonus beyond the slack.
        depth: Candidates considered (the rest keep their order below them).
    """

    weight: float = DEFAULT_TEMPORAL_WEIGHT
    before: timedelta = timedelta(days=1)
    after: timedelta = timedelta(days=14)
    half_life: timedelta = timedelta(days=7)
    depth: int = 50

    name = "temporal"

    def __post_init__(self) -> None:
        if not (isinstance(self.weight, (int, float)) and 0 <= self.weight < float("inf")):
            raise ConfigurationError("weight must be a finite number >= 0")
        if self.before < timedelta(0) or self.after < timedelta(0):
            raise ConfigurationError("before and after must be >= 0")
        if self.half_life <= timedelta(0):
            raise ConfigurationError("half_life must be > 0")
        if self.depth < 1:
            raise ConfigurationError("depth must be >= 1")

    def proximity(self, when: datetime, window: TimeWindow) -> float:
        """1 inside the slackened window, halving every ``half_life`` beyond it."""
        low, high = window.start - self.before, window.end + self.after
        if low <= when <= high:
            return 1.0
        distance = (low - when) if when < low else (when - high)
        return float(0.5 ** (distance / self.half_life))

    def rerank(
        self, ranking: Ranking, request: RecallRequest, ctx: RecallContext
    ) -> list[tuple[str, float]]:
        """Return the ranking with time-near candidates boosted."""
        items = list(dict.fromkeys(item for item, _ in ranking))
        scores = dict(reversed(ranking))
        if self.weight == 0 or len(items) < 2:
            return [(item, float(scores[item])) for item in items]
        now = request.now
        assert now is not None  # the pipeline sets it
        window = parse_time_window(request.query, now)
        if window is None:
            return [(item, float(scores[item])) for item in items]
        head = items[: self.depth]
        values = [float(scores[item]) for item in head]
        spread = max(values) - min(values)
        records = ctx.load(head, user_id=request.user_id)
        boosted = {
            item: float(scores[item])
            + (
                self.weight * spread * self.proximity(records[item].created_at, window)
                if item in records
                else 0.0
            )
            for item in head
        }
        order = {item: n for n, item in enumerate(items)}
        ranked = sorted(boosted.items(), key=lambda pair: (-pair[1], order[pair[0]]))
        # Boosts only raise scores, so the rest stay below the head in their order.
        return ranked + [(item, float(scores[item])) for item in items[self.depth :]]
