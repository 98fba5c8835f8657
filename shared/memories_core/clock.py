"""Clocks: time is injected so that every time-dependent rule is testable (DESIGN.md)."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta

from memories_core.types import ensure_utc, utcnow

__all__ = ["FixedClock", "SystemClock"]


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
