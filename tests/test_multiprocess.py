"""The embedded default under several processes, with real subprocesses.

* SQLite (WAL, ``BEGIN IMMEDIATE`` writes, a busy timeout) is shared safely: concurrent
  saves of one user from several processes lose and duplicate nothing, and each job's
  derivation is committed once (jobs are claimed with a lease).
* Embedded Chroma is not: a second process is refused at open with ``StoreInUseError``
  naming the server setup, and the refused engine leaves the SQLite file closed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from memories_core.backends import SQLiteRecordStore
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.errors import StoreInUseError
from memories_core.types import Scope, Turn

ROOT = Path(__file__).resolve().parents[1]

# A worker: an engine on the shared SQLite file with an in-process vector index, and one
# mechanism that derives a record from every turn (the job shape of the real mechanisms).
# Each started and finished derivation is appended to a log (O_APPEND lines are atomic).
WORKER = """
import json, os, sys
from memories_core.backends import NumpyIndex, SQLiteRecordStore
from memories_core.embedders import HashingEmbedder
from memories_core.engine import Derivation, MechanismHooks, MemoryEngine
from memories_core.types import JobSpec, MemoryRecord, Scope, Turn, new_id

db, log, name, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
engine = MemoryEngine(store=SQLiteRecordStore(db), index=NumpyIndex(),
                      embedder=HashingEmbedder(dimension=64), derive="inline")

def on_turns(records):
    return [JobSpec("derive", "note", f"turn:{r.id}", {"id": r.id, "text": r.text})
            for r in records]

def run_job(job):
    with open(log, "a") as f:
        f.write(json.dumps({"start": job.key, "pid": os.getpid()}) + "\\n")
    note = MemoryRecord(new_id(), job.user_id, "note", "note of " + job.payload["text"],
                        engine.clock.now(), source_ids=(job.payload["id"],))
    return Derivation(add=[note])

engine.attach(MechanismHooks(name="derive", on_turns=on_turns, run_job=run_job))
acked = []
for i in range(rounds):
    for user in ("shared", f"own-{name}"):
        records = engine.save([Turn("user", f"{name} says {i} to {user}")],
                              Scope(user, session_id=f"s-{name}"))
        acked += [r.id for r in records]
engine.close()
print(json.dumps(acked))
"""


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'shared'}:{ROOT}"},
    )


def finish(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out


def test_concurrent_saves_on_one_sqlite_file_lose_and_duplicate_nothing(tmp_path: Path) -> None:
    db, log = tmp_path / "records.sqlite3", tmp_path / "runs.log"
    workers, rounds = 4, 15
    # Every worker opens the fresh file at the same time: the schema setup races too.
    procs = [spawn(WORKER, str(db), str(log), f"w{n}", str(rounds)) for n in range(workers)]
    acked = [rid for proc in procs for rid in json.loads(finish(proc))]
    assert len(acked) == len(set(acked)) == workers * rounds * 2

    store = SQLiteRecordStore(db)
    try:
        assert store.check_integrity() == []
        users = ["shared", *(f"own-w{n}" for n in range(workers))]
        turns = [r for u in users for r in store.list(user_id=u, where={"kind": "turn"})]
        notes = [r for u in users for r in store.list(user_id=u, where={"kind": "note"})]
        # No acknowledged turn lost, none written twice.
        assert sorted(r.id for r in turns) == sorted(acked)
        assert len(store.list(user_id="shared", where={"kind": "turn"})) == workers * rounds
        # Every job ran to a commit exactly once: one note per turn, no job left.
        sources = [r.source_ids[0] for r in notes]
        assert sorted(sources) == sorted(acked)
        assert list(store.jobs()) == []
        starts = [json.loads(line)["start"] for line in log.read_text().splitlines()]
        assert sorted(starts) == sorted(f"turn:{rid}" for rid in acked)
        # One session per (user, worker) session id, shared-user turns in four sessions.
        sessions = {r.session_id for r in store.list(user_id="shared", where={"kind": "turn"})}
        assert len(sessions) == workers
    finally:
        store.close()


OPEN_DEFAULT = """
import sys
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.errors import StoreInUseError
try:
    engine = MemoryEngine(path=sys.argv[1], embedder=HashingEmbedder(dimension=64))
except StoreInUseError as exc:
    print("refused", exc.holder)
    print(str(exc))
else:
    print("opened", engine.records("alice", where={"kind": "turn"}).__len__())
    engine.close()
"""


def test_second_process_on_the_embedded_default_is_refused_naming_the_server_setup(
    tmp_path: Path,
) -> None:
    memory = tmp_path / "memory"
    engine = MemoryEngine(path=memory, embedder=HashingEmbedder(dimension=64))
    engine.save([Turn("user", "I keep bees")], Scope("alice"))
    first, message = finish(spawn(OPEN_DEFAULT, str(memory))).splitlines()[:2]
    assert first == f"refused {os.getpid()}"
    assert "PostgresRecordStore(dsn)" in message and "ChromaIndex(host=" in message
    assert "docs/deploy.md" in message
    # The refused process wrote nothing and this one carries on.
    engine.save([Turn("user", "and a goat")], Scope("alice"))
    assert len(engine.records("alice", where={"kind": "turn"})) == 2
    engine.close()
    # Once closed, the next process opens it (a killed holder frees it too: see below).
    assert finish(spawn(OPEN_DEFAULT, str(memory))).split() == ["opened", "2"]


HOLD_AND_DIE = """
import os, sys
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.types import Scope, Turn
engine = MemoryEngine(path=sys.argv[1], embedder=HashingEmbedder(dimension=64))
engine.save([Turn("user", "held")], Scope("alice"))
print("holding", flush=True)
sys.stdin.readline()
"""


def test_a_killed_holder_leaves_no_stale_lock(tmp_path: Path) -> None:
    memory = tmp_path / "memory"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(HOLD_AND_DIE), str(memory)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'shared'}:{ROOT}"},
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "holding"
        with pytest.raises(StoreInUseError, match="server setup"):
            MemoryEngine(path=memory, embedder=HashingEmbedder(dimension=64))
    finally:
        holder.kill()  # SIGKILL: no close(), no cleanup
        holder.wait(timeout=30)
    engine = MemoryEngine(path=memory, embedder=HashingEmbedder(dimension=64))
    try:
        assert [r.text for r in engine.records("alice", where={"kind": "turn"})] == ["user: held"]
        assert engine.search("held", "alice", k=1)
    finally:
        engine.close()


def test_indexes_on_one_folder_in_one_process_share_the_lock(tmp_path: Path) -> None:
    from memories_core.backends import ChromaIndex

    first = ChromaIndex(path=tmp_path / "chroma")
    second = ChromaIndex(path=tmp_path / "chroma")
    first.close()
    # The second instance still holds the folder for this process.
    out = finish(
        spawn(
            "import sys\nfrom memories_core.backends import ChromaIndex\n"
            "from memories_core.errors import StoreInUseError\n"
            "try:\n    ChromaIndex(path=sys.argv[1])\n"
            "except StoreInUseError:\n    print('refused')\n",
            str(tmp_path / "chroma"),
        )
    )
    assert out.strip() == "refused"
    second.close()


def _forked_child(path: str, opened: Any, release: Any, out: Any) -> None:
    from memories_core.backends import ChromaIndex

    try:
        ChromaIndex(path=path)
    except StoreInUseError:
        out.put("refused")
    else:
        out.put("opened")
    opened.set()
    release.wait(60)  # stay alive while the parent closes and another process opens


def test_a_forked_child_neither_shares_nor_keeps_the_parents_lock(tmp_path: Path) -> None:
    import multiprocessing

    from memories_core.backends import ChromaIndex

    ctx = multiprocessing.get_context("fork")
    folder = tmp_path / "chroma"
    index = ChromaIndex(path=folder)
    opened, release, out = ctx.Event(), ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_forked_child, args=(str(folder), opened, release, out))
    child.start()
    try:
        assert opened.wait(60)
        assert out.get(timeout=10) == "refused"
        index.close()
        # The child still runs and inherited the locked descriptor, yet the folder is free.
        assert child.is_alive()
        probe = (
            "import sys\nfrom memories_core.backends import ChromaIndex\n"
            "ChromaIndex(path=sys.argv[1]).close()\nprint('opened')\n"
        )
        assert finish(spawn(probe, str(folder))).strip() == "opened"
    finally:
        release.set()
        child.join(timeout=30)


def test_each_job_lease_starts_when_it_is_claimed_not_when_the_run_started(
    tmp_path: Path,
) -> None:
    # Found by benchmarks/fault_kill.py: a run of several jobs claimed them all with the time
    # the run started, so after a slow first job the next one was handed out with a lease
    # that had already ended, and a second worker ran it too.
    from datetime import datetime, timedelta, timezone

    from memories_core.backends import NumpyIndex
    from memories_core.clock import FixedClock
    from memories_core.engine import Derivation, JobPolicy, MechanismHooks
    from memories_core.types import Job, JobSpec

    clock = FixedClock(datetime(2026, 1, 1, tzinfo=timezone.utc))
    db = tmp_path / "records.sqlite3"
    policy = JobPolicy(lease=timedelta(seconds=5))
    engine = MemoryEngine(
        store=SQLiteRecordStore(db),
        index=NumpyIndex(),
        embedder=HashingEmbedder(dimension=64),
        clock=clock,
        jobs=policy,
    )
    other = SQLiteRecordStore(db)  # a second worker on the same file
    stolen: list[bool] = []

    def run_job(job: Job) -> Derivation:
        if job.key == "slow":
            clock.advance(timedelta(seconds=30))  # a model call longer than a lease
        else:
            stolen.append(other.claim_job(job.id, now=clock.now(), lease=policy.lease))
        return Derivation()

    engine.attach(MechanismHooks(name="m", run_job=run_job))
    engine.enqueue("alice", [JobSpec("m", "k", "slow"), JobSpec("m", "k", "next")])
    assert engine.run_pending("alice", force=True) == 0
    assert stolen == [False]  # "next" was leased from its own claim: nobody else got it
    other.close()
    engine.close()


# A read-modify-write whose read is outside the write's transaction (EMG's shape): each round
# reads a counter, waits a moment and writes counter + 1 in a transaction of its own. Only
# engine.user_lock keeps it whole when several processes share the SQLite file.
RMW_WORKER = """
import sys, time
from memories_core.backends import NumpyIndex, SQLiteRecordStore
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine

db, rounds = sys.argv[1], int(sys.argv[2])
engine = MemoryEngine(store=SQLiteRecordStore(db), index=NumpyIndex(),
                      embedder=HashingEmbedder(dimension=64), derive="inline")
for _ in range(rounds):
    with engine.user_lock("shared"):
        (record,) = engine.get("shared", ["m1"])
        time.sleep(0.005)
        engine.update_state("shared", {"m1": {"strength": record.state.strength + 1}})
engine.close()
"""


def test_user_lock_serializes_read_modify_write_across_processes_on_one_sqlite_file(
    tmp_path: Path,
) -> None:
    """Issue 15, Build 3: ``engine.user_lock`` takes the store's file lock of the user, so
    processes sharing one SQLite file lose no increment; the lock files name no user."""
    from datetime import datetime, timezone

    from memories_core.types import MemoryRecord

    db = tmp_path / "records.sqlite3"
    with SQLiteRecordStore(db) as store:
        store.add([MemoryRecord("m1", "shared", "note", "a counter", datetime.now(timezone.utc))])
    workers, rounds = 3, 25
    procs = [spawn(RMW_WORKER, str(db), str(rounds)) for _ in range(workers)]
    for proc in procs:
        finish(proc)
    with SQLiteRecordStore(db) as store:
        (record,) = store.get(["m1"], user_id="shared")
        history = store.history("shared", record_id="m1")
    assert record.state.strength == 1.0 + workers * rounds
    assert len(history) == workers * rounds
    locks = list((tmp_path / "records.sqlite3.user-locks").iterdir())
    assert len(locks) == 1 and locks[0].stat().st_size == 0 and "shared" not in locks[0].name


# A worker that claims its save's job and then either dies in it (SIGKILL, as a crash in a
# model call) or stays alive holding the claim. Store: a SQLite file, or PostgreSQL.
CLAIMER = """
import os, signal, sys, time
from memories_core.backends import NumpyIndex, SQLiteRecordStore
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MechanismHooks, MemoryEngine
from memories_core.types import JobSpec, Scope, Turn

mode, backend, where = sys.argv[1], sys.argv[2], sys.argv[3:]
if backend == "sqlite":
    parts = {"store": SQLiteRecordStore(where[0]), "index": NumpyIndex()}
else:
    from memories_core.backends import postgres_storage
    parts = postgres_storage(where[0], dimension=64, schema=where[1], pool_size=2)
engine = MemoryEngine(**parts, embedder=HashingEmbedder(dimension=64), derive="inline")

def run_job(job):
    print("claimed", flush=True)
    if mode == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(120)

engine.attach(MechanismHooks(
    name="derive",
    on_turns=lambda records: [JobSpec("derive", "note", f"turn:{r.id}", {}) for r in records],
    run_job=run_job,
))
engine.save([Turn("user", f"{mode}: hello")], Scope("alice"))
"""


def dead_owner_claims_are_taken_at_once(parts: dict[str, Any], *where: str) -> None:
    """A job claimed by a live worker stays its own (for the 5-minute lease); once that
    worker is dead (killed, reaped), a process on the same host runs it at once, and a
    worker killed mid-derivation has its job run at once too. Each job commits once."""
    from memories_core.engine import Derivation, MechanismHooks
    from memories_core.types import Job, MemoryRecord, new_id

    engine = MemoryEngine(**parts, embedder=HashingEmbedder(dimension=64), derive="inline")

    def run_job(job: Job) -> Derivation:
        note = MemoryRecord(new_id(), job.user_id, "note", f"note of {job.key}", engine.clock.now())
        return Derivation(add=[note])

    engine.attach(MechanismHooks(name="derive", run_job=run_job))
    try:
        holder = spawn(CLAIMER, "hold", *where)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "claimed"
        assert engine.run_pending("alice") == 1  # a live owner's claim is left alone
        holder.kill()
        holder.communicate(timeout=60)  # reaped: its pid is gone
        assert engine.run_pending("alice") == 0  # at once, not after the lease

        dying = spawn(CLAIMER, "die", *where)
        dying.communicate(timeout=120)
        assert dying.returncode == -9
        assert engine.run_pending("alice") == 0
        notes = engine.records("alice", where={"kind": "note"})
        assert len(notes) == 2 and len({n.text for n in notes}) == 2
    finally:
        engine.close()


def test_a_dead_workers_job_claim_is_taken_at_once_on_one_sqlite_file(tmp_path: Path) -> None:
    from memories_core.backends import NumpyIndex

    db = tmp_path / "records.sqlite3"
    parts = {"store": SQLiteRecordStore(db), "index": NumpyIndex()}
    dead_owner_claims_are_taken_at_once(parts, "sqlite", str(db))


def test_claim_owner_is_dead_only_when_this_host_can_tell() -> None:
    from memories_core.backends.claims import current_owner, owner_is_dead

    me = current_owner()
    assert me is not None  # Linux: /proc is there
    host, pid, start = me.rsplit("/", 2)
    assert pid == str(os.getpid()) and not owner_is_dead(me)
    assert owner_is_dead(f"{host}/{pid}/{int(start) + 1}")  # the pid, recycled later
    assert owner_is_dead(f"{host}/{2**22 + 17}/1")  # above Linux's pid_max: no such pid
    assert not owner_is_dead(f"another-host:boot:1/{pid}/{int(start) + 1}")  # not ours to judge
    assert not owner_is_dead(None) and not owner_is_dead("garbage")
