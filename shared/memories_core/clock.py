"""Clocks: time is injected so that every time-dependent rule is testable."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from memories_core.types import ensure_utc, utcnow

if TYPE_CHECKING:
    from memories_core.interfaces import Clock

__all__ = ["FixedClock", "SystemClock", "memory_time", "resolve_now"]


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
