"""Row codecs shared by every SQL dialect: times, record state, jobs, JSON.

What a row of the engine's tables means is the same in SQLite and PostgreSQL: times are
integer microseconds since the Unix epoch (exact round trip, sortable), JSON columns hold
``json.dumps`` text, a record without a ``record_state`` row has the defaults of
:class:`~memories_core.types.RecordState`. These functions turn rows into the core's types
and back; the SQL that reads and writes them is in the table-family modules of this package.
"""

from __future__ import annotations

import builtins
import json
import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from memories_core.backends.claims import owner_is_dead
from memories_core.errors import InvalidInputError
from memories_core.filters import ColumnType
from memories_core.types import (
    STATE_FIELDS,
    Job,
    MemoryRecord,
    RecordState,
    check_metadata,
    ensure_utc,
)

__all__ = [
    "FAILED",
    "INDEXED",
    "JOB_COLUMNS",
    "NOT_INDEXED",
    "PENDING",
    "STATE_COLUMNS",
    "STATE_DEFAULTS",
    "apply_state_changes",
    "changed_fields",
    "dumps",
    "from_micros",
    "record_from_row",
    "state_filter_columns",
    "state_from_row",
    "state_values",
    "to_micros",
    "unclaimed_jobs",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)

#: ``records.index_state``: not for the vector index, pending, indexed, refused by the index
#: (counted; ``verify(repair=True)`` makes it pending again).
NOT_INDEXED, PENDING, INDEXED, FAILED = 0, 1, 2, 3

STATE_DEFAULTS = RecordState()
_TIME_FIELDS = ("last_recalled_at", "valid_from", "valid_until")

#: Columns of ``record_state`` selected with a record (after the record's own columns).
STATE_COLUMNS = (
    "s.strength, s.recall_count, s.last_recalled_at, s.tier, s.valid_from, s.valid_until, "
    "s.archived, s.attrs"
)

#: Columns of a job row, in the order :func:`unclaimed_jobs` reads them.
JOB_COLUMNS = (
    "id, user_id, mechanism, kind, key, payload, attempts, last_error, next_attempt_at, created_at"
)


def to_micros(value: datetime) -> int:
    """Integer microseconds since the Unix epoch (exact, sortable; naive means UTC)."""
    return (ensure_utc(value) - _EPOCH) // _MICROSECOND


def from_micros(value: int) -> datetime:
    """Inverse of :func:`to_micros`: an aware UTC datetime."""
    return _EPOCH + timedelta(microseconds=value)


def _opt_micros(value: datetime | None) -> int | None:
    return None if value is None else to_micros(value)


def _opt_time(value: int | None) -> datetime | None:
    return None if value is None else from_micros(value)


def dumps(value: Any) -> str:
    """Strict JSON text of ``value`` (no NaN or infinity).

    Raises:
        InvalidInputError: if ``value`` is not JSON-serialisable.
    """
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"value is not JSON-serialisable: {exc}") from exc


def state_filter_columns(false: str) -> dict[str, tuple[str, ColumnType]]:
    """Filter fields of a query joining ``records AS r`` with ``record_state AS s``.

    State fields with defaults are COALESCEd, so that a record without a state row matches
    them; ``false`` is the dialect's false literal (``0`` or ``FALSE``).
    """
    return {
        "id": ("r.id", "text"),
        "kind": ("r.kind", "text"),
        "session_id": ("r.session_id", "text"),
        "created_at": ("r.created_at", "datetime"),
        "strength": ("COALESCE(s.strength, 1.0)", "real"),
        "recall_count": ("COALESCE(s.recall_count, 0)", "int"),
        "last_recalled_at": ("s.last_recalled_at", "datetime"),
        "tier": ("s.tier", "text"),
        "valid_from": ("s.valid_from", "datetime"),
        "valid_until": ("s.valid_until", "datetime"),
        "archived": (f"COALESCE(s.archived, {false})", "bool"),
    }


def state_from_row(row: Sequence[Any]) -> RecordState:
    """Build a :class:`RecordState` from the 8 ``STATE_COLUMNS`` (all ``NULL``: defaults)."""
    strength, count, last, tier, vfrom, vuntil, archived, attrs = row
    if all(value is None for value in row):
        return STATE_DEFAULTS
    return RecordState(
        strength=1.0 if strength is None else float(strength),
        recall_count=0 if count is None else int(count),
        last_recalled_at=_opt_time(last),
        tier=tier,
        valid_from=_opt_time(vfrom),
        valid_until=_opt_time(vuntil),
        archived=bool(archived),
        attrs=json.loads(attrs) if attrs else {},
    )


def record_from_row(row: Sequence[Any]) -> MemoryRecord:
    """A record from its 8 columns, with its state when the 8 ``STATE_COLUMNS`` follow."""
    rid, user_id, kind, text, created, session_id, metadata, source_ids = row[:8]
    record = MemoryRecord(
        id=rid,
        user_id=user_id,
        kind=kind,
        text=text,
        created_at=from_micros(created),
        session_id=session_id,
        metadata=json.loads(metadata),
        source_ids=tuple(json.loads(source_ids)),
    )
    if len(row) > 8:
        object.__setattr__(record, "state", state_from_row(row[8:]))
    return record


def apply_state_changes(current: RecordState, changes: Mapping[str, Any]) -> RecordState:
    """Apply ``changes`` (state field -> new value; ``attrs`` merges, None deletes a key).

    Raises:
        InvalidInputError: on an unknown field or a value of the wrong type.
    """
    values: dict[str, Any] = {
        "strength": current.strength,
        "recall_count": current.recall_count,
        "last_recalled_at": current.last_recalled_at,
        "tier": current.tier,
        "valid_from": current.valid_from,
        "valid_until": current.valid_until,
        "archived": current.archived,
    }
    attrs = dict(current.attrs)
    for key, value in changes.items():
        if key == "attrs":
            if not isinstance(value, Mapping):
                raise InvalidInputError("attrs changes must be a mapping")
            checked = check_metadata(value, allow_reserved=frozenset(value))
            for name, item in checked.items():
                if item is None:
                    attrs.pop(name, None)
                else:
                    attrs[name] = item
            continue
        if key not in STATE_FIELDS:
            raise InvalidInputError(
                f"{key!r} is not a state field; state fields: {sorted(STATE_FIELDS)} and 'attrs'"
            )
        values[key] = _check_state_value(key, value)
    return RecordState(**values, attrs=attrs)


def _check_state_value(key: str, value: Any) -> Any:
    if key in _TIME_FIELDS:
        if value is not None and not isinstance(value, datetime):
            raise InvalidInputError(f"{key} must be a datetime or None")
        return None if value is None else ensure_utc(value)
    if key == "strength":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidInputError("strength must be a number")
        if not math.isfinite(value):
            raise InvalidInputError("strength must be finite")
        return float(value)
    if key == "recall_count":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInputError("recall_count must be an int >= 0")
        return value
    if key == "tier":
        if value is not None and not isinstance(value, str):
            raise InvalidInputError("tier must be a string or None")
        return value
    if not isinstance(value, bool):
        raise InvalidInputError("archived must be a bool")
    return value


def state_values(state: RecordState, boolean: Callable[[bool], Any]) -> tuple[Any, ...]:
    """The 8 ``record_state`` column values of ``state`` (after ``seq, user_id``).

    ``boolean`` stores ``archived`` the dialect's way (``int`` or ``bool``).
    """
    return (
        state.strength,
        state.recall_count,
        _opt_micros(state.last_recalled_at),
        state.tier,
        _opt_micros(state.valid_from),
        _opt_micros(state.valid_until),
        boolean(state.archived),
        dumps(dict(state.attrs)),
    )


def changed_fields(old: RecordState, new: RecordState) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(before, after)`` of the JSON fields that differ between two states."""
    before, after = old.to_json(), new.to_json()
    keys = [key for key in after if before[key] != after[key]]
    return {k: before[k] for k in keys}, {k: after[k] for k in keys}


def _row_to_job(row: Sequence[Any]) -> Job:
    jid, user_id, mechanism, kind, key, payload, attempts, error, next_at, created = row
    return Job(
        id=jid,
        user_id=user_id,
        mechanism=mechanism,
        kind=kind,
        key=key,
        payload=json.loads(payload),
        attempts=attempts,
        last_error=error,
        next_attempt_at=from_micros(next_at),
        created_at=from_micros(created),
    )


def unclaimed_jobs(
    rows: Sequence[Sequence[Any]], due_micros: int | None, limit: int | None
) -> builtins.list[Job]:
    """Jobs of rows ``(*JOB_COLUMNS, claimed_until, claimed_by)``.

    With ``due_micros``, a row claimed until later is kept only if its owner is a dead
    process of this host (:mod:`memories_core.backends.claims`); then at most ``limit``.
    """
    jobs: builtins.list[Job] = []
    for row in rows:
        claimed_until, owner = row[-2], row[-1]
        if (
            due_micros is not None
            and claimed_until is not None
            and claimed_until >= due_micros
            and not owner_is_dead(owner)
        ):
            continue
        jobs.append(_row_to_job(row[:-2]))
        if limit is not None and len(jobs) >= limit:
            break
    return jobs
