"""The one filter language of the package: parsed once, evaluated in Python, translated to SQL.

A filter is a mapping, e.g.::

    {"kind": "turn", "created_at": {"$gte": since}, "$or": [{"topic": "food"}, {"n": {"$gt": 2}}]}

:func:`compile_filter` validates it and returns a small immutable tree (:class:`FilterExpr`)
that every backend uses: :meth:`FilterExpr.matches` evaluates it against any record-like
value source, :meth:`FilterExpr.to_sql` translates it for SQLite or PostgreSQL, and
:meth:`FilterExpr.split` keeps the part a partial backend (a vector index) can pre-filter on.

Keys (the field namespace of records):

* record fields ``id``, ``kind``, ``session_id`` (text) and ``created_at`` (datetime);
* state fields ``strength``, ``recall_count`` (numbers), ``last_recalled_at``, ``valid_from``,
  ``valid_until`` (datetimes), ``tier`` (text), ``archived`` (bool);
* ``attrs.<name>``: a key of the state's ``attrs`` JSON;
* any other key: a key of the record's ``metadata`` JSON.

Operators: equality shorthand ``{"k": v}``, ``$eq``, ``$ne``, ``$in`` / ``$nin`` (lists),
``$gt`` / ``$gte`` / ``$lt`` / ``$lte`` (numbers or datetimes), ``$exists`` (bool), and
``$and`` / ``$or`` (non-empty lists of filters). Several keys, or several operators on one
key, are AND-ed.

Semantics, identical in every backend:

* A missing key, ``None``, JSON ``null`` and SQL ``NULL`` match nothing except
  ``$exists: False``; in particular ``$ne`` and ``$nin`` do not match missing keys.
* Comparison operators (``$ne`` and ``$nin`` included) only ever match scalar values;
  a JSON list or object is present (for ``$exists``) but never compares.
* ``True`` never equals ``1`` and a string never equals a number; ``int`` and ``float``
  compare numerically.
* A datetime compares with datetime fields; on a metadata (or ``attrs``) key it compares
  with the ISO-8601 UTC string of :func:`to_iso` (how metadata stores datetimes).
"""

from __future__ import annotations

from memories_core.filters.expr import (
    ATTRS_PREFIX,
    FIELD_TYPES,
    MISSING,
    RECORD_FIELDS,
    STATE_FIELDS,
    AllOf,
    AnyOf,
    ColumnType,
    Condition,
    FilterExpr,
    compile_filter,
    from_micros,
    index_prefilter,
    is_index_field,
    record_getter,
    to_iso,
    to_micros,
)
from memories_core.filters.expr import Scalar as Scalar
from memories_core.filters.expr import ValueGetter as ValueGetter
from memories_core.filters.sql import (
    PostgresTranslator,
    SQLiteTranslator,
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
    "PostgresTranslator",
    "SQLiteTranslator",
    "compile_filter",
    "from_micros",
    "index_prefilter",
    "is_index_field",
    "record_getter",
    "to_iso",
    "to_micros",
]
