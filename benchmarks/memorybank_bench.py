"""MemoryBank benchmarks (Zhong et al.): ingest cost, LoCoMo recall with forgetting, latency.

1. **Ingest**: all 15 users x 10 days of ``memory_bank_en.json`` saved day by day with day
   timestamps (each day's first save closes the previous day; the last day is consolidated
   explicitly): turns/s, records per user by kind, summary LLM calls and tokens per day.
   The model is the rule-based stand-in ``memorybank_reply`` (a ScriptedLLM; tokens are the
   library's estimate), so the numbers are the mechanism's own cost and the call/token shape.
2. **LoCoMo dev** (``locomo_dev.json``): recall@k of evidence turns through the library's
   pipeline (dense + BM25 fusion, context spreading) without and with the forgetting
   re-weighting (``TimeDecay(factor=ForgettingCurve(...))``), per category, with ``now`` =
   the conversation's last session date. Turns are dated by their session. No reinforcement
   (each question is scored against the same state).
3. **Latency** of ``engine.search`` over 10,000 turn records of one user (hashing embedder,
   in memory), with the forgetting re-weighting on and off, and of ``recall`` (which also
   reinforces and renders the context).

    python benchmarks/memorybank_bench.py [--minilm] [--skip-locomo] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from memories_core import FixedClock, MemoryBankMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import Embedder
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.forgetting import ForgettingCurve
from memories_core.prompts.memorybank import memorybank_reply
from memories_core.retrieval import Pipeline, RecallRequest, TimeDecay
from memories_core.types import MemoryRecord, new_id

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_info import datasets_dir

OUT = Path(__file__).resolve().parent / "out"
KS = (1, 5, 10, 25)


# ----------------------------------------------------------------------------- 1. ingest
def ingest(data: Path, embedder: Embedder) -> dict[str, Any]:
    """Replay every user's ten days; measure throughput and the summarising cost per day."""
    users = {k.strip(): dict(v["history"]) for k, v in json.loads(data.read_text()).items()}
    clock = FixedClock(datetime(2023, 4, 27, tzinfo=timezone.utc))
    llm = ScriptedLLM(default=memorybank_reply)
    memory = MemoryBankMemory(llm=llm, embedder=embedder, clock=clock)
    days = sorted({day for history in users.values() for day in history})
    per_day: list[dict[str, Any]] = []
    turns_total = 0
    started = time.perf_counter()
    for day in days:
        calls, tokens = llm.usage.calls, llm.usage.total_tokens
        evening = datetime.fromisoformat(day).replace(hour=20, tzinfo=timezone.utc)
        for name, history in users.items():
            turns: list[Turn] = []
            for i, pair in enumerate(history.get(day, [])):
                at = evening + timedelta(minutes=2 * i)
                turns += [
                    Turn("user", pair["query"], timestamp=at),
                    Turn("assistant", pair["response"], timestamp=at + timedelta(seconds=40)),
                ]
            if turns:
                # The clock never goes back: a job made at one user's later save stays due.
                clock.set(max(clock.now(), turns[-1].timestamp or evening))
                memory.save(turns, Scope(name, session_id=day))
                turns_total += len(turns)
        memory.flush()  # the day's derivations run on the engine's worker: count them here
        per_day.append(
            {
                "day": day,
                "llm_calls": llm.usage.calls - calls,
                "llm_tokens": llm.usage.total_tokens - tokens,
            }
        )
    calls, tokens = llm.usage.calls, llm.usage.total_tokens
    for name in users:
        memory.consolidate(name)
    memory.flush()
    per_day.append(
        {
            "day": "final consolidate",
            "llm_calls": llm.usage.calls - calls,
            "llm_tokens": llm.usage.total_tokens - tokens,
        }
    )
    seconds = time.perf_counter() - started
    kinds: Counter[str] = Counter()
    for name in users:
        kinds.update(r.kind for r in memory.engine.records(name))
    pending = sum(len(memory.pending(name)) for name in users)
    memory.close()
    return {
        "users": len(users),
        "days": len(days),
        "turns": turns_total,
        "seconds": seconds,
        "turns_per_s": turns_total / seconds,
        "records_per_user": {k: v / len(users) for k, v in sorted(kinds.items())},
        "llm_calls": llm.usage.calls,
        "llm_tokens": llm.usage.total_tokens,
        "per_day": per_day,
        "pending_after": pending,
        "failures": dict(memory.engine.failures),
    }


# ----------------------------------------------------------------------------- 2. LoCoMo
def forgetting_variants() -> dict[str, Pipeline]:
    """Pipelines compared on LoCoMo: the library default, then it with forgetting after its
    own rerankers (so each row differs from the first by the forgetting alone)."""
    base = Pipeline()

    def with_decay(curve: ForgettingCurve, weight: float) -> Pipeline:
        decay = TimeDecay(factor=curve, weight=weight)
        return replace(base, rerankers=(*base.rerankers, decay))

    return {
        "no forgetting": base,
        "forgetting, t in days, weight 1 (score x R)": with_decay(ForgettingCurve(), 1.0),
        "forgetting, t in days, weight 0.5": with_decay(ForgettingCurve(), 0.5),
        "forgetting, scale 30 (a month), weight 1": with_decay(ForgettingCurve(scale=30), 1.0),
    }


def locomo(path: Path, minilm: bool) -> dict[str, Any]:
    """Recall@k of evidence turns per category, without and with forgetting."""
    from locomo_retrieval import CachedEmbedder, build_backend, summarise_categories

    from memories_core.evaluation import load_locomo, recall_at_k

    conversations = load_locomo(path)
    inner: Embedder = HashingEmbedder()
    if minilm:
        from memories_core.embedders import SentenceTransformerEmbedder

        inner = SentenceTransformerEmbedder()
    embedder = CachedEmbedder(inner, OUT / "cache")
    backends = {c.sample_id: build_backend(c, embedder, "session ids") for c in conversations}
    embedder.save()
    results: dict[str, Any] = {"embedder": inner.name, "conversations": len(conversations)}
    for label, pipeline in forgetting_variants().items():
        per_category: dict[int, list[dict[int, float]]] = defaultdict(list)
        for conversation in conversations:
            dates = [
                d
                for s in sorted({t.session for t in conversation.turns})
                if (d := conversation.session_datetime(s)) is not None
            ]
            now = max(dates) + timedelta(days=1)
            backend = backends[conversation.sample_id]
            for qa in conversation.qa:
                if not qa.evidence:
                    continue
                request = RecallRequest(
                    qa.question, user_id=conversation.sample_id, k=max(KS), now=now
                )
                ranked = [hit.record.id for hit in pipeline.run(request, backend)]
                per_category[qa.category].append(
                    {k: recall_at_k(ranked, qa.evidence, k) for k in KS}
                )
        results[label] = summarise_categories(per_category)
    embedder.save()
    for backend in backends.values():
        backend.close()
    return results


# ----------------------------------------------------------------------------- 3. latency
def latency(rows: int = 10_000, queries: int = 200) -> dict[str, Any]:
    """Search latency over ``rows`` turns of one user, forgetting on vs off."""
    start = datetime(2024, 1, 1, tzinfo=timezone.utc)
    clock = FixedClock(start + timedelta(days=rows // 100 + 1))
    memory = MemoryBankMemory(
        llm=ScriptedLLM(default=memorybank_reply),
        embedder=HashingEmbedder(),
        clock=clock,
        consolidate_on_session_end=False,
    )
    topics = ["tea", "chess", "running", "painting", "wine", "cooking", "work", "sleep"]
    records = [
        MemoryRecord(
            id=new_id(),
            user_id="u",
            kind="turn",
            text=f"user: on day {i // 100} I talked about {topics[i % 8]} and item {i}",
            created_at=start + timedelta(minutes=15 * i),
            session_id=f"s{i // 100}",
        )
        for i in range(rows)
    ]
    memory.engine.add_records(records)
    on, off = memory.recall_pipeline(forgetting=True), memory.recall_pipeline(forgetting=False)
    kinds = memory.recall_kinds
    out: dict[str, Any] = {"records": rows, "queries": queries}
    for label, run in (
        ("search, forgetting off", lambda q: memory.engine.search(q, "u", k=5, pipeline=off)),
        ("search, forgetting on", lambda q: memory.engine.search(q, "u", k=5, pipeline=on)),
        (
            "search of recall's kinds (turn, daily_summary), forgetting off",
            lambda q: memory.engine.search(q, "u", k=5, kinds=kinds, pipeline=off),
        ),
        (
            "search of recall's kinds (turn, daily_summary), forgetting on",
            lambda q: memory.engine.search(q, "u", k=5, kinds=kinds, pipeline=on),
        ),
        ("recall (library defaults: reinforce, context)", lambda q: memory.recall(q, Scope("u"))),
    ):
        for i in range(10):  # warm up
            run(f"{topics[i % 8]} item {i}")
        samples = []
        for i in range(queries):
            query = f"what about {topics[i % 8]} and item {i * 37 % rows}"
            began = time.perf_counter()
            run(query)
            samples.append((time.perf_counter() - began) * 1000)
        samples.sort()
        out[label] = {
            "p50_ms": statistics.median(samples),
            "p95_ms": samples[int(0.95 * len(samples)) - 1],
            "mean_ms": statistics.fmean(samples),
        }
    memory.close()
    return out


# ----------------------------------------------------------------------------- report
def markdown(results: dict[str, Any]) -> str:
    """The BENCHMARKS.md tables."""
    lines: list[str] = []
    if "machine" in results:
        m = results["machine"]
        lines += [
            f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram']}, "
            f"load {m['load_avg_1min_at_start']} at start; code {m['code']}; "
            f"Python {m['python']}.",
            "",
        ]
    ing = results["ingest"]
    lines += [
        f"Ingest: {ing['users']} users x {ing['days']} days, {ing['turns']} turns in "
        f"{ing['seconds']:.2f} s ({ing['turns_per_s']:.0f} turns/s); "
        f"{ing['llm_calls']} summary calls, {ing['llm_tokens']} tokens; "
        f"pending after: {ing['pending_after']}, failures: {ing['failures'] or 0}.",
        "",
        "Records per user: "
        + ", ".join(f"{k} {v:.1f}" for k, v in ing["records_per_user"].items()),
        "",
        "| day | summary LLM calls | tokens |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {d['day']} | {d['llm_calls']} | {d['llm_tokens']} |" for d in ing["per_day"]]
    if "locomo" in results:
        loc = results["locomo"]
        variants = [k for k in loc if k not in ("embedder", "conversations")]
        categories = list(loc[variants[0]]["categories"])
        lines += [
            "",
            f"LoCoMo dev ({loc['conversations']} conversations, embedder {loc['embedder']}), "
            "recall@5 / recall@10 of evidence, now = day after the last session:",
            "",
            "| pipeline | overall R@5 | R@10 | "
            + " | ".join(f"{c} R@10" for c in categories)
            + " |",
            "| --- | ---: | ---: | " + " | ".join("---:" for _ in categories) + " |",
        ]
        for v in variants:
            row = loc[v]
            cells = [f"{row['categories'][c]['R@10']:.3f}" for c in categories]
            lines.append(
                f"| {v} | {row['overall']['R@5']:.3f} | {row['overall']['R@10']:.3f} | "
                + " | ".join(cells)
                + " |"
            )
    lat = results["latency"]
    lines += [
        "",
        f"Latency over {lat['records']} turn records of one user ({lat['queries']} queries, "
        "hashing embedder, in memory):",
        "",
        "| call | p50 ms | p95 ms |",
        "| --- | ---: | ---: |",
    ]
    for label, row in lat.items():
        if isinstance(row, dict):
            lines.append(f"| {label} | {row['p50_ms']:.1f} | {row['p95_ms']:.1f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the three measurements and print Markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    data = datasets_dir()
    parser.add_argument("--memorybank", type=Path, default=data / "memorybank/memory_bank_en.json")
    parser.add_argument("--locomo", type=Path, default=data / "locomo/locomo_dev.json")
    parser.add_argument("--minilm", action="store_true", help="MiniLM for ingest and LoCoMo")
    parser.add_argument("--skip-locomo", action="store_true")
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument(
        "--json", type=Path, default=None, help="default: out/memorybank_bench*.json"
    )
    args = parser.parse_args(argv)
    embedder: Embedder = HashingEmbedder()
    if args.minilm:
        from memories_core.embedders import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder()
    from machine_info import machine

    results: dict[str, Any] = {"machine": machine(), "ingest": ingest(args.memorybank, embedder)}
    if not args.skip_locomo:
        results["locomo"] = locomo(args.locomo, args.minilm)
    results["latency"] = latency(args.rows)
    stem = "memorybank_bench_minilm" if args.minilm else "memorybank_bench"
    target = args.json or OUT / f"{stem}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(results, indent=2, default=str))
    target.with_suffix(".md").write_text(markdown(results) + "\n")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
