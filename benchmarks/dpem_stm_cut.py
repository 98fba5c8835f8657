"""DPeM short-term lookup: a relevance cut for the closest-match retriever, by cross-validation.

DPeM looks STM up by closest match (Zhang et al., 2023, "DPeM Mechanism": Levenshtein distance
for short-term memory). Without a cut the lookup returns its closest items for every query,
related or not. This script measures hits with and without a cut on a LoCoMo stand-in:

* STM items: LoCoMo's ``observation`` facts (short typed facts like DPeM's knowledge items),
  each citing the turn(s) it comes from;
* queries: LoCoMo questions with evidence; an item is relevant when it cites an evidence turn;
* per question, one STM of ``--capacity`` items (DPeM's default STM capacity, 64) drawn from
  the same conversation: a *positive* STM holds the relevant items plus random others, a
  *negative* STM (every other question) holds none of them, so the right lookup is empty;
* the lookup is the library's :meth:`DualProcessMemory.stm_lookup` scorer (rapidfuzz, same
  text processing) with ``k`` = 5; hits below the cut are dropped.

Micro precision and recall of the hits, F1, and the share of negative STMs whose lookup is
empty. The cut is chosen by leave-one-conversation-out cross-validation (grid below, best F1
on the other conversations, scored on the held-out one), for both STM scorers.

    python benchmarks/dpem_stm_cut.py [--capacity 64] [--k 5] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent))

from locomo_views import DEFAULT_DATA, Conversation, load
from machine_info import machine

from memories_core import DualProcessMemory, Scope
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.dpem import KNOWLEDGE_KIND, STM
from memories_core.prompts.dpem import dpem_reply
from memories_core.types import MemoryRecord, new_id

OUT = Path(__file__).resolve().parent / "out"
GRID = tuple(round(0.05 * i, 2) for i in range(0, 17))  # 0.00 .. 0.80


def cases(conv: Conversation, capacity: int, rng: random.Random) -> list[dict[str, Any]]:
    """One STM per question: (question, STM texts, relevant flags)."""
    obs = [(text, set(ids)) for _s, text, ids in conv.observations]
    out = []
    for n, qa in enumerate(q for q in conv.base.qa if q.evidence):
        evidence = set(qa.evidence)
        relevant = [t for t, ids in obs if ids & evidence]
        others = [t for t, ids in obs if not ids & evidence]
        if not relevant or len(others) < capacity:
            continue
        positive = n % 2 == 0
        chosen = relevant[:capacity] if positive else []
        filler = rng.sample(others, capacity - len(chosen))
        items = [(t, True) for t in chosen] + [(t, False) for t in filler]
        rng.shuffle(items)
        out.append({"question": qa.question, "items": items, "positive": positive})
    return out


def score_cases(
    memory: DualProcessMemory, user: str, batch: Sequence[dict[str, Any]], k: int
) -> list[dict[str, Any]]:
    """Run the library's STM lookup on every case; keep the top-k (text, score, relevant)."""
    scored = []
    for case in batch:
        memory.engine.clear(Scope(user))
        records = [
            MemoryRecord(new_id(), user, KNOWLEDGE_KIND, text, memory.clock.now())
            for text, _ in case["items"]
        ]
        memory.engine.add_records(
            records, index=False, state={r.id: {"tier": STM} for r in records}
        )
        relevant = {text for text, rel in case["items"] if rel}
        hits = memory.stm_lookup(case["question"], user, k=k)
        scored.append(
            {
                "hits": [(h.score, h.record.text in relevant) for h in hits],
                "relevant": len(relevant),
                "positive": case["positive"],
            }
        )
    return scored


def measure(scored: Sequence[dict[str, Any]], cut: float) -> dict[str, float]:
    hits = found = wanted = 0
    empty_negatives = negatives = 0
    for case in scored:
        kept = [rel for score, rel in case["hits"] if score >= cut]
        hits += len(kept)
        found += sum(kept)
        wanted += case["relevant"]
        if not case["positive"]:
            negatives += 1
            empty_negatives += not kept
    precision = found / hits if hits else 0.0
    recall = found / wanted if wanted else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {
        "precision": round(precision, 3),
        "recall": round(recall, 3),
        "f1": round(f1, 3),
        "empty_on_negatives": round(empty_negatives / negatives, 3) if negatives else 0.0,
        "hits_per_query": round(hits / len(scored), 2) if scored else 0.0,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--capacity", type=int, default=64)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    convs = load(args.data)
    report: dict[str, Any] = {
        "machine": machine(),
        "command": "python benchmarks/dpem_stm_cut.py " + " ".join(argv or sys.argv[1:]),
        "grid": GRID,
    }
    scorers: tuple[Literal["levenshtein", "partial"], ...] = ("levenshtein", "partial")
    for scorer in scorers:
        memory = DualProcessMemory(
            llm=ScriptedLLM(default=dpem_reply),
            embedder=HashingEmbedder(),
            stm_scorer=scorer,
            stm_cut=0.0,
        )
        per_conv = {}
        for conv in convs:
            rng = random.Random(f"{args.seed}:{conv.base.sample_id}")
            batch = cases(conv, args.capacity, rng)
            per_conv[conv.base.sample_id] = score_cases(memory, "u", batch, args.k)
        folds: list[dict[str, Any]] = []
        for held in per_conv:
            train = [c for name, cases_ in per_conv.items() if name != held for c in cases_]
            best = max(GRID, key=lambda cut: (measure(train, cut)["f1"], -cut))
            folds.append(
                {
                    "held_out": held,
                    "cut": best,
                    "with_cut": measure(per_conv[held], best),
                    "no_cut": measure(per_conv[held], 0.0),
                }
            )
        everything = [c for cases_ in per_conv.values() for c in cases_]
        report[scorer] = {
            "questions": len(everything),
            "folds": folds,
            "chosen_cuts": [f["cut"] for f in folds],
            "median_cut": statistics.median(f["cut"] for f in folds),
            "held_out_mean": {
                key: {
                    metric: round(statistics.mean(f[key][metric] for f in folds), 3)
                    for metric in folds[0][key]
                }
                for key in ("no_cut", "with_cut")
            },
            "curve": {str(cut): measure(everything, cut) for cut in GRID},
        }
        print(scorer, json.dumps(report[scorer]["held_out_mean"]), report[scorer]["chosen_cuts"])
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "dpem_stm_cut.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
