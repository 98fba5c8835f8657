"""Late-interaction token vectors kept with the records: ingest, disk, cold and warm recall.

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
* reopen: the memory is closed and opened again (a new reranker, empty cache) and the first
  recall is timed, with the models loaded beforehand (``cold``) and, separately, the very
  first call that also loads them, and the first recall of the first stage alone after a
  reopen (what the store's reopen costs without the late stage), and after one more reopen
  ``prefetch(user)`` (what an app calls when a user signs in) and the first recall after it;
* a new process: a fresh interpreter opens the store (Chroma reads the user's graph from
  disk, SQLite starts cold), loads both models, and times its first recall and then ten more
  (their p50 shows how long a new process stays slower than a long-running one: at 100k,
  all ten); a second one calls ``prefetch`` first;
* recall p50 over the queries, interleaved per query: the default pipeline, the late
  pipeline (vectors from its cache or the store), and the late pipeline with no cache
  (every recall reads its pool's vectors from SQLite). Every recall embeds its query.

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
    command_line,
    machine,
    make_queries,
    make_turns,
    real_embedder,
    render,
    save_results,
)

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


def timed(call: Callable[[], Any]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def new_process(folder: Path, mode: str, args: argparse.Namespace) -> dict[str, float]:
    """Run the cold recall in a fresh interpreter (``--child``) and return its figures."""
    import subprocess

    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        mode,
        "--child-store",
        str(folder),
        "--queries",
        str(args.queries),
        "--seed",
        str(args.seed),
        "--torch-threads",
        str(args.torch_threads),
        "--query-runtime",
        args.query_runtime,
    ]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def child(folder: Path, mode: str, args: argparse.Namespace) -> None:
    """A new process's first recall on a kept store: prints one JSON line."""
    from memories_core import HistoryMemory, Scope
    from memories_core.retrieval.late_interaction import (
        late_interaction_pipeline,
        late_interaction_reranker,
    )

    queries = make_queries(args.queries + 2, args.seed + 1)
    embedder = real_embedder(args.torch_threads, args.query_runtime)
    embedder.embed_query("load the model")
    reranker = late_interaction_reranker(cache_bytes=64 * 2**20)
    reranker.encoder.encode_query("load the model")  # models loaded, nothing of the store
    scope = Scope(TARGET)
    opened = time.perf_counter()
    memory = HistoryMemory(
        path=folder, embedder=embedder, pipeline=late_interaction_pipeline(reranker=reranker)
    )
    figures: dict[str, float] = {"open_ms": round(1000 * (time.perf_counter() - opened), 1)}
    if mode == "prefetch":
        figures["prefetch_ms"] = round(
            1000 * timed(lambda: memory.prefetch(TARGET, progress=False)), 1
        )
    figures["first_recall_ms"] = round(
        1000 * timed(lambda: memory.recall(queries[1], scope, k=5)), 1
    )
    later = []
    for query in queries[2:12]:
        start = time.perf_counter()
        memory.recall(query, scope, k=5)
        later.append(time.perf_counter() - start)
    figures["next_10_p50_ms"] = percentiles(later)["p50_ms"]
    memory.close()
    print(json.dumps(figures))


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
    parser.add_argument("--name", default="late_persist")
    parser.add_argument(
        "--keep-store",
        default=None,
        help="build the stores in this folder and keep them; if it holds stores built by an "
        "earlier run with the same --size/--batch/--seed, measure recall on them again "
        "(their ingest figures are reused) instead of ingesting",
    )
    parser.add_argument("--report-only", action="store_true", help="redo md/png from the JSON")
    parser.add_argument("--child", choices=("cold", "prefetch"), help=argparse.SUPPRESS)
    parser.add_argument("--child-store", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(Path(args.child_store), args.child, args)
        return
    if args.report_only:
        save_results(args.name, None, report, plot)
        return

    from tqdm.auto import tqdm

    from memories_core import HistoryMemory, Scope
    from memories_core.retrieval import Pipeline
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

        # -- reopen: a new process's view (new reranker, empty cache)
        def opened(cache_bytes: int) -> tuple[HistoryMemory, Any]:
            reranker = late_interaction_reranker(cache_bytes=cache_bytes)
            pipeline = late_interaction_pipeline(reranker=reranker)
            return HistoryMemory(path=work / "late", embedder=bank, pipeline=pipeline), reranker

        memory, reranker = opened(64 * 2**20)
        scope = Scope(TARGET)
        first_with_load = timed(lambda: memory.recall(queries[0], scope, k=5))
        memory.close()
        # The store's own reopen cost: the first stage alone, first recall after a reopen.
        plain_memory = HistoryMemory(path=work / "late", embedder=bank, pipeline=Pipeline())
        cold_first_stage = timed(lambda: plain_memory.recall(queries[1], scope, k=5))
        plain_memory.close()
        memory, reranker = opened(64 * 2**20)
        reranker.encoder.encode_query("load the model")  # models loaded, nothing cached
        cold = timed(lambda: memory.recall(queries[1], scope, k=5))
        encoded_after_reopen = reranker.cache.misses
        default = FusionConfig().pipeline()
        store_only_reranker = late_interaction_reranker(cache_bytes=1)
        store_only = late_interaction_pipeline(reranker=store_only_reranker)
        store_only_reranker.encoder.encode_query("load the model")
        calls: dict[str, Callable[[str], Any]] = {
            "default pipeline": lambda q: memory.engine.search(
                q, TARGET, k=5, kinds=["turn"], pipeline=default
            ),
            "late_interaction_pipeline() (cache + store)": lambda q: memory.recall(q, scope, k=5),
            "late_interaction_pipeline(), no cache (store only)": lambda q: memory.engine.search(
                q, TARGET, k=5, kinds=["turn"], pipeline=store_only
            ),
        }
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for query in tqdm(queries[2:], desc="recalls"):
            for name, call in calls.items():
                start = time.perf_counter()
                call(query)
                samples[name].append(time.perf_counter() - start)
        warm = {name: percentiles(s) for name, s in samples.items()}
        memory.close()
        # A user prefetched at sign-in: the index loads the user's collection first.
        memory, reranker = opened(64 * 2**20)
        reranker.encoder.encode_query("load the model")
        prefetch_s = timed(lambda: memory.prefetch(TARGET, progress=False))
        after_prefetch = timed(lambda: memory.recall(queries[1], scope, k=5))
        result["reopen"] = {
            "first_recall_with_model_load_ms": round(1000 * first_with_load, 1),
            "cold_first_recall_ms": round(1000 * cold, 1),
            "cold_first_stage_ms": round(1000 * cold_first_stage, 1),
            "warm_p50_ms": warm["late_interaction_pipeline() (cache + store)"]["p50_ms"],
            "cache_misses_of_first_recall": encoded_after_reopen,
            "prefetch_ms": round(1000 * prefetch_s, 1),
            "first_recall_after_prefetch_ms": round(1000 * after_prefetch, 1),
        }
        result["recall"] = warm
        memory.close()
        # A new process: nothing of the store is loaded (what a restarted server sees).
        result["new_process"] = {
            mode: new_process(work / "late", mode, args) for mode in ("cold", "prefetch")
        }
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
    reopen = result["reopen"]
    lines += [
        "",
        "| after reopen | ms |",
        "| --- | ---: |",
        f"| first recall, models loaded, empty cache (cold) | {reopen['cold_first_recall_ms']} |",
        f"| warm recall p50 | {reopen['warm_p50_ms']} |",
        f"| first recall of the first stage alone (the store's reopen) | "
        f"{reopen.get('cold_first_stage_ms', 'not measured')} |",
        f"| very first recall, loading both models | {reopen['first_recall_with_model_load_ms']} |",
        *(
            [
                f"| `prefetch(user)` after a reopen (loads the user's collection) | "
                f"{reopen['prefetch_ms']} |",
                "| first recall after that prefetch | "
                f"{reopen['first_recall_after_prefetch_ms']} |",
            ]
            if "prefetch_ms" in reopen
            else []
        ),
        *new_process_rows(result.get("new_process")),
        "",
        "| recall (query embedding included) | p50 ms | p95 ms | mean ms |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, row in result["recall"].items():
        lines.append(f"| {name} | {row['p50_ms']} | {row['p95_ms']} | {row['mean_ms']} |")
    return "\n".join(lines) + "\n"


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
    names += ["cold first recall after reopen"]
    values += [result["reopen"]["cold_first_recall_ms"]]
    fig, ax = plt.subplots(figsize=(8, 3))
    ax.barh(names, values, color="#4477aa")
    ax.set_xlabel("ms (p50; the cold recall is one call)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
