"""Cross-encoder reranking with context pairs on LoCoMo dev: why the gain was small, and
what the blended reranker's defaults are chosen from.

Setting: every raw turn saved turn by turn without session ids into the in-memory reference
backend, the library's default pipeline (``locomo_retrieval.Harness``, MiniLM, turns as
``speaker: text``), every third question with evidence (a fixed sample: 333 of 997; the
model is slow on the shared machine). The top ``--candidates`` of each question's default
ranking are scored by the bundled ms-marco-MiniLM-L-12-v2 INT8 ONNX cross-encoder at
``--max-length`` word pieces, twice: the turn alone, and the turn after the turn before it
(``context``, as :class:`~memories_core.retrieval.cross_encoder.BlendedCrossEncoderReranker`
builds pairs with ``context=True``). Scores are cached under ``benchmarks/out/cache``.

The grid (pair text x candidates x weight) is then scored with the reranker's blend
(min-max of both scores over the block, ``weight`` on the cross-encoder) and the defaults
are chosen by leave-one-conversation-out cross-validation (best R@5 + R@10 on four
conversations, scored on the fifth). ``--timing-questions N`` also times the default
pipeline with and without ``cross_encoder_reranker()`` live (wall p50, CPU mean).

    python benchmarks/rerank_context.py --data ../shared/datasets/locomo/locomo_dev.json
    python benchmarks/rerank_context.py --timing-questions 100      # + live cost
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_retrieval as lr
from machine_info import command_line, machine_line
from tqdm import tqdm

from memories_core.evaluation import load_locomo
from memories_core.retrieval import Pipeline, RecallRequest
from memories_core.retrieval.cross_encoder import (
    OnnxCrossEncoder,
    cross_encoder_reranker,
    pair_text,
)

FIELDS = ("alone", "context")
CANDIDATES = (10, 20, 30)
WEIGHTS = (0.2, 0.3, 0.4, 0.5, 0.7, 1.0)


def unit(values: Sequence[float]) -> npt.NDArray[np.float64]:
    array = np.asarray(values, dtype=np.float64)
    span = float(array.max() - array.min()) if len(array) else 0.0
    return (array - array.min()) / span if span > 0 else np.ones_like(array)


def score_questions(
    args: argparse.Namespace, harness: lr.Harness, conversations: Sequence[Any]
) -> list[dict[str, Any]]:
    """Per sampled question: default ranking, fused scores, cross-encoder scores (cached)."""
    cache = args.out / "cache" / f"rerank_context_{args.max_length}_{args.candidates}.json"
    if cache.exists():
        cached: list[dict[str, Any]] = json.loads(cache.read_text())
        return cached
    text = {c.sample_id: {t.dia_id: t.render() for t in c.turns} for c in conversations}
    previous = lr.previous_turns(conversations, "text")
    scorer = OnnxCrossEncoder(max_length=args.max_length, threads=2)
    config = lr.library_default()
    items = harness.first_stage("no session ids", False, config)
    items = items[:: args.every]
    rerankers = config.rerankers()
    rows = []
    for sample_id, qa, ranked, ctx in tqdm(items, desc="cross-encoder"):
        ids, fused = lr.reranked_top(ranked, ctx, rerankers)
        head = ids[: args.candidates]
        alone = scorer(qa.question, [text[sample_id][i] for i in head])
        paired = scorer(
            qa.question,
            [pair_text(previous.get((sample_id, i)) or None, text[sample_id][i]) for i in head],
        )
        rows.append(
            {
                "sid": sample_id,
                "cat": qa.category,
                "ev": qa.evidence,
                "ids": ids,
                "fused": [fused[i] for i in ids],
                "alone": alone,
                "context": paired,
            }
        )
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(rows))
    return rows


Cell = tuple[str, int, float]


def evaluate(rows: Sequence[dict[str, Any]], cell: Cell, convs: set[str]) -> dict[str, float]:
    """Mean R@5 / R@10 / S@10 of the blend over the questions of ``convs``."""
    field, candidates, weight = cell
    out: dict[str, list[float]] = {"R@5": [], "R@10": [], "S@10": []}
    for row in rows:
        if row["sid"] not in convs:
            continue
        ids = row["ids"]
        head = ids[:candidates]
        mix = weight * unit(row[field][:candidates]) + (1 - weight) * unit(
            row["fused"][:candidates]
        )
        order = sorted(range(len(head)), key=lambda i: (-mix[i], i))
        ranked = [head[i] for i in order] + ids[candidates:]
        metrics = lr.score_question(ranked, row["ev"])
        for key in out:
            out[key].append(metrics[key])
    return {key: statistics.fmean(values) for key, values in out.items()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=lr.DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=lr.OUT)
    parser.add_argument("--max-length", type=int, default=96)
    parser.add_argument("--candidates", type=int, default=30)
    parser.add_argument("--every", type=int, default=3, help="score every n-th question")
    parser.add_argument("--timing-questions", type=int, default=0)
    args = parser.parse_args(argv)

    from memories_core.embedders import SentenceTransformerEmbedder

    conversations = load_locomo(args.data)
    embedder = lr.CachedEmbedder(SentenceTransformerEmbedder(), args.out / "cache")
    # The harness keeps the text-only mapping the cached scores were computed with.
    harness = lr.Harness(conversations, embedder, {}, mapping="text")
    started = time.perf_counter()
    rows = score_questions(args, harness, conversations)
    score_s = time.perf_counter() - started
    convs = sorted({row["sid"] for row in rows})
    everything = set(convs)
    grid: list[Cell] = [(f, c, w) for f in FIELDS for c in CANDIDATES for w in WEIGHTS]
    cells = {cell: evaluate(rows, cell, everything) for cell in grid}
    base = evaluate(rows, ("alone", args.candidates, 0.0), everything)
    per_fold: dict[str, Any] = {}
    counts: Counter[str] = Counter()
    sizes = Counter(row["sid"] for row in rows)
    for fold in convs:
        train = everything - {fold}
        best = max(
            grid,
            key=lambda cell: sum(evaluate(rows, cell, train)[m] for m in ("R@5", "R@10")),
        )
        counts[f"{best[0]}, {best[1]} candidates, weight {best[2]}"] += 1
        per_fold[fold] = {
            "chosen": best,
            "held_out": evaluate(rows, best, {fold}),
            "default_pipeline": evaluate(rows, ("alone", args.candidates, 0.0), {fold}),
        }
    held = {
        m: sum(per_fold[f]["held_out"][m] * sizes[f] for f in convs) / len(rows)
        for m in ("R@5", "R@10", "S@10")
    }
    gains = {
        m: [per_fold[f]["held_out"][m] - per_fold[f]["default_pipeline"][m] for f in convs]
        for m in ("R@5", "R@10", "S@10")
    }
    timing: list[dict[str, Any]] = []
    if args.timing_questions:
        base_pipeline = Pipeline()
        with_ce = replace(
            base_pipeline, rerankers=(*base_pipeline.rerankers, cross_encoder_reranker())
        )
        sample = harness.first_stage("no session ids", False, lr.library_default())
        sample = sample[:: max(1, len(sample) // args.timing_questions)][: args.timing_questions]
        for label, pipeline in (("default pipeline", base_pipeline), ("+ cross-encoder", with_ce)):
            wall, cpu = [], []
            for sample_id, qa, _, ctx in sample:
                request = RecallRequest(qa.question, user_id=sample_id, k=10, now=ctx.request.now)
                t0, c0 = time.perf_counter(), time.process_time()
                pipeline.run(request, ctx.backend)
                cpu.append(1000 * (time.process_time() - c0))
                wall.append(1000 * (time.perf_counter() - t0))
            timing.append(
                {
                    "label": label,
                    "wall_p50_ms": round(statistics.median(wall), 1),
                    "cpu_mean_ms": round(statistics.fmean(cpu), 1),
                    "questions": len(wall),
                }
            )
            print(timing[-1], flush=True)

    report = {
        "machine": machine_line(),
        "questions": len(rows),
        "max_length": args.max_length,
        "scoring_seconds": round(score_s, 1),
        "default_pipeline": base,
        "cells": {f"{f} | {c} | {w}": v for (f, c, w), v in cells.items()},
        "cv": {"held_out": held, "chosen": dict(counts), "folds": per_fold, "gains": gains},
        "timing": timing,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rerank_context.json").write_text(
        json.dumps(report, indent=2, default=str), encoding="utf-8"
    )
    command = command_line(
        "benchmarks/rerank_context.py", list(argv if argv is not None else sys.argv[1:])
    )
    lines = [
        "## Cross-encoder with context pairs (LoCoMo dev, every third question)",
        "",
        f"- {len(rows)} questions, pairs cut to {args.max_length} word pieces, "
        f"top {args.candidates} of the default pipeline re-scored; machine: {report['machine']}",
        f"- command: `{command.strip()}`",
        "",
        "| pair text | candidates | weight | R@5 | R@10 | session R@10 |",
        "| --- | --- | --- | --- | --- | --- |",
        f"| (default pipeline, no reranker) | - | - | {base['R@5']:.3f} | {base['R@10']:.3f} | "
        f"{base['S@10']:.3f} |",
    ]
    for (field, candidates, weight), value in cells.items():
        lines.append(
            f"| {field} | {candidates} | {weight} | {value['R@5']:.3f} | {value['R@10']:.3f} | "
            f"{value['S@10']:.3f} |"
        )
    lines += [
        "",
        "Leave-one-conversation-out: chosen "
        + "; ".join(f"{k} ({v} folds)" for k, v in counts.items())
        + "; held-out "
        + ", ".join(
            f"{m} {held[m]:.3f} (gain over the default pipeline per fold "
            f"{min(gains[m]):+.3f}..{max(gains[m]):+.3f})"
            for m in held
        ),
        "",
    ]
    if timing:
        lines += [
            "| pipeline | wall p50 ms | CPU mean ms | questions |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {t['label']} | {t['wall_p50_ms']} | {t['cpu_mean_ms']} | {t['questions']} |"
            for t in timing
        ]
    (args.out / "rerank_context.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
