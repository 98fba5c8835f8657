"""PostgreSQL record store and pgvector index: parity with SQLite, isolation, concurrency.

Every test here needs the session's PostgreSQL server (``postgres_dsn`` in conftest.py) and
works in a schema of its own.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memories_core import HistoryMemory, MemoryBankMemory, Scope, Turn
from memories_core.backends import PgVectorIndex, PostgresRecordStore, SQLiteRecordStore
from memories_core.backends import postgres as postgres_module
from memories_core.cli import main
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.errors import (
    BackendError,
    ConfigurationError,
    EmbedderMismatchError,
    InvalidInputError,
    MemoriesError,
)
from memories_core.portable import export_user, import_user
from memories_core.retrieval import index_metadata
from memories_core.types import GraphEdge, GraphNode, JobSpec, MemoryRecord, RecordState, new_id

T0 = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)
DIM = 32


@pytest.fixture
def store(postgres_dsn: str, pg_schema: str) -> Iterator[PostgresRecordStore]:
    with PostgresRecordStore(postgres_dsn, schema=pg_schema) as opened:
        yield opened


def _record(user: str, rid: str, text: str, minutes: int = 0, **kw: Any) -> MemoryRecord:
    return MemoryRecord(
        id=rid,
        user_id=user,
        kind=kw.pop("kind", "turn"),
        text=text,
        created_at=T0 + timedelta(minutes=minutes),
        session_id=kw.pop("session_id", "s1"),
        metadata=kw.pop("metadata", {}),
        source_ids=tuple(kw.pop("source_ids", ())),
    )


# -- parity: the same calls give the same answers on SQLite and PostgreSQL ----------------------


def _exercise(store: Any) -> list[Any]:
    """Drive every EngineStore method; return a transcript of what came back."""
    out: list[Any] = []
    alice, bob = "alice", "bob"
    store.add(
        [
            _record(alice, "a1", "I adopted a puppy named Rex", 0, metadata={"topic": "pets"}),
            _record(alice, "a2", "Rex loves the beach", 1, metadata={"topic": "pets", "n": 2}),
            _record(alice, "a3", "I work as a nurse", 2, metadata={"n": 1e300}),
            _record(alice, "a4", "note on pets", 3, kind="note", source_ids=["a1", "a2"]),
            _record(bob, "b1", "my puppy is called Rex too", 0, metadata={"topic": "pets"}),
        ]
    )
    store.add([_record(alice, "a5", "kept out of the index", 4)], indexed=False)
    with pytest.raises(InvalidInputError, match="another user"):
        store.add([_record(bob, "a1", "steal")])
    out.append([r.id for r in store.get(["a3", "b1", "a1", "zz", "a1"], user_id=alice)])
    out.append([(r.id, dict(r.metadata), r.source_ids) for r in store.list(user_id=alice)])
    out.append([r.id for r in store.list(user_id=alice, where={"topic": "pets", "n": {"$gt": 1}})])
    out.append([r.id for r in store.list(user_id=alice, since=T0 + timedelta(minutes=1), limit=2)])
    out.append(sorted(i for i, _ in store.search_text("puppy Rex", user_id=alice, k=10)))
    out.append(store.search_text("the of and", user_id=alice, k=10))
    out.append(store.adjacent(["a2", "b1"], user_id=alice))
    # Records without a session: neighbours within the gap, same time by storage order.
    store.add(
        [
            _record(alice, f"loose{i}", "loose", minutes, session_id=None)
            for i, minutes in enumerate((0, 0, 0, 5, 40))
        ]
    )
    loose = [f"loose{i}" for i in range(5)]
    out.append(store.adjacent([*loose, "a2", "b1"], user_id=alice, gap=timedelta(minutes=30)))
    out.append(store.adjacent(loose, user_id=alice, gap=timedelta(0)))
    store.delete(loose, user_id=alice)
    out.append(store.users())
    out.append(sorted(r.id for r in store.pending_index()))
    store.mark_indexed(["a1", "a2", "b1"])
    store.mark_index_failed(["a3"])
    out.append(store.index_states(alice))
    store.mark_pending(["a3"], user_id=alice)
    out.append(store.include_in_index(kind="turn", user_id=alice))
    out.append(store.mark_all_pending())
    changes = store.update_state(
        alice,
        {"a1": {"strength": 2.5, "attrs": {"x": 1}}, "a2": {"archived": True}, "b1": {"tier": "x"}},
        at=T0,
        reason="test",
    )
    out.append([(c.record_id, c.old, c.new, c.reason) for c in changes])
    out.append([r.id for r in store.list(user_id=alice, where={"archived": False})])
    out.append([r.id for r in store.list(user_id=alice, where={"attrs.x": {"$gte": 1}})])
    out.append(store.get(["b1"], user_id=bob)[0].state == RecordState())
    store.add_history(alice, "a3", old={"text": "x"}, new={"text": "y"}, at=T0, reason="edit")
    out.append([(h.record_id, h.old, h.new) for h in store.history(alice)])
    out.append(store.edit_text("a3", "I work as a doctor", user_id=alice))
    out.append(store.edit_text("b1", "hijack", user_id=alice))
    out.append(store.add_jobs(alice, [JobSpec("m", "k", "key1", {"p": 1})] * 2, now=T0))
    out.append(store.add_jobs(bob, [JobSpec("m", "k", "key1", {"p": 2})], now=T0))
    job = store.jobs(user_id=alice)[0]
    out.append(store.claim_job(job.id, now=T0, lease=timedelta(minutes=5)))
    out.append(store.claim_job(job.id, now=T0 + timedelta(minutes=1), lease=timedelta(minutes=5)))
    out.append(len(store.jobs(user_id=alice, due_at=T0 + timedelta(minutes=1))))
    store.fail_job(job.id, error="boom", retry_at=T0 + timedelta(minutes=2))
    store.update_job(job.id, {"p": 3})
    got = store.jobs(user_id=alice, mechanisms=["m"], key="key1")[0]
    out.append((got.attempts, got.last_error, got.payload, got.next_attempt_at))
    out.append(store.finish_job(job.id))
    out.append(store.finish_job(job.id))
    out.append(store.restore_jobs(alice, [got, got]))
    store.put_graph(
        alice,
        nodes=[GraphNode("n1", "entity", "Rex"), GraphNode("n2", "entity", "beach")],
        edges=[GraphEdge("e1", "n1", "n2", "loves", record_id="a2")],
    )
    with pytest.raises(InvalidInputError, match="nodes this user does not have"):
        store.put_graph(bob, edges=[GraphEdge("e2", "n1", "n2", "x")])
    out.append(store.graph_nodes(alice))
    out.append(store.graph_edges(alice, node_id="n2"))
    out.append(store.graph_edges(bob))
    store.delete_graph(alice, node_ids=["n1"])
    out.append((store.graph_nodes(alice), store.graph_edges(alice)))
    store.register_artifact(alice, "lora", folder="f/1", size=3, sha256="abc", at=T0, meta={"r": 8})
    out.append(store.artifact_rows(alice))
    out.append(store.artifact_rows(bob))
    store.unregister_artifact(alice, "lora")
    out.append(store.artifact_rows())
    store.set_state("k", {"v": [1, 2.5, "x"]}, user_id=alice)
    store.set_state("k", 7)
    out.append((store.get_state("k", user_id=alice), store.get_state("k"), store.user_state(bob)))
    store.set_state("k", None, user_id=alice)
    out.append(store.user_state(alice))
    store.restore_state(alice, {"a4": RecordState(strength=0.5, tier="ltm")})
    out.append(store.get(["a4"], user_id=alice)[0].state)
    with store.transaction():
        store.add([_record(alice, "a6", "inside", 5)])
        store.set_state("t", 1, user_id=alice)
    with pytest.raises(RuntimeError), store.transaction():
        store.add([_record(alice, "a7", "rolled back", 6)])
        raise RuntimeError("abort")
    out.append([r.id for r in store.list(user_id=alice)][-2:])
    store.delete(["a6", "b1"], user_id=alice)
    out.append((store.count(alice), store.count(bob)))
    store.put_graph("carol", nodes=[GraphNode("c", "entity", "only a graph")])
    out.append(list(store.iter_user_ids()))
    store.mark_deleting(bob, at=T0)
    out.append((store.deleting_users(), store.is_deleting(bob), store.is_deleting(alice)))
    store.purge_user(bob)
    out.append((store.users(), store.deleting_users(), store.jobs(user_id=bob)))
    return out


def test_postgres_store_answers_like_the_sqlite_store(store: PostgresRecordStore) -> None:
    with SQLiteRecordStore() as sqlite:
        expected = _exercise(sqlite)
    assert _exercise(store) == expected


# -- isolation: every query path with a second user's data present ---------------------------


def test_postgres_every_query_path_keeps_users_apart(store: PostgresRecordStore) -> None:
    secret = "zqsecretbob"
    for user, word in (("alice", "alicetext"), ("bob", secret)):
        store.add([_record(user, f"{user}-1", f"puppy {word}", metadata={"w": word})])
        store.update_state(user, {f"{user}-1": {"tier": word}}, at=T0)
        store.add_history(user, f"{user}-1", old={}, new={"w": word}, at=T0)
        store.add_jobs(user, [JobSpec("m", "k", word, {"w": word})], now=T0)
        store.put_graph(user, nodes=[GraphNode("n", "e", word)])
        store.register_artifact(user, "a", folder=word, size=1, sha256=word, at=T0)
        store.set_state("k", word, user_id=user)
    seen = repr(
        [
            store.get(["alice-1", "bob-1"], user_id="alice"),
            store.list(user_id="alice"),
            store.list(user_id="alice", where={"w": secret}),
            store.search_text(f"puppy {secret}", user_id="alice", k=10),
            store.adjacent(["bob-1", "alice-1"], user_id="alice"),
            store.adjacent(["bob-1", "alice-1"], user_id="alice", gap=timedelta(days=1)),
            store.history("alice"),
            store.history("alice", record_id="bob-1"),
            store.jobs(user_id="alice"),
            store.graph_nodes("alice"),
            store.graph_edges("alice"),
            store.artifact_rows("alice"),
            store.user_state("alice"),
            store.get_state("k", user_id="alice"),
            store.index_states("alice"),
        ]
    )
    assert "alicetext" in seen and secret not in seen and "bob-1" not in seen
    # Writes naming another user's ids change nothing of theirs.
    store.delete(["bob-1"], user_id="alice")
    store.update_state("alice", {"bob-1": {"tier": "hacked"}}, at=T0)
    store.mark_pending(["bob-1"], user_id="alice")
    assert store.edit_text("bob-1", "hacked", user_id="alice") is None
    store.delete_graph("alice", node_ids=["n"])
    (bob_record,) = store.get(["bob-1"], user_id="bob")
    assert bob_record.text == f"puppy {secret}" and bob_record.state.tier == secret
    assert [n.label for n in store.graph_nodes("bob")] == [secret]


def test_postgres_statements_name_the_user(
    store: PostgresRecordStore, postgres_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every statement the store runs on a user's table names ``user_id``, with listed exceptions.

    All of the store's methods run (through :func:`_exercise`) while every statement is
    recorded. The exceptions: statements keyed by a job id (job ids are only handed out per
    user, by ``jobs(user_id=...)``), the vector-index bookkeeping keyed by record ids (ids
    that come from ``pending_index`` and the index itself), counts over all users and
    ``VACUUM``. The pgvector index's statements are checked the same way.
    """
    import psycopg

    index = PgVectorIndex(postgres_dsn, dimension=DIM, schema=store.schema)
    seen: list[str] = []
    execute, executemany = psycopg.Connection.execute, psycopg.Cursor.executemany

    def text(query: Any, conn: Any) -> str:
        return query if isinstance(query, str) else query.as_string(conn)

    def logged_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(text(query, self))
        return execute(self, query, *args, **kwargs)

    def logged_executemany(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(text(query, self.connection))
        return executemany(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", logged_execute)
    monkeypatch.setattr(psycopg.Cursor, "executemany", logged_executemany)
    _exercise(store)
    store.pending_count()
    store.count()
    store.compact()
    index.add(["v1"], np.stack([_unit(1)]), [{"user_id": "alice", "kind": "turn", "n": 1}])
    index.search(_unit(1), user_id="alice", k=3, where={"kind": "turn", "n": {"$gt": 0}})
    index.vectors(["v1"], user_id="alice")
    index.ids("alice")
    index.count("alice")
    index.delete(["v1"], user_id="alice")
    index.delete_user("alice")
    monkeypatch.undo()
    index.close()
    tables = re.compile(
        r"\b(records|record_state|record_history|jobs|graph_nodes|graph_edges|artifacts|"
        r"state|deletions|vectors)\b"
    )
    allowed = re.compile(
        r"^(UPDATE jobs SET .* WHERE id = |DELETE FROM jobs WHERE id = %s$|"
        r"SELECT claimed_by FROM jobs WHERE id = %s FOR UPDATE SKIP LOCKED$|"
        r"UPDATE records SET index_state = \d WHERE index_state (= \d|IN \(\d, \d\))"
        r"( AND id = ANY\(%s\))?$|"
        r"SELECT count\(\*\) FROM records( WHERE index_state = \d)?$|VACUUM \w+$)"
    )
    touching = {q for q in seen if tables.search(q) and "pg_advisory" not in q}
    unscoped = sorted(q for q in touching if "user_id" not in q and not allowed.match(q))
    assert len(touching) > 40 and not unscoped, unscoped


def test_postgres_erasure_leaves_no_row_of_the_user(
    postgres_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    import psycopg

    marker = "zqerase" + new_id()[:8]
    victim = f"victim-{marker}"
    store = PostgresRecordStore(postgres_dsn, schema=pg_schema, artifacts_path=tmp_path / "art")
    index = PgVectorIndex(postgres_dsn, dimension=64, schema=pg_schema)
    memory = MemoryBankMemory(
        store=store, index=index, embedder=HashingEmbedder(dimension=64), llm=_bank_llm()
    )
    scope = Scope(victim, f"session-{marker}")
    memory.save([Turn("user", f"remember {marker}", metadata={"tag": marker})], scope)
    memory.end_session(scope)
    memory.save([Turn("user", "keeper text")], Scope("keeper"))
    memory.engine.artifacts.put(victim, "adapter", {"w.bin": marker.encode()})
    store.put_graph(victim, nodes=[GraphNode("n", "entity", marker)])
    memory.delete_user(victim)
    memory.close()
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", (pg_schema,)
            )
        ]
        found = {}
        for table in tables:
            rows = conn.execute(f'SELECT t::text FROM "{pg_schema}"."{table}" AS t').fetchall()
            found[table] = [r[0] for r in rows if marker in r[0]]
    assert "records" in tables and "vectors" in tables
    assert not any(found.values()), found
    assert not list((tmp_path / "art").rglob("*.bin"))


def _bank_llm() -> Any:
    from memories_core.llms.scripted import ScriptedLLM
    from memories_core.prompts.rule_following import rule_following_reply
    from test_contract_memorybank import aware

    return aware(ScriptedLLM(default=rule_following_reply))


# -- jobs, transactions and many processes --------------------------------------------------


def test_postgres_a_job_is_claimed_by_one_store_only(postgres_dsn: str, pg_schema: str) -> None:
    with (
        PostgresRecordStore(postgres_dsn, schema=pg_schema) as one,
        PostgresRecordStore(postgres_dsn, schema=pg_schema) as two,
    ):
        one.add_jobs("u", [JobSpec("m", "k", "key")], now=T0)
        (job,) = two.jobs(user_id="u")
        lease = timedelta(minutes=5)
        assert one.claim_job(job.id, now=T0, lease=lease)
        assert not two.claim_job(job.id, now=T0 + timedelta(minutes=1), lease=lease)
        # After the lease ends another worker may take it over; the first worker's commit
        # then finds the job gone and must roll back.
        assert two.claim_job(job.id, now=T0 + timedelta(minutes=6), lease=lease)
        with two.transaction():
            assert two.finish_job(job.id)
        with pytest.raises(RuntimeError), one.transaction():
            one.add([_record("u", "derived", "derived twice?")])
            if not one.finish_job(job.id):
                raise RuntimeError("job gone: roll back")
        assert one.get(["derived"], user_id="u") == []


_WORKER = textwrap.dedent(
    """
    import os, sys, time
    from datetime import datetime, timezone
    from memories_core import Scope, Turn
    from memories_core.backends import PgVectorIndex, PostgresRecordStore
    from memories_core.embedders import HashingEmbedder
    from memories_core.engine import Derivation, MechanismHooks, MemoryEngine
    from memories_core.types import JobSpec, MemoryRecord, new_id

    dsn, schema, worker, count, log = sys.argv[1:6]
    engine = MemoryEngine(
        store=PostgresRecordStore(dsn, schema=schema, pool_size=2),
        index=PgVectorIndex(dsn, dimension=32, schema=schema, pool_size=2),
        embedder=HashingEmbedder(dimension=32),
    )

    def on_turns(records):
        return [JobSpec("echo", "note", "turn:" + r.id, {"id": r.id, "text": r.text})
                for r in records]

    def run_job(job):
        with open(log, "a") as handle:
            handle.write(job.key + "\\n")
        time.sleep(0.005)
        note = MemoryRecord(new_id(), job.user_id, "note", "note: " + job.payload["text"],
                            datetime.now(timezone.utc), source_ids=(job.payload["id"],))
        return Derivation(add=[note])

    engine.attach(MechanismHooks("echo", on_turns=on_turns, run_job=run_job))
    for i in range(int(count)):
        engine.save([Turn("user", f"w{worker} message {i}")], Scope("shared"))
    engine.run_pending("shared", force=True)
    engine.close()
    """
)


def _run_workers(workers: int, argv_of: Callable[[int], list[str]]) -> None:
    """Run ``workers`` Python processes (``python -c SCRIPT ARGS...`` from ``argv_of(i)``)
    at once on this interpreter's path; each must exit 0."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", *argv_of(w)], env=env, stderr=subprocess.PIPE, text=True
        )
        for w in range(workers)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-3000:]


def test_postgres_concurrent_processes_lose_and_duplicate_nothing(
    postgres_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    workers, count = 3, 12
    log = tmp_path / "ran.log"
    # Create the schema once, so that the workers race on data, not on the migration.
    PostgresRecordStore(postgres_dsn, schema=pg_schema).close()
    _run_workers(
        workers, lambda w: [_WORKER, postgres_dsn, pg_schema, str(w), str(count), str(log)]
    )
    with PostgresRecordStore(postgres_dsn, schema=pg_schema) as store:
        records = store.list(user_id="shared")
        jobs_left = store.jobs(user_id="shared")
    turns = Counter(r.text for r in records if r.kind == "turn")
    expected = {f"user: w{w} message {i}" for w in range(workers) for i in range(count)}
    assert set(turns) == expected and set(turns.values()) == {1}
    notes = Counter(r.source_ids for r in records if r.kind == "note")
    assert len(notes) == workers * count and set(notes.values()) == {1}
    ran = Counter(log.read_text().split())
    assert len(ran) == workers * count and set(ran.values()) == {1}, ran.most_common(3)
    assert jobs_left == []


_REINFORCER = textwrap.dedent(
    """
    import sys
    from memories_core import MemoryBankMemory
    from memories_core.backends import postgres_storage
    from memories_core.embedders import HashingEmbedder
    from memories_core.llms import ScriptedLLM

    dsn, schema, record_id, times = sys.argv[1:5]
    memory = MemoryBankMemory(
        **postgres_storage(dsn, dimension=32, schema=schema, pool_size=2),
        embedder=HashingEmbedder(dimension=32),
        llm=ScriptedLLM([]),
    )
    for _ in range(int(times)):
        memory.reinforce_records("shared", [record_id])
    memory.close()
    """
)


def test_postgres_read_modify_write_of_one_user_is_serialized_across_processes(
    postgres_dsn: str, pg_schema: str
) -> None:
    """MemoryBank's reinforcement (read strength, write strength + 1 under ``user_lock``)
    loses no increment when several processes reinforce the same memory at once."""
    with PostgresRecordStore(postgres_dsn, schema=pg_schema) as store:
        store.add([_record("shared", "m1", "a memory")])
    workers, times = 3, 15
    _run_workers(workers, lambda _: [_REINFORCER, postgres_dsn, pg_schema, "m1", str(times)])
    with PostgresRecordStore(postgres_dsn, schema=pg_schema) as store:
        (record,) = store.get(["m1"], user_id="shared")
        history = store.history("shared", record_id="m1")
    assert record.state.recall_count == workers * times
    assert record.state.strength == 1.0 + workers * times
    assert len(history) == workers * times


# A read-modify-write whose read is NOT inside the write's transaction (EMG's shape: plan
# from what is stored, then write the plan): only engine.user_lock keeps it whole. Each round
# reads the counter, waits a moment (other processes get to read the same value if nothing
# serializes them) and writes counter + 1 in a transaction of its own.
_RMW_WORKER = textwrap.dedent(
    """
    import sys, time
    from memories_core.backends import postgres_storage
    from memories_core.embedders import HashingEmbedder
    from memories_core.engine import MemoryEngine

    dsn, schema, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    engine = MemoryEngine(**postgres_storage(dsn, dimension=32, schema=schema, pool_size=2),
                          embedder=HashingEmbedder(dimension=32))
    for _ in range(rounds):
        with engine.user_lock("shared"):
            (record,) = engine.get("shared", ["m1"])
            time.sleep(0.005)
            engine.update_state("shared", {"m1": {"strength": record.state.strength + 1}})
            with engine.user_lock("shared"):  # re-entrant in one thread
                pass
    engine.close()
    """
)


def test_postgres_user_lock_serializes_read_modify_write_across_processes(
    postgres_dsn: str, pg_schema: str
) -> None:
    """Issue 15, Build 3: ``engine.user_lock`` holds across worker processes (an advisory
    lock of the store), so no increment is lost when the read is outside the write's
    transaction."""
    with PostgresRecordStore(postgres_dsn, schema=pg_schema) as store:
        store.add([_record("shared", "m1", "a counter")])
    workers, rounds = 3, 25
    _run_workers(workers, lambda _: [_RMW_WORKER, postgres_dsn, pg_schema, str(rounds)])
    with PostgresRecordStore(postgres_dsn, schema=pg_schema) as store:
        (record,) = store.get(["m1"], user_id="shared")
        history = store.history("shared", record_id="m1")
    assert record.state.strength == 1.0 + workers * rounds
    assert len(history) == workers * rounds


def test_postgres_user_lock_is_per_user_and_released(postgres_dsn: str, pg_schema: str) -> None:
    """One thread holds user a's lock: another thread takes b's at once, a's only after the
    block; the block's reads and writes run (on its pinned connection), and an error inside
    releases the lock."""
    import threading

    with PostgresRecordStore(postgres_dsn, schema=pg_schema, pool_size=3) as store:
        entered, release = threading.Event(), threading.Event()
        got: dict[str, float] = {}

        def hold_a() -> None:
            with store.user_lock("a"):
                store.add([_record("a", "a1", "written under the lock")])
                assert [r.id for r in store.list(user_id="a")] == ["a1"]
                entered.set()
                release.wait(10)

        def take(user: str) -> None:
            with store.user_lock(user):
                got[user] = time.monotonic()

        holder = threading.Thread(target=hold_a)
        holder.start()
        assert entered.wait(10)
        other, same = (
            threading.Thread(target=take, args=("b",)),
            threading.Thread(target=take, args=("a",)),
        )
        other.start()
        same.start()
        other.join(10)
        assert "b" in got and "a" not in got
        time.sleep(0.3)
        assert "a" not in got  # still waiting for the holder
        released_at = time.monotonic()
        release.set()
        holder.join(10)
        same.join(10)
        assert got["a"] >= released_at
        with pytest.raises(RuntimeError), store.user_lock("a"):
            raise RuntimeError("boom")
        got.clear()
        after_error = threading.Thread(target=take, args=("a",))
        after_error.start()
        after_error.join(10)
        assert "a" in got, "the lock was not released after an error in the block"


def test_postgres_a_dead_workers_job_claim_is_taken_at_once(
    postgres_dsn: str, pg_schema: str
) -> None:
    """Issue 15: the claim records its owner (host, pid, start time); a job claimed by a
    killed worker is run at once by a process of the same host, not after the lease."""
    import test_multiprocess
    from memories_core.backends import postgres_storage

    parts = postgres_storage(postgres_dsn, dimension=64, schema=pg_schema, pool_size=2)
    test_multiprocess.dead_owner_claims_are_taken_at_once(
        parts, "postgres", postgres_dsn, pg_schema
    )


async def test_postgres_async_twins_run_concurrently(postgres_dsn: str, pg_schema: str) -> None:
    memory = HistoryMemory(
        store=PostgresRecordStore(postgres_dsn, schema=pg_schema, pool_size=3),
        index=PgVectorIndex(postgres_dsn, dimension=DIM, schema=pg_schema),
        embedder=HashingEmbedder(dimension=DIM),
    )
    try:
        users = [f"u{i}" for i in range(6)]
        await asyncio.gather(
            *(memory.asave([Turn("user", f"{u} likes kayaking")], Scope(u)) for u in users)
        )
        recalls = await asyncio.gather(*(memory.arecall("kayaking", Scope(u)) for u in users))
        for user, recall in zip(users, recalls, strict=True):
            assert [r.record.text for r in recall.records] == [f"user: {user} likes kayaking"]
    finally:
        memory.close()


# -- schema versions, credentials, artifacts ------------------------------------------------


def test_postgres_schema_is_versioned_and_a_newer_one_is_refused(
    postgres_dsn: str, pg_schema: str
) -> None:
    import psycopg

    PostgresRecordStore(postgres_dsn, schema=pg_schema).close()
    PostgresRecordStore(postgres_dsn, schema=pg_schema).close()  # reopening migrates nothing
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        rows = conn.execute(
            f'SELECT component, version FROM "{pg_schema}".schema_version ORDER BY 1'
        ).fetchall()
        assert rows == [("store", v) for v in range(1, postgres_module.SCHEMA_VERSION + 1)]
        conn.execute(
            f'INSERT INTO "{pg_schema}".schema_version (component, version) VALUES (%s, %s)',
            ("store", postgres_module.SCHEMA_VERSION + 1),
        )
    with pytest.raises(BackendError, match="reads up to"):
        PostgresRecordStore(postgres_dsn, schema=pg_schema)


def test_postgres_credentials_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    dsn = "postgresql://carol:hunter2secret@/nowhere?host=/nonexistent-socket-dir"
    with pytest.raises(BackendError) as info:
        PostgresRecordStore(dsn, timeout=1.0)
    assert "hunter2secret" not in str(info.value) and "carol@unix-socket/nowhere" in str(info.value)
    assert "hunter2secret" not in caplog.text
    with pytest.raises(MemoriesError):
        PostgresRecordStore(dsn, schema="bad name;")


def test_postgres_repr_hides_the_password(postgres_dsn: str, pg_schema: str) -> None:
    with PostgresRecordStore(postgres_dsn, schema=pg_schema) as store:
        assert "postgres@" in repr(store) and pg_schema in repr(store)
        assert ":@" not in repr(store) and "password" not in repr(store)


def test_postgres_refuses_nul_with_a_typed_error(store: PostgresRecordStore) -> None:
    with pytest.raises(InvalidInputError, match="NUL"):
        store.add([_record("u", "r1", "a\x00b")])
    with pytest.raises(InvalidInputError, match="NUL"):
        store.add([_record("u", "r1", "ok", metadata={"k": "a\x00b"})])
    assert store.list(user_id="u") == []


def test_postgres_workers_share_artifacts_through_the_folder(
    postgres_dsn: str, pg_schema: str, tmp_path: Path
) -> None:
    def worker() -> MemoryEngine:
        return MemoryEngine(
            store=PostgresRecordStore(
                postgres_dsn, schema=pg_schema, artifacts_path=tmp_path / "shared"
            ),
            index=PgVectorIndex(postgres_dsn, dimension=DIM, schema=pg_schema),
            embedder=HashingEmbedder(dimension=DIM),
        )

    one, two = worker(), worker()
    try:
        one.artifacts.put("alice", "policy", {"weights.bin": b"\x01\x02"})
        # A third worker opening meanwhile must not remove a folder it has no row for yet.
        inflight = tmp_path / "shared" / "0123abcd" / ".tmp-inflight"
        inflight.mkdir(parents=True)
        (inflight / "part.bin").write_bytes(b"...")
        worker().close()
        assert (inflight / "part.bin").exists()
        assert two.artifacts.read("alice", "policy", "weights.bin") == b"\x01\x02"
        assert two.artifacts.get("bob", "policy") is None
    finally:
        one.close()
        two.close()


# -- pgvector ------------------------------------------------------------------------------


def _unit(seed: int, dim: int = DIM) -> np.ndarray:
    vector = np.random.default_rng(seed).normal(size=dim).astype(np.float32)
    return vector / np.linalg.norm(vector)


def _units(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    vectors = rng.normal(size=(n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _exact_top(vectors: np.ndarray, query: np.ndarray, k: int, prefix: str = "v") -> list[str]:
    """The ids (``prefix`` + row) of the ``k`` rows nearest ``query`` by cosine, ties stable."""
    return [f"{prefix}{i}" for i in np.argsort(-(vectors @ query), kind="stable")[:k]]


def _index_names(dsn: str, schema: str) -> set[str]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (schema,))
        return {name for (name,) in rows}


@pytest.mark.parametrize("exact_below", [2000, 0])  # exact search; every user in the graph
def test_pgvector_index_scopes_filters_and_round_trips(
    postgres_dsn: str, pg_schema: str, exact_below: int
) -> None:
    with PgVectorIndex(
        postgres_dsn, dimension=DIM, schema=pg_schema, exact_below=exact_below
    ) as index:
        records = [
            _record("alice", f"a{i}", "t", kind="turn" if i % 2 else "note", metadata={"n": i})
            for i in range(20)
        ] + [_record("bob", "b0", "t")]
        vectors = np.stack([_unit(i) for i in range(21)])
        index.add([r.id for r in records], vectors, [index_metadata(r) for r in records])
        hits = index.search(vectors[3], user_id="alice", k=5)
        assert hits[0][0] == "a3" and hits[0][1] == pytest.approx(1.0, abs=1e-5)
        assert all(h.startswith("a") for h, _ in index.search(vectors[20], user_id="alice", k=50))
        assert [h for h, _ in index.search(vectors[3], user_id="bob", k=5)] == ["b0"]
        notes = index.search(vectors[3], user_id="alice", k=50, where={"kind": "note"})
        assert {h for h, _ in notes} == {f"a{i}" for i in range(0, 20, 2)}
        ranged = index.search(vectors[3], user_id="alice", k=50, where={"n": {"$gte": 15}})
        assert {h for h, _ in ranged} == {f"a{i}" for i in range(15, 20)}
        stored = index.vectors(["a1", "b0"], user_id="alice")
        assert list(stored) == ["a1"] and np.allclose(stored["a1"], vectors[1], atol=1e-6)
        assert index.count() == 21 and index.count("alice") == 20
        assert index.probe(["a0", "a5", "b0", "missing"], user_id="alice") == set()
        assert index.ids("bob") == {"b0"} and index.users() == {"alice", "bob"}
        index.delete(["b0", "a1"], user_id="alice")
        assert index.count("bob") == 1 and "a1" not in index.ids("alice")
        index.delete_user("alice")
        assert index.count() == 1
        with pytest.raises(EmbedderMismatchError):
            index.search(_unit(1, DIM + 1), user_id="bob", k=1)
        with pytest.raises(InvalidInputError):
            index.search(vectors[0], user_id="bob", k=0)
    # Another dimension: refused until reset (what reindex does) rebuilds the table.
    with PgVectorIndex(postgres_dsn, dimension=DIM + 8, schema=pg_schema) as wider:
        with pytest.raises(EmbedderMismatchError):
            wider.add(["x"], np.stack([_unit(1, DIM + 8)]), [{"user_id": "u", "kind": "turn"}])
        wider.reset()
        wider.add(["x"], np.stack([_unit(1, DIM + 8)]), [{"user_id": "u", "kind": "turn"}])
        assert wider.count() == 1


def test_postgres_engine_reindexes_after_an_embedder_change(
    postgres_dsn: str, pg_schema: str
) -> None:
    def open_memory(dim: int, **kw: Any) -> HistoryMemory:
        return HistoryMemory(
            store=PostgresRecordStore(postgres_dsn, schema=pg_schema),
            index=PgVectorIndex(postgres_dsn, dimension=dim, schema=pg_schema),
            embedder=HashingEmbedder(dimension=dim),
            **kw,
        )

    memory = open_memory(DIM)
    memory.save([Turn("user", "I play the cello")], Scope("u"))
    memory.close()
    with pytest.raises(EmbedderMismatchError):
        open_memory(DIM * 2)
    memory = open_memory(DIM * 2, allow_embedder_change=True)
    try:
        assert "cello" in memory.recall("cello", Scope("u")).context
        assert memory.engine.index.count("u") >= 1
    finally:
        memory.close()


# -- the command line and the portable file on a DSN -----------------------------------------


def test_postgres_cli_and_export_import_on_a_dsn(
    postgres_dsn: str, pg_schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    memory = MemoryBankMemory(
        store=PostgresRecordStore(postgres_dsn, schema=pg_schema),
        index=PgVectorIndex(postgres_dsn, dimension=64, schema=pg_schema),
        embedder=HashingEmbedder(dimension=64),
        llm=_bank_llm(),
    )
    memory.save([Turn("user", "I moved to Lisbon last spring")], Scope("alice", "s1"))
    memory.end_session(Scope("alice", "s1"))
    memory.save([Turn("user", "bob's own words")], Scope("bob"))
    memory.close()
    base = ["--path", postgres_dsn, "--schema", pg_schema, "--embedder", "hashing-64", "-q"]

    def run(*args: str) -> str:
        capsys.readouterr()
        assert main([*base, *args]) == 0
        return capsys.readouterr().out

    assert re.search(r"alice\s+\d+", run("users")) and "bob" in run("users")
    assert "Lisbon" in run("show", "alice") and "bob's own words" not in run("show", "alice")
    assert "Lisbon" in run("search", "alice", "Lisbon")
    stats = run("stats")
    assert "users: 2" in stats and "PostgreSQL" in stats and postgres_dsn not in stats
    assert "index: ok" in stats
    file = tmp_path / "alice.memories.zip"
    assert "exported alice" in run("export", "alice", str(file))
    # Import into a fresh schema of the same server, through the library and the CLI.
    other = pg_schema + "_copy"
    engine = MemoryEngine(
        store=PostgresRecordStore(postgres_dsn, schema=other),
        index=PgVectorIndex(postgres_dsn, dimension=64, schema=other),
        embedder=HashingEmbedder(dimension=64),
    )
    try:
        report = import_user(engine, file)
        assert report.user_id == "alice" and report.records >= 1 and not report.reembedded
        assert engine.users() == ["alice"]
        assert "Lisbon" in " ".join(r.text for r in engine.records("alice"))
        again = tmp_path / "again.memories.zip"
        export_user(engine, "alice", again)
    finally:
        engine.close()
    assert "imported alice" in run("import", str(again), "--merge")
    assert "erased alice" in run("forget", "alice", "--yes")
    assert "alice" not in run("users")
    capsys.readouterr()
    assert main(["--path", postgres_dsn, "--schema", "lmt_missing_schema", "users"]) == 2
    assert "no memory in schema" in capsys.readouterr().err


def test_a_version_1_vector_table_gains_its_filter_columns(
    postgres_dsn: str, pg_schema: str
) -> None:
    """A table written by a release before the ``kind``/``session_id`` columns upgrades in place."""
    import psycopg

    rows = [
        ("a", "u1", {"user_id": "u1", "kind": "turn", "session_id": "s1"}, [1.0, 0.0, 0.0]),
        ("b", "u1", {"user_id": "u1", "kind": "daily_summary"}, [0.9, 0.1, 0.0]),
        ("c", "u1", {"user_id": "u1", "kind": "turn", "session_id": "s2"}, [0.8, 0.2, 0.0]),
    ]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        # The shape and version record that release 1 of the table left behind.
        conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        conn.execute(f'SET search_path TO "{pg_schema}", public')
        conn.execute(
            "CREATE TABLE schema_version (component text NOT NULL, version integer NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (component, version))"
        )
        conn.execute(
            "INSERT INTO schema_version (component, version) VALUES ('pgvector:vectors', 1)"
        )
        conn.execute(
            "CREATE TABLE vectors (id text PRIMARY KEY, user_id text NOT NULL, "
            "metadata json NOT NULL, embedding vector(3) NOT NULL)"
        )
        for vid, user, meta, vector in rows:
            conn.execute(
                "INSERT INTO vectors VALUES (%s, %s, %s, %s::vector)",
                (vid, user, json.dumps(meta), str(vector)),
            )
    query = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    with PgVectorIndex(postgres_dsn, dimension=3, schema=pg_schema) as index:
        assert [
            vid for vid, _ in index.search(query, user_id="u1", k=5, where={"kind": "turn"})
        ] == [
            "a",
            "c",
        ]
        found = index.search(query, user_id="u1", k=5, where={"session_id": "s2"})
        assert [vid for vid, _ in found] == ["c"]
        # New rows fill the columns from their metadata, and a reset keeps the latest shape.
        index.add(
            ["d"],
            np.array([[0.0, 1.0, 0.0]], dtype=np.float32),
            [{"user_id": "u1", "kind": "turn"}],
        )
        assert {
            vid for vid, _ in index.search(query, user_id="u1", k=5, where={"kind": "turn"})
        } == {
            "a",
            "c",
            "d",
        }
        index.reset()
        index.add(
            ["e"], np.array([[1.0, 0.0, 0.0]], dtype=np.float32), [{"user_id": "u1", "kind": "x"}]
        )
        assert [vid for vid, _ in index.search(query, user_id="u1", k=5, where={"kind": "x"})] == [
            "e"
        ]
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        versions = conn.execute(
            f'SELECT version FROM "{pg_schema}".schema_version WHERE component = %s ORDER BY 1',
            ("pgvector:vectors",),
        ).fetchall()
    assert [v for (v,) in versions] == [1, 2, 3, 4]


def test_a_bulk_load_refreshes_the_planner_statistics(postgres_dsn: str, pg_schema: str) -> None:
    """After 1,000+ new rows the planner knows the table's size (so it can use HNSW)."""
    import psycopg

    def reltuples() -> float:
        with psycopg.connect(postgres_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT c.reltuples FROM pg_class AS c JOIN pg_namespace AS n "
                "ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = 'vectors'",
                (pg_schema,),
            ).fetchone()
        assert row is not None
        return float(row[0])

    rng = np.random.default_rng(0)
    with PgVectorIndex(postgres_dsn, dimension=8, schema=pg_schema) as index:
        index.add(["few"], rng.random((1, 8), dtype=np.float32), [{"user_id": "u", "kind": "turn"}])
        assert reltuples() <= 0  # a few rows: left to autovacuum
        ids = [f"v{i}" for i in range(1200)]
        index.add(
            ids, rng.random((1200, 8), dtype=np.float32), [{"user_id": "u", "kind": "turn"}] * 1200
        )
        assert reltuples() == 1201
        found = index.search(rng.random(8, dtype=np.float32), user_id="u", k=5)
        assert len(found) == 5


def test_pgvector_search_settings_hold_on_every_pooled_connection(
    postgres_dsn: str, pg_schema: str
) -> None:
    """A filtered HNSW search finds k rows on each search, whatever k came before.

    The settings live on the index's pooled sessions (set once, changed when a search needs a
    larger ``ef_search``), so they must hold on later searches on the same connections and on
    concurrent ones on other connections.
    """
    rng = np.random.default_rng(1)
    n, dimension = 10_000, 16  # the planner walks the HNSW graph from about this size
    kinds = [{"user_id": "u", "kind": "note" if i % 100 == 0 else "turn"} for i in range(n)]
    with PgVectorIndex(postgres_dsn, dimension=dimension, schema=pg_schema, ef_search=5) as index:
        index.add([f"v{i}" for i in range(n)], rng.random((n, dimension), dtype=np.float32), kinds)
        notes = {f"v{i}" for i in range(0, n, 100)}
        queries = rng.random((14, dimension), dtype=np.float32)

        def search(k: int, query: np.ndarray) -> set[str]:
            found = index.search(query, user_id="u", k=k, where={"kind": "note"})
            return {item for item, _ in found}

        for k, query in zip((30, 5, 30, 90, 3, 30), queries, strict=False):
            got = search(k, query)  # k goes up and down between searches on the pool
            assert len(got) == k and got <= notes
            # unfiltered, k rows however small ef_search (the scan goes on past it)
            assert len(index.search(query, user_id="u", k=k)) == k
        assert len(index.search(queries[0], user_id="u", k=200)) == 200
        with ThreadPoolExecutor(4) as pool:  # several pooled connections at once
            found = list(pool.map(lambda q: search(30, q), queries[6:]))
        assert all(len(got) == 30 and got <= notes for got in found)


def _graph_rows(dsn: str, schema: str) -> dict[str, tuple[int, int]]:
    """Per user: (rows, rows in the HNSW graph)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        found = conn.execute(
            f'SELECT user_id, count(*), count(*) FILTER (WHERE graph) FROM "{schema}".vectors '
            "GROUP BY user_id"
        ).fetchall()
    return {user: (int(n), int(g)) for user, n, g in found}


def test_pgvector_small_users_are_searched_exactly_and_large_ones_enter_the_graph(
    postgres_dsn: str, pg_schema: str
) -> None:
    rng = np.random.default_rng(3)
    vectors = _units(rng, 80, 16)
    meta = [{"user_id": "big", "kind": "turn"}] * 80

    def exact_top(query: np.ndarray, upto: int, k: int) -> list[str]:
        return _exact_top(vectors[:upto], query, k)

    with PgVectorIndex(postgres_dsn, dimension=16, schema=pg_schema, exact_below=50) as index:
        index.add([f"v{i}" for i in range(30)], vectors[:30], meta[:30])
        index.add(["s0"], vectors[:1], [{"user_id": "small", "kind": "turn"}])
        assert _graph_rows(postgres_dsn, pg_schema) == {"big": (30, 0), "small": (1, 0)}
        for query in rng.normal(size=(5, 16)).astype(np.float32):
            query /= np.linalg.norm(query)
            assert [h for h, _ in index.search(query, user_id="big", k=7)] == exact_top(
                query, 30, 7
            )
        # The batch that takes "big" past 50 moves all of its rows into the graph.
        index.add([f"v{i}" for i in range(30, 80)], vectors[30:], meta[30:])
        assert _graph_rows(postgres_dsn, pg_schema) == {"big": (80, 80), "small": (1, 0)}
        for i in (0, 29, 30, 79):  # old and new rows are all reachable through the graph
            assert index.search(vectors[i], user_id="big", k=1)[0][0] == f"v{i}"
        assert [h for h, _ in index.search(vectors[0], user_id="small", k=5)] == ["s0"]
        assert index.search(vectors[0], user_id="nobody", k=5) == []
        index.delete_user("big")  # a returning user starts small again
        index.add(["v0"], vectors[:1], meta[:1])
        assert _graph_rows(postgres_dsn, pg_schema)["big"] == (1, 0)
        assert index.search(vectors[0], user_id="big", k=3)[0][0] == "v0"
    with pytest.raises(ConfigurationError):
        PgVectorIndex(postgres_dsn, dimension=16, schema=pg_schema, exact_below=-1)


def test_a_version_2_vector_table_keeps_only_large_users_in_the_graph(
    postgres_dsn: str, pg_schema: str
) -> None:
    import psycopg

    rng = np.random.default_rng(4)
    with PgVectorIndex(postgres_dsn, dimension=4, schema=pg_schema) as index:
        pass  # creates the latest shape; put it back to version 2's below
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{pg_schema}", public')
        conn.execute(
            "DELETE FROM schema_version WHERE component = 'pgvector:vectors' AND version >= 3"
        )
        conn.execute("DROP INDEX vectors_graph_hnsw")  # the covering ones go with the column
        conn.execute("ALTER TABLE vectors DROP COLUMN graph")
        conn.execute(
            "CREATE INDEX vectors_hnsw ON vectors USING hnsw (embedding vector_cosine_ops)"
        )
        from memories_core.backends.pgvector_index import EXACT_BELOW

        many = EXACT_BELOW + 1
        rows = [("few", f"f{i}") for i in range(3)] + [("many", f"m{i}") for i in range(many)]
        values = rng.random((len(rows), 4)).tolist()
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO vectors (id, user_id, metadata, embedding) VALUES (%s, %s, %s, %s)",
                [
                    (vid, user, json.dumps({"user_id": user, "kind": "turn"}), str(vector))
                    for (user, vid), vector in zip(rows, values, strict=True)
                ],
            )
    with PgVectorIndex(postgres_dsn, dimension=4, schema=pg_schema) as index:
        assert _graph_rows(postgres_dsn, pg_schema) == {"few": (3, 0), "many": (many, many)}
        assert len(index.search(np.ones(4, dtype=np.float32), user_id="few", k=5)) == 3
        assert len(index.search(np.ones(4, dtype=np.float32), user_id="many", k=5)) == 5
    indexes = _index_names(postgres_dsn, pg_schema)
    assert "vectors_graph_hnsw" in indexes and "vectors_hnsw" not in indexes
    assert {"vectors_exact", "vectors_exact_rest"} <= indexes  # and version 4's


def _plan(dsn: str, schema: str, sql: str, args: list[Any]) -> str:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}", public')
        conn.execute("VACUUM ANALYZE vectors")  # index-only scans need the visibility map
        # A table this small is cheaper to scan whole, and autovacuum may or may not have
        # analysed it yet: ask whether the index can serve the query, not whether it wins.
        conn.execute("SET enable_seqscan = off")
        conn.execute("SET enable_bitmapscan = off")
        return "\n".join(r[0] for r in conn.execute("EXPLAIN " + sql, args).fetchall())


def test_pgvector_small_users_are_read_from_the_covering_index_and_long_keys_are_not_lost(
    postgres_dsn: str, pg_schema: str
) -> None:
    from memories_core.backends.pgvector_index import _fits_clause, _key_budget, _literal

    rng = np.random.default_rng(5)
    vectors = _units(rng, 60, 384)
    # Rows 0-49 fit a B-tree row beside their vector; 50-59 have session ids that do not.
    metas: list[dict[str, Any]] = [
        {"user_id": "u", "kind": "turn", "session_id": "s" if i < 50 else "x" * (1200 + i)}
        for i in range(60)
    ]
    ids = [f"v{i}" for i in range(60)]
    with PgVectorIndex(postgres_dsn, dimension=384, schema=pg_schema) as index:
        index.add(ids, vectors, metas)
        index.add(["other"], vectors[:1], [{"user_id": "someone-else", "kind": "turn"}])
        for query in list(vectors[[0, 55]]) + list(rng.normal(size=(3, 384)).astype(np.float32)):
            query = query / np.linalg.norm(query)
            want = _exact_top(vectors, query, 12)
            got = index.search(query, user_id="u", k=12)
            assert [h for h, _ in got] == want
            assert np.allclose([s for _, s in got], np.sort(vectors @ query)[::-1][:12], atol=1e-5)
            turns = index.search(query, user_id="u", k=60, where={"kind": "turn"})
            assert len(turns) == 60 and "other" not in {h for h, _ in turns}
        fits = _fits_clause(_key_budget(384), "v.")
        plan = _plan(
            postgres_dsn,
            pg_schema,
            "SELECT v.id FROM vectors AS v WHERE v.user_id = %s AND NOT v.graph AND "
            f"{fits} ORDER BY v.embedding <=> %s::vector LIMIT 5",
            ["u", _literal(vectors[0])],
        )
    assert "Index Only Scan using vectors_exact " in plan
    import psycopg

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:  # a DBA trades speed for disk
        conn.execute(f'DROP INDEX "{pg_schema}".vectors_exact, "{pg_schema}".vectors_exact_rest')
    with PgVectorIndex(postgres_dsn, dimension=384, schema=pg_schema) as index:
        query = vectors[55] / np.linalg.norm(vectors[55])
        want = _exact_top(vectors, query, 60)
        assert [h for h, _ in index.search(query, user_id="u", k=60)] == want


def test_pgvector_vectors_too_long_for_a_btree_row_are_searched_without_covering_index(
    postgres_dsn: str, pg_schema: str
) -> None:

    rng = np.random.default_rng(6)
    vectors = rng.normal(size=(20, 768)).astype(np.float32)
    with PgVectorIndex(postgres_dsn, dimension=768, schema=pg_schema) as index:
        index.add([f"v{i}" for i in range(20)], vectors, [{"user_id": "u", "kind": "turn"}] * 20)
        query = vectors[7] / np.linalg.norm(vectors[7])
        assert index.search(query, user_id="u", k=3)[0][0] == "v7"
        assert len(index.search(query, user_id="u", k=50)) == 20
    names = _index_names(postgres_dsn, pg_schema)
    assert "vectors_exact" not in names and "vectors_user" in names
