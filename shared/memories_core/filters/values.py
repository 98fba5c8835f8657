"""The values a filter compares: field types, datetime encodings and typed comparison.

Shared by the Python evaluator (:mod:`memories_core.filters.expr`) and the SQL translators
(:mod:`memories_core.filters.sql`), so neither imports the other's internals.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any, Final, Literal

__all__ = [
    "ATTRS_PREFIX",
    "FIELD_TYPES",
    "MISSING",
    "RECORD_FIELDS",
    "STATE_FIELDS",
    "ColumnType",
    "Scalar",
    "ValueGetter",
    "from_micros",
    "to_iso",
    "to_micros",
]


ColumnType = Literal["text", "int", "real", "bool", "datetime"]


Scalar = str | int | float | bool | datetime


ValueGetter = Callable[[str], Any]


class _Missing:
    """Type of :data:`MISSING`."""

    _instance: _Missing | None = None

    def __new__(cls) -> _Missing:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


#: Returned by a value getter for a key the record does not have.
MISSING: Final = _Missing()


#: Immutable record fields and their types.
RECORD_FIELDS: Final[Mapping[str, ColumnType]] = {
    "id": "text",
    "kind": "text",
    "session_id": "text",
    "created_at": "datetime",
}


#: Mutable state fields (table ``record_state``) and their types.
STATE_FIELDS: Final[Mapping[str, ColumnType]] = {
    "strength": "real",
    "recall_count": "int",
    "last_recalled_at": "datetime",
    "tier": "text",
    "valid_from": "datetime",
    "valid_until": "datetime",
    "archived": "bool",
}


FIELD_TYPES: Final[Mapping[str, ColumnType]] = {**RECORD_FIELDS, **STATE_FIELDS}


ATTRS_PREFIX: Final = "attrs."


_RANGES = frozenset({"gt", "gte", "lt", "lte"})


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


_MICROSECOND = timedelta(microseconds=1)


def _utc(value: datetime) -> datetime:
    """``value`` as an aware UTC datetime (a naive value is taken to be UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def to_micros(value: datetime) -> int:
    """Integer microseconds since the Unix epoch (UTC): how SQLite stores datetime fields.

    A naive datetime is taken to be UTC.
    """
    return (_utc(value) - _EPOCH) // _MICROSECOND


def from_micros(value: int) -> datetime:
    """Inverse of :func:`to_micros`: an aware UTC datetime."""
    return _EPOCH + timedelta(microseconds=value)


def to_iso(value: datetime) -> str:
    """ISO-8601 UTC string of ``value``: how metadata stores datetimes.

    ``datetime.isoformat`` of a UTC datetime, e.g. ``2024-05-01T12:00:00+00:00`` or
    ``2024-05-01T12:00:00.250000+00:00``. These strings sort like the instants they name
    (``+`` sorts before ``.``), so string comparison is time comparison.
    """
    return _utc(value).isoformat()


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_scalar(value: object) -> bool:
    return isinstance(value, (str, int, float, bool, datetime))


def _equal(got: Any, want: Scalar) -> bool:
    """Typed equality: bool only equals bool, str only str, numbers by value."""
    if isinstance(want, bool):
        return isinstance(got, bool) and got == want
    if isinstance(want, (int, float)):
        return _is_number(got) and got == want
    if isinstance(want, str):
        return isinstance(got, str) and got == want
    if isinstance(got, datetime):
        return _utc(got) == want
    return isinstance(got, str) and got == to_iso(want)


def _order(got: Any, want: Scalar) -> int | None:
    """Sign of ``got - want`` for numbers and datetimes, ``None`` when not comparable."""
    left: Any
    right: Any
    if _is_number(want) and _is_number(got):
        left, right = got, want
    elif isinstance(want, datetime) and isinstance(got, datetime):
        left, right = _utc(got), want
    elif isinstance(want, datetime) and isinstance(got, str):
        left, right = got, to_iso(want)
    else:
        return None
    return (left > right) - (left < right)
