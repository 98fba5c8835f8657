"""What an exact pgvector search costs by user size, beside a search through the HNSW graph.

``PgVectorIndex`` keeps users with at most ``exact_below`` vectors out of the HNSW graph and
sorts their rows exactly (read from the covering ``user_id`` B-tree since schema version 4,
then ``<=>`` on each row). This measures
that exact search for users of several sizes inside a large table, and the same users'
search through the graph, so the bound is chosen by cost: the exact search must stay cheaper
than the graph's for every user below it, while every row kept out of the graph saves an
HNSW insert on write.

For each size ``n`` a user with ``n`` random unit vectors (384 dimensions) is written next
to the table's other rows with ``COPY`` twice: once outside the graph (``graph = false``)
and once inside it (``graph = true``, inserted into the partial HNSW index, timed per
row). Then ``--queries`` searches of each user through ``PgVectorIndex.search`` (one client,
``k=10``), p50/p95 in ms, and the share of queries whose target row is found (a noisy copy
of one of the user's vectors; the table is vacuumed after each ``COPY``, as autovacuum
would). A user's rows are copied together, so on the table's heap (before the covering
index) they lay on few pages, unlike rows of users who write in turn. The graph holds the
user's rows and whatever graph rows the table already has (none in a store of small users),
so its search figure is a lower bound for a user in a graph shared with other large users.

    python benchmarks/pg_exact_cost.py --dsn postgresql://... --schema scale_seeded_1000000
    python benchmarks/pg_exact_cost.py --sizes 500,2000 --background 20000   # own server
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "shared"), str(HERE.parent), str(HERE)]

from machine_info import command_line, machine  # noqa: E402
from scale_out import postgres_dsn, vector_text  # noqa: E402

OUT = HERE / "out"
DIM = 384


def _unit(rng: np.random.Generator, n: int) -> np.ndarray:
    block = rng.normal(size=(n, DIM)).astype(np.float32)
    return block / np.linalg.norm(block, axis=1, keepdims=True)


def _copy(conn: Any, user: str, vectors: np.ndarray, graph: bool) -> float:
    """COPY a user's rows (graph flag as given); seconds taken."""
    meta = json.dumps({"user_id": user, "kind": "note"})
    start = time.perf_counter()
    sql = "COPY vectors (id, user_id, metadata, embedding, graph) FROM STDIN"
    with conn.transaction(), conn.cursor() as cur, cur.copy(sql) as cp:
        for i, vector in enumerate(vectors):
            cp.write_row((f"{user}-{i}", user, meta, vector_text(vector.tolist()), graph))
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: start pgserver)")
    parser.add_argument("--schema", default="pg_exact_cost", help="schema (reused if present)")
    parser.add_argument("--sizes", default="500,1000,2000,5000,10000")
    parser.add_argument("--background", type=int, default=0, help="other rows to add first")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--name", default="pg_exact_cost")
    args = parser.parse_args(argv)

    import psycopg

    from memories_core.backends.pgvector_index import PgVectorIndex

    rng = np.random.default_rng(23)
    sizes = [int(s) for s in args.sizes.split(",")]
    result: dict[str, Any] = {
        "command": command_line(
            "benchmarks/pg_exact_cost.py", sys.argv[1:] if argv is None else argv
        ),
        "machine": machine(),
        "rows": [],
    }
    with postgres_dsn(args.dsn) as dsn:
        index = PgVectorIndex(dsn, dimension=DIM, schema=args.schema)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{args.schema}", public')
            for chunk in range(0, args.background, 10_000):
                n = min(10_000, args.background - chunk)
                _copy(conn, f"bg{chunk // 1000:05d}", _unit(rng, n), False)
            row = conn.execute("SELECT count(*) FROM vectors").fetchone()
            result["table_rows_before"] = int(row[0]) if row else 0
            conn.execute("ANALYZE vectors")
            for n in sizes:
                vectors = _unit(rng, n)
                entry: dict[str, Any] = {"user_rows": n}
                for graph in (False, True):
                    user = f"probe-{n}-{'graph' if graph else 'exact'}"
                    conn.execute("DELETE FROM vectors WHERE user_id = %s", (user,))
                    seconds = _copy(conn, user, vectors, graph)
                    # As autovacuum leaves a table: the visibility map lets the exact search
                    # read the covering index alone (index-only scan).
                    conn.execute("VACUUM (ANALYZE) vectors")
                    latencies, found = [], 0
                    for q in range(args.queries + 5):
                        target = int(rng.integers(n))
                        query = vectors[target] + 0.3 * _unit(rng, 1)[0]
                        query /= np.linalg.norm(query)
                        start = time.perf_counter()
                        hits = index.search(query, user_id=user, k=10)
                        if q >= 5:  # the first five warm the pages
                            latencies.append(1000 * (time.perf_counter() - start))
                            found += f"{user}-{target}" in {h for h, _ in hits}
                    latencies.sort()
                    key = "graph" if graph else "exact"
                    entry[key] = {
                        "write_ms_per_row": round(1000 * seconds / n, 3),
                        "search_p50_ms": round(statistics.median(latencies), 2),
                        "search_p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))], 2),
                        "target_found": round(found / args.queries, 3),
                    }
                    conn.execute("DELETE FROM vectors WHERE user_id = %s", (user,))
                print(json.dumps(entry), flush=True)
                result["rows"].append(entry)
        index.close()
    OUT.mkdir(exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"`{result['command']}`; {result['table_rows_before']:,} other rows in the table.",
        "",
        "| user rows | exact search p50 ms | p95 | graph search p50 ms | p95 | "
        "COPY ms/row outside the graph | into the graph | target found exact / graph |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for entry in result["rows"]:
        e, g = entry["exact"], entry["graph"]
        lines.append(
            f"| {entry['user_rows']:,} | {e['search_p50_ms']} | {e['search_p95_ms']} | "
            f"{g['search_p50_ms']} | {g['search_p95_ms']} | {e['write_ms_per_row']} | "
            f"{g['write_ms_per_row']} | {e['target_found']} / {g['target_found']} |"
        )
    (OUT / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
