"""Clocks: time is injected so that every time-dependent rule is testable."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from memories_core.types import ensure_utc, utcnow

if TYPE_CHECKING:
    from memories_core.interfaces import Clock

__all__ = [
    "FixedClock",
    "SystemClock",
    "dated_line",
    "memory_time",
    "metadata_time",
    "parse_time",
    "resolve_now",
]


def resolve_now(now: datetime | None = None, clock: Clock | None = None) -> datetime:
    """The time of a call, settled once at the public call and passed down from there.

    Args:
        now: The time the caller gave, if any (naive values are taken to be UTC).
        clock: The injected clock, read when ``now`` is not given.

    Returns:
        ``now``, else ``clock.now()``, else the wall clock (only when nothing is injected).
    """
    if now is not None:
        return ensure_utc(now)
    if clock is not None:
        return ensure_utc(clock.now())
    return utcnow()


def memory_time(when: datetime, *, time_of_day: bool = True) -> str:
    """How a memory's time is shown to a model: ``"8 May 2023, 13:56"`` (UTC).

    Written the way people (and the "today is" line of a prompt) write dates, so that a model
    answering "when ...?" from its memories answers in that form; ISO dates were copied
    verbatim into answers (LoCoMo QA, BENCHMARKS.md "Answer quality").

    Args:
        when: The time (naive values are taken to be UTC).
        time_of_day: Append ``", HH:MM"``.
    """
    when = ensure_utc(when)
    day = f"{when.day} {when:%B %Y}"
    return f"{day}, {when:%H:%M}" if time_of_day else day


def parse_time(value: Any) -> datetime | None:
    """A time found in untrusted metadata, as an aware UTC datetime; ``None`` if unusable.

    Accepts a datetime (naive: UTC), an ISO-8601 string (a trailing ``Z`` included) or Unix
    seconds. Anything else (a bool, a non-finite number, an unparsable string, another type)
    gives ``None`` rather than an error: metadata written by other tools is not ours to refuse.
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, datetime):
        return ensure_utc(value)
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            return None
        try:
            return datetime.fromtimestamp(float(value), tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str) and value.strip():
        try:
            return ensure_utc(datetime.fromisoformat(value.strip().replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


def metadata_time(metadata: Mapping[str, Any]) -> datetime | None:
    """When a document or node was written, from its ``created_at`` (else ``timestamp``).

    The keys the adapters write (``created_at``, ISO 8601) and the one many loaders use
    (``timestamp``); see :func:`parse_time` for the accepted values.
    """
    when = parse_time(metadata.get("created_at"))
    return when if when is not None else parse_time(metadata.get("timestamp"))


def dated_line(text: str, when: datetime | None) -> str:
    """``text`` as a memory line a model reads: ``"[8 May 2023, 13:56] text"``.

    The timestamped form of MemoryBank's memory (Zhong et al. §2.1), used by every mechanism
    that shows dates; without a time the text is returned as it is.
    """
    return text if when is None else f"[{memory_time(when)}] {text}"


class SystemClock:
    """The wall clock, in UTC."""

    def now(self) -> datetime:
        """Return the current aware UTC datetime."""
        return utcnow()


class FixedClock:
    """A clock that only moves when told to; for tests and simulations.

    Args:
        start: The initial time (naive values are taken to be UTC).
    """

    def __init__(self, start: datetime) -> None:
        self._now = ensure_utc(start)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        """Return the clock's current time."""
        with self._lock:
            return self._now

    def set(self, value: datetime) -> None:
        """Jump to ``value``."""
        with self._lock:
            self._now = ensure_utc(value)

    def advance(self, delta: timedelta) -> datetime:
        """Move forward by ``delta`` and return the new time."""
        with self._lock:
            self._now = self._now + delta
            return self._now
