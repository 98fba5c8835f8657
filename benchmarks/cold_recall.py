"""The first recall after a reopen, over several reopens: files cached, files on disk, prefetched.

``late_persist.py`` times one first recall per run, and on a machine that pages idle files
out (this one does after about a minute) that one call mostly measures the disk. This
script opens a kept late-interaction store (``late_persist.py --keep-store DIR`` builds one
in ``DIR/late``) again and again in one process, with both models loaded beforehand, and
times each reopen's first recall and the ten recalls after it. Each trial runs four
conditions, in this order:

* ``disk``: every file of the store is dropped from the page cache first
  (``posix_fadvise(DONTNEED)``, Linux): what a process sees after a reboot or after the
  kernel reclaimed the idle store; SQLite then reads each pool's rows from the disk;
* ``disk + prefetch``: the same, then ``memory.prefetch(user)`` (what an app calls when a
  user signs in), timed apart, then the first recall;
* ``reopen``: the store is reopened at once, its files as the prefetch left them (cached):
  what a restarted process sees on a machine that keeps its files cached. The process's
  state is cold: a new engine, new SQLite connections, Chroma's collection not loaded,
  an empty reranker cache;
* ``new process``: a fresh interpreter (``--child``) loads both models, opens the store, its
  files still cached, and times its first recall and the ten after it: what a restarted
  server sees, with the first calls of every library in the process.

The warm reference is the p50 of the ten recalls after each ``reopen``. Every recall embeds
its query, and every query is asked once (no answer can come from a query cache).
``--pipeline first-stage`` times the same conditions for the first stage alone (dense +
BM25, context spreading, no reranker): how much of a cold first recall the store's files
cost before any token vector is read.

    python benchmarks/cold_recall.py --store /data/late10k --trials 7 --name cold_recall_10k
    python benchmarks/cold_recall.py --store /data/late10k --pipeline first-stage \
        --name cold_recall_10k_first_stage
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency import (
    add_output_options,
    command_line,
    make_queries,
    real_embedder,
    save_results,
)
from machine_info import machine, repo_state, save_figure

TARGET = "target-user"
CONDITIONS = ("disk", "disk + prefetch", "reopen", "new process")


def drop_cached(folder: Path) -> int:
    """Ask the kernel to drop ``folder``'s files from the page cache; returns the files asked.

    ``posix_fadvise(POSIX_FADV_DONTNEED)`` drops clean pages only, which is all of a closed
    store's after a checkpoint. Raises ``OSError`` where the call does not exist.
    """
    if not hasattr(os, "posix_fadvise"):
        raise OSError("posix_fadvise is not available on this platform")
    files = 0
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            handle = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(handle)
            files += 1
    return files


def timed_ms(call: Callable[[], object]) -> float:
    """Milliseconds ``call`` takes, to 0.1 ms."""
    start = time.perf_counter()
    call()
    return round(1000 * (time.perf_counter() - start), 1)


def read_bytes() -> int | None:
    """Bytes this process has made the kernel fetch from storage (Linux), else ``None``."""
    try:
        lines = Path("/proc/self/io").read_text().splitlines()
    except OSError:
        return None
    return next((int(line.split()[1]) for line in lines if line.startswith("read_bytes")), None)


def random_read_rate(file: Path, reads: int = 600, seed: int = 3) -> dict[str, float]:
    """Random 4 KiB reads per second from ``file`` dropped from the page cache.

    One thread, then four: how many of a pool's scattered pages the disk returns per second,
    alone and with requests in flight together. The reads are marked random
    (``POSIX_FADV_RANDOM``), so the kernel reads no more than asked: the disk's own rate.
    """
    import random
    from concurrent.futures import ThreadPoolExecutor

    pages = max(1, file.stat().st_size // 4096)
    rng = random.Random(seed)
    rates: dict[str, float] = {}
    handle = os.open(file, os.O_RDONLY)
    try:
        os.posix_fadvise(handle, 0, 0, os.POSIX_FADV_RANDOM)
        for threads in (1, 4):
            drop_cached(file.parent)
            offsets = [rng.randrange(pages) * 4096 for _ in range(reads)]
            start = time.perf_counter()
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(lambda offset: os.pread(handle, 4096, offset), offsets))
            rates[f"{threads}_thread"] = round(reads / (time.perf_counter() - start))
    finally:
        os.close(handle)
    return rates


def timed_recalls(memory: Any, asked: list[str], *, prefetch: bool = False) -> dict[str, Any]:
    """Time ``memory``'s recalls of ``asked`` (after ``prefetch(user)`` if told); closes it.

    ``first_read_kib`` is what the first recall made the kernel read from storage.
    """
    from memories_core import Scope

    scope = Scope(TARGET)
    row: dict[str, Any] = {}
    if prefetch:
        row["prefetch_ms"] = timed_ms(lambda: memory.prefetch(TARGET, progress=False))
    before = read_bytes()
    row["first_ms"] = timed_ms(lambda: memory.recall(asked[0], scope, k=5))
    after = read_bytes()
    if before is not None and after is not None:
        row["first_read_kib"] = round((after - before) / 1024)
    row["later_ms"] = [timed_ms(partial(memory.recall, query, scope, k=5)) for query in asked[1:]]
    memory.close()
    return row


def load_models(args: argparse.Namespace) -> tuple[Any, Any]:
    """The query embedder and the late-interaction reranker (``None`` for the first stage)."""
    from memories_core.retrieval.late_interaction import late_interaction_reranker

    embedder = real_embedder(args.torch_threads)
    if args.pipeline == "first-stage":
        embedder.embed_query("load the model")
        return embedder, None
    reranker = late_interaction_reranker(cache_bytes=64 * 2**20)
    reranker.encoder.encode_query("load the model")  # models loaded, nothing of the store
    return embedder, reranker


def reopened(
    folder: Path, embedder: Any, reranker: Any, asked: list[str], *, prefetch: bool = False
) -> dict[str, Any]:
    """Open the store with an empty reranker cache and time the open and the recalls.

    ``reranker`` ``None``: the first stage alone (the engine's fusion defaults).
    """
    from memories_core import HistoryMemory
    from memories_core.retrieval import FusionConfig
    from memories_core.retrieval.late_interaction import late_interaction_pipeline

    if reranker is not None:
        reranker.cache.clear()
    opened = time.perf_counter()
    if reranker is None:
        pipeline = FusionConfig().pipeline()
    else:
        pipeline = late_interaction_pipeline(reranker=reranker)
    memory = HistoryMemory(path=folder, embedder=embedder, pipeline=pipeline)
    open_ms = round(1000 * (time.perf_counter() - opened), 1)
    return {"open_ms": open_ms} | timed_recalls(memory, asked, prefetch=prefetch)


def child(folder: Path, asked: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """A new process's reopen: load both models, open the store, time its recalls."""
    return reopened(folder, *load_models(args), asked)


def new_process(args: argparse.Namespace, first: int) -> dict[str, Any]:
    """Run :func:`child` in a fresh interpreter, asking the queries from index ``first``."""
    import subprocess

    command = [sys.executable, str(Path(__file__).resolve()), "--store", args.store]
    command += ["--trials", str(args.trials), "--later", str(args.later)]
    command += ["--seed", str(args.seed), "--torch-threads", str(args.torch_threads)]
    command += ["--pipeline", args.pipeline, "--child", str(first)]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def summarise(trials: list[dict[str, Any]]) -> dict[str, Any]:
    """Per condition: the first recalls' median and range, and their ratio to the warm p50.

    The warm p50 is the median of every later recall of the ``reopen`` trials (files cached,
    the process warmed by its first recall).
    """
    warm = statistics.median(ms for t in trials for ms in t["reopen"]["later_ms"])
    summary: dict[str, Any] = {"warm_p50_ms": round(warm, 1)}
    for condition in CONDITIONS:
        firsts = [t[condition]["first_ms"] for t in trials]
        later = [statistics.median(t[condition]["later_ms"]) for t in trials]
        row = {
            "first_median_ms": round(statistics.median(firsts), 1),
            "first_min_ms": round(min(firsts), 1),
            "first_max_ms": round(max(firsts), 1),
            "ratio_to_warm": round(statistics.median(firsts) / warm, 2),
            "trials_within_2x": sum(first <= 2 * warm for first in firsts),
            "later_p50_median_ms": round(statistics.median(later), 1),
            "open_median_ms": round(statistics.median(t[condition]["open_ms"] for t in trials), 1),
        }
        prefetch = [t[condition]["prefetch_ms"] for t in trials if "prefetch_ms" in t[condition]]
        if prefetch:
            row["prefetch_median_ms"] = round(statistics.median(prefetch), 1)
        read = [t[condition]["first_read_kib"] for t in trials if "first_read_kib" in t[condition]]
        if read:
            row["first_read_kib_median"] = round(statistics.median(read))
        summary[condition] = row
    return summary


def report(result: dict[str, Any]) -> str:
    """The summary as a markdown table."""
    summary = result["summary"]
    n = len(result["trials"])
    lines = [
        f"{result['command']}",
        "",
        f"{result['records']} records, pipeline {result.get('pipeline', 'late')}; warm recall "
        f"p50 {summary['warm_p50_ms']} ms "
        f"(the later recalls of the `reopen` trials); {n} trials; load average "
        f"{result['load_average']['start'][0]:.2f} at the start, "
        f"{result['load_average']['end'][0]:.2f} at the end.",
        "",
        "| condition | open ms | prefetch ms | first recall ms, median (min-max) | / warm p50 "
        "| trials within 2x | next 10 recalls p50 ms | first recall read from storage, KiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for condition in CONDITIONS:
        row = summary[condition]
        lines.append(
            f"| {condition} | {row['open_median_ms']} | {row.get('prefetch_median_ms', '-')} | "
            f"{row['first_median_ms']} ({row['first_min_ms']}-{row['first_max_ms']}) | "
            f"{row['ratio_to_warm']}x | {row['trials_within_2x']} of {n} | "
            f"{row['later_p50_median_ms']} | {row.get('first_read_kib_median', '-')} |"
        )
    probe = result.get("disk_probe")
    if probe:
        lines += [
            "",
            f"The disk: {probe['1_thread']} random 4 KiB reads per second from one thread, "
            f"{probe['4_thread']} from four (the store's file dropped from the page cache).",
        ]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """Each trial's first recall per condition, against the warm p50 and twice it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - the figure is optional
        return
    warm = result["summary"]["warm_p50_ms"]
    fig, ax = plt.subplots(figsize=(7, 3))
    for row, condition in enumerate(CONDITIONS):
        firsts = [t[condition]["first_ms"] for t in result["trials"]]
        ax.scatter(firsts, [row] * len(firsts), color="#4477aa", alpha=0.7)
    ax.axvline(warm, color="#228833", label=f"warm p50 {warm} ms")
    ax.axvline(2 * warm, color="#ee6677", linestyle="--", label="2x warm")
    ax.set_yticks(range(len(CONDITIONS)), list(CONDITIONS))
    ax.set_xlabel("first recall after a reopen, ms (one dot per trial)")
    ax.set_title(f"{result['records']} records")
    ax.legend(loc="lower right", fontsize=8)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", required=True, help="a late_persist.py --keep-store folder")
    parser.add_argument("--trials", type=int, default=7)
    parser.add_argument("--later", type=int, default=10, help="recalls timed after the first")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument(
        "--pipeline",
        choices=("late", "first-stage"),
        default="late",
        help="late interaction (the default's) or the first stage alone",
    )
    add_output_options(parser, "cold_recall")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # first query's index
    args = parser.parse_args(argv)
    if args.report_only:
        save_results(args.name, None, report, plot)
        return

    from tqdm.auto import tqdm

    from memories_core import HistoryMemory

    folder = Path(args.store) / "late"
    if not (folder / "records.sqlite3").is_file():
        raise SystemExit(f"{folder} holds no store: build one with late_persist.py --keep-store")
    per_condition = 1 + args.later
    queries = make_queries(args.trials * len(CONDITIONS) * per_condition, args.seed)
    if args.child is not None:  # a new process's reopen: one JSON line on stdout
        print(json.dumps(child(folder, queries[args.child : args.child + per_condition], args)))
        return
    load_start = os.getloadavg()
    embedder, reranker = load_models(args)

    def run(condition: str, first: int) -> dict[str, Any]:
        """One reopen under ``condition``, asking the queries from index ``first``."""
        if condition == "new process":
            return new_process(args, first)
        if condition.startswith("disk"):
            drop_cached(folder)
        asked = queries[first : first + per_condition]
        prefetch = condition.endswith("prefetch")
        return reopened(folder, embedder, reranker, asked, prefetch=prefetch)

    with HistoryMemory(path=folder, embedder=embedder) as counting:
        records = len(counting.engine.records(TARGET))
    trials: list[dict[str, Any]] = []
    for number in tqdm(range(args.trials), desc="trials"):
        trial: dict[str, Any] = {}
        for position, condition in enumerate(CONDITIONS):
            first = (number * len(CONDITIONS) + position) * per_condition
            trial[condition] = run(condition, first)
        trials.append(trial)
    result: dict[str, Any] = {
        "command": command_line(),
        "machine": machine(),
        "code": repo_state(),
        "records": records,
        "pipeline": args.pipeline,
        "trials": trials,
        "summary": summarise(trials),
        "load_average": {"start": load_start, "end": os.getloadavg()},
        "disk_probe": random_read_rate(folder / "records.sqlite3"),
    }
    save_results(args.name, result, report, plot)
    print(report(result))


if __name__ == "__main__":
    main()
