"""The filter language: a ``where`` mapping compiled into an expression, matched in Python."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memories_core.errors import InvalidInputError
from memories_core.filters.sql import TRANSLATORS, SQLiteTranslator
from memories_core.filters.values import (
    _RANGES,
    ATTRS_PREFIX,
    FIELD_TYPES,
    MISSING,
    RECORD_FIELDS,
    STATE_FIELDS,
    ColumnType,
    Scalar,
    ValueGetter,
    _equal,
    _is_number,
    _is_scalar,
    _order,
    _utc,
    from_micros,
    to_iso,
    to_micros,
)

__all__ = [
    "ATTRS_PREFIX",
    "FIELD_TYPES",
    "MISSING",
    "RECORD_FIELDS",
    "STATE_FIELDS",
    "AllOf",
    "AnyOf",
    "ColumnType",
    "Condition",
    "FilterExpr",
    "Scalar",
    "ValueGetter",
    "compile_filter",
    "from_micros",
    "index_prefilter",
    "is_index_field",
    "record_getter",
    "to_iso",
    "to_micros",
]


# Keys that may not appear in a filter at all, with the reason.
_FORBIDDEN_KEYS = {
    "user_id": "user_id may not appear in a filter: pass it as the user_id argument",
    "text": "text is not a filterable field (use a text search)",
    "source_ids": "source_ids is not a filterable field",
}


_COMPARISONS = {"$eq": "eq", "$ne": "ne", "$gt": "gt", "$gte": "gte", "$lt": "lt", "$lte": "lte"}


_OPERATORS = {**_COMPARISONS, "$in": "in", "$nin": "nin", "$exists": "exists"}


_INT64 = (-(2**63), 2**63 - 1)


class FilterExpr(ABC):
    """A compiled filter: an immutable tree of :class:`Condition`, :class:`AllOf`, :class:`AnyOf`.

    Build one with :func:`compile_filter`; never from user input directly.
    """

    __slots__ = ()

    @abstractmethod
    def matches(self, get: ValueGetter) -> bool:
        """Evaluate the filter in Python.

        Args:
            get: Returns the value of a key (a field, ``attrs.<name>`` or metadata key), or
                :data:`MISSING` (``None`` counts as missing too). Datetime fields are
                ``datetime`` objects; see :func:`record_getter` for a record.
        """

    @abstractmethod
    def translate_with(self, translator: SQLiteTranslator) -> tuple[str, list[Any]]:
        """``(condition, params)`` of this node in ``translator``'s SQL dialect.

        Use :meth:`to_sql`; this is the translators' callback, so the SQL module needs the
        node classes only for typing.
        """

    @abstractmethod
    def fields(self) -> frozenset[str]:
        """Every key the filter references."""

    def conjuncts(self) -> tuple[FilterExpr, ...]:
        """The parts of the top-level AND (just ``(self,)`` unless this is an :class:`AllOf`)."""
        return (self,)

    def split(self, available: Callable[[str], bool]) -> FilterExpr | None:
        """The part of the top-level AND that uses only keys ``available`` accepts.

        Used by backends that know only some fields (a vector index knows ``kind``,
        ``session_id`` and scalar metadata, not state): they pre-filter with the result,
        which matches a superset of the full filter, and the caller re-checks the full
        filter afterwards.

        Returns:
            The kept conjuncts, or ``None`` if none is usable (no pre-filter).
        """
        kept = tuple(
            part for part in self.conjuncts() if all(available(key) for key in part.fields())
        )
        if not kept:
            return None
        return kept[0] if len(kept) == 1 else AllOf(kept)

    def to_sql(
        self,
        columns: Mapping[str, tuple[str, ColumnType]],
        *,
        metadata_column: str,
        attrs_column: str | None = None,
        dialect: str = "sqlite",
    ) -> tuple[str, list[Any]]:
        """Translate the filter into one SQL condition and its parameters.

        Args:
            columns: Field name -> ``(sql expression, type)``; types are ``"text"``,
                ``"int"``, ``"real"``, ``"bool"`` (stored 0/1) and ``"datetime"`` (stored as
                integer microseconds since the epoch, :func:`to_micros`). ``NULL`` means
                missing, so give defaults with ``COALESCE`` where the Python side has them.
            metadata_column: SQL expression of the metadata JSON (keys not in ``columns``).
            attrs_column: SQL expression of the state ``attrs`` JSON, if the query has it.
            dialect: ``"sqlite"`` (:class:`SQLiteTranslator`) or ``"postgres"``
                (:class:`PostgresTranslator`).

        Returns:
            ``(condition, params)`` with the dialect's placeholders (``?`` / ``%s``), ready
            to AND into a ``WHERE``.

        Raises:
            InvalidInputError: if the filter names a field the query does not provide
                (e.g. a state field when ``columns`` maps only the records table).
        """
        translator = TRANSLATORS.get(dialect)
        if translator is None:
            raise InvalidInputError(f"no SQL translation for dialect {dialect!r}")
        return translator(columns, metadata_column, attrs_column).translate(self)


@dataclass(frozen=True)
class Condition(FilterExpr):
    """One operator on one key.

    Attributes:
        key: Field, ``attrs.<name>`` or metadata key.
        op: ``eq``, ``ne``, ``gt``, ``gte``, ``lt``, ``lte``, ``in``, ``nin`` or ``exists``.
        value: A scalar (datetimes in UTC), a tuple of scalars (``in``/``nin``) or a bool
            (``exists``).
    """

    key: str
    op: str
    value: Any

    def matches(self, get: ValueGetter) -> bool:  # noqa: D102
        got = get(self.key)
        present = got is not MISSING and got is not None
        if self.op == "exists":
            return present is self.value
        if not present or not _is_scalar(got):
            return False
        if self.op == "eq":
            return _equal(got, self.value)
        if self.op == "ne":
            return not _equal(got, self.value)
        if self.op == "in":
            return any(_equal(got, want) for want in self.value)
        if self.op == "nin":
            return not any(_equal(got, want) for want in self.value)
        sign = _order(got, self.value)
        if sign is None:
            return False
        return {"gt": sign > 0, "gte": sign >= 0, "lt": sign < 0, "lte": sign <= 0}[self.op]

    def translate_with(self, translator: SQLiteTranslator) -> tuple[str, list[Any]]:  # noqa: D102
        return translator.condition(self)

    def fields(self) -> frozenset[str]:  # noqa: D102
        return frozenset((self.key,))


@dataclass(frozen=True)
class AllOf(FilterExpr):
    """Every part matches (``$and``, several keys, several operators on one key)."""

    parts: tuple[FilterExpr, ...]

    def matches(self, get: ValueGetter) -> bool:  # noqa: D102
        return all(part.matches(get) for part in self.parts)

    def translate_with(self, translator: SQLiteTranslator) -> tuple[str, list[Any]]:  # noqa: D102
        return translator.group(self.parts, every=True)

    def fields(self) -> frozenset[str]:  # noqa: D102
        return frozenset().union(*(part.fields() for part in self.parts))

    def conjuncts(self) -> tuple[FilterExpr, ...]:  # noqa: D102
        return self.parts


@dataclass(frozen=True)
class AnyOf(FilterExpr):
    """At least one part matches (``$or``)."""

    parts: tuple[FilterExpr, ...]

    def matches(self, get: ValueGetter) -> bool:  # noqa: D102
        return any(part.matches(get) for part in self.parts)

    def translate_with(self, translator: SQLiteTranslator) -> tuple[str, list[Any]]:  # noqa: D102
        return translator.group(self.parts, every=False)

    def fields(self) -> frozenset[str]:  # noqa: D102
        return frozenset().union(*(part.fields() for part in self.parts))


def compile_filter(where: Mapping[str, Any] | FilterExpr | None) -> FilterExpr | None:
    """Validate a filter mapping and compile it.

    Args:
        where: The filter (see the module docstring); ``None`` or ``{}`` means no filter.
            An already compiled :class:`FilterExpr` is returned as is.

    Returns:
        The compiled filter, or ``None`` when there is nothing to filter on.

    Raises:
        InvalidInputError: on a ``user_id`` key, an unknown ``$`` operator, a range operator
            on a string or bool, a non-list ``$in``/``$nin``, a NaN or infinite number, an
            empty ``$and``/``$or``, or a value of the wrong type for a known field.
    """
    if where is None or isinstance(where, FilterExpr):
        return where
    if not isinstance(where, Mapping):
        raise InvalidInputError(f"a filter must be a mapping, got {type(where).__name__}")
    if not where:
        return None
    return _compile_mapping(where)


def _combine(parts: Sequence[FilterExpr]) -> FilterExpr:
    flat: list[FilterExpr] = []
    for part in parts:
        flat.extend(part.conjuncts())
    return flat[0] if len(flat) == 1 else AllOf(tuple(flat))


def _compile_mapping(where: Mapping[str, Any]) -> FilterExpr:
    parts: list[FilterExpr] = []
    for key, value in where.items():
        if key in ("$and", "$or"):
            parts.append(_compile_logical(key, value))
        else:
            _check_key(key)
            parts.append(_compile_field(key, value))
    return _combine(parts)


def _compile_logical(op: str, value: Any) -> FilterExpr:
    if not isinstance(value, (list, tuple)):
        raise InvalidInputError(f"{op} takes a list of filters, got {type(value).__name__}")
    if not value:
        raise InvalidInputError(f"{op} needs at least one filter")
    subs: list[FilterExpr] = []
    for item in value:
        if not isinstance(item, Mapping) or not item:
            raise InvalidInputError(f"each item of {op} must be a non-empty filter, got {item!r}")
        subs.append(_compile_mapping(item))
    if op == "$and":
        return _combine(subs)
    return subs[0] if len(subs) == 1 else AnyOf(tuple(subs))


def _check_key(key: Any) -> None:
    if not isinstance(key, str) or not key:
        raise InvalidInputError(f"filter keys must be non-empty strings, got {key!r}")
    if key in _FORBIDDEN_KEYS:
        raise InvalidInputError(_FORBIDDEN_KEYS[key])
    if key.startswith("$"):
        raise InvalidInputError(f"unknown filter operator {key!r} (top-level operators: $and, $or)")
    if key == ATTRS_PREFIX:
        raise InvalidInputError("a filter on attrs needs a name: 'attrs.<name>'")
    # SQLite JSON paths quote keys as $."key" with no escapes, and match the raw (escaped)
    # JSON text, so these characters could not be looked up the same way in every backend.
    if any(ch in key for ch in '"\\') or any(ord(ch) < 0x20 for ch in key):
        raise InvalidInputError(
            f"filter key {key!r} may not contain quotes, backslashes or control characters"
        )


def _compile_field(key: str, value: Any) -> FilterExpr:
    if isinstance(value, Mapping):
        if not value:
            raise InvalidInputError(f"empty operator mapping for {key!r}")
        parts = [_compile_operator(key, op, operand) for op, operand in value.items()]
        return _combine(parts)
    return Condition(key, "eq", _check_value(key, "$eq", value))


def _compile_operator(key: str, op: Any, operand: Any) -> FilterExpr:
    name = _OPERATORS.get(op) if isinstance(op, str) else None
    if name is None:
        raise InvalidInputError(
            f"unknown filter operator {op!r} on {key!r} (known: {', '.join(_OPERATORS)})"
        )
    if name == "exists":
        if not isinstance(operand, bool):
            raise InvalidInputError(f"$exists on {key!r} takes True or False, got {operand!r}")
        return Condition(key, name, operand)
    if name in ("in", "nin"):
        if not isinstance(operand, (list, tuple)):
            raise InvalidInputError(f"{op} on {key!r} takes a list, got {type(operand).__name__}")
        return Condition(key, name, tuple(_check_value(key, op, item) for item in operand))
    checked = _check_value(key, op, operand)
    if name in _RANGES and not (_is_number(checked) or isinstance(checked, datetime)):
        raise InvalidInputError(
            f"{op} on {key!r} needs a number or a datetime, got {type(operand).__name__}"
        )
    return Condition(key, name, checked)


def _check_value(key: str, op: str, value: Any) -> Scalar:
    """Validate one operand; return it normalised (datetimes in UTC)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidInputError(f"{op} on {key!r}: NaN and infinite numbers cannot be filtered")
    if _is_number(value) and isinstance(value, int) and not _INT64[0] <= value <= _INT64[1]:
        raise InvalidInputError(f"{op} on {key!r}: integer {value} is out of 64-bit range")
    if not _is_scalar(value):
        raise InvalidInputError(
            f"{op} on {key!r} takes a str, int, float, bool or datetime, got {type(value).__name__}"
        )
    expected = FIELD_TYPES.get(key)
    if expected is not None and not _fits(value, expected):
        raise InvalidInputError(
            f"{key!r} is a {_TYPE_NAMES[expected]} field; {op} got {type(value).__name__}"
        )
    return _utc(value) if isinstance(value, datetime) else value


_TYPE_NAMES = {
    "text": "string",
    "int": "number",
    "real": "number",
    "bool": "bool",
    "datetime": "datetime",
}


def _fits(value: Scalar, kind: ColumnType) -> bool:
    if kind == "text":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "datetime":
        return isinstance(value, datetime)
    return _is_number(value)


def is_index_field(key: str) -> bool:
    """Whether a vector index's metadata can answer ``key``: ``kind``, ``session_id``, metadata.

    Index metadata holds the record's scalar metadata plus ``kind`` and ``session_id``
    (:func:`memories_core.retrieval.index_metadata`), never state, ``attrs`` or ``created_at``.
    Pass it to :meth:`FilterExpr.split`.
    """
    if key in FIELD_TYPES:
        return key in ("kind", "session_id")
    return not key.startswith(ATTRS_PREFIX)


def index_prefilter(
    where: Mapping[str, Any] | FilterExpr | None, *, with_id: bool = False
) -> FilterExpr | None:
    """The part of ``where`` a vector index can apply without losing any match.

    The conjuncts on :func:`is_index_field` keys (and ``id`` with ``with_id``), minus those
    that test ``$exists: True`` on a metadata key: index metadata leaves out lists, dicts and
    ``None``, so a key present in the record may be absent from its vector. What remains
    matches a superset of ``where``; the caller re-checks the full filter.

    Raises:
        InvalidInputError: if ``where`` is not a valid filter.
    """
    expr = compile_filter(where)
    if expr is None:
        return None

    def usable(key: str) -> bool:
        return (with_id and key == "id") or is_index_field(key)

    kept = tuple(
        part
        for part in (expr.split(usable) or AllOf(())).conjuncts()
        if not any(
            cond.op == "exists" and cond.value and cond.key not in FIELD_TYPES
            for cond in _conditions(part)
        )
    )
    if not kept:
        return None
    return kept[0] if len(kept) == 1 else AllOf(kept)


def _conditions(expr: FilterExpr) -> Iterator[Condition]:
    if isinstance(expr, Condition):
        yield expr
    elif isinstance(expr, (AllOf, AnyOf)):
        for part in expr.parts:
            yield from _conditions(part)


def record_getter(record: Any) -> ValueGetter:
    """A value getter over a :class:`~memories_core.types.MemoryRecord` for :meth:`matches`.

    Record fields come from the record, state fields and ``attrs.<name>`` from
    ``record.state`` (missing when the record carries no state), other keys from metadata.
    """
    state = getattr(record, "state", None)

    def get(key: str) -> Any:
        if key in RECORD_FIELDS:
            return getattr(record, key)
        if key in STATE_FIELDS:
            return MISSING if state is None else getattr(state, key, MISSING)
        if key.startswith(ATTRS_PREFIX):
            attrs = getattr(state, "attrs", None) if state is not None else None
            return MISSING if attrs is None else attrs.get(key[len(ATTRS_PREFIX) :], MISSING)
        return record.metadata.get(key, MISSING)

    return get
