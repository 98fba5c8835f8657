"""Translating a compiled filter into SQL for SQLite and PostgreSQL, with bound parameters only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memories_core.errors import InvalidInputError
from memories_core.filters.values import (
    _RANGES,
    ATTRS_PREFIX,
    FIELD_TYPES,
    ColumnType,
    Scalar,
    _is_number,
    to_iso,
    to_micros,
)

if TYPE_CHECKING:
    from memories_core.filters.expr import Condition, FilterExpr

__all__ = ["TRANSLATORS", "PostgresTranslator", "SQLiteTranslator"]


class SQLiteTranslator:
    """Translates a :class:`FilterExpr` into a SQLite condition.

    Column fields compare their SQL values directly (datetimes as microseconds, bools as
    0/1). JSON keys use ``json_type`` to keep the typing of the Python evaluator
    (``json_extract`` alone maps ``true`` to 1) and ``json_extract`` for the value.

    Another dialect (e.g. Postgres with ``jsonb_typeof`` / ``->>``) subclasses this and
    overrides the JSON hooks (:meth:`json_type`, :meth:`json_value`, the type-name
    attributes) and :attr:`placeholder`; the operator logic is shared.
    """

    placeholder = "?"
    #: Placeholder of a number compared with a JSON number (a dialect may cast it).
    number_placeholder = "?"
    #: SQL literal of a condition that is never true.
    false_sql = "0"
    #: ``json_type`` results for JSON numbers, text, true, false, and every scalar.
    number_types: tuple[str, ...] = ("integer", "real")
    text_types: tuple[str, ...] = ("text",)
    true_types: tuple[str, ...] = ("true",)
    false_types: tuple[str, ...] = ("false",)
    null_type = "null"

    def __init__(
        self,
        columns: Mapping[str, tuple[str, ColumnType]],
        metadata_column: str,
        attrs_column: str | None = None,
    ) -> None:
        self.columns = columns
        self.metadata_column = metadata_column
        self.attrs_column = attrs_column

    # -- dialect hooks ----------------------------------------------------------------------

    def json_path(self, key: str) -> str:
        """The JSON path parameter that addresses the top-level ``key``."""
        return f'$."{key}"'

    def json_type(self, column: str, key: str) -> tuple[str, list[Any]]:
        """SQL for the JSON type name of ``column[key]`` (``NULL`` when absent)."""
        return f"json_type({column}, {self.placeholder})", [self.json_path(key)]

    def json_value(self, column: str, key: str) -> tuple[str, list[Any]]:
        """SQL for the SQL value of the scalar ``column[key]``."""
        return f"json_extract({column}, {self.placeholder})", [self.json_path(key)]

    def json_number(self, column: str, key: str) -> tuple[str, list[Any]]:
        """SQL for ``column[key]`` compared as a number (used under a number type check)."""
        return self.json_value(column, key)

    def json_text(self, column: str, key: str) -> tuple[str, list[Any]]:
        """SQL for ``column[key]`` compared as text (used under a text type check)."""
        return self.json_value(column, key)

    # -- translation ------------------------------------------------------------------------

    def translate(self, expr: FilterExpr) -> tuple[str, list[Any]]:
        """``(condition, params)`` for ``expr``.

        Each node calls back :meth:`group` or :meth:`condition`, so this module needs the
        node classes only for typing.
        """
        return expr.translate_with(self)

    def group(self, parts: Sequence[FilterExpr], *, every: bool) -> tuple[str, list[Any]]:
        """``(condition, params)`` joining ``parts`` with AND (``every``) or OR."""
        joiner = " AND " if every else " OR "
        sqls: list[str] = []
        params: list[Any] = []
        for part in parts:
            sql, more = self.translate(part)
            sqls.append(sql)
            params += more
        return "(" + joiner.join(sqls) + ")", params

    def condition(self, expr: Condition) -> tuple[str, list[Any]]:
        """``(condition, params)`` for one operator on one key."""
        column = self.columns.get(expr.key)
        if column is not None:
            return self._column_condition(expr, *column)
        if expr.key in FIELD_TYPES:
            raise InvalidInputError(f"this store cannot filter on {expr.key!r}")
        if expr.key.startswith(ATTRS_PREFIX):
            if self.attrs_column is None:
                raise InvalidInputError(f"this store cannot filter on {expr.key!r}")
            return self._json_condition(expr, self.attrs_column, expr.key[len(ATTRS_PREFIX) :])
        return self._json_condition(expr, self.metadata_column, expr.key)

    def _column_condition(
        self, cond: Condition, sql: str, kind: ColumnType
    ) -> tuple[str, list[Any]]:
        p = self.placeholder
        present = f"{sql} IS NOT NULL"
        if cond.op == "exists":
            return (present if cond.value else f"{sql} IS NULL"), []
        if cond.op in ("in", "nin"):
            values = [v for v in (self._column_param(w, kind) for w in cond.value) if v is not None]
            if cond.op == "in":
                if not values:
                    return self.false_sql, []
                return f"{sql} IN ({', '.join(p for _ in values)})", values
            if not values:
                return present, []
            return f"({present} AND {sql} NOT IN ({', '.join(p for _ in values)}))", values
        value = self._column_param(cond.value, kind)
        if cond.op == "ne":
            return (present, []) if value is None else (f"({present} AND {sql} <> {p})", [value])
        if value is None or (cond.op in _RANGES and kind in ("text", "bool")):
            return self.false_sql, []  # a value of another type never compares
        symbol = {"eq": "=", "gt": ">", "gte": ">=", "lt": "<", "lte": "<="}[cond.op]
        return f"{sql} {symbol} {p}", [value]

    @staticmethod
    def _column_param(value: Scalar, kind: ColumnType) -> Any:
        """The SQL parameter for ``value`` in a column of ``kind``, ``None`` if never equal."""
        if kind == "text":
            return value if isinstance(value, str) else None
        if kind == "bool":
            return int(value) if isinstance(value, bool) else None
        if kind == "datetime":
            return to_micros(value) if isinstance(value, datetime) else None
        return value if _is_number(value) else None

    def _json_condition(self, cond: Condition, column: str, key: str) -> tuple[str, list[Any]]:
        type_sql, type_params = self.json_type(column, key)
        if cond.op == "exists":
            symbol = "<>" if cond.value else "="
            return f"COALESCE({type_sql}, '{self.null_type}') {symbol} '{self.null_type}'", [
                *type_params
            ]
        if cond.op in ("eq", "in"):
            values = (cond.value,) if cond.op == "eq" else cond.value
            return self._json_in(values, column, key)
        if cond.op in ("ne", "nin"):
            values = (cond.value,) if cond.op == "ne" else cond.value
            sql, params = self._json_in(values, column, key)
            scalars = self._types(
                self.number_types + self.text_types + self.true_types + self.false_types
            )
            # On a present scalar, the IN condition is never NULL, so NOT is exact.
            return f"({type_sql} IN {scalars} AND NOT {sql})", [*type_params, *params]
        symbol = {"gt": ">", "gte": ">=", "lt": "<", "lte": "<="}[cond.op]
        if isinstance(cond.value, datetime):
            types, param = self.text_types, to_iso(cond.value)
            value_sql, value_params = self.json_text(column, key)
            mark = self.placeholder
        else:
            types, param = self.number_types, cond.value
            value_sql, value_params = self.json_number(column, key)
            mark = self.number_placeholder
        return (
            f"({type_sql} IN {self._types(types)} AND {value_sql} {symbol} {mark})",
            [*type_params, *value_params, param],
        )

    def _json_in(self, values: Sequence[Scalar], column: str, key: str) -> tuple[str, list[Any]]:
        """Condition: ``column[key]`` equals one of ``values`` (typed), never NULL."""
        type_sql, type_params = self.json_type(column, key)
        bool_types = tuple(
            dict.fromkeys(
                t
                for v in values
                if isinstance(v, bool)
                for t in (self.true_types if v else self.false_types)
            )
        )
        numbers = [v for v in values if _is_number(v)]
        texts = [to_iso(v) if isinstance(v, datetime) else v for v in values if _is_text(v)]
        clauses: list[str] = []
        params: list[Any] = []
        if bool_types:
            clauses.append(f"{type_sql} IN {self._types(bool_types)}")
            params += type_params
        groups = (
            (self.number_types, numbers, self.json_number, self.number_placeholder),
            (self.text_types, texts, self.json_text, self.placeholder),
        )
        for types, group, typed_value, mark in groups:
            if group:
                value_sql, value_params = typed_value(column, key)
                marks = ", ".join(mark for _ in group)
                clauses.append(f"({type_sql} IN {self._types(types)} AND {value_sql} IN ({marks}))")
                params += [*type_params, *value_params, *group]
        if not clauses:
            return self.false_sql, []
        # COALESCE: json_type is NULL for an absent key, and this may sit under a NOT.
        return "COALESCE(" + " OR ".join(clauses) + f", {self.false_sql})", params

    @staticmethod
    def _types(names: Sequence[str]) -> str:
        return "(" + ", ".join(f"'{name}'" for name in names) + ")"


def _is_text(value: Scalar) -> bool:
    return isinstance(value, (str, datetime))


class PostgresTranslator(SQLiteTranslator):
    """Translates a :class:`FilterExpr` into a PostgreSQL condition (psycopg ``%s`` style).

    JSON columns are of type ``json`` (kept as written, so numbers round-trip exactly).
    The JSON type of a key is ``json_typeof`` with booleans split into ``'true'`` and
    ``'false'`` (as SQLite's ``json_type`` does); values are read with ``->>`` and converted
    only under a ``CASE`` that checked the type first (Postgres does not promise to evaluate
    ``AND`` left to right, so a bare ``::numeric`` could meet a string). Numbers compare as
    ``numeric`` (exact for 64-bit integers; a float parameter compares by its shortest
    decimal form, as ``json.dumps`` writes it), text with ``COLLATE "C"`` (code-point
    order, as in Python and SQLite). Bool columns are ``boolean``; datetime columns hold
    integer microseconds (:func:`to_micros`), as in SQLite.
    """

    placeholder = "%s"
    number_placeholder = "%s::numeric"
    false_sql = "FALSE"
    number_types = ("number",)
    text_types = ("string",)

    def json_type(self, column: str, key: str) -> tuple[str, list[Any]]:  # noqa: D102
        return (
            f"(CASE json_typeof({column} -> %s::text) WHEN 'boolean' THEN ({column} ->> %s::text) "
            f"ELSE json_typeof({column} -> %s::text) END)",
            [key, key, key],
        )

    def json_value(self, column: str, key: str) -> tuple[str, list[Any]]:  # noqa: D102
        return f"({column} ->> %s::text)", [key]

    def json_number(self, column: str, key: str) -> tuple[str, list[Any]]:  # noqa: D102
        return (
            f"(CASE WHEN json_typeof({column} -> %s::text) = 'number' "
            f"THEN ({column} ->> %s::text)::numeric END)",
            [key, key],
        )

    def json_text(self, column: str, key: str) -> tuple[str, list[Any]]:  # noqa: D102
        return (
            f"(CASE WHEN json_typeof({column} -> %s::text) = 'string' "
            f'THEN ({column} ->> %s::text) END) COLLATE "C"',
            [key, key],
        )

    @staticmethod
    def _column_param(value: Scalar, kind: ColumnType) -> Any:
        if kind == "bool":
            return value if isinstance(value, bool) else None
        return SQLiteTranslator._column_param(value, kind)


#: The SQL dialects a filter translates to, by name.
TRANSLATORS: Mapping[str, type[SQLiteTranslator]] = {
    "sqlite": SQLiteTranslator,
    "postgres": PostgresTranslator,
}
