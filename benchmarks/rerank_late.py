"""Second-stage reranking on LoCoMo dev: late interaction vs cheaper cross-encoder settings.

Setting (as ``locomo_retrieval.py``'s headline): every raw turn saved turn by turn without
session ids into the in-memory reference backend, turns as ``speaker: text [shares
<caption>]``, the library's default pipeline (MiniLM, lexical 0.65, context spreading,
temporal boost); ``--first-stage best`` uses the strongest LLM-free first stage instead
(bge-small ``OnnxEmbedder``, lexical 0.5, LoCoMo observations as search keys, key fusion
max). The top 30 of each question's ranking are re-scored:

* late interaction (:mod:`memories_core.retrieval.late_interaction`): the bundled
  answerai-colbert-small-v1 INT8 ONNX, MaxSim over L2-normalised 384-dim hidden states,
  with and without ColBERT's ``[Q]``/``[D]`` markers and query ``[MASK]`` augmentation,
  each turn alone or after the turn before it; every question with evidence;
* the cross-encoder (:mod:`memories_core.retrieval.cross_encoder`), context pairs, at 64
  and 96 word pieces, on every third question (``--ce-every``; it is the slow one).

Scores are cached under ``benchmarks/out/cache``. Each family's knobs (variant, candidates
10/20/30, weight) are chosen by leave-one-conversation-out cross-validation (best mean of
R@5 and R@10 on four conversations, scored on the fifth); held-out metrics pool every
question as scored by the fold that held its conversation out. ``--timing-questions N``
times ``Pipeline.run`` live per setting (wall p50 and CPU mean per query; for late
interaction cold = a fresh cache, warm = every candidate already encoded).

    python benchmarks/rerank_late.py --data ../shared/datasets/locomo/locomo_dev.json
    python benchmarks/rerank_late.py --first-stage best --no-ce
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_retrieval as lr
from machine_info import command_line
from tqdm import tqdm

from memories_core.evaluation import CATEGORY_NAMES, load_locomo
from memories_core.retrieval import Pipeline, RecallRequest
from memories_core.retrieval.cross_encoder import OnnxCrossEncoder, cross_encoder_reranker
from memories_core.retrieval.keys import KeyedBackend
from memories_core.retrieval.late_interaction import (
    LateInteractionReranker,
    OnnxLateInteractionEncoder,
    TokenVectorCache,
    maxsim,
)

HEAD = 30
CANDIDATES = (10, 20, 30)
WEIGHTS = (0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
#: Late-interaction encoder variants: (markers, query augmentation).
LATE_VARIANTS = ((False, False), (True, False), (True, True))
CE_LENGTHS = (64, 96)
METRICS = ("R@5", "R@10", "S@10")
#: What each fold maximises (the mean of these metrics on the training conversations).
OBJECTIVE: tuple[str, ...] = ("R@5", "R@10")


def unit(values: Sequence[float]) -> npt.NDArray[np.float64]:
    array = np.asarray(values, dtype=np.float64)
    span = float(array.max() - array.min()) if len(array) else 0.0
    return (array - array.min()) / span if span > 0 else np.ones_like(array)


def first_stage(args: argparse.Namespace, conversations: Sequence[Any]) -> dict[str, Any]:
    """Per question: the first stage's top 50 and fused scores; turn and previous texts."""
    cache = args.out / "cache" / f"rerank_late_stage1_{args.first_stage}.pkl"
    if cache.exists():
        loaded: dict[str, Any] = pickle.loads(cache.read_bytes())
        return loaded
    if args.first_stage == "best":
        from memories_core.embedders.onnx import OnnxEmbedder

        embedder = lr.CachedEmbedder(OnnxEmbedder(), args.out / "cache")
        keys = lr.observation_keys(args.data)
        config = replace(lr.library_default(), lexical=0.5)
    else:
        from memories_core.embedders import SentenceTransformerEmbedder

        embedder = lr.CachedEmbedder(SentenceTransformerEmbedder(), args.out / "cache")
        keys = {}
        config = lr.library_default()
    harness = lr.Harness(conversations, embedder, keys, mapping="caption")
    with_keys = bool(keys)
    items = harness.first_stage("no session ids", with_keys, config)
    text = {
        c.sample_id: {t.dia_id: lr.render(t, "caption") for t in c.turns} for c in conversations
    }
    previous = lr.previous_turns(conversations, "caption")
    rows = []
    rerankers = config.rerankers()
    for sample_id, qa, ranked, ctx in tqdm(items, desc="first stage"):
        ids, fused = lr.reranked_top(ranked, ctx, rerankers)
        rows.append(
            {
                "sid": sample_id,
                "cat": qa.category,
                "ev": qa.evidence,
                "q": qa.question,
                "ids": ids,
                "fused": [fused[i] for i in ids],
            }
        )
    embedder.save()
    out = {"rows": rows, "text": text, "prev": previous, "config": config.label()}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_bytes(pickle.dumps(out))
    return out


def pair_text(stage: dict[str, Any], sid: str, item: str, context: bool) -> str:
    """The text a candidate is scored with (the rerankers' ``context`` rule on LoCoMo)."""
    own: str = stage["text"][sid][item]
    before = stage["prev"].get((sid, item)) if context else None
    return f"{before} {own}" if before else own


def late_scores(args: argparse.Namespace, stage: dict[str, Any]) -> dict[str, list[list[float]]]:
    """MaxSim of the top 30 per question, per (markers, augment, context) variant."""
    suffix = "" if HEAD == 30 else f"_{HEAD}"
    cache = args.out / "cache" / f"rerank_late_scores_{args.first_stage}{suffix}.pkl"
    found: dict[str, list[list[float]]] = pickle.loads(cache.read_bytes()) if cache.exists() else {}
    rows = stage["rows"]
    for markers, augment in args.late_variants:
        encoder = OnnxLateInteractionEncoder(markers=markers, augment=augment, threads=1)
        docs: dict[str, npt.NDArray[np.float32]] = {}
        for context in (False, True):
            key = f"markers={markers} augment={augment} context={context}"
            if key in found:
                continue
            values = []
            for row in tqdm(rows, desc=key):
                query = encoder.encode_query(row["q"])
                scores = []
                for item in row["ids"][:HEAD]:
                    text = pair_text(stage, row["sid"], item, context)
                    if text not in docs:
                        docs[text] = encoder.encode_document(text).astype(np.float16)
                    scores.append(maxsim(query, docs[text]))
                values.append(scores)
            found[key] = values
            cache.write_bytes(pickle.dumps(found))
    return found


def ce_scores(args: argparse.Namespace, stage: dict[str, Any]) -> dict[str, dict[int, list[float]]]:
    """Cross-encoder logits of the top 30 (context pairs) per sampled question, per length."""
    cache = args.out / "cache" / f"rerank_late_ce_{args.first_stage}.pkl"
    found: dict[str, dict[int, list[float]]] = (
        pickle.loads(cache.read_bytes()) if cache.exists() else {}
    )
    rows = stage["rows"]
    for length in CE_LENGTHS:
        key = f"context, {length} pieces"
        scorer = OnnxCrossEncoder(max_length=length, threads=1)
        done = found.setdefault(key, {})
        todo = [n for n in range(0, len(rows), args.ce_every) if n not in done]
        for count, n in enumerate(tqdm(todo, desc=key)):
            row = rows[n]
            texts = [pair_text(stage, row["sid"], i, True) for i in row["ids"][:HEAD]]
            done[n] = scorer(row["q"], texts)
            if count % 50 == 49:
                cache.write_bytes(pickle.dumps(found))
        cache.write_bytes(pickle.dumps(found))
    return found


Cell = tuple[str, int, float]


def blended_rows(
    rows: Sequence[dict[str, Any]],
    scores: dict[str, Any],
    cell: Cell,
    subset: Sequence[int],
) -> list[tuple[str, int, dict[str, float]]]:
    """Scored questions (conversation, category, metrics) for one grid cell."""
    variant, candidates, weight = cell
    out = []
    for n in subset:
        row = rows[n]
        ids = row["ids"]
        head = ids[:candidates]
        if weight > 0:
            mix = weight * unit(scores[variant][n][:candidates]) + (1 - weight) * unit(
                row["fused"][:candidates]
            )
            order = sorted(range(len(head)), key=lambda i: (-mix[i], i))
            ranked = [head[i] for i in order] + ids[candidates:]
        else:
            ranked = ids
        out.append((row["sid"], row["cat"], lr.score_question(ranked, row["ev"])))
    return out


def mean(rows: Sequence[tuple[str, int, dict[str, float]]], convs: set[str]) -> dict[str, float]:
    part = [r[2] for r in rows if r[0] in convs]
    return {m: statistics.fmean(p[m] for p in part) for m in METRICS}


def by_category(rows: Sequence[tuple[str, int, dict[str, float]]]) -> dict[str, dict[str, float]]:
    groups: dict[int, list[dict[str, float]]] = defaultdict(list)
    for _, category, metrics in rows:
        groups[category].append(metrics)
    return {
        CATEGORY_NAMES.get(c, str(c)): {m: statistics.fmean(p[m] for p in part) for m in METRICS}
        | {"n": len(part)}
        for c, part in sorted(groups.items())
    }


def cross_validate(
    rows: Sequence[dict[str, Any]],
    scores: dict[str, Any],
    variants: Sequence[str],
    subset: list[int],
) -> dict[str, Any]:
    """LOCO CV over variant x candidates x weight; the cells' full-sample table too."""
    grid: list[Cell] = [(v, c, w) for v in variants for c in CANDIDATES for w in WEIGHTS]
    scored = {cell: blended_rows(rows, scores, cell, subset) for cell in grid}
    base = blended_rows(rows, scores, (variants[0], HEAD, 0.0), subset)
    convs = sorted({rows[n]["sid"] for n in subset})
    everything = set(convs)
    folds: dict[str, Any] = {}
    counts: Counter[str] = Counter()
    held_rows: list[tuple[str, int, dict[str, float]]] = []
    for fold in convs:
        train = everything - {fold}
        best = max(grid, key=lambda cell: sum(mean(scored[cell], train)[m] for m in OBJECTIVE))
        counts[f"{best[0]}, {best[1]} candidates, weight {best[2]}"] += 1
        held_rows += [r for r in scored[best] if r[0] == fold]
        folds[fold] = {
            "chosen": best,
            "held_out": mean(scored[best], {fold}),
            "first_stage": mean(base, {fold}),
        }
    gains = {
        m: [folds[f]["held_out"][m] - folds[f]["first_stage"][m] for f in convs] for m in METRICS
    }
    return {
        "questions": len(subset),
        "first_stage": mean(base, everything),
        "first_stage_categories": by_category(base),
        "cells": {f"{v} | {c} | {w}": mean(r, everything) for (v, c, w), r in scored.items()},
        "cell_categories": {f"{v} | {c} | {w}": by_category(r) for (v, c, w), r in scored.items()},
        "held_out": mean(held_rows, everything),
        "held_out_categories": by_category(held_rows),
        "chosen": dict(counts),
        "folds": folds,
        "gains": gains,
    }


def timing(
    args: argparse.Namespace, conversations: Sequence[Any], stage: dict[str, Any]
) -> list[dict[str, Any]]:
    """Live ``Pipeline.run`` cost per query for each setting (in-memory backend, k=10)."""
    from memories_core.embedders import SentenceTransformerEmbedder

    embedder = lr.CachedEmbedder(SentenceTransformerEmbedder(), args.out / "cache")
    keys = lr.observation_keys(args.data) if args.first_stage == "best" else {}
    if args.first_stage == "best":
        from memories_core.embedders.onnx import OnnxEmbedder

        embedder = lr.CachedEmbedder(OnnxEmbedder(), args.out / "cache")
    backends = {
        c.sample_id: lr.build_backend(c, embedder, "no session ids", keys.get(c.sample_id, []))
        for c in conversations
    }
    if args.live_query_embedding:
        # Documents keep their cached vectors; every query is embedded by the real model.
        for backend in backends.values():
            backend.embedder = embedder.inner
    config = lr.library_default()
    if args.first_stage == "best":
        config = replace(config, lexical=0.5)
    from memories_core.retrieval import DenseSource, LexicalSource

    base = Pipeline(
        sources=(
            DenseSource(weight=round(1 - config.lexical, 2)),
            LexicalSource(weight=config.lexical),
        ),
        rerankers=config.rerankers(),
    )
    rows = stage["rows"]
    step = max(1, len(rows) // args.timing_questions)
    sample = rows[::step][: args.timing_questions]
    times = {c.sample_id: lr.question_time(c) for c in conversations}

    def backend_of(sid: str) -> Any:
        inner = backends[sid]
        return KeyedBackend(inner) if keys else inner

    late = OnnxLateInteractionEncoder(markers=args.late_markers, augment=args.late_augment)
    settings: list[tuple[str, Callable[[], Pipeline], bool]] = [
        ("first stage only", lambda: base, False)
    ]
    for candidates in () if args.no_late_timing else (10, 20, 30):
        for warm in (False, True):
            settings.append(
                (
                    f"late interaction, {candidates} candidates, {('cold', 'warm')[warm]} cache",
                    lambda c=candidates: replace(
                        base,
                        rerankers=(
                            *base.rerankers,
                            LateInteractionReranker(late, candidates=c, cache=TokenVectorCache()),
                        ),
                    ),
                    warm,
                )
            )
    for length, candidates, threads in args.ce_timing:
        settings.append(
            (
                f"cross-encoder, {candidates} x {length} pieces, {threads} thread(s)",
                lambda n=length, c=candidates, t=threads: replace(
                    base,
                    rerankers=(
                        *base.rerankers,
                        cross_encoder_reranker(candidates=c, max_length=n, threads=t),
                    ),
                ),
                False,
            )
        )
    results = []
    for label, build, warm in settings:
        pipeline = build()
        # Load the models outside the timed loop (first call), as a running app would have.
        warmup = RecallRequest(
            "warm up", user_id=sample[0]["sid"], k=10, now=times[sample[0]["sid"]]
        )
        pipeline.run(warmup, backend_of(sample[0]["sid"]))
        if warm:
            for row in sample:
                request = RecallRequest(row["q"], user_id=row["sid"], k=10, now=times[row["sid"]])
                pipeline.run(request, backend_of(row["sid"]))
        wall, cpu = [], []
        for row in sample:
            request = RecallRequest(row["q"], user_id=row["sid"], k=10, now=times[row["sid"]])
            t0, c0 = time.perf_counter(), time.process_time()
            pipeline.run(request, backend_of(row["sid"]))
            cpu.append(1000 * (time.process_time() - c0))
            wall.append(1000 * (time.perf_counter() - t0))
        cache_bytes = None
        for stage_ in pipeline.rerankers:
            if isinstance(stage_, LateInteractionReranker):
                cache_bytes = stage_.cache.nbytes / max(1, len(stage_.cache))
        results.append(
            {
                "label": label,
                "wall_p50_ms": round(statistics.median(wall), 1),
                "cpu_p50_ms": round(statistics.median(cpu), 1),
                "cpu_mean_ms": round(statistics.fmean(cpu), 1),
                "questions": len(wall),
                "bytes_per_cached_record": round(cache_bytes) if cache_bytes else None,
                "load": lr.machine().split("load average ")[-1].split(")")[0],
            }
        )
        print(results[-1], flush=True)
    return results


def parse_ce_timing(text: str) -> list[tuple[int, int, int]]:
    out = []
    for part in text.split(","):
        if part.strip():
            length, candidates, threads = (int(x) for x in part.split("x"))
            out.append((length, candidates, threads))
    return out


def fmt(metrics: dict[str, float]) -> str:
    return " / ".join(f"{metrics[m]:.3f}" for m in METRICS)


def report_lines(name: str, cv: dict[str, Any]) -> list[str]:
    held, base = cv["held_out"], cv["first_stage"]
    lines = [
        f"### {name} ({cv['questions']} questions)",
        "",
        f"First stage R@5 / R@10 / session R@10: {fmt(base)}. LOCO CV held-out: {fmt(held)}; "
        "chosen " + "; ".join(f"{k} ({v} folds)" for k, v in cv["chosen"].items()) + "; gain per "
        "fold "
        + ", ".join(f"{m} {min(cv['gains'][m]):+.3f}..{max(cv['gains'][m]):+.3f}" for m in METRICS),
        "",
        "| variant | candidates | weight | R@5 | R@10 | session R@10 |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for cell, value in cv["cells"].items():
        variant, candidates, weight = cell.split(" | ")
        if weight in ("0.3", "0.5", "0.7", "1.0"):
            lines.append(
                f"| {variant} | {candidates} | {weight} | {value['R@5']:.3f} | "
                f"{value['R@10']:.3f} | {value['S@10']:.3f} |"
            )
    lines += [
        "",
        "| category (n) | first stage R@5 / R@10 / S@10 | held-out R@5 / R@10 / S@10 |",
        "| --- | --- | --- |",
    ]
    for category, value in cv["held_out_categories"].items():
        first = cv["first_stage_categories"][category]
        lines.append(f"| {category} ({value['n']}) | {fmt(first)} | {fmt(value)} |")
    return [*lines, ""]


def parse_objective(text: str) -> list[str]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in parts if part not in METRICS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"metrics must be among {', '.join(METRICS)}: {text!r}")
    return parts


def main(argv: Sequence[str] | None = None) -> int:
    global HEAD, CANDIDATES, OBJECTIVE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=lr.DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=lr.OUT)
    parser.add_argument("--first-stage", choices=("default", "best"), default="default")
    parser.add_argument("--ce-every", type=int, default=3)
    parser.add_argument("--no-ce", action="store_true")
    parser.add_argument("--no-late", action="store_true")
    parser.add_argument("--timing-questions", type=int, default=0)
    parser.add_argument("--no-late-timing", action="store_true")
    parser.add_argument(
        "--live-query-embedding",
        action="store_true",
        help="time the query's embedding too (otherwise query vectors come from the cache)",
    )
    parser.add_argument("--name", default="", help="suffix of the output files")
    parser.add_argument(
        "--objective",
        type=parse_objective,
        default=list(OBJECTIVE),
        help="metrics each CV fold maximises, e.g. R@5,R@10,S@10",
    )
    parser.add_argument(
        "--candidates",
        type=lambda text: tuple(int(part) for part in text.split(",")),
        default=CANDIDATES,
        help="candidate counts in the CV grid, e.g. 10,20,30,40,50 (the largest is re-scored)",
    )
    parser.add_argument(
        "--late-variants",
        type=lambda text: [
            (m == "1", a == "1") for m, a in (part.split("/") for part in text.split(","))
        ],
        default=list(LATE_VARIANTS),
        help="late-interaction encoder variants scored: MARKERS/AUGMENT (0 or 1),...",
    )
    parser.add_argument("--late-markers", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--late-augment", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument(
        "--ce-timing",
        type=parse_ce_timing,
        default=parse_ce_timing("96x30x1,64x30x1,64x20x1,64x10x1,64x20x2"),
        help="cross-encoder settings timed: LENGTHxCANDIDATESxTHREADS,...",
    )
    args = parser.parse_args(argv)
    OBJECTIVE = tuple(args.objective)
    CANDIDATES = tuple(sorted(args.candidates))
    HEAD = max(CANDIDATES)

    conversations = load_locomo(args.data)
    stage = first_stage(args, conversations)
    rows = stage["rows"]
    report: dict[str, Any] = {"machine": lr.machine(), "first_stage": stage["config"]}
    lines = [f"## Second-stage reranking, first stage `{args.first_stage}` ({stage['config']})", ""]
    if not args.no_late:
        late = late_scores(args, stage)
        everything = list(range(len(rows)))
        report["late"] = cross_validate(rows, late, list(late), everything)
        lines += report_lines("Late interaction, every question", report["late"])
        ce_sample = list(range(0, len(rows), args.ce_every))
        report["late_sample"] = cross_validate(rows, late, list(late), ce_sample)
        lines += report_lines("Late interaction, the cross-encoder's sample", report["late_sample"])
    if not args.no_ce:
        ce = ce_scores(args, stage)
        subset = sorted(set.intersection(*(set(v) for v in ce.values())))
        report["ce"] = cross_validate(rows, ce, list(ce), subset)
        lines += report_lines("Cross-encoder (context pairs), every third question", report["ce"])
    if args.timing_questions:
        report["timing"] = timing(args, conversations, stage)
        lines += [
            "| setting | wall p50 ms | CPU p50 ms | CPU mean ms | bytes per cached record | "
            "questions | load |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {t['label']} | {t['wall_p50_ms']} | {t['cpu_p50_ms']} | {t['cpu_mean_ms']} | "
            f"{t['bytes_per_cached_record'] or '-'} | {t['questions']} | {t['load']} |"
            for t in report["timing"]
        ]
    command = command_line(
        "benchmarks/rerank_late.py", list(argv if argv is not None else sys.argv[1:])
    )
    lines[1:1] = ["", f"- machine: {report['machine']}", f"- command: `{command.strip()}`"]
    stem = f"rerank_late_{args.first_stage}{args.name}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2, default=str), "utf-8")
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
