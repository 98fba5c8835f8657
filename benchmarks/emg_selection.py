"""EMG-RAG memory selection on LoCoMo dev (Wang et al., 2024, §4.3), and retrieval latency.

Memories: every LoCoMo ``observation`` fact, with its ``dia_id``, loaded into one EMG per
conversation. Entities and relations come from the rule-based stand-in extractor
(``memories_core.prompts.emg.emg_reply``; no LLM offline). Required memories of a question:
the observations whose dia_id is in its ``evidence``. Split by conversation: the first
``--train`` conversations train the policy (warm start + REINFORCE with the offline
selection-F1 reward), the others are the test set.

Reported on the test questions: selection precision / recall / F1 of the trained policy, of
the untrained fallback (cosine threshold) and of fixed top-K (K = 1..10, the activation
ranking), and recall@k of the evidence. Then the latency of ``answer``'s retrieval step
(``EMGMemory.select``) at 1k and 10k memories per user (synthetic facts), without the LLM.

Run: ``python benchmarks/emg_selection.py [DATASETS]`` (default: ``../shared/datasets`` next to the
repository)
Writes ``benchmarks/out/emg_selection.{json,md,png}``; embeddings are cached under
``benchmarks/out/cache/``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from locomo_retrieval import CachedEmbedder
from machine_info import machine
from tqdm.auto import tqdm

from memories_core import FixedClock
from memories_core.embedders import SentenceTransformerEmbedder
from memories_core.mechanisms.emg import EMGMemory, TrainingExample
from memories_core.prompts.emg import EXTRACT, ExtractInput, parse_extract

OUT = Path(__file__).resolve().parent / "out"
NOW = datetime(2024, 1, 1, tzinfo=timezone.utc)


def extract(text: str) -> list[Any]:
    """The stand-in extractor's memories of one observation (one statement at least)."""
    inputs = ExtractInput(text, NOW)
    found = parse_extract(EXTRACT.stand_in(inputs), inputs)
    return found[:1]


def load(memory: EMGMemory, sample: dict[str, Any]) -> dict[str, str]:
    """Load a conversation's observations in one batch; returns memory id -> dia_ids."""
    user = sample["sample_id"]
    batch: list[Any] = []
    dias: list[str] = []
    for facts in sample["observation"].values():
        for _speaker, items in facts.items():
            for text, dia in items:
                found = extract(text)
                if found:
                    batch.append(found[0])
                    dias.append(dia if isinstance(dia, str) else ",".join(dia))
    edits = memory.add_memories(user, batch, at=NOW, edit=False)
    return {e.record_id: d for e, d in zip(edits, dias, strict=True) if e.record_id}


def examples(sample: dict[str, Any], ids: dict[str, str]) -> list[TrainingExample]:
    by_dia: dict[str, set[str]] = {}
    for rid, dias in ids.items():
        for dia in dias.split(","):
            by_dia.setdefault(dia.strip(), set()).add(rid)
    out = []
    for qa in sample["qa"]:
        evidence = [e.strip() for e in qa.get("evidence", []) for e in str(e).split(";")]
        required = frozenset(r for e in evidence for r in by_dia.get(e, ()))
        if required and qa.get("question"):
            out.append(
                TrainingExample(
                    sample["sample_id"], qa["question"], required, str(qa.get("answer"))
                )
            )
    return out


def prf(selected: list[str], required: frozenset[str]) -> tuple[float, float, float]:
    hits = len(set(selected) & required)
    p = hits / len(selected) if selected else 0.0
    r = hits / len(required)
    f = 2 * p * r / (p + r) if p + r else 0.0
    return p, r, f


def evaluate(memory: EMGMemory, tests: list[TrainingExample]) -> dict[str, Any]:
    from memories_core.mechanisms.emg import MEMORY_KIND

    rows: dict[str, list[tuple[float, float, float]]] = {}
    sizes: dict[str, list[int]] = {}
    recall_at: dict[int, list[float]] = {k: [] for k in (1, 3, 5, 10, 20)}
    trained = memory.policy()
    for ex in tqdm(tests, desc="evaluate"):
        ranked = [
            h.record.id
            for h in memory.engine.search(
                ex.question,
                ex.user_id,
                k=20,
                kinds=[MEMORY_KIND],
                now=NOW,
                pipeline=memory._activation_pipeline(),
            )
        ]
        for k in recall_at:
            recall_at[k].append(len(set(ranked[:k]) & ex.required) / len(ex.required))
        for k in range(1, 11):
            rows.setdefault(f"top-{k}", []).append(prf(ranked[:k], ex.required))
            sizes.setdefault(f"top-{k}", []).append(len(ranked[:k]))
        for name, policy in (("trained policy", trained), ("untrained fallback", None)):
            chosen = [
                h.record.id
                for h in memory.select(ex.question, ex.user_id, now=NOW, policy=policy).memories
            ]
            rows.setdefault(name, []).append(prf(chosen, ex.required))
            sizes.setdefault(name, []).append(len(chosen))
    table = {
        name: {
            "precision": statistics.mean(v[0] for v in vals),
            "recall": statistics.mean(v[1] for v in vals),
            "f1": statistics.mean(v[2] for v in vals),
            "mean_size": statistics.mean(sizes[name]),
        }
        for name, vals in rows.items()
    }
    return {
        "selection": table,
        "recall_at_k": {k: statistics.mean(v) for k, v in recall_at.items()},
        "questions": len(tests),
    }


def latency(embedder: Any, sizes: tuple[int, ...], questions: int = 20) -> dict[str, Any]:
    """Median / p90 time of ``select`` (answer's retrieval step) per memory count."""
    rng = random.Random(0)
    people = ["Anna", "Ben", "Carla", "Dev", "Elif", "Femi", "Gus", "Hana", "Ivo", "Jun"]
    places = ["Amsterdam", "Berlin", "Cairo", "Denver", "Oslo", "Lima", "Porto", "Seoul"]
    verbs = ["visited", "booked", "likes", "called", "met", "bought", "sold", "painted"]
    things = ["a blue bike", "the EK349 flight", "a new phone", "tickets", "a guitar", "a cake"]
    out: dict[str, Any] = {}
    for size in sizes:
        memory = EMGMemory(llm=_NoLLM(), embedder=embedder, clock=FixedClock(NOW))  # type: ignore[arg-type]
        facts = []
        for i in range(size):
            who, verb, what, where = (
                rng.choice(people),
                rng.choice(verbs),
                rng.choice(things),
                rng.choice(places),
            )
            facts.append(f"{who} {verb} {what} in {where} on day {i}.")
        for start in tqdm(range(0, size, 500), desc=f"load {size}"):
            batch = [m for text in facts[start : start + 500] for m in extract(text)]
            memory.add_memories("bench", batch, at=NOW, edit=False)
        qs = [
            f"What did {rng.choice(people)} do in {rng.choice(places)}?" for _ in range(questions)
        ]
        memory.select(qs[0], "bench", now=NOW)  # warm caches (embedder loaded)
        times = []
        for q in qs:
            start = time.perf_counter()
            memory.select(q, "bench", now=NOW)
            times.append(time.perf_counter() - start)
        times.sort()
        out[str(size)] = {
            "median_s": statistics.median(times),
            "p90_s": times[int(0.9 * (len(times) - 1))],
            "questions": questions,
        }
        memory.close()
    return out


class _NoLLM:
    """The selection never calls a model; any call is a bug in the benchmark."""

    name = "none"

    def generate(self, *args: Any, **kwargs: Any) -> str:
        raise AssertionError("selection must not call the LLM")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sel = result["selection"]
    ks = list(range(1, 11))
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(ks, [sel[f"top-{k}"]["f1"] for k in ks], "o-", label="fixed top-K F1")
    ax.plot(ks, [sel[f"top-{k}"]["precision"] for k in ks], ".:", label="fixed top-K precision")
    ax.plot(ks, [sel[f"top-{k}"]["recall"] for k in ks], ".:", label="fixed top-K recall")
    for name, style in (("trained policy", "r"), ("untrained fallback", "g")):
        row = sel[name]
        ax.scatter(
            [row["mean_size"]],
            [row["f1"]],
            c=style,
            marker="*",
            s=180,
            zorder=5,
            label=f"{name} F1 (mean size {row['mean_size']:.1f})",
        )
    ax.set_xlabel("memories selected (K, or mean selection size)")
    ax.set_ylabel("score")
    ax.set_title("EMG-RAG memory selection, LoCoMo dev test conversations")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "datasets",
        nargs="?",
        default=str(Path(__file__).resolve().parents[1] / ".." / "shared" / "datasets"),
    )
    parser.add_argument("--train", type=int, default=3, help="conversations used for training")
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--sizes", default="1000,10000")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)  # the machine has 2 cores; more threads only contend
    OUT.mkdir(parents=True, exist_ok=True)
    data = json.loads((Path(args.datasets) / "locomo" / "locomo_dev.json").read_text())
    embedder = CachedEmbedder(SentenceTransformerEmbedder(), OUT / "cache")
    memory = EMGMemory(llm=_NoLLM(), embedder=embedder, clock=FixedClock(NOW))  # type: ignore[arg-type]
    train: list[TrainingExample] = []
    test: list[TrainingExample] = []
    for i, sample in enumerate(tqdm(data, desc="load conversations")):
        ids = load(memory, sample)
        (train if i < args.train else test).extend(examples(sample, ids))
    embedder.save()
    started = time.perf_counter()
    report = memory.train_policy(train, episodes=args.episodes, now=NOW)
    train_s = time.perf_counter() - started
    result = evaluate(memory, test)
    embedder.save()
    result["training"] = {**report.__dict__, "questions": len(train), "seconds": train_s}
    result["threshold"] = memory.threshold
    result["latency"] = latency(embedder, tuple(int(s) for s in args.sizes.split(",")))
    embedder.save()
    result["machine"] = machine()
    (OUT / "emg_selection.json").write_text(json.dumps(result, indent=1, default=str))
    plot(result, OUT / "emg_selection.png")
    lines = ["| selector | precision | recall | F1 | mean size |", "|---|---|---|---|---|"]
    for name, row in result["selection"].items():
        lines.append(
            f"| {name} | {row['precision']:.3f} | {row['recall']:.3f} | {row['f1']:.3f} | "
            f"{row['mean_size']:.2f} |"
        )
    lines += ["", "| k | recall@k |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in result["recall_at_k"].items()]
    lines += ["", "| memories per user | median select (s) | p90 (s) |", "|---|---|---|"]
    lines += [
        f"| {n} | {v['median_s']:.3f} | {v['p90_s']:.3f} |" for n, v in result["latency"].items()
    ]
    text = "\n".join(lines)
    (OUT / "emg_selection.md").write_text(text + "\n")
    print(text)
    print(json.dumps(result["training"], default=str))


if __name__ == "__main__":
    main()
