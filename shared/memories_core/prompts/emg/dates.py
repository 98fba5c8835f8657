"""Resolving the relative dates an extraction reports against the turn's timestamp."""

from __future__ import annotations

import calendar
import re
from datetime import datetime, time, timedelta, timezone

from memories_core.types import ensure_utc

__all__ = ["resolve_date"]


# ----------------------------------------------------------------------------- dates
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


_TIME = re.compile(
    r"\b(\d{1,2})[:.h](\d{2})\s*(am|pm)?\b|\b(\d{1,2})\s*(am|pm)\b|\bat\s+(\d{1,2})\b(?![-/]|[:.h]\d)",
    re.I,
)


_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?)?")


_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


def _clock_time(text: str) -> time | None:
    match = _TIME.search(text)
    if not match:
        return None
    if match.group(1) is not None:
        hour, minute, half = int(match.group(1)), int(match.group(2)), match.group(3)
    elif match.group(6) is not None:
        hour, minute, half = int(match.group(6)), 0, None
    else:
        hour, minute, half = int(match.group(4)), 0, match.group(5)
    if half:
        hour = hour % 12 + (12 if half.lower() == "pm" else 0)
    if not (0 <= hour < 24 and 0 <= minute < 60):
        return None
    return time(hour, minute)


def _add_months(day: datetime, months: int) -> datetime:
    month = day.month - 1 + months
    year = day.year + month // 12
    month = month % 12 + 1
    return day.replace(
        year=year, month=month, day=min(day.day, calendar.monthrange(year, month)[1])
    )


def resolve_date(text: str | None, anchor: datetime) -> datetime | None:
    """Resolve a date phrase to an absolute UTC datetime against ``anchor`` (appendix A.1).

    Understands ISO dates and datetimes, ``today``/``tonight``/``tomorrow``/``yesterday``/
    ``the day after tomorrow``, ``[next|this] <weekday>``, ``in N days|weeks|months``,
    ``next week|month|year``, each with an optional clock time (``at 9``, ``01:40``,
    ``7pm``). A phrase without a clock time resolves to midnight of that day.

    Returns:
        The datetime, or ``None`` if ``text`` holds no date it understands.
    """
    if not text or not text.strip():
        return None
    anchor = ensure_utc(anchor)
    lowered = text.lower()
    iso = _ISO.search(text)
    if iso:
        year, month, mday = int(iso.group(1)), int(iso.group(2)), int(iso.group(3))
        try:
            base = datetime(year, month, mday, tzinfo=timezone.utc)
        except ValueError:
            return None
        if iso.group(4) is not None:
            return base.replace(hour=int(iso.group(4)), minute=int(iso.group(5)))
        rest = text[: iso.start()] + text[iso.end() :]
        clock = _clock_time(rest)
        return base if clock is None else base.replace(hour=clock.hour, minute=clock.minute)
    midnight = anchor.replace(hour=0, minute=0, second=0, microsecond=0)
    day: datetime | None = None
    if "day after tomorrow" in lowered:
        day = midnight + timedelta(days=2)
    elif "tomorrow" in lowered:
        day = midnight + timedelta(days=1)
    elif "yesterday" in lowered:
        day = midnight - timedelta(days=1)
    elif "today" in lowered or "tonight" in lowered:
        day = midnight
    else:
        weekday = re.search(r"\b(next|this|on)?\s*(" + "|".join(_WEEKDAYS) + r")\b", lowered)
        span = re.search(
            r"\bin\s+(\d+|" + "|".join(_NUMBERS) + r")\s+(day|week|month)s?\b", lowered
        )
        nxt = re.search(r"\bnext\s+(week|month|year)\b", lowered)
        if weekday:
            target = _WEEKDAYS.index(weekday.group(2))
            ahead = (target - midnight.weekday()) % 7
            if ahead == 0 and weekday.group(1) != "this":
                ahead = 7  # "next Monday" / "on Monday" said on a Monday: a week later
            day = midnight + timedelta(days=ahead)
        elif span:
            raw = span.group(1)
            count = int(raw) if raw.isdigit() else _NUMBERS[raw]
            unit = span.group(2)
            if unit == "month":
                day = _add_months(midnight, count)
            else:
                day = midnight + timedelta(days=count * (7 if unit == "week" else 1))
        elif nxt:
            unit = nxt.group(1)
            if unit == "week":
                day = midnight + timedelta(days=7)
            elif unit == "month":
                day = _add_months(midnight, 1)
            else:
                day = _add_months(midnight, 12)
    if day is None:
        return None
    clock = _clock_time(text)
    if clock is None and "tonight" in lowered:
        clock = time(20, 0)
    return day if clock is None else day.replace(hour=clock.hour, minute=clock.minute)
