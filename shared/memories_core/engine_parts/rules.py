"""What the engine checks and returns: inputs, derivations, job policy, hooks, reports."""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal

from memories_core.errors import (
    ConfigurationError,
    InvalidInputError,
    MemoriesError,
    as_whole,
)
from memories_core.interfaces import MechanismHooks
from memories_core.types import (
    Job,
    MemoryRecord,
    Scope,
    Turn,
    without_surrogates,
)

__all__ = [
    "MAX_K",
    "PARKED_UNTIL",
    "Derivation",
    "DeriveMode",
    "JobFailed",
    "JobPolicy",
    "MechanismHooks",
    "VerifyReport",
    "check_k",
    "check_query",
    "check_scope",
    "check_turns",
    "default_derive",
    "is_parked",
    "turn_from_record",
    "turn_metadata",
]

#: The engine's log records keep the engine's logger name, whichever part writes them.
logger = logging.getLogger("memories_core.engine")

#: Largest ``k`` a recall accepts.
MAX_K = 10_000


#: Where derivations run: a background thread of the engine, or inside ``save``.
DeriveMode = Literal["background", "inline"]


_DERIVE_DEFAULT: contextvars.ContextVar[DeriveMode] = contextvars.ContextVar(
    "memories_derive_default", default="background"
)


@contextmanager
def default_derive(mode: DeriveMode) -> Iterator[None]:
    """Make ``mode`` the ``derive`` of engines built inside the block that give none.

    For test suites and scripts written for one mode: e.g. a suite that checks derivation
    rules step by step builds every engine with ``derive="inline"`` this way. An engine's
    own ``derive=`` argument always wins.

    Raises:
        ConfigurationError: for a mode other than ``"background"`` or ``"inline"``.
    """
    if mode not in ("background", "inline"):
        raise ConfigurationError(f"derive must be 'background' or 'inline', got {mode!r}")
    token = _DERIVE_DEFAULT.set(mode)
    try:
        yield
    finally:
        _DERIVE_DEFAULT.reset(token)


_EMBEDDER_STATE_KEY = "embedder"


_SESSION_KEY = "engine.session"


class JobFailed(MemoriesError):
    """Raised by a job handler for a failure it has a name for (counted in ``usage.failures``).

    Args:
        label: The failure's name (e.g. ``"decision"``, ``"record"``).
        message: What went wrong.
    """

    def __init__(self, label: str, message: str) -> None:
        super().__init__(message)
        self.label = label


class _JobGone(Exception):
    """The job was finished by another worker meanwhile; roll back what this one derived."""


@dataclass(frozen=True)
class Derivation:
    """What a job produced, committed in one transaction with the job's completion.

    Attributes:
        add: New records (indexed for vector search).
        replace: Ids of the user's records deleted in the same transaction (e.g. an older
            summary of the same session).
        state: State changes, record id -> ``{field: value}``.
        reason: Reason kept in the update history for ``state``.
        apply: Further store writes of the mechanism (graph nodes and edges, state changes
            with their own reasons), run inside the same transaction after the records are
            added: they commit with the job's completion, or not at all (EMG-RAG §4.2 edits).
            Store calls only; no model calls.
        index: Whether the added records get vectors (``False``: kept for the mechanism's
            own lookups only, e.g. DPeM's working notes).
    """

    add: Sequence[MemoryRecord] = ()
    replace: Sequence[str] = ()
    state: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    reason: str | None = None
    apply: Callable[[], None] | None = None
    index: bool = True


@dataclass(frozen=True)
class JobPolicy:
    """How pending work is retried: a budget per run, exponential backoff, leases, parking.

    Attributes:
        retry_budget: Older due jobs a save may retry after running its own new jobs.
        base_backoff: Wait after a job's first failure; doubles with every failure.
        max_backoff: Longest wait between attempts.
        lease: How long a claimed job is reserved for the worker running it; a worker that
            died frees it when the lease ends.
        max_attempts: Failures after which a job whose last failure was its *content* (a
            reply that does not parse, a derivation refused) is parked: it is kept, with its
            turns and its error, but runs again only on an explicit retry
            (``retry_pending()``, ``llm-memories retry-pending``). A greedy model writes the
            same reply to the same prompt, so its retries would cost a full generation every
            ``max_backoff`` forever. Failures of an unreachable or slow model
            (:class:`~memories_core.errors.LLMError`) never park a job: the model comes back.
            ``None``: retry every job for ever.
    """

    retry_budget: int = 4
    base_backoff: timedelta = timedelta(seconds=10)
    max_backoff: timedelta = timedelta(hours=1)
    lease: timedelta = timedelta(minutes=5)
    max_attempts: int | None = 4

    def __post_init__(self) -> None:
        attempts = self.max_attempts
        if attempts is not None and (
            isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1
        ):
            raise ConfigurationError(
                f"max_attempts must be a positive int or None, got {attempts!r}"
            )

    def retry_at(self, now: datetime, attempts: int) -> datetime:
        """When a job that has failed ``attempts + 1`` times may run again."""
        delay = self.base_backoff * (2 ** min(attempts, 30))
        return now + min(delay, self.max_backoff)

    def parks(self, attempts: int) -> bool:
        """Whether a job failing for its content for the ``attempts + 1``-th time is parked."""
        return self.max_attempts is not None and attempts + 1 >= self.max_attempts


#: The retry time of a parked job: never due by the clock, only on an explicit retry.
PARKED_UNTIL = datetime(9999, 1, 1, tzinfo=timezone.utc)


def is_parked(job: Job) -> bool:
    """Whether ``job`` is parked (:attr:`JobPolicy.max_attempts`): due only on an explicit retry."""
    return job.next_attempt_at >= PARKED_UNTIL


@dataclass(frozen=True)
class VerifyReport:
    """What :meth:`MemoryEngine.verify` found (and repaired, if asked).

    Attributes:
        users: Users checked.
        missing: Record ids marked indexed whose vector is absent from the index.
        orphans: Vector ids with no record behind them.
        unreachable: Ids whose vector is stored but not found by a query with itself: a
            damaged index (seen after kills), or, at scale, an approximate-search miss of HNSW
            (about 0.5% of records at 20k synthetic vectors with ``ef_search`` 100); repair
            re-adds them.
        failed: Ids the index refused earlier.
        repaired: Whether the problems were repaired (re-indexed, orphans removed).
    """

    users: int = 0
    missing: tuple[str, ...] = ()
    orphans: tuple[str, ...] = ()
    unreachable: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    repaired: bool = False

    @property
    def ok(self) -> bool:
        """Whether store and index agree."""
        return not (self.missing or self.orphans or self.unreachable or self.failed)


def check_scope(scope: Any) -> Scope:
    """Return ``scope`` if it is a :class:`Scope`, else raise :class:`InvalidInputError`."""
    if not isinstance(scope, Scope):
        raise InvalidInputError(f"scope must be a Scope, got {type(scope).__name__}")
    return scope


def check_turns(turns: Any) -> list[Turn]:
    """Return ``turns`` as a list of :class:`Turn` (one Turn is accepted too).

    Raises:
        InvalidInputError: for ``None``, a string, or anything that is not Turns.
    """
    if isinstance(turns, Turn):
        return [turns]
    if turns is None or isinstance(turns, (str, bytes, Mapping)):
        raise InvalidInputError("turns must be a sequence of Turn objects")
    try:
        out = list(turns)
    except TypeError as exc:
        raise InvalidInputError(f"turns must be a sequence of Turn, got {turns!r}") from exc
    for turn in out:
        if not isinstance(turn, Turn):
            raise InvalidInputError(f"turns must be Turn objects, got {type(turn).__name__}")
    return out


def check_k(k: Any) -> int:
    """Validate a result count: a whole number in ``1..MAX_K``, returned as an ``int``."""
    whole = as_whole(k)
    if whole is None or not 1 <= whole <= MAX_K:
        raise InvalidInputError(f"k must be an int from 1 to {MAX_K}, got {k!r}")
    return whole


def check_query(query: Any) -> str:
    """Validate a query: a non-empty string; returns it as it is searched.

    The documented fallback of :func:`~memories_core.types.clean_text`: lone UTF-16
    surrogates (which no encoder or store can take) become U+FFFD.
    """
    if not isinstance(query, str) or not query.strip():
        raise InvalidInputError("query is empty or only whitespace")
    return without_surrogates(query)


def turn_metadata(turn: Turn, batch_id: str) -> dict[str, Any]:
    """The stored metadata of a turn: the caller's plus ``role``, ``speaker``, ``batch_id``."""
    meta: dict[str, Any] = dict(turn.metadata)
    meta["role"] = turn.role
    if turn.speaker:
        meta["speaker"] = turn.speaker
    meta["batch_id"] = batch_id
    return meta


def turn_from_record(record: MemoryRecord) -> Turn:
    """Rebuild the :class:`Turn` a ``"turn"`` record was stored from."""
    meta = dict(record.metadata)
    role = str(meta.pop("role", "user"))
    speaker = meta.pop("speaker", None)
    meta.pop("batch_id", None)
    label = speaker or role
    prefix = f"{label}: "
    content = record.text[len(prefix) :] if record.text.startswith(prefix) else record.text
    return Turn(
        role=role, content=content, speaker=speaker, timestamp=record.created_at, metadata=meta
    )
