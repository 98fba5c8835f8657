"""Second-stage reranking on LoCoMo dev: late interaction vs cheaper cross-encoder settings.

Setting (as ``locomo_retrieval.py``'s headline): every raw turn saved turn by turn without
session ids into the in-memory reference backend, turns as ``speaker: text [shares
<caption>]``, the library's default pipeline (MiniLM, lexical 0.65, context spreading,
temporal boost); ``--first-stage best`` uses the strongest LLM-free first stage instead
(bge-small ``OnnxEmbedder``, lexical 0.5, LoCoMo observations as search keys, key fusion
max). The top 30 of each question's ranking are re-scored:

* late interaction (:mod:`memories_core.retrieval.late_interaction`): the bundled
  answerai-colbert-small-v1 INT8 ONNX, MaxSim over its L2-normalised hidden states projected
  onto their first ``--late-dim`` principal directions (the library's default 128; 384: the
  hidden states as they are; ``fit_late_basis.py``), with and without ColBERT's
  ``[Q]``/``[D]`` markers and query ``[MASK]`` augmentation,
  each turn alone or after the turn before it; every question with evidence;
* the cross-encoder (:mod:`memories_core.retrieval.cross_encoder`), context pairs, at 64
  and 96 word pieces, on every third question (``--ce-every``; it is the slow one).

With ``--pools`` the late-interaction grid also scores the fused ranking down to each pool
and lets the pool's best join the head (``LateInteractionReranker.pool``); ``--depth``
sets the first stage's candidates per source so that the pool exists. Every metric is
scored on the first 50 results, what ``recall(k=50)`` returns.

Scores are cached under ``benchmarks/out/cache``. Each family's knobs (variant, candidates
10/20/30, pool, weight) are chosen by leave-one-conversation-out cross-validation (best
mean of ``--objective``, R@5 and R@10 unless told, on four conversations, scored on the
fifth); held-out metrics pool every question as scored by the fold that held its
conversation out. ``--chart`` draws saved runs' R@k curves beside the published anchors;
``--public`` adds rows measured through ``HistoryMemory.recall`` on the default Chroma
backend. ``--timing-questions N`` times ``Pipeline.run`` live per setting (wall p50 and CPU
mean per query; for late interaction cold = a fresh cache, warm = every record of a conversation
encoded by ``Pipeline.prefetch`` before its questions, whose cost per record is reported too).

    python benchmarks/rerank_late.py --data ../shared/datasets/locomo/locomo_dev.json
    python benchmarks/rerank_late.py --first-stage best --no-ce
    python benchmarks/rerank_late.py --first-stage best --no-ce --depth 150 \
        --pools 0,100,150,200,250 --candidates 10,20,30,40,50 --late-variants 0/0 \
        --objective R@5,R@10,S@10 --name _pool
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_retrieval as lr
from machine_info import command_line, machine_line
from tqdm import tqdm

from memories_core.evaluation import CATEGORY_NAMES, load_locomo
from memories_core.retrieval import Pipeline, RecallRequest
from memories_core.retrieval.cross_encoder import (
    OnnxCrossEncoder,
    blend_head,
    cross_encoder_reranker,
)
from memories_core.retrieval.cross_encoder import pair_text as context_text
from memories_core.retrieval.keys import KeyedBackend
from memories_core.retrieval.late_encoder import BUNDLED_HIDDEN_DIM, DEFAULT_LATE_DIM
from memories_core.retrieval.late_interaction import (
    LateInteractionReranker,
    OnnxLateInteractionEncoder,
    TokenVectorCache,
    late_interaction_pipeline,
    maxsim,
    pool_head,
)
from memories_core.retrieval.pipeline import DEFAULT_DEPTH

HEAD = 30
CANDIDATES = (10, 20, 30)
#: How deep MaxSim scores the fused ranking (0: the head only); the pool's best join the head.
POOLS: tuple[int, ...] = (0,)
WEIGHTS = (0.2, 0.3, 0.4, 0.5, 0.7, 1.0)
#: Late-interaction encoder variants: (markers, query augmentation).
LATE_VARIANTS = ((False, False), (True, False), (True, True))
CE_LENGTHS = (64, 96)
METRICS = ("R@5", "R@10", "S@10")
#: What each fold maximises (the mean of these metrics on the training conversations).
OBJECTIVE: tuple[str, ...] = ("R@5", "R@10")


def first_stage(args: argparse.Namespace, conversations: Sequence[Any]) -> dict[str, Any]:
    """Per question: the first stage's top 50 and fused scores; turn and previous texts."""
    deep = "" if args.depth == DEFAULT_DEPTH else f"_depth{args.depth}"
    cache = args.out / "cache" / f"rerank_late_stage1_{args.first_stage}{deep}.json"
    if cache.exists():
        loaded: dict[str, Any] = json.loads(cache.read_text())
        # JSON keys are strings: the previous turns are stored as [sample, turn, text] rows.
        loaded["prev"] = {(sid, item): text for sid, item, text in loaded["prev"]}
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
    items = harness.first_stage("no session ids", with_keys, config, depth=args.depth)
    text = {
        c.sample_id: {t.dia_id: lr.render(t, "caption") for t in c.turns} for c in conversations
    }
    previous = lr.previous_turns(conversations, "caption")
    rows = []
    rerankers = config.rerankers()
    for sample_id, qa, ranked, ctx in tqdm(items, desc="first stage"):
        ids, fused = lr.reranked_top(ranked, ctx, rerankers, keep=max(lr.DEPTH_K, HEAD))
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
    stored = out | {"prev": [[sid, item, value] for (sid, item), value in previous.items()]}
    cache.write_text(json.dumps(stored))
    return out


def pair_text(stage: dict[str, Any], sid: str, item: str, context: bool) -> str:
    """The text a candidate is scored with (the rerankers' ``context`` rule on LoCoMo)."""
    own: str = stage["text"][sid][item]
    before = stage["prev"].get((sid, item)) if context else None
    return context_text(before or None, own)  # the library's rule for a record in context


def late_scores(args: argparse.Namespace, stage: dict[str, Any]) -> dict[str, list[list[float]]]:
    """MaxSim of the top 30 per question, per (markers, augment, context) variant."""
    suffix = "" if HEAD == 30 else f"_{HEAD}"
    deep = "" if args.depth == DEFAULT_DEPTH else f"_depth{args.depth}"
    cache = args.out / "cache" / f"rerank_late_scores_{args.first_stage}{deep}{suffix}.json"
    found: dict[str, list[list[float]]] = json.loads(cache.read_text()) if cache.exists() else {}
    rows = stage["rows"]
    # Scores at the full 384 dimensions keep the keys they were cached under before --late-dim.
    width = "" if args.late_dim == BUNDLED_HIDDEN_DIM else f" dim={args.late_dim}"
    wanted = []
    for markers, augment in args.late_variants:
        encoder = OnnxLateInteractionEncoder(
            markers=markers, augment=augment, threads=1, dim=args.late_dim
        )
        docs: dict[str, npt.NDArray[np.float32]] = {}
        for context in (False, True):
            key = f"markers={markers} augment={augment} context={context}{width}"
            wanted.append(key)
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
            cache.write_text(json.dumps(found))
    return {key: found[key] for key in wanted}


def ce_scores(args: argparse.Namespace, stage: dict[str, Any]) -> dict[str, dict[int, list[float]]]:
    """Cross-encoder logits of the top 30 (context pairs) per sampled question, per length."""
    cache = args.out / "cache" / f"rerank_late_ce_{args.first_stage}.json"
    found: dict[str, dict[int, list[float]]] = {}
    if cache.exists():  # JSON keys are strings: the question numbers come back as ints
        stored: dict[str, dict[str, list[float]]] = json.loads(cache.read_text())
        found = {key: {int(n): v for n, v in done.items()} for key, done in stored.items()}
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
                cache.write_text(json.dumps(found))
        cache.write_text(json.dumps(found))
    return found


#: A grid point: (variant, candidates, pool, weight).
Cell = tuple[str, int, int, float]


def blended_rows(
    rows: Sequence[dict[str, Any]],
    scores: dict[str, Any],
    cell: Cell,
    subset: Sequence[int],
) -> list[tuple[str, int, dict[str, float]]]:
    """Scored questions (conversation, category, metrics) for one grid cell: the library's
    own rule (``pool_head`` then ``blend_head``, as ``LateInteractionReranker``), scored on
    the first ``DEPTH_K`` results as ``recall`` returns."""
    out = []
    for n in subset:
        row = rows[n]
        ranked = blended_ranking(row, scores[cell[0]][n], cell)[: lr.DEPTH_K]
        out.append((row["sid"], row["cat"], lr.score_question(ranked, row["ev"])))
    return out


def blended_ranking(row: dict[str, Any], values: Sequence[float], cell: Cell) -> list[str]:
    """One question's ranking after the rerank of ``cell`` (weight 0: the first stage)."""
    _, candidates, pool, weight = cell
    ids: list[str] = row["ids"]
    if weight <= 0:
        return list(ids)
    scored = ids[: max(pool, candidates)]
    value = dict(zip(scored, values, strict=False))
    head = pool_head(scored, [value[i] for i in scored], candidates)
    fused = dict(zip(ids, row["fused"], strict=True))
    blended = blend_head(ids, fused, head, [value[i] for i in head], weight)
    return [item for item, _ in blended]


def mean(rows: Sequence[tuple[str, int, dict[str, float]]], convs: set[str]) -> dict[str, float]:
    part = [r[2] for r in rows if r[0] in convs]
    return {m: statistics.fmean(p[m] for p in part) for m in METRICS}


def curve(rows: Sequence[tuple[str, int, dict[str, float]]]) -> dict[str, float]:
    """Every recall@k of ``lr.score_question`` (turn and session k), averaged."""
    return {m: statistics.fmean(r[2][m] for r in rows) for m in rows[0][2]}


#: Chart labels of the ``--first-stage`` choices.
FIRST_STAGE_NAMES = {
    "default": "library default (MiniLM + BM25)",
    "best": "bge-small + BM25 + observation keys",
}


def chart(out: Path, stems: Sequence[str], path: Path) -> None:
    """R@k of each saved run's first stage and held-out reranking beside the published
    anchors (``lr.plot_variants``)."""
    rows: dict[str, Any] = {}
    for stem in stems:
        report = json.loads((out / f"{stem}.json").read_text("utf-8"))
        name = FIRST_STAGE_NAMES.get(report.get("first_stage_name", ""), stem)
        curves = report["late"]["curves"]
        rows[f"{name} first stage"] = {"overall": curves["first stage"]}
        rows[f"{name} + late interaction (LOCO held-out)"] = {"overall": curves["held-out"]}
    lr.plot_variants(rows, path)


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
    """LOCO CV over variant x candidates x pool x weight; the cells' full-sample table too."""
    grid: list[Cell] = [
        (v, c, p, w)
        for v in variants
        for c in CANDIDATES
        for p in POOLS
        for w in WEIGHTS
        if p == 0 or p > c
    ]
    scored = {cell: blended_rows(rows, scores, cell, subset) for cell in tqdm(grid, desc="grid")}
    base = blended_rows(rows, scores, (variants[0], HEAD, 0, 0.0), subset)
    convs = sorted({rows[n]["sid"] for n in subset})
    everything = set(convs)
    folds: dict[str, Any] = {}
    counts: Counter[str] = Counter()
    held_rows: list[tuple[str, int, dict[str, float]]] = []
    for fold in convs:
        train = everything - {fold}
        best = max(grid, key=lambda cell: sum(mean(scored[cell], train)[m] for m in OBJECTIVE))
        counts[f"{best[0]}, {best[1]} candidates, pool {best[2]}, weight {best[3]}"] += 1
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
        "curves": {"first stage": curve(base), "held-out": curve(held_rows)},
        "first_stage": mean(base, everything),
        "first_stage_categories": by_category(base),
        "cells": {" | ".join(map(str, cell)): mean(r, everything) for cell, r in scored.items()},
        "cell_categories": {
            " | ".join(map(str, cell)): by_category(r) for cell, r in scored.items()
        },
        "held_out": mean(held_rows, everything),
        "held_out_categories": by_category(held_rows),
        "chosen": dict(counts),
        "folds": folds,
        "gains": gains,
    }


def late_timed(
    base: Pipeline, late: OnnxLateInteractionEncoder, candidates: int, pool: int, depth: int
) -> Pipeline:
    """The late-interaction pipeline a timing row runs (a fresh cache: cold)."""
    reranker = LateInteractionReranker(
        late, candidates=candidates, pool=pool, cache=TokenVectorCache()
    )
    return late_interaction_pipeline(base, reranker, depth=depth if pool else base.depth)


def ce_timed(base: Pipeline, length: int, candidates: int, threads: int) -> Pipeline:
    """The cross-encoder pipeline a timing row runs."""
    stage = cross_encoder_reranker(candidates=candidates, max_length=length, threads=threads)
    return replace(base, rerankers=(*base.rerankers, stage))


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

    late = OnnxLateInteractionEncoder(
        markers=args.late_markers, augment=args.late_augment, dim=args.late_dim
    )
    settings: list[tuple[str, Callable[[], Pipeline], bool]] = [
        ("first stage only", lambda: base, False)
    ]
    for candidates, pool in () if args.no_late_timing else args.late_timing:
        for warm in (False, True):
            deep = f", pool {pool} (depth {args.depth})" if pool else ""
            settings.append(
                (
                    f"late interaction, {candidates} candidates{deep}, "
                    f"{('cold', 'warm')[warm]} cache",
                    partial(late_timed, base, late, candidates, pool, args.depth),
                    warm,
                )
            )
    for length, candidates, threads in args.ce_timing:
        settings.append(
            (
                f"cross-encoder, {candidates} x {length} pieces, {threads} thread(s)",
                partial(ce_timed, base, length, candidates, threads),
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
        prefetched, prefetch_s, encoded = "", 0.0, 0
        wall, cpu = [], []
        for row in sample:  # grouped by conversation
            if warm and row["sid"] != prefetched:
                # Every record of the conversation encoded ahead (Pipeline.prefetch), untimed
                # in the recalls; one conversation fits in the default 64 MB cache.
                started = time.perf_counter()
                sid = row["sid"]
                records = list(backends[sid].load(list(stage["text"][sid]), user_id=sid).values())
                encoded += pipeline.prefetch(backend_of(sid), sid, records)
                prefetch_s += time.perf_counter() - started
                prefetched = row["sid"]
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
                "prefetch_ms_per_record": round(1000 * prefetch_s / encoded, 1)
                if encoded
                else None,
                "load": ", ".join(f"{x:.1f}" for x in os.getloadavg()),
            }
        )
        print(results[-1], flush=True)
    return results


def public(args: argparse.Namespace, conversations: Sequence[Any]) -> dict[str, Any]:
    """``HistoryMemory.recall`` rows (``lr.public_rows``): the first stage alone and with
    ``late_interaction_pipeline()``, no session ids, turns with image captions."""
    if args.first_stage == "best":
        from memories_core.embedders.onnx import OnnxEmbedder

        embedders = {"bge-small": lr.CachedEmbedder(OnnxEmbedder(), args.out / "cache")}
        keys = lr.observation_keys(args.data)
        variant = lr.PublicVariant(embedder="bge-small", lexical=0.5, keys=True)
    else:
        from memories_core.embedders import SentenceTransformerEmbedder

        embedders = {"MiniLM": lr.CachedEmbedder(SentenceTransformerEmbedder(), args.out / "cache")}
        keys = {}
        variant = lr.PublicVariant()
    return lr.public_rows(
        conversations, embedders, keys, variants=(variant, replace(variant, late=True))
    )


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
        "| variant | candidates | pool | weight | R@5 | R@10 | session R@10 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for cell, value in cv["cells"].items():
        variant, candidates, pool, weight = cell.split(" | ")
        if weight in ("0.3", "0.5", "0.7", "1.0"):
            lines.append(
                f"| {variant} | {candidates} | {pool} | {weight} | {value['R@5']:.3f} | "
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


def int_list(text: str) -> tuple[int, ...]:
    """``"10,20,30"`` -> ``(10, 20, 30)`` (an argparse type)."""
    return tuple(int(part) for part in text.split(","))


def float_list(text: str) -> tuple[float, ...]:
    """``"0.5,0.7"`` -> ``(0.5, 0.7)`` (an argparse type)."""
    return tuple(float(part) for part in text.split(","))


def parse_objective(text: str) -> list[str]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [part for part in parts if part not in METRICS]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"metrics must be among {', '.join(METRICS)}: {text!r}")
    return parts


def main(argv: Sequence[str] | None = None) -> int:
    global HEAD, CANDIDATES, OBJECTIVE, POOLS, WEIGHTS
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
        "--public",
        action="store_true",
        help="also measure through HistoryMemory.recall on the default Chroma backend with "
        "late_interaction_pipeline() (every record prefetched after the import)",
    )
    parser.add_argument(
        "--chart",
        default="",
        help="only draw rerank_late_chart.png from saved runs: STEM,STEM (e.g. "
        "rerank_late_default_pool,rerank_late_best_pool)",
    )
    parser.add_argument(
        "--objective",
        type=parse_objective,
        default=list(OBJECTIVE),
        help="metrics each CV fold maximises, e.g. R@5,R@10,S@10",
    )
    parser.add_argument(
        "--candidates",
        type=int_list,
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
    parser.add_argument(
        "--weights",
        type=float_list,
        default=WEIGHTS,
        help="blend weights in the CV grid, e.g. 0.5,0.6,0.7,0.8 (0 is the first stage)",
    )
    parser.add_argument(
        "--pools",
        type=int_list,
        default=POOLS,
        help="late-interaction pools in the CV grid, e.g. 0,100,150 (0: the head only)",
    )
    parser.add_argument(
        "--depth",
        type=int,
        default=DEFAULT_DEPTH,
        help="the first stage's candidates per source (Pipeline.depth)",
    )
    parser.add_argument(
        "--late-timing",
        type=lambda text: [tuple(int(x) for x in part.split("x")) for part in text.split(",")],
        default=[(10, 0), (20, 0), (30, 0)],
        help="late-interaction settings timed: CANDIDATESxPOOL,... (a pool runs at --depth)",
    )
    parser.add_argument("--late-markers", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--late-augment", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument(
        "--late-dim",
        type=int,
        default=DEFAULT_LATE_DIM,
        help="width of the token vectors: the bundled model's first principal directions "
        f"(384: unprojected; default {DEFAULT_LATE_DIM})",
    )
    parser.add_argument(
        "--ce-timing",
        type=parse_ce_timing,
        default=parse_ce_timing("96x30x1,64x30x1,64x20x1,64x10x1,64x20x2"),
        help="cross-encoder settings timed: LENGTHxCANDIDATESxTHREADS,...",
    )
    args = parser.parse_args(argv)
    if args.chart:
        chart(args.out, args.chart.split(","), args.out / "rerank_late_chart.png")
        print(f"wrote {args.out / 'rerank_late_chart.png'}")
        return 0
    OBJECTIVE = tuple(args.objective)
    WEIGHTS = tuple(sorted(args.weights))
    CANDIDATES = tuple(sorted(args.candidates))
    POOLS = tuple(sorted(args.pools))
    HEAD = max(CANDIDATES + POOLS)

    conversations = load_locomo(args.data)
    stage = first_stage(args, conversations)
    rows = stage["rows"]
    report: dict[str, Any] = {
        "machine": machine_line(),
        "first_stage": stage["config"],
        "first_stage_name": args.first_stage,
    }
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
    if args.public:
        report["public"] = public(args, conversations)
        lines += ["### Through `HistoryMemory.recall` (default Chroma backend)", ""]
        lines += [
            "| row | R@5 | R@10 | session R@10 | recall ms mean | prefetch s | top 5 of k=10 "
            "differs from k=50 |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for label, result in report["public"].items():
            o = result["overall"]
            lines.append(
                f"| {label} | {o['R@5']:.3f} | {o['R@10']:.3f} | {o['S@10']:.3f} | "
                f"{result['recall_ms_mean']} | {result['prefetch_s']} | "
                f"{result['prefix_mismatches']} of {result['prefix_checked']} |"
            )
        lines.append("")
    if args.timing_questions:
        report["timing"] = timing(args, conversations, stage)
        lines += [
            "| setting | wall p50 ms | CPU p50 ms | CPU mean ms | bytes per cached record | "
            "prefetch ms per record | questions | load |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        lines += [
            f"| {t['label']} | {t['wall_p50_ms']} | {t['cpu_p50_ms']} | {t['cpu_mean_ms']} | "
            f"{t['bytes_per_cached_record'] or '-'} | {t['prefetch_ms_per_record'] or '-'} | "
            f"{t['questions']} | {t['load']} |"
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
