"""Late-interaction token vectors kept with the records: ingest, disk and warm recall.

One user saves N synthetic dialogue turns (``latency.py``'s generator, 2 turns per
``save``) into ``HistoryMemory(path=..., pipeline=late_interaction_pipeline())``: SQLite +
embedded Chroma, the library's MiniLM embedder, answerai-colbert-small ONNX, default
background derivation. Measured:

* ingest: turns/s until ``flush()`` returns (every turn's token vectors encoded by the
  save jobs and stored), beside the same turns saved into a memory without the stage; the
  MiniLM document vectors are computed once beforehand and looked up by both, so the two
  differ by the token vectors only;
* disk: the SQLite file's bytes per record with and without vectors, and the stored int8
  payload per record;
* the first recall after a reopen is ``cold_recall.py``'s, on stores kept here with
  ``--keep-store`` (several reopens per condition: one call per run, as this script timed
  it before, mostly measured the disk on a machine that pages idle files out);
* recall p50 over the queries, interleaved per query: the default pipeline and the late
  pipeline (its pool's vectors read from SQLite with their links; the cache does not front
  such a store). Every recall embeds its query.

    nice -n 15 python benchmarks/late_persist.py --size 10000 --queries 100
    nice -n 15 python benchmarks/late_persist.py --size 300 --queries 10 --name _late_dev
    python benchmarks/late_persist.py --size 100000 --batch 10 --keep-store /data/late100k
    # again later: recall measured on the kept stores, no ingest
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency import (
    BASE_TIME,
    VectorBank,
    add_output_options,
    command_line,
    make_queries,
    make_turns,
    real_embedder,
    render,
    save_results,
)
from machine_info import machine, save_figure

TARGET = "target-user"
#: Time between two turns: a conversation of turns 30 s apart.
STEP = timedelta(seconds=30)


def disk_bytes(folder: Path) -> int:
    """Bytes of the SQLite store (file, WAL and shared memory) in ``folder``."""
    return sum(p.stat().st_size for p in folder.glob("records.sqlite3*"))


def checkpoint(folder: Path) -> None:
    with sqlite3.connect(folder / "records.sqlite3") as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def ingest(
    folder: Path, pairs: list[tuple[str, str]], bank: VectorBank, pipeline: Any, batch: int
) -> dict[str, Any]:
    from memories_core import HistoryMemory, Scope, Turn

    memory = HistoryMemory(path=folder, embedder=bank, pipeline=pipeline)
    scope = Scope(TARGET)
    start = time.perf_counter()
    for lo in range(0, len(pairs), batch):
        turns = [
            Turn(role, content, timestamp=BASE_TIME + i * STEP)
            for i, (role, content) in enumerate(pairs[lo : lo + batch], start=lo)
        ]
        memory.save(turns, scope)
    saved = time.perf_counter() - start
    left = memory.flush()
    done = time.perf_counter() - start
    rows = 0
    payload = 0
    store = memory.engine.store
    if hasattr(store, "token_vector_rows"):
        for row in store.token_vector_rows(TARGET):
            rows += 1
            payload += row.data.nbytes
    memory.close()
    checkpoint(folder)
    n = len(pairs)
    return {
        "turns": n,
        "save_returns_s": round(saved, 1),
        "vectors_done_s": round(done, 1),
        "turns_per_s": round(n / done, 1),
        "jobs_left": left,
        "vector_rows": rows,
        "payload_bytes_per_record": round(payload / max(rows, 1)),
        "disk_bytes": disk_bytes(folder),
        "disk_bytes_per_record": round(disk_bytes(folder) / n),
    }


def percentiles(samples: list[float]) -> dict[str, float]:
    ms = sorted(1000 * s for s in samples)
    return {
        "n": len(ms),
        "p50_ms": round(float(np.percentile(ms, 50)), 1),
        "p95_ms": round(float(np.percentile(ms, 95)), 1),
        "mean_ms": round(statistics.fmean(ms), 1),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--batch", type=int, default=2, help="turns per save() call")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument(
        "--query-runtime", default="auto", choices=("auto", "torch"), help="embedder queries"
    )
    add_output_options(parser, "late_persist")
    parser.add_argument(
        "--keep-store",
        default=None,
        help="build the stores in this folder and keep them; if it holds stores built by an "
        "earlier run with the same --size/--batch/--seed, measure recall on them again "
        "(their ingest figures are reused) instead of ingesting",
    )
    args = parser.parse_args(argv)
    if args.report_only:
        save_results(args.name, None, report, plot)
        return

    from tqdm.auto import tqdm

    from memories_core import HistoryMemory, Scope
    from memories_core.retrieval.hybrid import FusionConfig
    from memories_core.retrieval.late_interaction import (
        late_interaction_pipeline,
        late_interaction_reranker,
    )

    load_start = os.getloadavg()
    queries = make_queries(args.queries + 2, args.seed + 1)
    embedder = real_embedder(args.torch_threads, args.query_runtime)
    bank = VectorBank(embedder)
    kept = Path(args.keep_store) if args.keep_store else None
    built = kept / "ingest.json" if kept else None
    shape = {"size": args.size, "batch": args.batch, "seed": args.seed}
    reused: dict[str, Any] | None = None
    if built is not None and built.is_file():
        reused = json.loads(built.read_text())
        if reused.get("shape") != shape:
            raise SystemExit(f"{kept} holds stores of {reused.get('shape')}, not {shape}")
    work = kept if kept else Path(tempfile.mkdtemp(prefix="late-persist-"))
    result: dict[str, Any] = {
        "command": command_line(),
        "machine": machine(),
        "query_runtime": getattr(embedder, "query_runtime", "torch"),
    }
    try:
        if reused is not None:
            result["ingest"] = reused["ingest"]
            result["ingest_reused_from"] = reused["command"]
        else:
            pairs = make_turns(args.size, args.seed)
            texts = [render(r, c) for r, c in pairs]
            unique = list(dict.fromkeys(texts))
            for lo in tqdm(range(0, len(unique), 512), desc="MiniLM vectors (once)"):
                bank._real(unique[lo : lo + 512])
            plain = ingest(work / "plain", pairs, bank, None, args.batch)
            print("plain ingest", plain, flush=True)
            late = ingest(work / "late", pairs, bank, late_interaction_pipeline(), args.batch)
            print("late ingest", late, flush=True)
            result["ingest"] = {"plain": plain, "late": late}
            if built is not None:
                record = {"shape": shape, "command": result["command"], "ingest": result["ingest"]}
                built.write_text(json.dumps(record, indent=2))

        reranker = late_interaction_reranker(cache_bytes=64 * 2**20)
        reranker.encoder.encode_query("load the model")
        pipeline = late_interaction_pipeline(reranker=reranker)
        memory = HistoryMemory(path=work / "late", embedder=bank, pipeline=pipeline)
        scope = Scope(TARGET)
        default = FusionConfig().pipeline()
        calls: dict[str, Callable[[str], Any]] = {
            "default pipeline": lambda q: memory.engine.search(
                q, TARGET, k=5, kinds=["turn"], pipeline=default
            ),
            "late_interaction_pipeline() (cache + store)": lambda q: memory.recall(q, scope, k=5),
        }
        for query in queries[:2]:  # the first recalls after the open: cold_recall.py's part
            memory.recall(query, scope, k=5)
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for query in tqdm(queries[2:], desc="recalls"):
            for name, call in calls.items():
                start = time.perf_counter()
                call(query)
                samples[name].append(time.perf_counter() - start)
        result["recall"] = {name: percentiles(s) for name, s in samples.items()}
        memory.close()
    finally:
        if kept is None:
            shutil.rmtree(work, ignore_errors=True)
    result["load_average"] = {"start": load_start, "end": os.getloadavg()}
    save_results(args.name, result, report, plot)
    print(report(result))


def report(result: dict[str, Any]) -> str:
    ingest_rows = result["ingest"]
    # More runnable work than the 2 cores can hold at either end: the figures are loaded.
    busy = max(result["load_average"]["start"][0], result["load_average"]["end"][0]) > 2
    lines = [
        f"`{result['command']}`; load average "
        f"{' / '.join(f'{v:.1f}' for v in result['load_average']['start'])} at start, "
        f"{' / '.join(f'{v:.1f}' for v in result['load_average']['end'])} at end "
        "(1 / 5 / 15 min; 2 cores: "
        f"{'loaded figures' if busy else 'a quiet machine'}). Queries embedded in "
        f"{result.get('query_runtime', 'torch')}.",
        "",
        *(
            [f"Stores and ingest figures kept from `{result['ingest_reused_from']}`.", ""]
            if "ingest_reused_from" in result
            else []
        ),
        "| ingest | turns | turns/s (vectors done) | save() returns s | SQLite bytes per record "
        "| int8 payload per record |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in ingest_rows.items():
        lines.append(
            f"| {name} | {row['turns']} | {row['turns_per_s']} | {row['save_returns_s']} | "
            f"{row['disk_bytes_per_record']:,} | {row['payload_bytes_per_record']:,} |"
        )
    lines += reopen_rows(result.get("reopen"))
    lines += new_process_rows(result.get("new_process"))
    lines += [
        "",
        "| recall (query embedding included) | p50 ms | p95 ms | mean ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, row in result["recall"].items():
        lines.append(f"| {name} | {row['p50_ms']} | {row['p95_ms']} | {row['mean_ms']} |")
    return "\n".join(lines) + "\n"


def reopen_rows(reopen: dict[str, Any] | None) -> list[str]:
    """The one-call reopen table of results made before ``cold_recall.py`` took it over."""
    if not reopen:
        return []
    prefetched = (
        [
            "| `prefetch(user)` after a reopen (loads the user's collection) | "
            f"{reopen['prefetch_ms']} |",
            f"| first recall after that prefetch | {reopen['first_recall_after_prefetch_ms']} |",
        ]
        if "prefetch_ms" in reopen
        else []
    )
    return [
        "",
        "| after reopen | ms |",
        "| --- | ---: |",
        f"| first recall, models loaded, empty cache (cold) | {reopen['cold_first_recall_ms']} |",
        f"| warm recall p50 | {reopen['warm_p50_ms']} |",
        "| first recall of the first stage alone (the store's reopen) | "
        f"{reopen.get('cold_first_stage_ms', 'not measured')} |",
        f"| very first recall, loading both models | {reopen['first_recall_with_model_load_ms']} |",
        *prefetched,
    ]


def new_process_rows(figures: dict[str, dict[str, float]] | None) -> list[str]:
    """The new-process table (empty for results made before it was measured)."""
    if not figures:
        return []
    cold, prefetched = figures["cold"], figures["prefetch"]
    return [
        "",
        "| a new process (models loaded first) | ms |",
        "| --- | ---: |",
        f"| open the memory | {cold['open_ms']} |",
        f"| first recall | {cold['first_recall_ms']} |",
        f"| next 10 recalls, p50 | {cold['next_10_p50_ms']} |",
        f"| first recall / that p50 | {cold['first_recall_ms'] / cold['next_10_p50_ms']:.1f}x |",
        f"| `prefetch(user)` in another new process | {prefetched['prefetch_ms']} |",
        f"| its first recall after the prefetch | {prefetched['first_recall_ms']} |",
        f"| its next 10 recalls, p50 | {prefetched['next_10_p50_ms']} |",
    ]


def plot(result: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - the figure is optional
        return
    names = list(result["recall"])
    values = [result["recall"][n]["p50_ms"] for n in names]
    if "reopen" in result:  # outputs from before cold_recall.py
        names += ["cold first recall after reopen"]
        values += [result["reopen"]["cold_first_recall_ms"]]
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.barh(names, values, color="#4477aa")
    ax.set_xlabel("ms (p50; the cold recall is one call)")
    ax.invert_yaxis()
    save_figure(fig, path)


if __name__ == "__main__":
    main()
