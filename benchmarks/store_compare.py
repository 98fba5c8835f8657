"""LangGraph stores side by side: batched puts/s and query search latency in one namespace.

``N`` items (default 10,000) are put into one namespace ``("memories", "alice")`` in batches
of ``--batch`` puts, then ``--queries`` natural-language searches (``limit=10``) run against
that namespace. Every store embeds with the same deterministic hashing embedder (256 dims, no
model), so the numbers compare storage and search, not embedding models.

Stores:

* ``MemoryStore`` on the default embedded storage (SQLite + the embedded vector index in a
  temporary folder), ``index={"embed": "hashing", "fields": ["text"]}``;
* ``MemoryStore`` in memory (SQLite in memory + numpy index);
* LangGraph's ``InMemoryStore`` with the same embeddings;
* LangGraph's ``PostgresStore`` (pgvector), when ``langgraph.store.postgres`` is importable
  and ``--postgres-dsn`` (or ``LLM_MEMORIES_TEST_DSN``) names a server; otherwise reported as
  skipped.

Reported per store: puts/s over the whole load, search p50/p95 in milliseconds, and the
share of queries whose best hit is the item the query was written from (a sanity check that
every store searched the same data, not a quality benchmark).

    python benchmarks/store_compare.py                 # 10k items, JSON + Markdown
    python benchmarks/store_compare.py --items 1000    # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langgraph.store.base import BaseStore, PutOp
from langgraph.store.memory import InMemoryStore
from machine_info import command_line, machine

from langchain_memories import CoreEmbeddings, MemoryStore
from memories_core.embedders import HashingEmbedder

DEFAULT_OUT = Path(__file__).parent / "out" / "store_compare"
NAMESPACE = ("memories", "alice")
DIMS = 256
WORDS = [
    "garden",
    "river",
    "coffee",
    "train",
    "violin",
    "winter",
    "museum",
    "bakery",
    "harbor",
    "lantern",
    "meadow",
    "tennis",
    "pottery",
    "glacier",
    "market",
    "orchard",
    "festival",
    "canyon",
    "library",
    "bicycle",
    "theater",
    "volcano",
    "spice",
    "island",
    "compass",
    "marble",
    "thunder",
    "desert",
    "jungle",
    "castle",
    "falcon",
    "ribbon",
    "anchor",
]


def corpus(n: int, seed: int) -> list[str]:
    """``n`` distinct short notes built from a fixed vocabulary."""
    rng = random.Random(seed)
    return [
        f"note {i}: Alice " + " ".join(rng.sample(WORDS, 6)) + f" on day {i % 365}"
        for i in range(n)
    ]


@contextmanager
def memory_store(path: Path | None) -> Iterator[BaseStore]:
    """Our store, on a folder (embedded default) or in memory."""
    store = MemoryStore(index={"embed": f"hashing:{DIMS}", "fields": ["text"]}, path=path)
    try:
        yield store
    finally:
        store.close()


@contextmanager
def in_memory_store() -> Iterator[BaseStore]:
    """LangGraph's InMemoryStore."""
    yield InMemoryStore(
        index={"dims": DIMS, "embed": CoreEmbeddings(HashingEmbedder(DIMS)), "fields": ["text"]}
    )


@contextmanager
def postgres_store(dsn: str) -> Iterator[BaseStore]:
    """LangGraph's PostgresStore (pgvector)."""
    from langgraph.store.postgres import PostgresStore  # type: ignore[import-not-found]

    with PostgresStore.from_conn_string(
        dsn,
        index={"dims": DIMS, "embed": CoreEmbeddings(HashingEmbedder(DIMS)), "fields": ["text"]},
    ) as store:
        store.setup()
        yield store


def measure(store: BaseStore, texts: list[str], batch: int, queries: list[int]) -> dict[str, Any]:
    """Put every text in batches, then time the queries."""
    start = time.perf_counter()
    for first in range(0, len(texts), batch):
        store.batch(
            [
                PutOp(NAMESPACE, f"k{i}", {"text": texts[i]})
                for i in range(first, min(first + batch, len(texts)))
            ]
        )
    put_seconds = time.perf_counter() - start
    latencies: list[float] = []
    found = 0
    for i in queries:
        query = " ".join(texts[i].split()[3:9])
        began = time.perf_counter()
        hits = store.search(NAMESPACE, query=query, limit=10)
        latencies.append(1000 * (time.perf_counter() - began))
        found += bool(hits) and hits[0].key == f"k{i}"
    latencies.sort()
    return {
        "items": len(texts),
        "puts_per_s": round(len(texts) / put_seconds, 1),
        "put_seconds": round(put_seconds, 2),
        "search_p50_ms": round(statistics.median(latencies), 2),
        "search_p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))], 2),
        "top1_is_source": round(found / len(queries), 3),
    }


def markdown(report: dict[str, Any]) -> str:
    """The report as a Markdown table."""
    rows = [
        "| store | items | puts/s (batched) | search p50 ms | search p95 ms | top-1 = source |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, result in report["stores"].items():
        if "skipped" in result:
            rows.append(f"| {name} | skipped: {result['skipped']} | | | | |")
            continue
        rows.append(
            f"| {name} | {result['items']} | {result['puts_per_s']} | {result['search_p50_ms']} "
            f"| {result['search_p95_ms']} | {result['top1_is_source']} |"
        )
    return (
        f"# LangGraph stores: {report['items']} items in one namespace\n\n"
        f"Command: `{report['command']}`\n\n" + "\n".join(rows) + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and write ``<out>.json`` and ``<out>.md``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500, help="puts per batch call")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--postgres-dsn", default=os.environ.get("LLM_MEMORIES_TEST_DSN"))
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output path without suffix")
    args = parser.parse_args(argv)

    texts = corpus(args.items, args.seed)
    rng = random.Random(args.seed + 1)
    queries = [rng.randrange(args.items) for _ in range(args.queries)]
    stores: dict[str, Callable[[], Any]] = {}
    with tempfile.TemporaryDirectory() as folder:
        stores["MemoryStore (embedded default)"] = lambda: memory_store(Path(folder) / "store")
        stores["MemoryStore (in memory)"] = lambda: memory_store(None)
        stores["InMemoryStore (LangGraph)"] = in_memory_store
        results: dict[str, Any] = {}
        for name, open_store in stores.items():
            with open_store() as store:
                results[name] = measure(store, texts, args.batch, queries)
            print(name, results[name], file=sys.stderr)
    name = "PostgresStore (LangGraph, pgvector)"
    try:
        import langgraph.store.postgres  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        results[name] = {"skipped": "langgraph-checkpoint-postgres is not installed"}
    else:
        if not args.postgres_dsn:
            results[name] = {"skipped": "no --postgres-dsn"}
        else:
            with postgres_store(args.postgres_dsn) as store:
                results[name] = measure(store, texts, args.batch, queries)
    report = {
        "items": args.items,
        "batch": args.batch,
        "queries": args.queries,
        "embedder": f"hashing, {DIMS} dims",
        "command": command_line("benchmarks/store_compare.py", sys.argv[1:]),
        "machine": machine(),
        "stores": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
