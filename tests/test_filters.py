"""The one filter language: validation, semantics, and the same ids from every backend."""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memories_core.backends import (
    ChromaIndex,
    NumpyIndex,
    PgVectorIndex,
    PostgresRecordStore,
    SQLiteRecordStore,
)
from memories_core.backends.numpy_index import check_filter, matches_filter
from memories_core.backends.sqlite_store import _STATE_FILTER_COLUMNS
from memories_core.errors import InvalidInputError
from memories_core.filters import (
    MISSING,
    AllOf,
    AnyOf,
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
from memories_core.retrieval import index_metadata
from memories_core.types import MemoryRecord

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
USER = "alice"
DIM = 8


def rec(rid: str, kind: str, minutes: int, session: str | None, **metadata: Any) -> MemoryRecord:
    return MemoryRecord(
        id=rid,
        user_id=USER,
        kind=kind,
        text=f"pizza record {rid}",
        created_at=T0 + timedelta(minutes=minutes),
        session_id=session,
        metadata=metadata,
    )


def vectors(n: int) -> npt.NDArray[np.float32]:
    v = np.random.default_rng(n).normal(size=(n, DIM)).astype(np.float32)
    return (v / np.linalg.norm(v, axis=1, keepdims=True)).astype(np.float32)


# -- validation -----------------------------------------------------------------------------

VALID: list[Any] = [
    None,
    {},
    {"kind": "turn"},
    {"kind": {"$eq": "turn"}, "topic": "food"},
    {"n": {"$ne": 1}},
    {"n": {"$in": [1, "1", True, 2.5]}},
    {"n": {"$nin": []}},
    {"n": {"$in": ()}},
    {"n": {"$gt": 1, "$lte": 2.5}},
    {"due": {"$lt": T0}},
    {"created_at": {"$gte": T0}},
    {"created_at": datetime(2024, 1, 1)},  # naive datetimes are UTC
    {"strength": {"$lt": 0.5}, "recall_count": {"$gte": 2}, "archived": False},
    {"tier": {"$in": ["core", "archive"]}, "valid_until": {"$exists": False}},
    {"attrs.importance": {"$gte": 3}},
    {"$and": [{"kind": "turn"}, {"$or": [{"a": 1}, {"b": {"$exists": True}}]}]},
    {"$or": [{"kind": "note"}]},
    {"a.b": 1, "sp ace": "x", "é": True, "attrs": "plain metadata key"},
    {"n": 2**63 - 1},
]

INVALID: list[tuple[Any, str]] = [
    ({"user_id": "bob"}, "user_id"),
    ({"$and": [{"user_id": "bob"}]}, "user_id"),
    ({"text": "pizza"}, "text"),
    ({"n": {"$regex": "x"}}, "unknown filter operator"),
    ({"$not": {"a": 1}}, "unknown filter operator"),
    ({"n": {"$gt": "a"}}, "number or a datetime"),
    ({"n": {"$lt": True}}, "number or a datetime"),
    ({"n": {"$in": "abc"}}, "takes a list"),
    ({"n": {"$nin": 1}}, "takes a list"),
    ({"n": float("nan")}, "NaN"),
    ({"n": {"$in": [float("inf")]}}, "NaN"),
    ({"n": {"$gt": float("-inf")}}, "NaN"),
    ({"$and": []}, "at least one"),
    ({"$or": []}, "at least one"),
    ({"$or": {"a": 1}}, "list of filters"),
    ({"$or": [{}]}, "non-empty filter"),
    ({"n": {}}, "empty operator"),
    ({"n": [1, 2]}, "got list"),
    ({"n": {"$eq": {"x": 1}}}, "got dict"),
    ({"n": None}, "got NoneType"),
    ({"n": {"$exists": 1}}, "True or False"),
    ({"n": 2**63}, "64-bit"),
    ({"": 1}, "non-empty"),
    ({"attrs.": 1}, "needs a name"),
    ({'a"b': 1}, "quotes"),
    ({"a\\b": 1}, "backslashes"),
    ({"a\nb": 1}, "control"),
    ({"created_at": "2024-05-01"}, "datetime field"),
    ({"kind": 1}, "string field"),
    ({"archived": 0}, "bool field"),
    ({"strength": True}, "number field"),
    ({"recall_count": {"$in": [1, "2"]}}, "number field"),
    (["kind", "turn"], "mapping"),
]


@pytest.mark.parametrize("where", VALID)
def test_valid_filters_compile(where: Any) -> None:
    expr = compile_filter(where)
    assert (expr is None) == (not where)
    assert compile_filter(expr) is expr  # compiled filters pass through


@pytest.mark.parametrize(("where", "message"), INVALID)
def test_invalid_filters_raise_a_clear_error(where: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message.replace("$", r"\$")):
        compile_filter(where)


def test_invalid_filters_are_rejected_by_every_backend() -> None:
    store = SQLiteRecordStore()
    index = NumpyIndex()
    index.add(["r"], vectors(1), [{"user_id": USER, "kind": "turn"}])
    for where, _ in INVALID:
        with pytest.raises(InvalidInputError):
            store.list(user_id=USER, where=where)
        with pytest.raises(InvalidInputError):
            store.search_text("pizza", user_id=USER, k=3, where=where)
        with pytest.raises(InvalidInputError):
            index.search(vectors(1)[0], user_id=USER, k=3, where=where)
        with pytest.raises(InvalidInputError):
            check_filter(where)


def test_compiled_tree_shape() -> None:
    expr = compile_filter(
        {"kind": "turn", "n": {"$gte": 1, "$lt": 3}, "$or": [{"a": 1}, {"b": {"$in": [2]}}]}
    )
    assert expr == AllOf(
        (
            Condition("kind", "eq", "turn"),
            Condition("n", "gte", 1),
            Condition("n", "lt", 3),
            AnyOf((Condition("a", "eq", 1), Condition("b", "in", (2,)))),
        )
    )
    assert expr.fields() == {"kind", "n", "a", "b"}
    # Nested $and flattens into the top-level conjunction.
    assert compile_filter({"$and": [{"kind": "turn"}, {"$and": [{"a": 1}]}]}) == AllOf(
        (Condition("kind", "eq", "turn"), Condition("a", "eq", 1))
    )
    with pytest.raises(AttributeError):
        expr.parts = ()  # type: ignore[misc]


def test_split_keeps_the_usable_conjuncts() -> None:
    expr = compile_filter(
        {
            "kind": "turn",
            "created_at": {"$gte": T0},
            "strength": {"$gt": 0.2},
            "$or": [{"topic": "food"}, {"archived": False}],
            "topic": {"$exists": True},
        }
    )
    assert expr is not None
    assert expr.split(is_index_field) == AllOf(
        (Condition("kind", "eq", "turn"), Condition("topic", "exists", True))
    )
    assert expr.split(lambda key: key == "kind") == Condition("kind", "eq", "turn")
    assert expr.split(lambda key: False) is None
    assert expr.split(lambda key: True) == expr
    single = compile_filter({"$or": [{"kind": "turn"}, {"strength": 1.0}]})
    assert single is not None and single.split(is_index_field) is None


def test_index_fields() -> None:
    assert is_index_field("kind") and is_index_field("session_id") and is_index_field("topic")
    for key in ("id", "created_at", "strength", "archived", "tier", "attrs.x"):
        assert not is_index_field(key)


def test_value_helpers() -> None:
    moment = datetime(2024, 5, 1, 14, 30, 0, 250000, tzinfo=timezone(timedelta(hours=2)))
    assert to_iso(moment) == "2024-05-01T12:30:00.250000+00:00"
    assert to_iso(datetime(2024, 5, 1, 12)) == "2024-05-01T12:00:00+00:00"
    assert from_micros(to_micros(moment)) == moment
    assert to_micros(datetime(1970, 1, 1, 0, 0, 1)) == 1_000_000
    # ISO strings sort like the instants they name, with or without microseconds.
    instants = [T0, T0 + timedelta(microseconds=1), T0 + timedelta(seconds=1), T0 - timedelta(1)]
    assert sorted(instants) == sorted(instants, key=to_iso)
    assert repr(MISSING) == "MISSING" and not MISSING


# -- semantics, checked on every backend ----------------------------------------------------

RECORDS = [
    rec("r1", "turn", 0, "s1", topic="food", n=1, flag=True, due=to_iso(T0 + timedelta(1))),
    rec("r2", "note", 60, None, topic="cars", n=2.5, flag=False, é="x"),
    rec("r3", "turn", 120, "s2", n="1", flag=1, tags=["a"]),
    rec("r4", "summary", 180, "s1", topic=None, n=0),
]

# (filter, expected ids, whether a vector index can answer it exactly)
SEMANTICS: list[tuple[dict[str, Any], set[str], bool]] = [
    ({"kind": "turn"}, {"r1", "r3"}, True),
    ({"topic": {"$ne": "food"}}, {"r2"}, True),  # missing and null do not match $ne
    ({"topic": {"$nin": ["food"]}}, {"r2"}, True),
    ({"topic": {"$exists": False}}, {"r3", "r4"}, True),  # JSON null counts as missing
    ({"topic": {"$exists": True}}, {"r1", "r2"}, False),  # indexes skip it (lists)
    ({"flag": True}, {"r1"}, True),  # True != 1
    ({"flag": 1}, {"r3"}, True),
    ({"flag": {"$in": [True, False]}}, {"r1", "r2"}, True),
    ({"n": 1}, {"r1"}, True),  # 1 != "1"
    ({"n": 1.0}, {"r1"}, True),  # 1 == 1.0
    ({"n": "1"}, {"r3"}, True),
    ({"n": {"$eq": 2.5}}, {"r2"}, True),
    ({"n": {"$gt": 0}}, {"r1", "r2"}, True),  # strings never compare with numbers
    ({"n": {"$gte": 0, "$lt": 2}}, {"r1", "r4"}, True),
    ({"n": {"$lte": 2.5}}, {"r1", "r2", "r4"}, True),
    ({"n": {"$in": [1, "1", 0]}}, {"r1", "r3", "r4"}, True),
    ({"n": {"$in": [True]}}, set(), True),
    ({"n": {"$nin": [1]}}, {"r2", "r3", "r4"}, True),
    ({"n": {"$ne": True}}, {"r1", "r2", "r3", "r4"}, True),
    ({"session_id": "s1"}, {"r1", "r4"}, True),
    ({"session_id": {"$ne": "s1"}}, {"r3"}, True),  # a None session is missing
    ({"session_id": {"$exists": False}}, {"r2"}, True),
    ({"session_id": {"$nin": ["s2"]}}, {"r1", "r4"}, True),
    ({"kind": {"$in": []}}, set(), True),
    ({"kind": {"$nin": []}}, {"r1", "r2", "r3", "r4"}, True),
    ({"é": "x"}, {"r2"}, True),
    ({"due": T0 + timedelta(1)}, {"r1"}, True),  # metadata datetimes are ISO strings
    ({"due": {"$gt": T0}}, {"r1"}, True),
    ({"due": {"$lt": T0}}, set(), True),
    ({"due": {"$in": [T0, T0 + timedelta(1)]}}, {"r1"}, True),
    ({"topic": {"$lt": T0}}, set(), True),  # any text compares as a string: "food" > "2024"
    ({"created_at": T0}, {"r1"}, False),
    (
        {"created_at": {"$gte": T0 + timedelta(hours=1), "$lt": T0 + timedelta(hours=3)}},
        {"r2", "r3"},
        False,
    ),
    ({"created_at": {"$in": [T0, T0 + timedelta(hours=3)]}}, {"r1", "r4"}, False),
    ({"created_at": {"$ne": T0}}, {"r2", "r3", "r4"}, False),
    ({"id": {"$in": ["r1", "r4", "zz"]}}, {"r1", "r4"}, False),
    ({"id": "r2"}, {"r2"}, False),
    ({"tags": {"$exists": True}}, {"r3"}, False),  # the index leaves lists out
    ({"tags": {"$ne": "a"}}, set(), True),  # lists never compare
    ({"tags": {"$nin": ["b"]}}, set(), True),
    (
        {"$or": [{"kind": "note"}, {"$and": [{"kind": "turn"}, {"n": {"$gte": 1}}]}]},
        {"r1", "r2"},
        True,
    ),
    (
        {"$or": [{"topic": "food"}, {"created_at": {"$gt": T0 + timedelta(hours=2)}}]},
        {"r1", "r4"},
        False,
    ),
    (
        {"$and": [{"$or": [{"n": 0}, {"n": 1}]}, {"$or": [{"session_id": "s1"}]}]},
        {"r1", "r4"},
        True,
    ),
    ({"kind": "turn", "$or": [{"flag": 1}, {"topic": "cars"}]}, {"r3"}, True),
]


def evaluator_ids(records: list[MemoryRecord], where: Any) -> set[str]:
    expr = compile_filter(where)
    return {r.id for r in records if expr is None or expr.matches(record_getter(r))}


@pytest.fixture(scope="module")
def backends() -> Iterator[tuple[SQLiteRecordStore, NumpyIndex, ChromaIndex]]:
    store = SQLiteRecordStore()
    store.add(RECORDS)
    numpy_index, chroma = NumpyIndex(), ChromaIndex()
    metas = [index_metadata(r) for r in RECORDS]
    for index in (numpy_index, chroma):
        index.add([r.id for r in RECORDS], vectors(len(RECORDS)), metas)
    yield store, numpy_index, chroma
    chroma.close()
    store.close()


@pytest.mark.parametrize(("where", "expected", "index_exact"), SEMANTICS)
def test_semantics_on_every_backend(
    backends: tuple[SQLiteRecordStore, NumpyIndex, ChromaIndex],
    where: dict[str, Any],
    expected: set[str],
    index_exact: bool,
) -> None:
    store, numpy_index, chroma = backends
    assert evaluator_ids(RECORDS, where) == expected
    assert {r.id for r in store.list(user_id=USER, where=where)} == expected
    assert {i for i, _ in store.search_text("pizza", user_id=USER, k=10, where=where)} == expected
    query = vectors(1)[0]
    from_numpy = {i for i, _ in numpy_index.search(query, user_id=USER, k=10, where=where)}
    from_chroma = {i for i, _ in chroma.search(query, user_id=USER, k=10, where=where)}
    if index_exact:
        assert from_numpy == expected
        assert from_chroma == expected
    else:
        # Keys an index does not hold are skipped there and re-checked by the caller.
        assert from_numpy >= expected
        assert from_chroma >= expected


def test_matches_filter_wrapper_keeps_equality_rules() -> None:
    meta: dict[str, str | int | float | bool] = {
        "user_id": USER,
        "kind": "turn",
        "n": 1,
        "flag": True,
    }
    assert matches_filter(meta, None) and matches_filter(meta, {})
    assert matches_filter(meta, {"n": 1.0, "flag": True})
    assert not matches_filter(meta, {"flag": 1})
    assert not matches_filter(meta, {"n": "1"})
    assert matches_filter(meta, {"n": {"$in": [0, 1]}, "kind": {"$ne": "note"}})
    # Keys a vector's metadata cannot answer are left to the caller's re-check.
    assert matches_filter(meta, {"n": 1, "created_at": {"$gt": T0}})
    with pytest.raises(InvalidInputError):
        matches_filter(meta, {"user_id": USER})


def test_store_filters_state_fields_like_the_evaluator() -> None:
    store = SQLiteRecordStore()
    store.add(list(RECORDS))
    first, second = RECORDS[0], RECORDS[1]
    store.update_state(
        USER,
        {
            first.id: {"strength": 3.0, "tier": "ltm", "attrs": {"x": 1}},
            second.id: {"archived": True, "valid_until": T0},
        },
        at=T0,
    )
    stored = store.list(user_id=USER)
    for where in (
        {"strength": {"$gt": 0.5}},
        {"strength": {"$gt": 1.5}},
        {"attrs.x": 1},
        {"$or": [{"archived": True}, {"tier": "ltm"}]},
        {"archived": False},
        {"valid_until": {"$exists": False}},
        {"recall_count": 0},
    ):
        expr = compile_filter(where)
        assert expr is not None
        expected = [r.id for r in stored if expr.matches(record_getter(r))]
        assert [r.id for r in store.list(user_id=USER, where=where)] == expected, where


def test_record_getter_reads_fields_state_and_metadata() -> None:
    record = RECORDS[0]
    get = record_getter(record)
    assert get("id") == "r1" and get("kind") == "turn" and get("created_at") == T0
    assert get("topic") == "food" and get("missing") is MISSING
    assert get("strength") is MISSING or isinstance(get("strength"), float)


# -- to_sql with a full column map (how the engine wires state fields) ----------------------

# The store's own column map: the test checks the wiring the engine uses, not a copy of it.
STATE_COLUMNS: Mapping[str, tuple[str, Any]] = _STATE_FILTER_COLUMNS


def state_rows() -> list[dict[str, Any]]:
    """Records as plain value dicts, the second one without a state row (defaults apply)."""
    return [
        {
            "id": "a",
            "kind": "turn",
            "session_id": "s1",
            "created_at": T0,
            "strength": 0.4,
            "recall_count": 3,
            "last_recalled_at": T0 + timedelta(1),
            "tier": "core",
            "valid_from": T0,
            "valid_until": None,
            "archived": False,
            "attrs": {"importance": 5, "flag": True},
            "metadata": {"topic": "food"},
        },
        {
            "id": "b",
            "kind": "note",
            "session_id": None,
            "created_at": T0 + timedelta(1),
            "strength": 1.0,
            "recall_count": 0,
            "last_recalled_at": None,
            "tier": None,
            "valid_from": None,
            "valid_until": None,
            "archived": False,
            "attrs": None,
            "metadata": {"topic": "cars"},
        },
        {
            "id": "c",
            "kind": "turn",
            "session_id": "s2",
            "created_at": T0 + timedelta(2),
            "strength": 2.0,
            "recall_count": 1,
            "last_recalled_at": None,
            "tier": "archive",
            "valid_from": None,
            "valid_until": T0 + timedelta(3),
            "archived": True,
            "attrs": {"importance": 1.5},
            "metadata": {},
        },
    ]


def test_to_sql_with_state_columns_matches_the_evaluator() -> None:
    import json

    conn = sqlite3.connect(":memory:")
    conn.executescript(
        "CREATE TABLE records (id TEXT, kind TEXT, session_id TEXT, created_at INTEGER,"
        " metadata TEXT);"
        "CREATE TABLE record_state (id TEXT, strength REAL, recall_count INTEGER,"
        " last_recalled_at INTEGER, tier TEXT, valid_from INTEGER, valid_until INTEGER,"
        " archived INTEGER, attrs TEXT);"
    )
    rows = state_rows()
    micros = lambda v: None if v is None else to_micros(v)  # noqa: E731
    for row in rows:
        conn.execute(
            "INSERT INTO records VALUES (?, ?, ?, ?, ?)",
            (
                row["id"],
                row["kind"],
                row["session_id"],
                to_micros(row["created_at"]),
                json.dumps(row["metadata"]),
            ),
        )
        if row["attrs"] is not None:  # "b" has no state row: the COALESCE defaults apply
            conn.execute(
                "INSERT INTO record_state VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row["id"],
                    row["strength"],
                    row["recall_count"],
                    micros(row["last_recalled_at"]),
                    row["tier"],
                    micros(row["valid_from"]),
                    micros(row["valid_until"]),
                    int(row["archived"]),
                    json.dumps(row["attrs"]),
                ),
            )

    def getter(row: dict[str, Any]) -> Callable[[str], Any]:
        def get(key: str) -> Any:
            if key.startswith("attrs."):
                return (row["attrs"] or {}).get(key[6:], MISSING)
            return row[key] if key in STATE_COLUMNS else row["metadata"].get(key, MISSING)

        return get

    filters: list[dict[str, Any]] = [
        {"strength": {"$lt": 1.0}},
        {"strength": 1},
        {"recall_count": {"$gte": 1}},
        {"archived": False},
        {"archived": {"$ne": False}},
        {"tier": {"$nin": ["core"]}},
        {"tier": {"$exists": False}},
        {"last_recalled_at": {"$exists": True}},
        {"valid_until": {"$gt": T0}},
        {"valid_from": {"$lte": T0}},
        {"attrs.importance": {"$gt": 1}},
        {"attrs.flag": True},
        {"attrs.importance": {"$exists": False}},
        {"$or": [{"attrs.flag": {"$ne": False}}, {"tier": "archive"}], "topic": {"$exists": True}},
    ]
    for where in filters:
        expr = compile_filter(where)
        assert expr is not None
        sql, params = expr.to_sql(
            STATE_COLUMNS, metadata_column="r.metadata", attrs_column="s.attrs"
        )
        got = {
            rid
            for (rid,) in conn.execute(
                "SELECT r.id FROM records AS r LEFT JOIN record_state AS s ON s.id = r.id "
                f"WHERE {sql}",
                params,
            )
        }
        assert got == {row["id"] for row in rows if expr.matches(getter(row))}, where
    with pytest.raises(InvalidInputError, match="dialect"):
        compile_filter({"a": 1}).to_sql({}, metadata_column="m", dialect="oracle")  # type: ignore[union-attr]


# -- property test: the same random filters on every backend --------------------------------

META_KEYS = ["a", "b", "c"]
KINDS = ["turn", "note", "summary"]
SESSIONS = ["s1", "s2"]
MOMENTS = [T0 + timedelta(minutes=m) for m in (-30, 0, 1, 90)] + [
    T0 + timedelta(seconds=1, microseconds=500)
]

texts = st.sampled_from(["x", "y", "1", "", "Ü"])
numbers = st.one_of(
    st.integers(-3, 3), st.sampled_from([-1.5, 0.0, 1.0, 2.5, 1e-9, 9007199254740993])
)
moments = st.sampled_from(MOMENTS)
meta_values = st.one_of(texts, numbers, st.booleans(), moments.map(to_iso), st.none())


@st.composite
def record_sets(draw: st.DrawFn) -> list[MemoryRecord]:
    count = draw(st.integers(0, 10))
    return [
        MemoryRecord(
            id=f"r{i}",
            user_id=USER,
            kind=draw(st.sampled_from(KINDS)),
            text=f"pizza {i}",
            created_at=draw(moments),
            session_id=draw(st.sampled_from([None, *SESSIONS])),
            metadata=draw(st.dictionaries(st.sampled_from(META_KEYS), meta_values, max_size=3)),
        )
        for i in range(count)
    ]


def values_for(key: str) -> st.SearchStrategy[Any]:
    if key == "kind":
        return st.sampled_from([*KINDS, "other"])
    if key == "session_id":
        return st.sampled_from([*SESSIONS, "s3"])
    if key == "id":
        return st.sampled_from([f"r{i}" for i in range(4)])
    if key == "created_at":
        return moments
    return st.one_of(texts, numbers, st.booleans(), moments)


def range_values_for(key: str) -> st.SearchStrategy[Any]:
    return moments if key == "created_at" else st.one_of(numbers, moments)


def leaves(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def leaf(draw: st.DrawFn) -> dict[str, Any]:
        key = draw(st.sampled_from(keys))
        op = draw(st.sampled_from(["short", "$eq", "$ne", "$in", "$nin", "$exists", "range"]))
        if op == "short":
            return {key: draw(values_for(key))}
        if op in ("$eq", "$ne"):
            return {key: {op: draw(values_for(key))}}
        if op in ("$in", "$nin"):
            return {key: {op: draw(st.lists(values_for(key), max_size=3))}}
        if op == "$exists":
            # Indexes skip `$exists: True` on metadata (lists are not indexed): not exact there.
            exact_only = keys == INDEX_KEYS and key in META_KEYS
            return {key: {op: False if exact_only else draw(st.booleans())}}
        if key in ("kind", "session_id", "id"):
            return {key: {"$exists": True}}  # ranges on strings are invalid
        ops = draw(
            st.lists(
                st.sampled_from(["$gt", "$gte", "$lt", "$lte"]), min_size=1, max_size=2, unique=True
            )
        )
        return {key: {o: draw(range_values_for(key)) for o in ops}}

    return leaf()


def filters(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    def extend(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
        parts = st.lists(children, min_size=1, max_size=3)
        return st.one_of(
            parts.map(lambda p: {"$and": p}),
            parts.map(lambda p: {"$or": p}),
            # Several keys in one mapping are AND-ed (later duplicates win, as in a dict).
            parts.map(lambda p: {k: v for item in p for k, v in item.items()}),
        )

    return st.recursive(leaves(keys), extend, max_leaves=6)


FULL_KEYS = [*META_KEYS, "kind", "session_id", "created_at", "id"]
INDEX_KEYS = [*META_KEYS, "kind", "session_id"]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records=record_sets(), where=filters(FULL_KEYS))
def test_property_store_matches_evaluator(
    records: list[MemoryRecord], where: dict[str, Any]
) -> None:
    expected = evaluator_ids(records, where)
    with SQLiteRecordStore() as store:
        store.add(records)
        assert {r.id for r in store.list(user_id=USER, where=where)} == expected
        lexical = store.search_text("pizza", user_id=USER, k=50, where=where)
        assert {i for i, _ in lexical} == expected
    # NumpyIndex applies the conjuncts it can answer exactly and skips the rest.
    index = NumpyIndex()
    index.add([r.id for r in records], vectors(len(records)), [index_metadata(r) for r in records])
    expr = compile_filter(where)
    assert expr is not None
    pre = evaluator_ids(records, index_prefilter(expr, with_id=True))
    got = {i for i, _ in index.search(vectors(1)[0], user_id=USER, k=50, where=where)}
    assert got == pre and got >= expected


@pytest.fixture(scope="module")
def chroma() -> Iterator[ChromaIndex]:
    index = ChromaIndex()
    yield index
    index.close()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(records=record_sets(), where=filters(INDEX_KEYS))
def test_property_every_backend_returns_the_same_ids(
    chroma: ChromaIndex, records: list[MemoryRecord], where: dict[str, Any]
) -> None:
    expected = evaluator_ids(records, where)
    user = f"u-{uuid.uuid4().hex}"
    records = [
        MemoryRecord(
            id=r.id,
            user_id=user,
            kind=r.kind,
            text=r.text,
            created_at=r.created_at,
            session_id=r.session_id,
            metadata=r.metadata,
        )
        for r in records
    ]
    ids = [r.id for r in records]
    metas = [index_metadata(r) for r in records]
    embeddings = vectors(len(records))
    query = vectors(1)[0]
    k = len(records) + 5
    with SQLiteRecordStore() as store:
        store.add(records)
        assert {r.id for r in store.list(user_id=user, where=where)} == expected
    numpy_index = NumpyIndex()
    numpy_index.add(ids, embeddings, metas)
    assert {i for i, _ in numpy_index.search(query, user_id=user, k=k, where=where)} == expected
    try:
        chroma.add(ids, embeddings, metas)
        assert {i for i, _ in chroma.search(query, user_id=user, k=k, where=where)} == expected
    finally:
        chroma.delete_user(user)


@pytest.fixture(scope="module")
def postgres_backends(postgres_dsn: str) -> Iterator[tuple[PostgresRecordStore, PgVectorIndex]]:
    schema = f"lmt_filters_{uuid.uuid4().hex[:12]}"
    with (
        PostgresRecordStore(postgres_dsn, schema=schema) as store,
        PgVectorIndex(postgres_dsn, dimension=8, schema=schema) as index,
    ):
        yield store, index


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(records=record_sets(), where=filters(FULL_KEYS))
def test_property_postgres_store_and_pgvector_match_the_evaluator(
    postgres_backends: tuple[PostgresRecordStore, PgVectorIndex],
    records: list[MemoryRecord],
    where: dict[str, Any],
) -> None:
    """The Postgres translation (PostgresTranslator) keeps the evaluator's semantics."""
    store, index = postgres_backends
    expected = evaluator_ids(records, where)
    expr = compile_filter(where)
    assert expr is not None
    prefiltered = evaluator_ids(records, index_prefilter(expr, with_id=True))
    try:
        store.add(records)
        assert {r.id for r in store.list(user_id=USER, where=where)} == expected
        lexical = store.search_text("pizza", user_id=USER, k=50, where=where)
        assert {i for i, _ in lexical} == expected
        index.add(
            [r.id for r in records], vectors(len(records)), [index_metadata(r) for r in records]
        )
        got = {i for i, _ in index.search(vectors(1)[0], user_id=USER, k=50, where=where)}
        assert got == prefiltered and got >= expected
    finally:
        store.purge_user(USER)
        index.delete_user(USER)


def test_filter_expr_is_the_public_base() -> None:
    assert issubclass(Condition, FilterExpr) and issubclass(AllOf, FilterExpr)
