"""Cost counters: every LLM and embedder call is counted (cost is visible)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields

__all__ = ["MemoryUsage", "Usage", "UsageCounter", "estimate_tokens"]


def estimate_tokens(text: str) -> int:
    """Rough token count (about four characters a token) for backends that report none."""
    return max(1, (len(text) + 3) // 4) if text else 0


@dataclass(frozen=True)
class Usage:
    """A snapshot of what a model has cost so far.

    Attributes:
        calls: Successful calls.
        failures: Calls that raised.
        prompt_tokens: Tokens sent (for embedders: tokens embedded, estimated).
        completion_tokens: Tokens generated (always 0 for embedders).
        items: Texts embedded (embedders only).
        capped: Successful calls whose reply reached its output cap (``max_tokens``), as far
            as the backend reports its token counts: a reply that was cut, or a model that
            loops until the cap stops it. A reply that :class:`~memories_core.llms.LocalLLM`
            stopped in a loop before the cap counts too.
    """

    calls: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    items: int = 0
    capped: int = 0

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion tokens."""
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, n) + getattr(other, n) for n in _COUNTS))

    def __sub__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, n) - getattr(other, n) for n in _COUNTS))


#: :class:`Usage`'s counters, in field order (added and subtracted field by field).
_COUNTS = tuple(f.name for f in fields(Usage))


@dataclass
class UsageCounter:
    """A thread-safe, mutable counter; ``snapshot()`` returns an immutable :class:`Usage`."""

    _usage: Usage = field(default_factory=Usage)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(
        self,
        *,
        calls: int = 0,
        failures: int = 0,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        items: int = 0,
        capped: int = 0,
    ) -> None:
        """Add to the counters."""
        delta = Usage(calls, failures, prompt_tokens, completion_tokens, items, capped)
        with self._lock:
            self._usage = self._usage + delta

    def snapshot(self) -> Usage:
        """Return the counts so far."""
        with self._lock:
            return self._usage

    def reset(self) -> None:
        """Set every counter back to zero."""
        with self._lock:
            self._usage = Usage()


@dataclass(frozen=True)
class MemoryUsage:
    """What a memory object has cost so far, and what failed.

    Attributes:
        llm: Usage of the memory's LLM (``None`` for mechanisms without one).
        embedder: Usage of the memory's embedder.
        failures: Failed derivations by name (e.g. ``{"summary": 1, "index": 0}``); the raw
            turns behind a failure are always stored and the derivation is retried later.
        finished_after: Pending jobs that finished, by the run that succeeded (``{1: 40,
            2: 1}``: 40 on their first run, one after one failure). With ``failures``, it
            shows whether retries of a failed job ever succeed (``JobPolicy.max_attempts``).
    """

    llm: Usage | None
    embedder: Usage
    failures: dict[str, int] = field(default_factory=dict)
    finished_after: dict[int, int] = field(default_factory=dict)

    def summary(self) -> dict[str, int]:
        """Flat counts for tracing: embedder calls, and LLM calls and tokens when there is one."""
        out = {"embedder_calls": self.embedder.calls}
        if self.llm is not None:
            out.update(
                llm_calls=self.llm.calls,
                llm_prompt_tokens=self.llm.prompt_tokens,
                llm_completion_tokens=self.llm.completion_tokens,
            )
        return out
