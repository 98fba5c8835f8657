"""Fault: SIGKILL a worker mid-save and mid-derivation; count what is lost or run twice.

A worker process saves 2-turn exchanges through ``MemoryEngine.save``
for a few users; an attached mechanism derives one note from every saved exchange in a job
(the job shape of the real mechanisms: written in the save's transaction, run after it,
committed with its result). Its handler sleeps ``--derive-ms`` (a model call) and reports on
stdout when it starts and when it returns; the worker reports every record id whose
``save`` returned (acknowledged). The parent kills the worker with SIGKILL:

* **mid-save**: after a random delay, wherever the worker is (writing, indexing, deriving);
* **mid-derivation**: right after a handler reported its start (before it returned).

then starts a fresh worker, ``--rounds`` times per mode. Jobs are claimed with a short lease
(``--lease-s``) so a killed worker's job is retried quickly. At the end a drain process runs
the pending jobs (after the lease) and the store is checked:

* **acknowledged records lost**: acknowledged ids missing from the store (must be 0);
* **jobs run twice**: jobs whose handler was started by two workers that were not killed, or
  whose note was committed twice (must be 0); a job started again after the worker running
  it was killed is the intended retry (its lease ended) and is counted separately;
* **derivations lost**: saved exchanges without their note after the drain (must be 0);
* store integrity (SQLite) and ``engine.verify()`` (record store vs vector index).

Backends as in ``scale_out.py``: ``embedded`` (SQLite + embedded Chroma; one worker at a
time, the killed worker's folder lock goes with it), ``sqlite-chroma`` and ``postgres``
(``--dsn``, or a pgserver started here); on those two a second worker runs beside the one
that gets killed, competing for the same users' jobs.

    python benchmarks/fault_kill.py --backend embedded --rounds 10
    python benchmarks/fault_kill.py --backend postgres --rounds 10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "shared"), str(HERE.parent), str(HERE)]

from machine_info import machine  # noqa: E402
from scale_out import Target, chroma_server, open_engine, postgres_dsn  # noqa: E402

OUT = HERE / "out"
USERS = ["alice", "bob", "carol"]


def child(target: Target, name: str, derive_ms: int, lease_s: float, saves: int) -> None:
    """A worker: save exchanges forever (or ``saves``), deriving a note per exchange."""
    from memories_core.embedders import HashingEmbedder
    from memories_core.engine import Derivation, JobPolicy, MechanismHooks
    from memories_core.types import JobSpec, MemoryRecord, Scope, Turn, new_id

    engine = open_engine(
        target,
        HashingEmbedder(dimension=64),
        jobs=JobPolicy(lease=timedelta(seconds=lease_s), base_backoff=timedelta(seconds=0.2)),
    )

    def say(kind: str, value: str) -> None:
        sys.stdout.write(f"{kind} {value}\n")
        sys.stdout.flush()

    def on_turns(records: Sequence[MemoryRecord]) -> list[JobSpec]:
        first = records[0]
        return [
            JobSpec(
                "derive",
                "note",
                f"x:{first.id}",
                {"ids": [r.id for r in records], "text": first.text},
            )
        ]

    def run_job(job: Any) -> Derivation:
        say("D", job.key)  # derivation started
        time.sleep(derive_ms / 1000)
        note = MemoryRecord(
            new_id(),
            job.user_id,
            "note",
            f"note on {job.payload['text']}",
            engine.clock.now(),
            source_ids=tuple(job.payload["ids"]),
        )
        return Derivation(add=[note])

    engine.attach(MechanismHooks(name="derive", on_turns=on_turns, run_job=run_job))
    say("O", name)  # opened
    n = 0
    while saves <= 0 or n < saves:
        user = USERS[n % len(USERS)]
        records = engine.save(
            [Turn("user", f"{name} message {n}"), Turn("assistant", f"reply {n}")],
            Scope(user, session_id=name),
        )
        for record in records:
            say("A", record.id)  # acknowledged: save() returned
        n += 1
    engine.close()


def _spawn(target: Target, name: str, args: argparse.Namespace, saves: int = 0) -> Any:
    code = (
        "import sys, json; sys.path[:0] = json.loads(sys.argv[1]);"
        "from fault_kill import child; from scale_out import Target;"
        "child(Target(**json.loads(sys.argv[2])), sys.argv[3], int(sys.argv[4]), "
        "float(sys.argv[5]), int(sys.argv[6]))"
    )
    paths = [str(HERE.parent / "shared"), str(HERE.parent), str(HERE)]
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            json.dumps(paths),
            json.dumps(target.__dict__),
            name,
            str(args.derive_ms),
            str(args.lease_s),
            str(saves),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "ANONYMIZED_TELEMETRY": "False"},
    )


class Events:
    """Lines reported by every worker, gathered from their stdout."""

    def __init__(self) -> None:
        self.acked: list[str] = []
        self.started: dict[str, list[str]] = {}  # job key -> workers that started it
        self.killed: set[str] = set()
        self.lock = threading.Lock()

    def read(self, proc: Any, name: str, on_line: Any = None) -> threading.Thread:
        def pump() -> None:
            for line in proc.stdout:
                kind, _, value = line.strip().partition(" ")
                with self.lock:
                    if kind == "A":
                        self.acked.append(value)
                    elif kind == "D":
                        self.started.setdefault(value, []).append(name)
                if on_line is not None:
                    on_line(kind, value)

        thread = threading.Thread(target=pump, daemon=True)
        thread.start()
        return thread


def kill_round(
    target: Target, events: Events, mode: str, n: int, args: argparse.Namespace, rng: random.Random
) -> dict[str, Any]:
    """One worker killed with SIGKILL, in ``mode``."""
    name = f"k{mode[:1]}{n}"
    proc = _spawn(target, name, args)
    opened = threading.Event()
    derivation = threading.Event()
    skip = rng.randint(0, 3)  # kill in a later derivation, not always the first
    seen = [0]

    def on_line(kind: str, _value: str) -> None:
        if kind == "O":
            opened.set()
        if kind == "D" and opened.is_set():
            seen[0] += 1
            if seen[0] > skip:
                derivation.set()

    pump = events.read(proc, name, on_line)
    if not opened.wait(timeout=120):
        proc.kill()
        raise RuntimeError(f"worker did not open: {proc.stderr.read()[-2000:]}")
    if mode == "mid-save":
        time.sleep(rng.uniform(0.2, 3.0))
    else:
        derivation.wait(timeout=120)
    os.kill(proc.pid, signal.SIGKILL)
    events.killed.add(name)
    proc.wait(timeout=60)
    pump.join(timeout=10)
    return {"mode": mode, "killed": proc.returncode == -signal.SIGKILL}


def drain_and_check(target: Target, events: Events, args: argparse.Namespace) -> dict[str, Any]:
    """Run what is pending, then compare the store with what the workers reported."""
    from memories_core.embedders import HashingEmbedder
    from memories_core.engine import Derivation, JobPolicy, MechanismHooks
    from memories_core.types import MemoryRecord, new_id

    time.sleep(args.lease_s + 0.5)  # every lease of a killed worker has ended
    engine = open_engine(
        target, HashingEmbedder(dimension=64), jobs=JobPolicy(lease=timedelta(seconds=60))
    )
    drained: Counter[str] = Counter()

    def run_job(job: Any) -> Derivation:
        drained[job.key] += 1
        events.started.setdefault(job.key, []).append("drain")
        note = MemoryRecord(
            new_id(),
            job.user_id,
            "note",
            f"note on {job.payload['text']}",
            engine.clock.now(),
            source_ids=tuple(job.payload["ids"]),
        )
        return Derivation(add=[note])

    engine.attach(MechanismHooks(name="derive", run_job=run_job))
    left = engine.run_pending(force=True)
    engine.index_pending()
    stored_turns: dict[str, Any] = {}
    notes: Counter[str] = Counter()
    for user in USERS:
        for record in engine.records(user):
            if record.kind == "turn":
                stored_turns[record.id] = record
            elif record.kind == "note":
                notes[record.source_ids[0]] += 1
    exchanges = {rid for rid, rec in stored_turns.items() if rec.metadata.get("role") == "user"}
    lost = sorted(set(events.acked) - set(stored_turns))
    # A job started by two workers of which at most one was killed before finishing it...
    twice_run = sorted(
        key
        for key, names in events.started.items()
        if len([n for n in names if n not in events.killed]) > 1
    )
    twice_committed = sorted(k for k, c in notes.items() if c > 1)
    # ...is a retry only if every earlier starter was killed (the lease handed it on).
    restarted = sorted(
        key for key, names in events.started.items() if len(names) > 1 and key not in twice_run
    )
    derivations_lost = sorted(rid for rid in exchanges if notes[rid] == 0)
    integrity: list[str] = []
    check = getattr(engine.store, "check_integrity", None)
    if callable(check):
        integrity = list(check())
    report = engine.verify()
    engine.close()
    return {
        "acknowledged_records": len(events.acked),
        "stored_turns": len(stored_turns),
        "acknowledged_lost": len(lost),
        "jobs_run_twice": len(twice_run),
        "notes_committed_twice": len(twice_committed),
        "jobs_restarted_after_kill": len(restarted),
        "jobs_run_by_drain": sum(drained.values()),
        "jobs_left": left,
        "derivations_lost": len(derivations_lost),
        "integrity_problems": integrity,
        "index_verify_ok": bool(report.ok),
        "detail": {
            "run_twice": {key: events.started[key] for key in twice_run},
            "committed_twice": twice_committed,
            "lost": lost,
            "verify": {
                "missing": list(report.missing),
                "orphans": list(report.orphans),
                "unreachable": list(report.unreachable),
                "failed": list(report.failed),
            },
        },
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--backend", choices=["embedded", "sqlite-chroma", "postgres"], default="embedded"
    )
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--rounds", type=int, default=10, help="kills per mode")
    parser.add_argument("--derive-ms", type=int, default=150)
    parser.add_argument("--lease-s", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--tag", default="")
    ns = parser.parse_args(argv)
    rng = random.Random(ns.seed)
    root = Path(tempfile.mkdtemp(prefix="fault-kill-"))
    result: dict[str, Any] = {
        "backend": ns.backend,
        "machine": machine(),
        "rounds": [],
        "command": " ".join(["python", "benchmarks/fault_kill.py", *(argv or sys.argv[1:])]),
        "args": {"rounds": ns.rounds, "derive_ms": ns.derive_ms, "lease_s": ns.lease_s},
    }
    events = Events()
    with contextlib.ExitStack() as stack:
        dsn = stack.enter_context(postgres_dsn(ns.dsn)) if ns.backend == "postgres" else ""
        port = stack.enter_context(chroma_server(root)) if ns.backend == "sqlite-chroma" else 0
        target = Target(
            ns.backend,
            str(root / "memory"),
            dsn=dsn,
            schema=f"fault_{os.getpid()}",
            chroma_port=port,
            dim=64,
        )
        survivor = None
        if ns.backend != "embedded":
            # A worker that is never killed, competing for the same users' jobs.
            survivor = _spawn(target, "survivor", ns)
            events.read(survivor, "survivor")
        t0 = time.perf_counter()
        for n in range(ns.rounds):
            for mode in ("mid-save", "mid-derivation"):
                row = kill_round(target, events, mode, n, ns, rng)
                result["rounds"].append(row)
                print(json.dumps(row), flush=True)
        if survivor is not None:
            # Stopping it may interrupt a derivation too: it counts as a kill.
            events.killed.add("survivor")
            survivor.send_signal(signal.SIGTERM)
            survivor.wait(timeout=60)
        result["kill_phase_s"] = round(time.perf_counter() - t0, 1)
        result["check"] = drain_and_check(target, events, ns)
        if ns.backend == "postgres":
            with contextlib.suppress(Exception):
                import psycopg

                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{target.schema}" CASCADE')
    check = result["check"]
    print(json.dumps({k: v for k, v in check.items() if k != "detail"}, indent=2))
    OUT.mkdir(exist_ok=True)
    name = f"fault_kill_{ns.backend}{ns.tag}"
    (OUT / f"{name}.json").write_text(json.dumps(result, indent=2))
    kills = sum(r["killed"] for r in result["rounds"])
    md = (
        f"Backend `{ns.backend}`: {kills} SIGKILLs ({ns.rounds} mid-save, {ns.rounds} "
        f"mid-derivation), derivation {ns.derive_ms} ms, lease {ns.lease_s} s; "
        f"{check['acknowledged_records']} acknowledged records; "
        f"**acknowledged records lost: {check['acknowledged_lost']}**, "
        f"**jobs run twice: {check['jobs_run_twice']}** (notes committed twice: "
        f"{check['notes_committed_twice']}), derivations lost: {check['derivations_lost']}, "
        f"jobs restarted after their worker was killed: {check['jobs_restarted_after_kill']}, "
        f"jobs left: {check['jobs_left']}, integrity problems: "
        f"{len(check['integrity_problems'])}, index verify ok: {check['index_verify_ok']}."
    )
    (OUT / f"{name}.md").write_text(md + "\n")
    print(md)
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    bad = (
        check["acknowledged_lost"]
        + check["jobs_run_twice"]
        + check["notes_committed_twice"]
        + check["derivations_lost"]
    )
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
