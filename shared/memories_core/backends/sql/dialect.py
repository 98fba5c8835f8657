"""What differs between two SQL databases, as data: the :class:`SQLDialect`.

The engine's SQL store (:class:`~memories_core.backends.sql.SQLStore`) is written once, with
``?`` placeholders and the statements both SQLite and PostgreSQL accept (``ON CONFLICT ...
DO UPDATE``, row values, ``LIMIT``). Where the two differ, the statement asks its dialect:

* placeholders (``?`` or ``%s``);
* how a list of ids is bound (``json_each`` of a JSON array, or ``= ANY`` of an array);
* how a JSON column reads back as text (SQLite stores text; PostgreSQL ``json`` needs
  ``::text``);
* the column that keeps insertion order per table (SQLite's ``rowid``, PostgreSQL identity
  columns);
* boolean literals and values, binary collation, row locks (``FOR UPDATE``, ``SKIP
  LOCKED``), planner hints (SQLite's unary ``+`` that keeps a column off an index, its
  ``INDEXED BY``);
* whether text may hold NUL characters.

Connections, transactions, user locks and full-text search are not the dialect's: each
backend module (:mod:`~memories_core.backends.sqlite_store`,
:mod:`~memories_core.backends.postgres`) provides them. A third SQL database is one more
:class:`SQLDialect` value and such a module.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from memories_core.errors import InvalidInputError

__all__ = ["SQLDialect"]


def _json_array(values: Sequence[str]) -> str:
    return json.dumps(list(values))


@dataclass(frozen=True)
class SQLDialect:
    """The differences of one SQL database that the shared store's statements need.

    Attributes:
        name: Dialect name for :meth:`memories_core.filters.FilterExpr.to_sql` and the
            migrations (``"sqlite"``, ``"postgres"``).
        title: The database's name in messages (``"SQLite"``, ``"PostgreSQL"``).
        placeholder: Parameter marker of the driver; statements are written with ``?``.
        id_match: Template of "``{column}`` is one of a bound list", with one ``?``.
        encode_list: How that list is bound (a JSON array, or the list itself).
        json_cast: Suffix that reads a JSON column as text (``""`` or ``"::text"``).
        order_columns: Table -> the column giving its insertion order.
        false: The false literal.
        encode_bool: How a boolean is bound.
        collate: Suffix that sorts text by code point (``""`` where that is the default).
        row_lock: Suffix that locks selected rows until commit (``""`` where the
            transaction already holds the database's write lock).
        skip_locked: Suffix that skips rows locked by another transaction.
        index_hint: Prefix that keeps a column's index out of a plan (SQLite's ``+``).
        index_choice: Template that names the index of a table in ``FROM`` (SQLite's
            ``INDEXED BY``), with ``{index}``; ``""`` leaves the choice to the planner.
        refuses_nul: Whether text cannot hold NUL characters.
    """

    name: Literal["sqlite", "postgres"] | str
    title: str = ""
    placeholder: str = "?"
    id_match: str = "{column} IN (SELECT value FROM json_each(?))"
    encode_list: Callable[[Sequence[str]], Any] = _json_array
    json_cast: str = ""
    order_columns: Mapping[str, str] = field(default_factory=dict)
    false: str = "0"
    encode_bool: Callable[[bool], Any] = int
    collate: str = ""
    row_lock: str = ""
    skip_locked: str = ""
    index_hint: str = ""
    index_choice: str = ""
    refuses_nul: bool = False

    def sql(self, statement: str) -> str:
        """``statement`` with the driver's placeholders (``?`` -> :attr:`placeholder`)."""
        if self.placeholder == "?":
            return statement
        return _translate(statement, self.placeholder)

    def ids_in(self, column: str) -> str:
        """The condition "``column`` is one of the bound list" (bind :meth:`ids`)."""
        return self.id_match.format(column=column)

    def ids(self, values: Sequence[str]) -> Any:
        """The bound value of a list for :meth:`ids_in`."""
        return self.encode_list(list(values))

    def json(self, column: str) -> str:
        """``column`` (JSON) read as text."""
        return column + self.json_cast

    def order(self, table: str) -> str:
        """The column giving ``table``'s insertion order."""
        return self.order_columns.get(table, "rowid")

    def hint(self, column: str) -> str:
        """``column`` kept off its index in a plan where another index is more selective."""
        return self.index_hint + column

    def using(self, index: str) -> str:
        """Suffix of a table in ``FROM`` that makes the plan seek ``index``."""
        return self.index_choice.format(index=index)

    def lock(self, of: str = "") -> str:
        """Row-lock suffix of a ``SELECT`` (of table alias ``of`` if given)."""
        if not self.row_lock:
            return ""
        return f"{self.row_lock} OF {of}" if of else self.row_lock

    def check_text(self, value: str | None, what: str) -> None:
        """Refuse text this database cannot store.

        Raises:
            InvalidInputError: if the dialect refuses NUL and ``value`` holds one (or its
                JSON escape, which a ``json`` column cannot extract).
        """
        if self.refuses_nul and value is not None and ("\x00" in value or "\\u0000" in value):
            raise InvalidInputError(
                f"{what} contains a NUL character, which {self.title or self.name} cannot store"
            )

    def storable(self, text: str) -> str:
        """``text`` with characters this database cannot store replaced (error messages)."""
        return text.replace("\x00", "\ufffd") if self.refuses_nul else text


@functools.lru_cache(maxsize=512)
def _translate(statement: str, placeholder: str) -> str:
    return statement.replace("?", placeholder)
