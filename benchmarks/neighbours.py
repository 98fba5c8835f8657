"""Context spreading's neighbour lookup on a long session: recall latency before/after.

One user saves 2,000 turns in one ``save`` call (every turn the same timestamp, as a batch
put through the LangGraph store gets), then recalls with ``HistoryMemory.recall`` (hybrid
search, fusion, context spreading over the best 20 candidates). Two variants: turns saved
without a session id (the engine's session tracker routes them into one session) and turns
saved with one session id.

A third measurement times the neighbour lookup alone (``StoreBackend.adjacent`` for 20
candidates) on a bare record store whose turns have no session id, the path a store without
a session tracker takes.

The script counts the record store's ``list`` calls and the rows they return during the
recalls: the neighbour lookup used to list every record of the user within the gap window
for each candidate (quadratic in the session's length); the SQL store's indexed neighbour
query lists nothing.

Run it on the code before and after a change and compare the two JSON entries:

    PYTHONPATH=<old checkout>/shared nice -n 15 python benchmarks/neighbours.py --label before
    PYTHONPATH=shared nice -n 15 python benchmarks/neighbours.py --label after

Results are merged by label into ``benchmarks/out/neighbours.json`` (and ``.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder

# First-stage figures (HistoryMemory reranks by default where the rerank extra is).
os.environ.setdefault("LLM_MEMORIES_LATE_INTERACTION", "off")

OUT = Path(__file__).resolve().parent / "out"
WHEN = datetime(2024, 1, 1, 12, tzinfo=timezone.utc)
TOPICS = (
    "hiking trip to the Alps",
    "new puppy named Rex",
    "sourdough bread recipe",
    "marathon training plan",
    "job interview at the bank",
    "guitar lessons on Tuesdays",
    "moving to Lisbon next spring",
    "sister's wedding in June",
)


def turns(n: int) -> list[Turn]:
    """``n`` dialogue turns about a handful of topics, all said at the same time."""
    out = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        role = "user" if i % 2 == 0 else "assistant"
        out.append(
            Turn(role, f"Turn {i}: let me tell you about my {topic} ({i * 7 % 97})", timestamp=WHEN)
        )
    return out


def counting(method: Callable[..., list[Any]], tally: dict[str, int]) -> Callable[..., list[Any]]:
    """``method`` that also counts its calls and the rows they return."""

    def wrapped(*args: Any, **kwargs: Any) -> list[Any]:
        rows = method(*args, **kwargs)
        tally["list_calls"] += 1
        tally["list_rows"] += len(rows)
        return rows

    return wrapped


def run(n: int, queries: int, session: str | None) -> dict[str, Any]:
    """Save ``n`` turns in one call, then time ``queries`` recalls."""
    memory = HistoryMemory(embedder=HashingEmbedder(dimension=256), k=5)
    scope = Scope("alice", session_id=session)
    started = time.perf_counter()
    memory.save(turns(n), scope)
    save_s = time.perf_counter() - started
    memory.recall("warm up", scope)  # index pending vectors outside the timed loop
    store = memory.engine.store
    tally = {"list_calls": 0, "list_rows": 0}
    store.list = counting(store.list, tally)  # type: ignore[method-assign]
    times = []
    for i in range(queries):
        query = f"what did I say about the {TOPICS[i % len(TOPICS)]}?"
        started = time.perf_counter()
        recall = memory.recall(query, scope)
        times.append((time.perf_counter() - started) * 1000)
        assert recall.records, "recall found nothing"
    memory.close()
    times.sort()
    return {
        "turns": n,
        "session_id": session is not None,
        "queries": queries,
        "save_s": round(save_s, 2),
        "recall_p50_ms": round(statistics.median(times), 1),
        "recall_p95_ms": round(times[int(0.95 * (len(times) - 1))], 1),
        "list_calls_per_query": tally["list_calls"] / queries,
        "list_rows_per_query": tally["list_rows"] / queries,
    }


def run_lookup(n: int, repeats: int) -> dict[str, Any]:
    """Time the neighbour lookup alone: 20 candidates among ``n`` turns without a session.

    The records sit in a bare record store (no session tracker), all at one time, so every
    candidate's neighbours are looked up through the 30-minute gap rule.
    """
    from datetime import timedelta

    from memories_core.backends import NumpyIndex, SQLiteRecordStore
    from memories_core.retrieval.store_backend import StoreBackend
    from memories_core.types import MemoryRecord

    store = SQLiteRecordStore()
    store.add([MemoryRecord(f"r{i}", "alice", "turn", f"turn {i}", WHEN) for i in range(n)])
    backend = StoreBackend(store, NumpyIndex(), HashingEmbedder(dimension=64))
    tally = {"list_calls": 0, "list_rows": 0}
    store.list = counting(store.list, tally)  # type: ignore[method-assign]
    top = [f"r{i}" for i in range(0, n, max(1, n // 20))][:20]
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        backend.adjacent(top, user_id="alice", gap=timedelta(minutes=30))
        times.append((time.perf_counter() - started) * 1000)
    store.close()
    times.sort()
    return {
        "turns": n,
        "session_id": False,
        "what": "neighbour lookup of 20 candidates",
        "queries": repeats,
        "recall_p50_ms": round(statistics.median(times), 1),
        "recall_p95_ms": round(times[int(0.95 * (len(times) - 1))], 1),
        "list_calls_per_query": tally["list_calls"] / repeats,
        "list_rows_per_query": tally["list_rows"] / repeats,
    }


def report(results: dict[str, Any]) -> str:
    """Markdown table of every label's runs."""
    lines = [
        "| code | what | turns | session id | p50 ms | p95 ms | list calls/query | rows/query |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, entry in results.items():
        for row in entry["runs"]:
            lines.append(
                f"| {label} | {row.get('what', 'recall')} | {row['turns']} | "
                f"{'yes' if row['session_id'] else 'no'} | "
                f"{row['recall_p50_ms']} | {row['recall_p95_ms']} | "
                f"{row['list_calls_per_query']:g} | {row['list_rows_per_query']:g} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run both variants and merge the results under ``--label``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True, help="name of this code state (before/after)")
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=20)
    parser.add_argument("--name", default="neighbours", help="output file stem")
    args = parser.parse_args()
    runs = [run(args.turns, args.queries, session) for session in (None, "one-long-session")]
    runs.append(run_lookup(args.turns, args.queries))
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{args.name}.json"
    results = json.loads(path.read_text()) if path.exists() else {}
    results[args.label] = {
        "runs": runs,
        "load_1min": round(os.getloadavg()[0], 2),
        "at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    path.write_text(json.dumps(results, indent=2) + "\n")
    (OUT / f"{args.name}.md").write_text(report(results))
    print(report(results))


if __name__ == "__main__":
    main()
