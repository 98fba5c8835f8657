"""Embedded Chroma reachability across close/reopen, and the cost of keeping it whole.

A store of near-duplicate vectors (one user, hashed texts that differ in one unique word) is
written in small batches, then closed and reopened ``--cycles`` times; each cycle re-upserts
20 records and deletes and re-adds 5 (what ``verify(repair=True)`` does). After every open
and every cycle's writes, each record is searched with its own vector (10 neighbours) and
counted unreachable if it is not returned. Three settings of ``ChromaIndex``:

* ``graph``: ``exact_below=0, open_check=0``: Chroma's HNSW graph alone (the old behaviour);
* ``pinned``: ``exact_below=0``: the graph plus the reachability check on open and after
  writes, which pins lost records;
* ``exact``: the default (users up to 2,000 vectors searched exactly from a mirror).

Reported: unreachable records per check, the time of the first search after an open (it
loads the mirror or runs the open check), the median search time, and add/delete times.

Usage::

    nice -n 15 python benchmarks/chroma_reopen.py

writes ``benchmarks/out/chroma_reopen.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from memories_core.backends import ChromaIndex
from memories_core.embedders.hashing import HashingEmbedder

USER = "u"
SETTINGS: dict[str, dict[str, int]] = {
    "graph": {"exact_below": 0, "open_check": 0},
    "pinned": {"exact_below": 0, "open_check": 200},
    "exact": {"exact_below": 2000, "open_check": 200},  # the defaults
}


def _texts(n: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rnd.choice("bcdfghjklmnprstvz") + rnd.choice("aeiou") for _ in range(4)))
    return [
        f"Today I had lunch at the small cafe near the office and the soup was fine {w}"
        for w in sorted(words)
    ]


def _meta(n: int) -> list[dict[str, str | int | float | bool]]:
    return [{"user_id": USER, "kind": "turn"} for _ in range(n)]


def _unreachable(
    index: ChromaIndex, ids: list[str], vectors: npt.NDArray[np.float32]
) -> tuple[int, list[float]]:
    lost = 0
    times: list[float] = []
    for vid, vector in zip(ids, vectors, strict=True):
        start = time.perf_counter()
        hits = index.search(vector, user_id=USER, k=10)
        times.append(time.perf_counter() - start)
        lost += vid not in {h for h, _ in hits}
    return lost, times


def run(setting: str, n: int, cycles: int, seed: int) -> dict[str, Any]:
    """One setting: fill, then ``cycles`` reopen cycles; returns counts and timings."""
    options = SETTINGS[setting]
    vectors = np.asarray(HashingEmbedder().embed_documents(_texts(n, seed)), dtype=np.float32)
    ids = [f"r{i}" for i in range(n)]
    folder = Path(tempfile.mkdtemp(prefix="chroma-reopen-"))
    index = ChromaIndex(
        path=folder, exact_below=options["exact_below"], open_check=options["open_check"]
    )
    start = time.perf_counter()
    for s in range(0, n, 7):
        index.add(ids[s : s + 7], vectors[s : s + 7], _meta(len(ids[s : s + 7])))
    fill = time.perf_counter() - start
    index.close()
    on_open: list[int] = []
    after_writes: list[int] = []
    first_search: list[float] = []
    searches: list[float] = []
    writes: list[float] = []
    for cycle in range(cycles):
        index = ChromaIndex(
            path=folder, exact_below=options["exact_below"], open_check=options["open_check"]
        )
        start = time.perf_counter()
        index.search(vectors[0], user_id=USER, k=10)
        first_search.append(time.perf_counter() - start)
        index.wait_checks()  # the open check runs in the background; count after it
        lost, times = _unreachable(index, ids, vectors)
        on_open.append(lost)
        searches += times
        part = slice(cycle * 20 % n, cycle * 20 % n + 20)
        start = time.perf_counter()
        index.add(ids[part], vectors[part], _meta(20))
        index.delete(ids[part][:5], user_id=USER)
        index.add(ids[part][:5], vectors[part][:5], _meta(5))
        writes.append(time.perf_counter() - start)
        lost, times = _unreachable(index, ids, vectors)
        after_writes.append(lost)
        searches += times
        index.close()
    return {
        "setting": setting,
        "options": options,
        "records": n,
        "cycles": cycles,
        "unreachable_on_open": on_open,
        "unreachable_after_writes": after_writes,
        "fill_s": round(fill, 3),
        "first_search_after_open_ms": round(1000 * statistics.median(first_search), 1),
        "search_median_ms": round(1000 * statistics.median(searches), 2),
        "cycle_writes_median_ms": round(1000 * statistics.median(writes), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out")
    args = parser.parse_args()
    results = [
        {**run(setting, args.records, args.cycles, seed), "seed": seed}
        for seed in args.seeds
        for setting in SETTINGS
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "chroma_reopen.json").write_text(json.dumps(results, indent=2) + "\n")
    lines = [
        "# Embedded Chroma: records unreachable by their own vector across close/reopen",
        "",
        f"{args.records} near-duplicate records, {args.cycles} close/reopen cycles, each with"
        " 20 re-upserts and 5 deletes + re-adds (`benchmarks/chroma_reopen.py`).",
        "",
        "| setting | seed | unreachable on open (max) | after writes (max) "
        "| first search after open ms | search median ms | cycle writes ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['setting']} | {r['seed']} | {max(r['unreachable_on_open'])} | "
            f"{max(r['unreachable_after_writes'])} | {r['first_search_after_open_ms']} | "
            f"{r['search_median_ms']} | {r['cycle_writes_median_ms']} |"
        )
    (args.out / "chroma_reopen.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
