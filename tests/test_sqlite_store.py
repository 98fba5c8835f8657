"""SQLiteRecordStore: the record of truth (RecordStore protocol, FTS5 search, durability)."""

from __future__ import annotations

import itertools
import sqlite3
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memories_core.backends import SQLiteRecordStore
from memories_core.backends.sqlite_store import query_terms
from memories_core.errors import BackendError, InvalidInputError, MissingUserError
from memories_core.interfaces import (
    ArtifactRegistryStore,
    DeletionStore,
    EngineStore,
    IndexStateStore,
    JobQueueStore,
    NeighbourStore,
    RecordStateStore,
    RecordStore,
    TransactionStore,
    UserGraphStore,
)
from memories_core.types import MemoryRecord

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


def rec(
    rid: str,
    text: str,
    user: str = "alice",
    *,
    kind: str = "turn",
    minutes: int = 0,
    session: str | None = None,
    **metadata: object,
) -> MemoryRecord:
    return MemoryRecord(
        id=rid,
        user_id=user,
        kind=kind,
        text=text,
        created_at=T0 + timedelta(minutes=minutes),
        session_id=session,
        metadata=metadata,
    )


@pytest.fixture
def store() -> Iterator[SQLiteRecordStore]:
    s = SQLiteRecordStore()
    yield s
    s.close()


def test_implements_protocol(store: SQLiteRecordStore) -> None:
    assert isinstance(store, RecordStore)


def test_engine_store_is_the_union_of_the_narrow_store_protocols(
    store: SQLiteRecordStore,
) -> None:
    narrow = (
        RecordStore,
        TransactionStore,
        RecordStateStore,
        JobQueueStore,
        UserGraphStore,
        ArtifactRegistryStore,
        DeletionStore,
        IndexStateStore,
    )
    assert set(narrow) <= set(EngineStore.__mro__)
    assert all(isinstance(store, protocol) for protocol in (*narrow, EngineStore))
    assert isinstance(store, NeighbourStore)


def test_round_trip_keeps_every_field(store: SQLiteRecordStore) -> None:
    created = datetime(2023, 1, 2, 3, 4, 5, 123456, tzinfo=timezone(timedelta(hours=2)))
    text = "NUL \x00 inside, emoji 🐕‍🦺, accents déjà vu, CJK 記憶"
    record = MemoryRecord(
        id="r1",
        user_id="alice",
        kind="note",
        text=text,
        created_at=created,
        session_id="s1",
        metadata={"topic": "dogs", "n": 3, "ok": True, "nested": {"a": [1, "\x00"]}},
        source_ids=("a", "b"),
    )
    store.add([record])
    [got] = store.get(["r1"], user_id="alice")
    assert got == record
    assert got.created_at == created  # exact to the microsecond, as UTC
    assert got.text == text


def test_get_keeps_order_and_skips_missing_and_foreign(store: SQLiteRecordStore) -> None:
    store.add([rec("a", "one"), rec("b", "two"), rec("c", "three", user="bob")])
    got = store.get(["b", "missing", "c", "a", "b"], user_id="alice")
    assert [r.id for r in got] == ["b", "a"]
    assert store.get([], user_id="alice") == []


def test_add_is_all_or_nothing(store: SQLiteRecordStore) -> None:
    store.add([rec("x", "owned by bob", user="bob")])
    with pytest.raises(InvalidInputError):
        store.add([rec("new", "fine"), rec("x", "steals bob's id")])
    assert store.get(["new"], user_id="alice") == []
    assert store.get(["x"], user_id="bob")[0].text == "owned by bob"
    bad = MemoryRecord("bad", "alice", "turn", "t", T0, metadata={"obj": object()})
    with pytest.raises(InvalidInputError):
        store.add([rec("new2", "fine"), bad])
    assert store.count() == 1


def test_add_same_id_replaces_and_reindexes_text(store: SQLiteRecordStore) -> None:
    store.add([rec("r", "the cat sleeps")])
    store.mark_indexed(["r"])
    store.add([rec("r", "the dog barks", kind="note")])
    [got] = store.get(["r"], user_id="alice")
    assert (got.text, got.kind) == ("the dog barks", "note")
    assert store.search_text("cat", user_id="alice", k=5) == []
    assert [i for i, _ in store.search_text("dog", user_id="alice", k=5)] == ["r"]
    assert [r.id for r in store.pending_index()] == ["r"]
    assert store.count() == 1


def test_duplicate_id_within_one_batch_last_wins(store: SQLiteRecordStore) -> None:
    store.add([rec("d", "first"), rec("d", "second")])
    assert store.get(["d"], user_id="alice")[0].text == "second"
    assert [i for i, _ in store.search_text("second", user_id="alice", k=5)] == ["d"]
    assert store.search_text("first", user_id="alice", k=5) == []


def test_list_filters_and_orders(store: SQLiteRecordStore) -> None:
    store.add(
        [
            rec("3", "c", minutes=3, session="s1", topic="x"),
            rec("1", "a", minutes=1, session="s1", topic="x", n=1),
            rec("2", "b", minutes=2, kind="note", session="s2", topic="y", flag=True),
            rec("4", "d", minutes=4, n=1.0, flag=1),
            rec("5", "e", minutes=0, user="bob", topic="x"),
        ]
    )

    def ids(**kwargs: object) -> list[str]:
        return [r.id for r in store.list(user_id="alice", **kwargs)]  # type: ignore[arg-type]

    assert ids() == ["1", "2", "3", "4"]
    assert ids(where={"kind": "turn"}) == ["1", "3", "4"]
    assert ids(where={"session_id": "s1"}) == ["1", "3"]
    assert ids(where={"topic": "x", "kind": "turn"}) == ["1", "3"]
    assert ids(where={"n": 1}) == ["1", "4"]  # numbers compare by value
    assert ids(where={"flag": True}) == ["2"]  # True does not match 1
    assert ids(where={"n": "1"}) == []  # a string does not match a number
    assert ids(since=T0 + timedelta(minutes=2), until=T0 + timedelta(minutes=4)) == ["2", "3"]
    assert ids(limit=2) == ["1", "2"]
    with pytest.raises(InvalidInputError):
        ids(where={"user_id": "bob"})


def test_search_text_ranks_and_scopes(store: SQLiteRecordStore) -> None:
    store.add(
        [
            rec("dog", "I adopted a puppy named Max last week"),
            rec("cat", "My cat hates the vacuum cleaner"),
            rec("both", "The puppy and the cat play together; the puppy wins"),
            rec("bob", "Bob's puppy is called Rex", user="bob"),
        ]
    )
    hits = store.search_text("What is the puppy's name?", user_id="alice", k=10)
    assert [i for i, _ in hits][:2] == ["both", "dog"] or [i for i, _ in hits][:2] == [
        "dog",
        "both",
    ]
    assert "bob" not in {i for i, _ in hits}
    assert all(a[1] >= b[1] for a, b in itertools.pairwise(hits))
    assert all(score > 0 for _, score in hits)
    assert [i for i, _ in store.search_text("puppy", user_id="bob", k=10)] == ["bob"]
    assert store.search_text("puppy", user_id="nobody", k=10) == []
    assert len(store.search_text("puppy cat", user_id="alice", k=1)) == 1


def test_search_text_stems_and_drops_stopwords(store: SQLiteRecordStore) -> None:
    store.add([rec("run", "She was running marathons"), rec("the", "the and of to is")])
    assert [i for i, _ in store.search_text("runs", user_id="alice", k=5)] == ["run"]
    assert store.search_text("the of and is to", user_id="alice", k=5) == []
    assert store.search_text("   ", user_id="alice", k=5) == []


def test_search_text_where_is_inside_the_query(store: SQLiteRecordStore) -> None:
    store.add(
        [rec(f"t{i}", f"pizza party {i}", kind="turn") for i in range(30)]
        + [rec("n1", "pizza", kind="note", session="s9", topic="food", score=2)]
    )
    # With k=1 a post-filter would return nothing: the filter must run before the limit.
    assert [
        i for i, _ in store.search_text("pizza", user_id="alice", k=1, where={"kind": "note"})
    ] == ["n1"]
    for where in ({"session_id": "s9"}, {"topic": "food"}, {"score": 2}):
        assert [i for i, _ in store.search_text("pizza", user_id="alice", k=1, where=where)] == [
            "n1"
        ]
    assert store.search_text("pizza", user_id="alice", k=5, where={"topic": "cars"}) == []


NASTY_QUERIES = [
    'what "did" she say',
    '"',
    '""""',
    "col:umn : value",
    "text: puppy",
    "NEAR(puppy cat, 2)",
    "puppy NEAR cat",
    "pup*",
    "*",
    "(puppy OR",
    "AND OR NOT",
    "NOT puppy",
    "puppy -cat +dog ^start",
    "{text}: puppy",
    "rowid = 1; DROP TABLE records; --",
    "emoji 🐶 puppy 🐱",
    "ünïcödé Straße ǅ İstanbul",
    "\x00puppy\x00",
    "tab\tnew\nline",
    "'single' quotes' puppy",
    "a" * 5000,
    " ".join(f"word{i}" for i in range(300)),
]


@pytest.mark.parametrize("query", NASTY_QUERIES)
def test_search_text_never_raises_on_odd_queries(store: SQLiteRecordStore, query: str) -> None:
    store.add([rec("dog", "puppy cat dog start Straße 🐶")])
    store.search_text(query, user_id="alice", k=5)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(query=st.text(max_size=60))
def test_search_text_never_raises_on_any_text(store: SQLiteRecordStore, query: str) -> None:
    if store.count() == 0:
        store.add([rec("r", "hello world of puppies and cats")])
    hits = store.search_text(query, user_id="alice", k=3)
    assert all(i == "r" for i, _ in hits)


def test_query_terms() -> None:
    assert query_terms("What did Caroline's dog eat at the park?") == [
        "caroline",
        "dog",
        "eat",
        "park",
    ]
    assert query_terms("dog DOG dog_cat") == ["dog", "cat"]  # underscore splits, like FTS5
    assert query_terms("a I x 7 to") == []
    assert query_terms("Straße 2023") == ["straße", "2023"]


def test_delete_and_delete_user(store: SQLiteRecordStore) -> None:
    store.add(
        [rec("a1", "apple pie"), rec("a2", "apple tart"), rec("b1", "apple cake", user="bob")]
    )
    store.set_state("mood", {"v": 1}, user_id="alice")
    store.set_state("mood", {"v": 2}, user_id="bob")
    store.delete(["a1", "b1"], user_id="alice")  # b1 is bob's: untouched
    assert [r.id for r in store.list(user_id="alice")] == ["a2"]
    assert [r.id for r in store.list(user_id="bob")] == ["b1"]
    store.delete_user("alice")
    assert store.list(user_id="alice") == []
    assert store.search_text("apple", user_id="alice", k=5) == []
    assert store.get_state("mood", user_id="alice") is None
    assert store.get_state("mood", user_id="bob") == {"v": 2}
    assert store.users() == ["bob"]
    assert store.count("alice") == 0
    # The FTS index is consistent with the table after all of that.
    assert store.check_integrity() == []
    # A deleted user can come back with fresh records.
    store.add([rec("a3", "apple crumble")])
    assert [i for i, _ in store.search_text("apple", user_id="alice", k=5)] == ["a3"]


def test_pending_index_lifecycle(store: SQLiteRecordStore) -> None:
    store.add([rec("p1", "x"), rec("p2", "y", user="bob")])
    store.add([rec("n1", "z")], indexed=False)
    assert {r.id for r in store.pending_index()} == {"p1", "p2"}
    assert store.pending_count() == 2
    assert len(store.pending_index(limit=1)) == 1
    store.mark_indexed(["p1", "p2", "n1", "missing"])
    assert store.pending_index() == []
    assert store.mark_all_pending() == 2  # n1 was never for the index
    assert {r.id for r in store.pending_index()} == {"p1", "p2"}


def test_state_values(store: SQLiteRecordStore) -> None:
    assert store.get_state("k") is None
    store.set_state("k", {"a": [1, 2, "\x00"], "b": None})
    store.set_state("k", "per-user", user_id="alice")
    assert store.get_state("k") == {"a": [1, 2, "\x00"], "b": None}
    assert store.get_state("k", user_id="alice") == "per-user"
    store.set_state("k", None)
    assert store.get_state("k") is None
    assert store.get_state("k", user_id="alice") == "per-user"
    with pytest.raises(InvalidInputError):
        store.set_state("k", object())


def test_user_id_is_required(store: SQLiteRecordStore) -> None:
    for call in (
        lambda: store.get(["a"], user_id=""),
        lambda: store.list(user_id=" "),
        lambda: store.search_text("x", user_id="", k=1),
        lambda: store.delete(["a"], user_id=""),
        lambda: store.delete_user(""),
        lambda: store.set_state("k", 1, user_id=""),
    ):
        with pytest.raises(MissingUserError):
            call()


def test_closed_store_raises_backend_error() -> None:
    store = SQLiteRecordStore()
    store.add([rec("a", "x")])
    store.close()
    store.close()  # idempotent
    for call in (
        lambda: store.add([rec("b", "y")]),
        lambda: store.get(["a"], user_id="alice"),
        lambda: store.list(user_id="alice"),
        lambda: store.search_text("x", user_id="alice", k=1),
        lambda: store.users(),
        lambda: store.pending_index(),
        lambda: store.mark_indexed(["a"]),
        lambda: store.mark_all_pending(),
        lambda: store.get_state("k"),
        lambda: store.set_state("k", 1),
        lambda: store.delete_user("alice"),
    ):
        with pytest.raises(BackendError):
            call()


def test_file_store_persists_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "dir" / "records.sqlite3"
    with SQLiteRecordStore(path) as store:
        store.add([rec("a", "persistent puppy", session="s")])
        store.set_state("v", 1)
        with sqlite3.connect(path) as raw:
            assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with SQLiteRecordStore(path) as again:
        assert again.get(["a"], user_id="alice")[0].text == "persistent puppy"
        assert [i for i, _ in again.search_text("puppy", user_id="alice", k=1)] == ["a"]
        assert again.get_state("v") == 1


def test_unopenable_path_is_a_backend_error(tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    with pytest.raises(BackendError):
        SQLiteRecordStore(tmp_path / "adir")
    (tmp_path / "junk.sqlite3").write_bytes(b"this is not a database" * 100)
    with pytest.raises(BackendError):
        SQLiteRecordStore(tmp_path / "junk.sqlite3")


def test_sqlite_errors_are_wrapped(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    store = SQLiteRecordStore(path)
    with sqlite3.connect(path) as raw:  # damage the file from outside, as another tool might
        raw.execute("DROP TABLE state")
    with pytest.raises(BackendError):
        store.get_state("k")
    with pytest.raises(BackendError):
        store.set_state("k", 1)


def test_concurrent_writers_and_readers(tmp_path: Path) -> None:
    store = SQLiteRecordStore(tmp_path / "r.sqlite3")
    errors: list[BaseException] = []

    def work(user: str) -> None:
        try:
            for i in range(40):
                store.add([rec(f"{user}-{i}", f"note {i} about {user}", user=user)])
                store.search_text(f"note {user}", user_id=user, k=3)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(f"u{n}",)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert store.count() == 160
    assert all(store.count(f"u{n}") == 40 for n in range(4))
    store.close()


def test_adjacent_follows_session_order(store: SQLiteRecordStore) -> None:
    store.add(
        [
            rec("s1a", "a", minutes=1, session="s1"),
            rec("s1c", "c", minutes=3, session="s1"),
            rec("s2a", "x", minutes=2, session="s2"),
            rec("s1b", "b", minutes=2, session="s1"),
            rec("note", "n", minutes=2, session="s1", kind="note"),
            rec("nos", "no session", minutes=2),
            rec("bob", "b", minutes=2, session="s1", user="bob"),
        ]
    )
    # Same timestamp: insertion order decides.
    store.add([rec("t1", "p", minutes=9, session="s3"), rec("t2", "q", minutes=9, session="s3")])
    got = store.adjacent(["s1b", "s1a", "s1c", "note", "nos", "bob", "t1", "t2"], user_id="alice")
    assert got == {
        "s1a": (None, "s1b"),
        "s1b": ("s1a", "s1c"),
        "s1c": ("s1b", None),
        "note": (None, None),
        "t1": (None, "t2"),
        "t2": ("t1", None),
    }


def test_adjacent_links_records_without_a_session_within_the_gap(
    store: SQLiteRecordStore,
) -> None:
    store.add(
        [
            rec("n1", "a", minutes=0),
            rec("n2", "b", minutes=10),
            rec("n3", "c", minutes=60),  # 50 minutes after n2: beyond a 30-minute gap
            rec("n4", "d", minutes=60),  # same time as n3: storage order decides
            rec("sess", "in a session", minutes=5, session="s1"),
            rec("other-kind", "note", minutes=5, kind="note"),
            rec("bob", "b", minutes=5, user="bob"),
        ]
    )
    ids = ["n1", "n2", "n3", "n4", "sess", "other-kind", "bob", "missing"]
    got = store.adjacent(ids, user_id="alice", gap=timedelta(minutes=30))
    assert got == {
        "n1": (None, "n2"),
        "n2": ("n1", None),
        "n3": (None, "n4"),
        "n4": ("n3", None),
        "sess": (None, None),
        "other-kind": (None, None),
    }
    # Exactly the gap still links; without a gap, records without a session are left out.
    assert store.adjacent(["n2"], user_id="alice", gap=timedelta(minutes=50)) == {
        "n2": ("n1", "n3")
    }
    assert store.adjacent(ids, user_id="alice") == {"sess": (None, None)}


def test_adjacent_is_an_indexed_seek_per_side(store: SQLiteRecordStore) -> None:
    """The neighbour query seeks an index, never scans records, however long the session.

    Records written in one batch share their time; the seek must not walk them either.
    """
    store.add([rec(f"r{i}", "t") for i in range(300)])
    store.add([rec(f"s{i}", "t", session="long") for i in range(300)])
    for session, own, bounded, params in (
        ("x.session_id IS NULL", "IS NULL", True, (1, 1, "alice", '["r5"]')),
        ("x.session_id = c.session_id", "IS NOT NULL", False, ("alice", '["s5"]')),
    ):
        sql = store._neighbours_sql(session, own, bounded=bounded)
        plans = [row[3] for row in store._conn.execute("EXPLAIN QUERY PLAN " + sql, params)]
        searches = [plan for plan in plans if plan.startswith("SEARCH x")]
        assert len(searches) == 4, plans
        assert all("records_session_order" in plan for plan in searches), plans
        assert not [p for p in plans if p.startswith("SCAN") and "json_each" not in p], plans
    got = store.adjacent(["r5", "s5"], user_id="alice", gap=timedelta(0))
    assert got == {"r5": ("r4", "r6"), "s5": ("s4", "s6")}


def test_rowid_ranges_keep_users_apart_in_fts(store: SQLiteRecordStore) -> None:
    store.add([rec(f"a{i}", "shared words here", user="alice") for i in range(5)])
    store.add([rec(f"b{i}", "shared words here", user="bob") for i in range(5)])
    store.add([rec("a-late", "shared words here", user="alice")])
    alice = {i for i, _ in store.search_text("shared words", user_id="alice", k=50)}
    bob = {i for i, _ in store.search_text("shared words", user_id="bob", k=50)}
    assert alice == {f"a{i}" for i in range(5)} | {"a-late"}
    assert bob == {f"b{i}" for i in range(5)}


def test_schema_version_from_the_future_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    SQLiteRecordStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(BackendError, match="schema version 99"):
        SQLiteRecordStore(path)


def test_a_kind_filter_every_record_passes_ranks_as_no_filter(store: SQLiteRecordStore) -> None:
    """A user of one kind is searched without the join; another kind is still filtered."""
    texts = ["tea with milk", "green tea and cake", "the cat likes tea", "coffee at noon"]
    store.add([rec(f"t{i}", text, minutes=i) for i, text in enumerate(texts)])
    store.add([rec("b0", "tea for bob", user="bob", kind="note")])  # another user's kind
    plain = store.search_text("tea", user_id="alice", k=10)
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    assert store.search_text("tea", user_id="alice", k=10, where={"kind": "turn"}) == plain
    assert not any("JOIN record_state" in s for s in statements)  # ranked inside FTS5
    assert store.search_text("tea", user_id="alice", k=10, where={"kind": "note"}) == []
    store.add([rec("n0", "a note about tea", kind="note", minutes=9)])
    statements.clear()
    turns = store.search_text("tea", user_id="alice", k=10, where={"kind": "turn"})
    assert [rid for rid, _ in turns] == [rid for rid, _ in plain]  # the note is left out
    assert any("JOIN record_state" in s for s in statements)  # filtered row by row again
    notes = store.search_text("tea", user_id="alice", k=10, where={"kind": "note"})
    assert [rid for rid, _ in notes] == ["n0"]
    store._conn.set_trace_callback(None)
