"""Memory engine: before and after, same machine, same run.

Runs every measurement in a fresh subprocess per checkout, with
``PYTHONPATH=<copy>/shared:<copy>``, where ``<copy>`` is the checkout's committed ``shared/``
at ``--before-rev`` / ``--after-rev`` (default ``HEAD``), exported with ``git archive`` when
the run starts (the checkouts may move meanwhile). So the code before the engine and the code
after it are measured side by side in one invocation, interleaved (before, after, before, after...)
so that the load of the shared machine hits both alike. Only the public API of each version
is used: ``HistoryMemory`` / ``ConditionalMemory`` ``save`` and ``recall``, and in the engine
version ``MemoryEngine.update_state``.

Measurements:

* **LoCoMo dev evidence recall**: per conversation, ``HistoryMemory(path=None)`` with the
  real bundled all-MiniLM-L6-v2 embedder (offline); every session is saved with its own
  ``session_id`` (turn metadata ``dia_id``); every question with evidence is asked through
  ``recall(question, scope, k=10)``; R@5 and R@10 of the evidence ``dia_id`` s (as in
  ``benchmarks/locomo_retrieval.py``), plus how many questions get the same top 10.
* **Save and recall latency at N records** (default 10k and 100k): one user,
  ``HistoryMemory(path=tmpdir)`` (SQLite file + embedded Chroma, the library default), fed in
  saves of 100 turns (one session each). Then 2-turn saves (a chat exchange) and ``recall(k=5)``
  are timed. These rows use ``HashingEmbedder``: its cost is identical in both versions, so
  the comparison isolates the storage, index and engine code (and 100k real embeddings would
  not fit the time budget of a shared 2-core machine).
* **State update** (engine version only, the old code had no record state): 10k records'
  ``strength``/``recall_count``/``attrs`` in one ``MemoryEngine.update_state`` call, timed,
  with the embedder's call counter before and after (it must not move).
* **Reopen (cold start)**: a fresh process imports the library, constructs
  ``HistoryMemory(path=...)`` on the store built above and answers the first recall (the OS
  file cache is warm: this is a process cold start, not a disk cold start). Repeated.
* **Two users, one slow LLM**: one ``ConditionalMemory`` shared by users A and B, its
  ``ScriptedLLM`` sleeping 2 s per call. B's save (an assistant turn, which asks the LLM
  nothing in either version) and B's recall are timed while A is idle, then while A keeps
  saving user turns (each one a 2 s decision call and a 2 s record call).

Text generation comes from ``benchmarks/latency.py`` (imported in the workers).

    python benchmarks/engine_compare.py --before ../wt/before --after .            # full
    python benchmarks/engine_compare.py --before ../wt/before --after . --quick    # trial
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

# First-stage figures (HistoryMemory reranks by default where the rerank extra is).
os.environ.setdefault("LLM_MEMORIES_LATE_INTERACTION", "off")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine_info import datasets_dir, folder_bytes, save_figure  # noqa: E402

DEFAULT_DATA = datasets_dir()
DEFAULT_OUT = HERE / "out" / "engine_compare"
VERSIONS = ("before", "after")
USER = "target-user"
SEED = 7
BASE_TIME = datetime(2024, 1, 1, tzinfo=timezone.utc)
EMBEDDER_NOTE = (
    "Latency, reopen and two-user rows use HashingEmbedder (no model; identical cost in both "
    "versions), so they compare the storage, index and engine code. LoCoMo recall uses the real "
    "bundled all-MiniLM-L6-v2."
)

# --------------------------------------------------------------------------- helpers


def stats_ms(samples: Sequence[float]) -> dict[str, float]:
    """p50/p95/mean/max of durations given in seconds, in milliseconds."""
    if not samples:
        return {"n": 0}
    ms = sorted(s * 1000 for s in samples)

    def pct(q: float) -> float:
        pos = (len(ms) - 1) * q
        low = int(pos)
        high = min(low + 1, len(ms) - 1)
        return ms[low] + (ms[high] - ms[low]) * (pos - low)

    return {
        "n": len(ms),
        "p50_ms": pct(0.5),
        "p95_ms": pct(0.95),
        "mean_ms": statistics.fmean(ms),
        "max_ms": ms[-1],
    }


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def dir_mib(path: Path) -> float:
    return round(folder_bytes(path) / 2**20, 1)


def library_origin() -> str:
    from machine_info import portable_path

    import memories_core

    return portable_path(Path(memories_core.__file__).resolve().parent)


# --------------------------------------------------------------------------- workers
# Each runs in a subprocess whose PYTHONPATH points at one checkout.


def worker_locomo(p: dict[str, Any]) -> dict[str, Any]:
    """R@5/R@10 of LoCoMo evidence through HistoryMemory.recall, real MiniLM embedder."""
    import latency  # benchmarks/latency.py: loads and warms the real embedder

    from memories_core import HistoryMemory, Scope, Turn
    from memories_core.evaluation import load_locomo, recall_at_k

    embedder = latency.real_embedder(p["torch_threads"])
    conversations = load_locomo(p["data"])[: p["conversations"]]
    memory = HistoryMemory(embedder=embedder, k=10)
    save_s = 0.0
    saved = 0
    for conv in conversations:
        by_session: dict[int, list[Any]] = {}
        for turn in conv.turns:
            if turn.text.strip():
                by_session.setdefault(turn.session, []).append(turn)
        for number, turns in sorted(by_session.items()):
            start_at = conv.session_datetime(number)
            base = start_at.replace(tzinfo=timezone.utc) if start_at else BASE_TIME
            batch = [
                Turn(
                    "user",
                    t.text,
                    speaker=t.speaker or None,
                    timestamp=base + timedelta(seconds=30 * i),
                    metadata={"dia_id": t.dia_id},
                )
                for i, t in enumerate(turns)
            ]
            t0 = time.perf_counter()
            memory.save(batch, Scope(conv.sample_id, session_id=f"session_{number}"))
            save_s += time.perf_counter() - t0
            saved += len(batch)
    r5: list[float] = []
    r10: list[float] = []
    took: list[float] = []
    rankings: list[list[str]] = []
    for conv in conversations:
        questions = [qa for qa in conv.qa if qa.evidence][: p["questions_per_conversation"]]
        for qa in questions:
            t0 = time.perf_counter()
            recalled = memory.recall(qa.question, Scope(conv.sample_id), k=10)
            took.append(time.perf_counter() - t0)
            ranked = [str(hit.record.metadata.get("dia_id")) for hit in recalled.records]
            rankings.append(ranked)
            r5.append(recall_at_k(ranked, qa.evidence, 5))
            r10.append(recall_at_k(ranked, qa.evidence, 10))
    memory.close()
    return {
        "conversations": len(conversations),
        "turns_saved": saved,
        "save_seconds": round(save_s, 2),
        "questions": len(r5),
        "R@5": statistics.fmean(r5),
        "R@10": statistics.fmean(r10),
        "recall_latency": stats_ms(took),
        "rankings": rankings,
        "embedder": embedder.name,
    }


def worker_scale(p: dict[str, Any]) -> dict[str, Any]:
    """Ingest N turns in saves of ``batch``, then time 2-turn saves and recalls."""
    import latency  # benchmarks/latency.py: synthetic turns and questions

    from memories_core import HistoryMemory, Scope, Turn
    from memories_core.embedders import HashingEmbedder

    n, batch = p["n"], p["batch"]
    pairs = latency.make_turns(n + 2 * p["saves"], SEED)
    path = Path(p["path"])
    memory = HistoryMemory(path=path, embedder=HashingEmbedder())
    batch_times: list[float] = []
    t_ingest = time.perf_counter()
    for b, start in enumerate(range(0, n, batch)):
        chunk = pairs[start : min(start + batch, n)]
        turns = [
            Turn(role, content, timestamp=BASE_TIME + timedelta(seconds=start + i))
            for i, (role, content) in enumerate(chunk)
        ]
        t0 = time.perf_counter()
        memory.save(turns, Scope(USER, session_id=f"s{b:05d}"))
        batch_times.append(time.perf_counter() - t0)
    ingest_s = time.perf_counter() - t_ingest
    chat: list[float] = []
    for j in range(p["saves"]):
        c1, c2 = pairs[n + 2 * j][1], pairs[n + 2 * j + 1][1]
        turns = [Turn("user", c1), Turn("assistant", c2)]
        t0 = time.perf_counter()
        memory.save(turns, Scope(USER, session_id="chat"))
        chat.append(time.perf_counter() - t0)
    queries = latency.make_queries(p["queries"] + 3, SEED)
    for q in queries[:3]:
        memory.recall(q, Scope(USER), k=5)
    recall: list[float] = []
    for q in queries[3:]:
        t0 = time.perf_counter()
        memory.recall(q, Scope(USER), k=5)
        recall.append(time.perf_counter() - t0)
    result: dict[str, Any] = {
        "n": n,
        "batch": batch,
        "ingest_seconds": round(ingest_s, 2),
        "ingest_turns_per_s": round(n / ingest_s, 1),
        "batch_save": stats_ms(batch_times),
        "chat_save": stats_ms(chat),
        "recall": stats_ms(recall),
    }
    engine = getattr(memory, "engine", None)
    if engine is not None and hasattr(engine, "update_state") and p["state_records"]:
        records = engine.records(USER, limit=p["state_records"])
        ids = [r.id for r in records]
        changes = {
            rid: {"strength": 0.5, "recall_count": 1, "attrs": {"bench": True}} for rid in ids
        }
        before_usage = memory.embedder.usage
        t0 = time.perf_counter()
        written = engine.update_state(USER, changes, reason="benchmark")
        took = time.perf_counter() - t0
        after_usage = memory.embedder.usage
        check = engine.get(USER, [ids[0], ids[-1]])
        result["state_update"] = {
            "records": len(ids),
            "seconds": round(took, 3),
            "records_per_s": round(len(ids) / took, 1),
            "history_entries": len(written),
            "embedder_calls": after_usage.calls - before_usage.calls,
            "embedder_texts": after_usage.items - before_usage.items,
            "applied": all(r.state.strength == 0.5 and r.state.recall_count == 1 for r in check),
        }
    result["failures"] = dict(memory.usage.failures)  # e.g. "index": records left pending
    memory.close()
    result["disk_mib"] = dir_mib(path)
    result["library"] = library_origin()
    return result


def worker_reopen(p: dict[str, Any]) -> dict[str, Any]:
    """Fresh process: import, construct HistoryMemory(path=...), first and second recall."""
    t0 = time.perf_counter()
    from memories_core import HistoryMemory, Scope
    from memories_core.embedders import HashingEmbedder

    t1 = time.perf_counter()
    memory = HistoryMemory(path=Path(p["path"]), embedder=HashingEmbedder())
    t2 = time.perf_counter()
    first = memory.recall("What did I say about my sister's trip to Lisbon?", Scope(USER), k=5)
    t3 = time.perf_counter()
    memory.recall("Which food do I like best?", Scope(USER), k=5)
    t4 = time.perf_counter()
    memory.close()
    return {
        "import_s": t1 - t0,
        "construct_s": t2 - t1,
        "first_recall_s": t3 - t2,
        "cold_start_s": t3 - t1,
        "second_recall_s": t4 - t3,
        "hits": len(first.records),
    }


def worker_two_users(p: dict[str, Any]) -> dict[str, Any]:
    """B's save/recall latency with A idle, then with A saving turns that call a 2 s LLM."""
    import re

    import latency

    from memories_core import ConditionalMemory, Scope, Turn
    from memories_core.embedders import HashingEmbedder
    from memories_core.llms import ScriptedLLM

    delay = {"s": 0.0}
    calls = {"n": 0}
    fence = re.compile(r"<user_input>\n(.*?)\n</user_input>", re.S)

    def answer(messages: Sequence[Any]) -> str:
        calls["n"] += 1
        time.sleep(delay["s"])
        last = messages[-1].content
        if "Answer with <Decision>" in last:
            return "<Decision>: yes"
        found = fence.search(last)
        said = found.group(1) if found else "something"
        return f"<Context>: NaN <Summary>: The user said: {said} <Note>: Remember that {said}"

    memory = ConditionalMemory(
        llm=ScriptedLLM(default=answer), embedder=HashingEmbedder(), path=Path(p["path"])
    )
    user_texts = [c for r, c in latency.make_turns(2000, SEED) if r == "user"]
    other_texts = [c for r, c in latency.make_turns(500, SEED + 1) if r == "assistant"]
    queries = latency.make_queries(2 * p["iterations"] + 2, SEED)
    a, b = Scope("user-a"), Scope("user-b")
    for text in user_texts[: p["setup_turns"]]:  # instant LLM: B and A get records
        memory.save([Turn("user", text)], b)
    for text in user_texts[p["setup_turns"] : p["setup_turns"] + 5]:
        memory.save([Turn("user", text)], a)
    memory.recall(queries[-1], b)
    memory.recall(queries[-2], b)

    def run_b(offset: int) -> dict[str, Any]:
        saves: list[float] = []
        recalls: list[float] = []
        for i in range(p["iterations"]):
            t0 = time.perf_counter()
            memory.save([Turn("assistant", other_texts[offset + i])], b)
            saves.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            memory.recall(queries[offset + i], b)
            recalls.append(time.perf_counter() - t0)
            time.sleep(p["pause"])
        return {"save": stats_ms(saves), "recall": stats_ms(recalls)}

    idle = run_b(0)
    delay["s"] = p["llm_seconds"]
    stop = threading.Event()
    a_saves = {"n": 0}
    a_texts = iter(user_texts[p["setup_turns"] + 5 :])

    def run_a() -> None:
        while not stop.is_set():
            memory.save([Turn("user", next(a_texts))], a)
            a_saves["n"] += 1
            time.sleep(0.1)  # A's next message; also lets a waiting thread take the lock

    calls_before = calls["n"]
    thread = threading.Thread(target=run_a, daemon=True)
    t_phase = time.perf_counter()
    thread.start()
    time.sleep(0.5)  # A is inside its first 2 s LLM call
    loaded = run_b(p["iterations"])
    stop.set()
    phase_s = time.perf_counter() - t_phase
    thread.join(timeout=4 * p["llm_seconds"] + 30)
    result = {
        "idle": idle,
        "loaded": loaded,
        "llm_seconds": p["llm_seconds"],
        "loaded_phase_seconds": round(phase_s, 1),
        "a_saves_during_phase": a_saves["n"],
        "llm_calls_during_phase": calls["n"] - calls_before,
        "b_records": len(memory.records(b)) if hasattr(memory, "records") else None,
    }
    memory.close()
    return result


WORKERS = {
    "locomo": worker_locomo,
    "scale": worker_scale,
    "reopen": worker_reopen,
    "two_users": worker_two_users,
}


def run_worker(kind: str, params_file: str, result_file: str) -> None:
    params = json.loads(Path(params_file).read_text())
    result = WORKERS[kind](params)
    Path(result_file).write_text(json.dumps(result))


# --------------------------------------------------------------------------- orchestration


class Runner:
    """Starts one worker subprocess per (measurement, checkout) and collects the JSON."""

    def __init__(self, repos: dict[str, Path], scratch: Path, log: Path) -> None:
        self.repos = repos
        self.scratch = scratch
        self.log = log
        self.count = 0

    def __call__(
        self, kind: str, version: str, params: dict[str, Any], timeout: float
    ) -> dict[str, Any]:
        self.count += 1
        repo = self.repos[version]
        pfile = self.scratch / f"p{self.count}.json"
        rfile = self.scratch / f"r{self.count}.json"
        pfile.write_text(json.dumps(params))
        env = dict(os.environ)
        env["PYTHONPATH"] = f"{repo / 'shared'}:{repo}"
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        env.setdefault("HF_HUB_OFFLINE", "1")
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind]
        cmd += ["--params", str(pfile), "--result", str(rfile)]
        load = load_avg()
        t0 = time.perf_counter()
        label = f"{kind} {version} {params.get('n', '')}".strip()
        print(f"  running {label} (load {load[0]}) ...", flush=True)
        with self.log.open("a") as log:
            log.write(f"\n===== {label}: {' '.join(cmd)}\n")
            log.flush()
            try:
                proc = subprocess.run(
                    cmd, env=env, stdout=log, stderr=log, timeout=timeout, check=False
                )
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = -999
        wall = time.perf_counter() - t0
        if code != 0 or not rfile.exists():
            print(f"  FAILED {label}: exit {code}; see {self.log}", flush=True)
            return {"error": f"exit {code}", "wall_s": wall, "load_at_start": load}
        result: dict[str, Any] = json.loads(rfile.read_text())
        result["wall_s"] = round(wall, 1)
        result["load_at_start"] = load
        print(f"  done {label} in {wall:.0f} s", flush=True)
        return result


def snapshot(repo: Path, rev: str, dest: Path) -> str:
    """Export ``rev``'s ``shared/`` of ``repo`` to ``dest``; returns the commit measured.

    The checkouts may move while the benchmark runs (other workers commit to main), so every
    measurement runs on this frozen copy of the committed code, never on the live tree.
    """
    head = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", rev],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", head, "shared"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return head


def git_state(repo: Path) -> str:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True
        ).stdout.strip()

    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--", "shared")
    return head + (" (uncommitted changes in shared/)" if dirty else "")


def nice_command_line() -> str:
    """``machine_info.nice_command_line`` of this script."""
    from machine_info import nice_command_line as of

    return of("benchmarks/engine_compare.py", sys.argv[1:])


def orchestrate(args: argparse.Namespace) -> dict[str, Any]:
    from machine_info import machine, portable_path

    repos = {"before": Path(args.before).resolve(), "after": Path(args.after).resolve()}
    for version, repo in repos.items():
        if not (repo / "shared" / "memories_core").is_dir():
            raise SystemExit(f"--{version} {repo} holds no shared/memories_core")
    out = Path(args.out)
    if args.quick and out == DEFAULT_OUT:
        out = DEFAULT_OUT.with_name("engine_compare_quick")
    out.parent.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    quick = args.quick
    if quick:
        sizes = [1000]
    queries = args.queries or (20 if quick else 200)
    saves = 10 if quick else 50
    scratch = Path(tempfile.mkdtemp(prefix="engine_compare_", dir=args.workdir))
    revs = {"before": args.before_rev, "after": args.after_rev}
    checkouts: dict[str, Any] = {}
    frozen: dict[str, Path] = {}
    for version, repo in repos.items():
        frozen[version] = scratch / f"code-{version}"
        commit = snapshot(repo, revs[version], frozen[version])
        checkouts[version] = {
            "path": portable_path(repo),
            "rev": revs[version],
            "commit": commit,
            "subject": subprocess.run(
                ["git", "-C", str(repo), "log", "-1", "--format=%s", commit],
                capture_output=True,
                text=True,
            ).stdout.strip(),
            "live_tree_at_start": git_state(repo),
        }
    runner = Runner(frozen, scratch, out.with_suffix(".log"))
    out.with_suffix(".log").write_text("")
    started = datetime.now(timezone.utc)
    t_start = time.perf_counter()
    report: dict[str, Any] = {
        "command": nice_command_line(),
        "started": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "load_avg_start": load_avg(),
        "checkouts": checkouts,
        "embedder_note": EMBEDDER_NOTE,
        "quick": quick,
        "params": {
            "sizes": sizes,
            "batch": args.batch,
            "recall_queries": queries,
            "chat_saves": saves,
            "state_records": args.state_records,
            "reopen_repeats": args.reopen_repeats,
            "llm_seconds": args.llm_seconds,
            "two_user_iterations": 6 if quick else args.iterations,
            "torch_threads": args.torch_threads,
        },
        "results": {},
    }
    results = report["results"]
    try:
        if not args.skip_locomo:
            print("LoCoMo dev evidence recall (MiniLM):", flush=True)
            data = locomo_file(Path(args.data))
            params = {
                "data": str(data),
                "conversations": 1 if quick else 1000,
                "questions_per_conversation": 40 if quick else 100_000,
                "torch_threads": args.torch_threads,
            }
            results["locomo"] = {v: runner("locomo", v, params, 1800) for v in VERSIONS}
            summarise_locomo(results["locomo"])
        results["scale"] = {}
        results["reopen"] = {}
        for n in sizes:
            print(f"{n} records (HashingEmbedder):", flush=True)
            row: dict[str, Any] = {}
            for v in VERSIONS:
                store = scratch / f"{v}-{n}"
                params = {
                    "n": n,
                    "batch": args.batch,
                    "path": str(store),
                    "queries": queries,
                    "saves": saves,
                    "state_records": min(args.state_records, n),
                }
                row[v] = runner("scale", v, params, 3600)
            results["scale"][str(n)] = row
            reopen: dict[str, Any] = {v: [] for v in VERSIONS}
            for _ in range(args.reopen_repeats):
                for v in VERSIONS:
                    reopen[v].append(
                        runner("reopen", v, {"path": str(scratch / f"{v}-{n}"), "n": n}, 900)
                    )
            results["reopen"][str(n)] = {v: summarise_reopen(runs) for v, runs in reopen.items()}
            for v in VERSIONS:
                shutil.rmtree(scratch / f"{v}-{n}", ignore_errors=True)
        if not args.skip_two_users:
            print(f"Two users, one LLM sleeping {args.llm_seconds} s per call:", flush=True)
            iterations = 6 if quick else args.iterations
            results["two_users"] = {
                v: runner(
                    "two_users",
                    v,
                    {
                        "path": str(scratch / f"{v}-two-users"),
                        "iterations": iterations,
                        "setup_turns": 10 if quick else 40,
                        "pause": 0.2,
                        "llm_seconds": args.llm_seconds,
                    },
                    600 + iterations * 20 * args.llm_seconds,
                )
                for v in VERSIONS
            }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report["load_avg_end"] = load_avg()
    report["duration_s"] = round(time.perf_counter() - t_start, 1)
    return report


def locomo_file(datasets: Path) -> Path:
    """``<datasets>/locomo/locomo_dev.json``."""
    return datasets / "locomo" / "locomo_dev.json"


def summarise_locomo(locomo: dict[str, Any]) -> None:
    before = locomo["before"].get("rankings")
    after = locomo["after"].get("rankings")
    if before and after and len(before) == len(after):
        same = sum(1 for x, y in zip(before, after, strict=True) if x == y)
        locomo["same_top10"] = same
        locomo["same_top10_fraction"] = same / len(before)
        locomo["same_top5_fraction"] = statistics.fmean(
            1.0 if x[:5] == y[:5] else 0.0 for x, y in zip(before, after, strict=True)
        )
    for version in VERSIONS:
        locomo[version].pop("rankings", None)


def summarise_reopen(runs: list[dict[str, Any]]) -> dict[str, Any]:
    good = [r for r in runs if "error" not in r]
    if not good:
        return {"error": runs[0].get("error") if runs else "not run", "runs": runs}
    keys = ("import_s", "construct_s", "first_recall_s", "cold_start_s", "second_recall_s")
    return {
        **{key: statistics.median(r[key] for r in good) for key in keys},
        "runs": len(good),
        "cold_start_all_s": [round(r["cold_start_s"], 3) for r in good],
        "load_at_start": [r["load_at_start"][0] for r in good],
    }


# --------------------------------------------------------------------------- reporting


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def change(before: float | None, after: float | None) -> str:
    if before is None or after is None or before == 0:
        return "n/a"
    ratio = after / before
    pct = (ratio - 1) * 100
    return f"{pct:+.0f}%"


def get(result: dict[str, Any], *path: str) -> Any:
    value: Any = result
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value


def table_rows(report: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(metric, before, after, change) rows of the summary table."""
    res = report["results"]
    rows: list[tuple[str, str, str, str]] = []
    loco = res.get("locomo")
    if loco:
        for key in ("R@5", "R@10"):
            b, a = get(loco, "before", key), get(loco, "after", key)
            rows.append(
                (
                    f"LoCoMo dev evidence {key} ({fmt(get(loco, 'after', 'questions'))} questions)",
                    fmt(b, 3),
                    fmt(a, 3),
                    f"{a - b:+.3f}" if a is not None and b is not None else "n/a",
                )
            )
        b, a = (
            get(loco, "before", "recall_latency", "p50_ms"),
            get(loco, "after", "recall_latency", "p50_ms"),
        )
        rows.append(("LoCoMo recall p50, ms (MiniLM query)", fmt(b), fmt(a), change(b, a)))
        if "same_top10_fraction" in loco:
            rows.append(
                (
                    "LoCoMo questions with identical top 10 / top 5",
                    "",
                    f"{loco['same_top10_fraction']:.1%} / {loco['same_top5_fraction']:.1%}",
                    "",
                )
            )
    for n, row in res.get("scale", {}).items():
        label = f"{int(n) // 1000}k"
        metrics = [
            (f"{label}: recall p50, ms", ("recall", "p50_ms")),
            (f"{label}: recall p95, ms", ("recall", "p95_ms")),
            (f"{label}: save of 2 turns p50, ms", ("chat_save", "p50_ms")),
            (f"{label}: save of 2 turns p95, ms", ("chat_save", "p95_ms")),
            (f"{label}: save of 100 turns p50, ms", ("batch_save", "p50_ms")),
            (f"{label}: ingest, turns/s", ("ingest_turns_per_s",)),
        ]
        for name, path in metrics:
            b, a = get(row, "before", *path), get(row, "after", *path)
            rows.append((name, fmt(b), fmt(a), change(b, a)))
        b, a = get(row, "before", "disk_mib"), get(row, "after", "disk_mib")
        rows.append((f"{label}: store on disk, MiB", fmt(b), fmt(a), change(b, a)))
        reopen = res.get("reopen", {}).get(n, {})
        b, a = get(reopen, "before", "cold_start_s"), get(reopen, "after", "cold_start_s")
        b = b * 1000 if b is not None else None
        a = a * 1000 if a is not None else None
        rows.append(
            (f"{label}: reopen, construct + first recall, ms", fmt(b), fmt(a), change(b, a))
        )
        b, a = get(reopen, "before", "import_s"), get(reopen, "after", "import_s")
        b = b * 1000 if b is not None else None
        a = a * 1000 if a is not None else None
        rows.append((f"{label}: reopen, import of the library, ms", fmt(b), fmt(a), change(b, a)))
        state = get(row, "after", "state_update")
        if state:
            rows.append(
                (
                    f"{label}: update_state of {fmt(state['records'])} records, ms "
                    "(embedder calls)",
                    "no state",
                    f"{state['seconds'] * 1000:,.0f} ({state['embedder_calls']})",
                    "",
                )
            )
    two = res.get("two_users")
    if two:
        for phase, title in (("idle", "A idle"), ("loaded", "A saving, LLM 2 s/call")):
            for op in ("save", "recall"):
                for q in ("p50_ms", "p95_ms"):
                    b, a = get(two, "before", phase, op, q), get(two, "after", phase, op, q)
                    rows.append(
                        (f"user B {op} {q[:3]}, ms ({title})", fmt(b), fmt(a), change(b, a))
                    )
    return rows


def markdown(report: dict[str, Any], png_name: str) -> str:
    m = report["machine"]
    co = report["checkouts"]
    lines = [
        f"Command: `{report['command']}`",
        "",
        f"Machine: {m['nproc']} cores ({m['cpu']}), {m['ram']} RAM, Python {m['python']}, "
        f"{m['os']}. Load average (1/5/15 min) at start {report['load_avg_start']}, at end "
        f"{report['load_avg_end']} (other jobs were using the CPU; each measurement's load is "
        "in the JSON). "
        f"Run {report['started']}, {report['duration_s'] / 60:.1f} min.",
        "",
        f"Before: `{co['before']['path']}` at {co['before']['commit']} "
        f"({co['before']['subject'][:70]}). "
        f"After: `{co['after']['path']}` at {co['after']['commit']} "
        f"({co['after']['subject'][:70]}). Each version's committed `shared/` was exported "
        "(`git archive`) at the start and measured from that frozen copy.",
        "",
        report["embedder_note"],
        "",
        "| metric | before | after | change |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in table_rows(report)]
    two = report["results"].get("two_users")
    if two:
        lines += [
            "",
            "Two users: "
            + "; ".join(
                f"{v}: A completed {get(two, v, 'a_saves_during_phase')} saves "
                f"({get(two, v, 'llm_calls_during_phase')} LLM calls) while B did "
                f"{get(two, v, 'loaded', 'save', 'n')} saves and recalls "
                f"in {get(two, v, 'loaded_phase_seconds')} s"
                for v in VERSIONS
            )
            + ".",
        ]
    lines += ["", f"![Memory engine: before and after]({png_name})", ""]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    res = report["results"]
    panels: list[tuple[str, list[str], list[float | None], list[float | None]]] = []
    loco = res.get("locomo")
    if loco:
        panels.append(
            (
                "LoCoMo dev evidence recall",
                ["R@5", "R@10"],
                [get(loco, "before", k) for k in ("R@5", "R@10")],
                [get(loco, "after", k) for k in ("R@5", "R@10")],
            )
        )
    scale = res.get("scale", {})
    sizes = list(scale)
    labels = [f"{int(n) // 1000}k" for n in sizes]
    if sizes:
        for title, key in (
            ("recall p50, ms", ("recall", "p50_ms")),
            ("save of 2 turns p50, ms", ("chat_save", "p50_ms")),
            ("ingest, turns/s", ("ingest_turns_per_s",)),
        ):
            panels.append(
                (
                    title,
                    labels,
                    [get(scale[n], "before", *key) for n in sizes],
                    [get(scale[n], "after", *key) for n in sizes],
                )
            )
        reopen = res.get("reopen", {})

        def cold(n: str, v: str) -> float | None:
            value = get(reopen, n, v, "cold_start_s")
            return value * 1000 if value is not None else None

        panels.append(
            (
                "reopen: construct + first recall, ms",
                labels,
                [cold(n, "before") for n in sizes],
                [cold(n, "after") for n in sizes],
            )
        )
    two = res.get("two_users")
    if two:
        cats = ["save, A idle", "save, A busy", "recall, A idle", "recall, A busy"]
        keys = [("idle", "save"), ("loaded", "save"), ("idle", "recall"), ("loaded", "recall")]
        panels.append(
            (
                "user B p50, ms (log)",
                cats,
                [get(two, "before", ph, op, "p50_ms") for ph, op in keys],
                [get(two, "after", ph, op, "p50_ms") for ph, op in keys],
            )
        )
    cols = 3
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.8 * rows), squeeze=False)
    for ax, (title, cats, before, after) in zip(axes.flat, panels, strict=False):
        xs = range(len(cats))
        width = 0.38
        bvals = [v if v is not None else 0.0 for v in before]
        avals = [v if v is not None else 0.0 for v in after]
        ax.bar([x - width / 2 for x in xs], bvals, width, label="before", color="#999999")
        ax.bar([x + width / 2 for x in xs], avals, width, label="after", color="#1f77b4")
        ax.set_xticks(list(xs))
        ax.set_xticklabels(cats, fontsize=8)
        ax.set_title(title, fontsize=10)
        if "log" in title:
            ax.set_yscale("log")
        for x, value in zip(xs, bvals, strict=True):
            ax.annotate(
                fmt(value, 2 if value < 10 else 0),
                (x - width / 2, value),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        for x, value in zip(xs, avals, strict=True):
            ax.annotate(
                fmt(value, 2 if value < 10 else 0),
                (x + width / 2, value),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    load = report["load_avg_start"][0]
    fig.suptitle(
        f"Memory engine: before vs after (same run; load avg {load} on "
        f"{report['machine']['nproc']} cores)",
        fontsize=11,
    )
    save_figure(fig, path, dpi=110)


def write_outputs(report: dict[str, Any], out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    png = out.with_suffix(".png")
    plot(report, png)
    out.with_suffix(".md").write_text(markdown(report, png.name))
    width = max(len(r[0]) for r in table_rows(report)) if table_rows(report) else 20
    print()
    print(f"{'metric':<{width}}  {'before':>12}  {'after':>14}  {'change':>7}")
    for name, before, after, delta in table_rows(report):
        print(f"{name:<{width}}  {before:>12}  {after:>14}  {delta:>7}")
    print(f"\nwrote {out.with_suffix('.json')}, .md, .png")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", help="checkout of the code before the engine")
    parser.add_argument("--after", help="checkout of the code with the engine")
    parser.add_argument("--before-rev", default="HEAD", help="commit of --before to measure")
    parser.add_argument("--after-rev", default="HEAD", help="commit of --after to measure")
    parser.add_argument("--sizes", default="10000,100000", help="records, comma separated")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output path without suffix")
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="the shared datasets folder")
    parser.add_argument("--quick", action="store_true", help="1k records, fewer queries")
    parser.add_argument("--queries", type=int, default=0, help="timed recalls per size")
    parser.add_argument("--batch", type=int, default=100, help="turns per save when ingesting")
    parser.add_argument("--state-records", type=int, default=10_000)
    parser.add_argument("--reopen-repeats", type=int, default=3)
    parser.add_argument("--llm-seconds", type=float, default=2.0)
    parser.add_argument("--iterations", type=int, default=20, help="B's saves/recalls a phase")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--workdir", default=None, help="scratch folder (default: tmp)")
    parser.add_argument("--skip-locomo", action="store_true")
    parser.add_argument("--skip-two-users", action="store_true")
    parser.add_argument("--report-only", action="store_true", help="redo md/png from the JSON")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.worker and not args.report_only and not (args.before and args.after):
        parser.error("--before and --after are required")
    return args


def main() -> None:
    args = parse_args()
    if args.worker:
        run_worker(args.worker, args.params, args.result)
        return
    out = Path(args.out)
    if args.quick and out == DEFAULT_OUT:
        out = DEFAULT_OUT.with_name("engine_compare_quick")
    if args.report_only:
        write_outputs(json.loads(out.with_suffix(".json").read_text()), out)
        return
    write_outputs(orchestrate(args), out)


if __name__ == "__main__":
    main()
