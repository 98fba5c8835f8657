"""DPeM memory dynamics and lookup latency (Zhang et al., 2023, "DPeM Mechanism", Table 1).

1. **Dynamics**: one scripted patient (``benchmarks/dpem_data.py``, ann: 12 weekly sessions,
   one save per exchange) through :class:`DualProcessMemory` with the rule-based coordinator
   ``dpem_reply`` (a ScriptedLLM: token counts are the library's estimate). Per round: items
   in working memory / STM / LTM, merges, promotions, STM refreshes, coordinator calls and
   tokens.
2. **Lookup latency** with 1,000 and 10,000 knowledge items of one user (written directly,
   half STM, half LTM; hashing embedder, in-memory numpy index): STM lookup (rapidfuzz
   Levenshtein over the STM items, read from SQLite each call), LTM lookup (the engine's fused
   dense + lexical search restricted to tier ``ltm``, DPeM's pipeline: no context spreading)
   and a whole ``recall``. Median and p95
   of 50 queries.

    python benchmarks/dpem_dynamics.py [--sessions 12] [--theta 3] [--refresh 6]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dpem_data import patient_rounds
from machine_info import portable_path

from memories_core import DualProcessMemory, Scope
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.dpem import KNOWLEDGE_KIND
from memories_core.prompts.dpem import dpem_reply
from memories_core.types import MemoryRecord, new_id

OUT = Path(__file__).resolve().parent / "out"

_VOCAB = (
    "sugar insulin feet skin rash itch thirst fatigue dinner rice walk metformin vision "
    "cramp night morning dose pill water juice fruit bread toe cut heal nurse eye check "
    "blood pressure headache sleep stress tea coffee salt diet exercise swim cold cough"
)
WORDS = tuple(_VOCAB.split())


def dynamics(sessions: int, theta: int, refresh: int) -> list[dict[str, int]]:
    llm = ScriptedLLM(default=dpem_reply)
    memory = DualProcessMemory(
        llm=llm,
        embedder=HashingEmbedder(dimension=256),
        theta=theta,
        stm_refresh_rounds=refresh,
    )
    rows: list[dict[str, int]] = []
    for turns in patient_rounds("ann", sessions):
        calls, prompt, completion = (
            llm.usage.calls,
            llm.usage.prompt_tokens,
            llm.usage.completion_tokens,
        )
        memory.save(turns, Scope("ann"))
        stats = memory.stats("ann")
        rows.append(
            {
                "round": stats.rounds,
                "working": stats.working,
                "stm": stats.stm,
                "ltm": stats.ltm,
                "merges": stats.merges,
                "promotions": stats.promotions,
                "refreshes": stats.refreshes,
                "dropped": stats.dropped,
                "llm_calls": llm.usage.calls - calls,
                "prompt_tokens": llm.usage.prompt_tokens - prompt,
                "completion_tokens": llm.usage.completion_tokens - completion,
            }
        )
    memory.close()
    return rows


def sentence(rng: random.Random) -> str:
    return "The user " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 10))) + "."


def latency(n: int, queries: int = 50) -> dict[str, float]:
    rng = random.Random(n)
    memory = DualProcessMemory(
        llm=ScriptedLLM(default=dpem_reply),
        embedder=HashingEmbedder(dimension=256),
        stm_capacity=n,
    )
    engine = memory.engine
    records = [
        MemoryRecord(new_id(), "u", KNOWLEDGE_KIND, sentence(rng), engine.clock.now())
        for _ in range(n)
    ]
    state = {
        r.id: {
            "tier": "stm" if i % 2 else "ltm",
            "attrs": {"count": 1, "rounds": [1], "type": "user-specific"},
        }
        for i, r in enumerate(records)
    }
    t0 = time.perf_counter()
    engine.add_records(records, state=state)
    build = time.perf_counter() - t0
    pipeline = memory.pipeline
    asks = [" ".join(rng.choice(WORDS) for _ in range(4)) for _ in range(queries)]
    out: dict[str, float] = {"items": n, "build_s": round(build, 2)}
    for name, run in (
        ("stm_ms", lambda q: memory.stm_lookup(q, "u", k=5)),
        (
            "ltm_ms",
            lambda q: engine.search(
                q, "u", k=5, kinds=[KNOWLEDGE_KIND], where={"tier": "ltm"}, pipeline=pipeline
            ),
        ),
        ("recall_ms", lambda q: memory.recall(q, Scope("u"), k=5)),
    ):
        run(asks[0])  # warm-up
        times = []
        for q in asks:
            t = time.perf_counter()
            run(q)
            times.append((time.perf_counter() - t) * 1000)
        times.sort()
        out[name] = round(statistics.median(times), 2)
        out[name.replace("_ms", "_p95_ms")] = round(times[int(0.95 * (len(times) - 1))], 2)
    memory.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, default=12)
    parser.add_argument("--theta", type=int, default=3)
    parser.add_argument("--refresh", type=int, default=6)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--json", type=Path, default=OUT / "dpem_dynamics.json")
    args = parser.parse_args()
    rows = dynamics(args.sessions, args.theta, args.refresh)
    header = list(rows[0])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(r[h]) for h in header) + " |" for r in rows]
    dyn_table = "\n".join(lines)
    print(dyn_table)
    lat = [latency(n) for n in args.sizes]
    lat_lines = [
        "| items | STM lookup median / p95 (ms) | LTM lookup median / p95 (ms) | "
        "recall median / p95 (ms) | build (s) |",
        "|---|---|---|---|---|",
    ]
    for r in lat:
        lat_lines.append(
            f"| {r['items']:,} | {r['stm_ms']} / {r['stm_p95_ms']} | {r['ltm_ms']} / "
            f"{r['ltm_p95_ms']} | {r['recall_ms']} / {r['recall_p95_ms']} | {r['build_s']} |"
        )
    lat_table = "\n".join(lat_lines)
    print(lat_table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "args": vars(args) | {"json": portable_path(args.json)},
                "rounds": rows,
                "latency": lat,
            },
            indent=1,
        )
    )
    args.json.with_suffix(".md").write_text(dyn_table + "\n\n" + lat_table + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 3.5))
        x = [r["round"] for r in rows]
        for key in ("working", "stm", "ltm"):
            ax.plot(x, [r[key] for r in rows], label=key.upper() if key != "working" else "working")
        for row in rows:
            if row["refreshes"] and (
                row["round"] == 1 or row["refreshes"] != rows[row["round"] - 2]["refreshes"]
            ):
                ax.axvline(row["round"], color="grey", lw=0.6, ls=":")
        ax.set_xlabel("round (one save)")
        ax.set_ylabel("items")
        ax.set_title(
            f"DPeM memory per round (theta={args.theta}, STM refresh every {args.refresh})"
        )
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.json.with_suffix(".png"), dpi=120)
    except ImportError:
        pass


if __name__ == "__main__":
    main()
