"""MemoChat (Lu et al., 2023): memo retrieval F1, LLM-free segmentation, cost.

Reads MemoChat test items (``test.jsonl``'s format: ``question_id``, ``text``, ``type``,
``answer``) and measures:

* **selector F1** on the ``retrieval_*`` items: the paper's option-selection F1 (Table 3's
  regular F1; per item, between the chosen and the reference option sets, NOTO included,
  averaged over items) for the fused dense + BM25 selector
  (:func:`memories_core.mechanisms.memochat.select_options`) at several thresholds, for an
  embedding-only selector (each query sentence's best option above a cosine threshold), and,
  with ``--llm local --llm-items N``, for the LLM selector on the first N/2 items of each
  source (the bundled SmolLM2-135M; slow);
* settings by **cross-validation over the two sources** (tune on dialogsum, test on
  topiocqa, and the other way round; both directions and the spread are printed), over the
  grid threshold x answer penalty x smoothing; the documented default is the grid point with
  the best mean of the two per-source figures;
* the **answer rule**, which only bare-title options can trigger, by **split-half
  cross-validation within each source** (tune the penalty on the even items, test on the odd
  ones and the other way round), since the other source cannot choose it;
* **decision-rule variants** on the same scores, each cross-validated the same way: a
  relative-to-best margin (a sentence also votes for options within ``margin`` of its best),
  a lead rule (a sentence votes only if its best leads the second by a margin; the item's
  overall best when none does), a relative-to-best option cutoff, and an expected-F1 set
  choice over softmax posteriors with a NOTO logit; with ``--cross-encoder``, the ONNX
  ms-marco cross-encoder of the ``rerank`` extra blended into the scores;
* **segmenter boundary P/R/F1** of the LLM-free segmenter
  (:func:`memories_core.mechanisms.memochat.segment_lines`) on the ``writing_*`` items: a
  boundary is the first line of a topic other than the first; exact matches; also
  cross-validated over the two sources;
* **cost**: LLM calls and (estimated) tokens per 100 dialogue lines for memo writing and
  per query for retrieval, counted on the prompts the library sends.

The last two lines printed are always ``selector F1: 0.xxx`` and
``segmenter boundary F1: 0.xxx``: the default LLM-free selector and segmenter with their
documented defaults (no tuning on the file).

    python benchmarks/memochat_eval.py [ITEMS] [--llm local --llm-items 4 [--model qwen2.5-1.5b]]
        [--cross-encoder]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from tqdm import tqdm

from memories_core.embedders import SentenceTransformerEmbedder
from memories_core.mechanisms.memochat import (
    DEFAULT_ANSWER_PENALTY,
    DEFAULT_DENSE_WEIGHT,
    DEFAULT_SMOOTHING,
    DEFAULT_THRESHOLD,
    choose_memos,
    option_scores,
    segment_lines,
    vote,
)
from memories_core.prompts.memochat import build_retrieval_messages, build_writing_messages
from memories_core.usage import estimate_tokens

sys.path.insert(0, str(Path(__file__).resolve().parent))
from locomo_retrieval import CachedEmbedder
from machine_info import datasets_dir, portable_path

DEFAULT_ITEMS = datasets_dir() / "memochat" / "test.jsonl"
THRESHOLDS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4)
PENALTIES = (0.0, 0.25, 0.5, 0.75, 1.0)
SMOOTHINGS = (0.0, 0.15, 0.3, 0.5)
SEGMENTER_GRID = [
    (w, c, shift, cont)
    for w in (2, 3)
    for c in (0.5, 1.0, 1.5)
    for shift in (0.0, 0.4, 0.8)
    for cont in (0.0, 0.2, 0.4)
]
_OPTION = re.compile(r"^\((\d+)\) ?(.*)$", re.M)
_LINE = re.compile(r"^\(line \d+\) (.*)$", re.M)


def retrieval_items(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for item in items:
        if not item["type"].startswith("retrieval"):
            continue
        text = item["text"]
        query = text.split("Query Sentence:\n", 1)[1].split("\nTopic Options:", 1)[0]
        block = text.split("Topic Options:\n", 1)[1].split("```", 1)[0]
        options = [o.strip() for _, o in _OPTION.findall(block)]
        noto = next(i for i, o in enumerate(options, 1) if o.startswith("NOTO"))
        gold = {int(x) for x in re.findall(r"\d+", item["answer"])}
        source = item["type"].split("_", 1)[1]
        position = sum(1 for it in out if it["source"] == source)
        out.append(
            {
                "query": query,
                "options": options,
                "noto": noto,
                "gold": gold,
                "source": source,
                "position": position,
            }
        )
    return out


def writing_items(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        if not item["type"].startswith("writing"):
            continue
        block = item["text"].split("Task Conversation:\n", 1)[1].split("\n```", 1)[0]
        lines = _LINE.findall(block)
        spans = json.loads(item["answer"])
        gold = {int(s["start"]) for s in spans if int(s["start"]) > 1}
        out.append({"lines": lines, "gold": gold, "source": item["type"].split("_", 1)[1]})
    return out


def f1(pred: set[int], gold: set[int]) -> float:
    hit = len(pred & gold)
    if not hit:
        return 1.0 if not pred and not gold else 0.0
    p, r = hit / len(pred), hit / len(gold)
    return 2 * p * r / (p + r)


Setting = dict[str, Any]


class ScoreSource(Protocol):
    """What the selectors read: an item's score matrix (query sentences x real options)."""

    def scores(self, item: dict[str, Any], setting: Setting, /) -> np.ndarray: ...


class Scorer:
    """Score matrices (query sentences x real options) per item, computed once per setting.

    A setting names the scoring (``dense_weight``, ``smoothing``, ``answer_penalty``; run
    through :func:`option_scores`, the library's own code) and the decision on it (``rule``
    plus its parameters); decisions are cheap, so grids over them reuse the matrices.
    """

    def __init__(self, embedder: Any, cross_encoder: Any = None) -> None:
        self.embedder = embedder
        self.cross_encoder = cross_encoder
        self.cache: dict[tuple[Any, ...], np.ndarray] = {}
        self.ce_cache: dict[int, np.ndarray] = {}

    def scores(self, item: dict[str, Any], setting: Setting) -> np.ndarray:
        key = (
            id(item),
            setting.get("dense_weight", DEFAULT_DENSE_WEIGHT),
            setting.get("smoothing", DEFAULT_SMOOTHING),
            setting.get("answer_penalty", DEFAULT_ANSWER_PENALTY),
        )
        if key not in self.cache:
            _, self.cache[key] = option_scores(
                item["query"],
                real_options(item),
                self.embedder,
                dense_weight=key[1],
                smoothing=key[2],
                answer_penalty=key[3],
            )
        scores = self.cache[key]
        if setting.get("ce_weight"):
            scores = scores + setting["ce_weight"] * self.ce(item)
        return scores

    def ce(self, item: dict[str, Any]) -> np.ndarray:
        """Cross-encoder probabilities (sigmoid of the logit) minus 0.5, per sentence, smoothed."""
        if id(item) not in self.ce_cache:
            from memories_core.mechanisms.memochat import _SENTENCE

            sentences = [s for s in _SENTENCE.split(item["query"].strip()) if s.strip()]
            logits = np.array([self.cross_encoder(s, real_options(item)) for s in sentences])
            self.ce_cache[id(item)] = 1 / (1 + np.exp(-logits)) - 0.5
        return self.ce_cache[id(item)]


def real_options(item: dict[str, Any]) -> list[str]:
    return [o for i, o in enumerate(item["options"], 1) if i != item["noto"]]


def decide(scores: np.ndarray, setting: Setting) -> list[int]:
    """The options chosen from a score matrix (0-based into the real options)."""
    if not scores.size:
        return []
    rule = setting.get("rule", "vote")
    t = setting.get("threshold", DEFAULT_THRESHOLD)
    if rule == "vote":
        return vote(scores, t)
    if rule == "margin":  # every option within `margin` of the sentence's best
        return sorted(
            {
                j
                for row in scores
                if row.max() >= t
                for j in np.flatnonzero(row >= row.max() - setting["margin"]).tolist()
            }
        )
    if rule == "lead":  # the sentence votes only if its best leads the second by `lead`
        chosen = set()
        for row in scores:
            top = np.sort(row)[::-1]
            second = top[1] if len(top) > 1 else 0.0
            if top[0] >= t and top[0] - second >= setting["lead"]:
                chosen.add(int(row.argmax()))
        best = scores.max(axis=0)
        if not chosen and best.max() >= t:
            chosen.add(int(best.argmax()))
        return sorted(chosen)
    if rule == "cutoff":  # votes kept only if their score reaches `ratio` x the best vote
        votes: dict[int, float] = {}  # option -> its best vote
        for row in scores:
            j = int(row.argmax())
            if row[j] >= t:
                votes[j] = max(votes.get(j, float("-inf")), float(row[j]))
        if not votes:
            return []
        strongest = max(votes.values())
        return sorted(j for j, v in votes.items() if v >= setting["ratio"] * strongest)
    if rule == "expected_f1":  # softmax posteriors with a NOTO logit; best expected-F1 set
        tau, nu = setting["tau"], setting["noto_logit"]
        logits = np.hstack([scores, np.full((len(scores), 1), nu)]) / tau
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        related = 1 - np.prod(1 - p[:, :-1], axis=0)
        order = np.argsort(-related)
        gains = [
            2 * related[order[:k]].sum() / (k + related.sum()) for k in range(1, len(order) + 1)
        ]
        k = int(np.argmax(gains)) + 1
        if np.prod(1 - related) > gains[k - 1]:
            return []
        return sorted(int(j) for j in order[:k])
    raise ValueError(rule)


def ranking_ceiling(
    items: Sequence[dict[str, Any]], scorer: ScoreSource, setting: Setting
) -> float:
    """F1 when told how many options are right: the top-k options by their best sentence score.

    Over the items whose reference is not NOTO; k = the reference's size. No threshold or
    decision rule can beat this with the same scores (an upper bound of what ranking allows).
    """
    scores = []
    for item in items:
        if item["noto"] in item["gold"] or not real_options(item):
            continue
        real = [i for i in range(1, len(item["options"]) + 1) if i != item["noto"]]
        best = scorer.scores(item, setting).max(axis=0)
        top = np.argsort(-best, kind="stable")[: len(item["gold"])]
        scores.append(f1({real[int(j)] for j in top}, item["gold"]))
    return statistics.fmean(scores) if scores else float("nan")


def select(item: dict[str, Any], scorer: ScoreSource, setting: Setting) -> set[int]:
    """Run a selector on one item; map back to the item's option numbers (NOTO if none)."""
    real = [i for i in range(1, len(item["options"]) + 1) if i != item["noto"]]
    if not real:
        return {item["noto"]}
    chosen = decide(scorer.scores(item, setting), setting)
    return {real[c] for c in chosen} or {item["noto"]}


def selector_f1(items: Sequence[dict[str, Any]], scorer: ScoreSource, setting: Setting) -> float:
    if not items:
        return float("nan")
    return statistics.fmean(f1(select(it, scorer, setting), it["gold"]) for it in items)


def boundaries(item: dict[str, Any], embedder: Any, **kwargs: Any) -> set[int]:
    return {start for start, _ in segment_lines(item["lines"], embedder, **kwargs) if start > 1}


def boundary_prf(
    items: Sequence[dict[str, Any]], embedder: Any, **kwargs: Any
) -> tuple[float, float, float]:
    tp = fp = fn = 0
    for item in items:
        pred = boundaries(item, embedder, **kwargs)
        tp += len(pred & item["gold"])
        fp += len(pred - item["gold"])
        fn += len(item["gold"] - pred)
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def by_source(item: dict[str, Any]) -> str:
    return str(item["source"])


def by_half(item: dict[str, Any]) -> str:
    """Even / odd position of the item within its source (split-half cross-validation)."""
    return "even" if item["position"] % 2 == 0 else "odd"


def cross_validate(
    items: Sequence[dict[str, Any]],
    score: Callable[[Sequence[dict[str, Any]], Any], float],
    grid: Sequence[Any],
    group: Callable[[dict[str, Any]], str] = by_source,
) -> list[dict[str, Any]]:
    """Tune on one group, test on the other, both ways (ties: the earliest grid point)."""
    groups = sorted({group(it) for it in items})
    rows = []
    for tune in groups:
        on_tune = [it for it in items if group(it) == tune]
        best = max(grid, key=lambda g: score(on_tune, g))
        for test in groups:
            if test == tune:
                continue
            on_test = [it for it in items if group(it) == test]
            rows.append(
                {
                    "tune": tune,
                    "test": test,
                    "chosen": best,
                    "tune_f1": score(on_tune, best),
                    "test_f1": score(on_test, best),
                    "test_best": max(score(on_test, g) for g in grid),
                }
            )
    return rows


def cv_summary(rows: Sequence[dict[str, Any]]) -> str:
    """Mean held-out figure and the spread (held-out vs the test group's own best)."""
    held = statistics.fmean(r["test_f1"] for r in rows)
    gaps = ", ".join(f"{r['test']} -{r['test_best'] - r['test_f1']:.3f}" for r in rows)
    return f"mean held-out {held:.3f}; loss against each test group's own best: {gaps}"


def macro_best(
    items: Sequence[dict[str, Any]],
    score: Callable[[Sequence[dict[str, Any]], Any], float],
    grid: Sequence[Any],
) -> Any:
    """The grid point with the best mean of the per-source figures (sources weigh alike)."""
    sources = sorted({it["source"] for it in items})
    split = [[it for it in items if it["source"] == s] for s in sources]
    return max(grid, key=lambda g: statistics.fmean(score(part, g) for part in split))


def describe(setting: Setting) -> str:
    return ", ".join(
        f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in setting.items()
    )


def writing_cost(items: Sequence[dict[str, Any]], max_lines: int = 10) -> dict[str, float]:
    """LLM calls and prompt tokens per 100 lines: one writing prompt per buffer of ``max_lines``.

    The buffer keeps two lines after each memo, so each call adds ``max_lines - 2`` new lines.
    """
    calls = tokens = lines = 0
    for item in items:
        buffer = item["lines"]
        step = max_lines - 2
        for start in range(0, max(1, len(buffer) - 2), step):
            chunk = buffer[start : start + max_lines]
            messages = build_writing_messages(chunk)
            calls += 1
            tokens += sum(estimate_tokens(m.content) for m in messages)
        lines += len(buffer)
    return {
        "calls_per_100_lines": 100 * calls / lines,
        "tokens_per_100_lines": 100 * tokens / lines,
    }


def retrieval_cost(items: Sequence[dict[str, Any]]) -> dict[str, float]:
    tokens = []
    for item in items:
        real = [o for i, o in enumerate(item["options"], 1) if i != item["noto"]]
        messages, _ = build_retrieval_messages(item["query"], real)
        tokens.append(sum(estimate_tokens(m.content) for m in messages))
    return {"calls_per_query": 1.0, "tokens_per_query": statistics.fmean(tokens)}


def llm_selector(items: Sequence[dict[str, Any]], llm: Any) -> tuple[float, float]:
    scores = []
    started = time.perf_counter()
    for item in items:
        real = [i for i in range(1, len(item["options"]) + 1) if i != item["noto"]]
        chosen = choose_memos(llm, item["query"], [item["options"][i - 1] for i in real])
        pred = {real[c] for c in chosen or []} or {item["noto"]}
        scores.append(f1(pred, item["gold"]))
    return statistics.fmean(scores), (time.perf_counter() - started) / max(len(items), 1)


def print_cv(label: str, rows: Sequence[dict[str, Any]], show: Callable[[Any], str]) -> None:
    for row in rows:
        print(
            f"  {label}: tune {row['tune']:9s} -> {show(row['chosen'])} "
            f"(F1 {row['tune_f1']:.3f} there), F1 on {row['test']}: {row['test_f1']:.3f}"
        )
    print(f"  {label}: {cv_summary(rows)}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("items", nargs="?", default=str(DEFAULT_ITEMS))
    parser.add_argument("--llm", choices=["none", "local"], default="none")
    parser.add_argument("--llm-items", type=int, default=4)
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="offline model for --llm local: smollm2-135m or qwen2.5-1.5b",
    )
    parser.add_argument(
        "--cross-encoder",
        action="store_true",
        help="also measure the ONNX ms-marco cross-encoder blended in (extra 'rerank')",
    )
    parser.add_argument(
        "--bge",
        action="store_true",
        help="also score the default selector with the optional bge-small OnnxEmbedder "
        "(extra 'rerank') in place of MiniLM",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)

    rows = [json.loads(line) for line in Path(args.items).read_text().splitlines() if line.strip()]
    retrieval = retrieval_items(rows)
    writing = writing_items(rows)
    cache = Path(__file__).resolve().parent / "out" / "cache" / "memochat_minilm.npz"
    embedder = CachedEmbedder(SentenceTransformerEmbedder(), cache.parent, file=cache)
    scorer = Scorer(embedder)
    out: dict[str, Any] = {
        "items": portable_path(args.items),
        "retrieval": len(retrieval),
        "writing": len(writing),
    }
    sources = sorted({it["source"] for it in retrieval})
    split = {s: [it for it in retrieval if it["source"] == s] for s in sources}

    def fscore(items: Sequence[dict[str, Any]], setting: Setting) -> float:
        return selector_f1(items, scorer, setting)

    print(f"{len(retrieval)} retrieval items, {len(writing)} writing items ({args.items})")
    for item in tqdm(retrieval, desc="embedding and scoring", leave=False):
        for p in PENALTIES:
            for s in SMOOTHINGS:
                scorer.scores(item, {"answer_penalty": p, "smoothing": s})
    embedder.save()
    dense_only: Setting = {"dense_weight": 1.0, "smoothing": 0.0, "answer_penalty": 0.0}

    print("\nselector F1 by threshold (fused dense+BM25 | embedding-only), all / per source")
    sweep = []
    for t in THRESHOLDS:
        fused = fscore(retrieval, {"threshold": t})
        dense = fscore(retrieval, {**dense_only, "threshold": t})
        per = {s: fscore(split[s], {"threshold": t}) for s in sources}
        sweep.append({"threshold": t, "fused": fused, "dense": dense, **per})
        detail = "  ".join(f"{s} {v:.3f}" for s, v in per.items())
        print(f"  t={t:.2f}  fused {fused:.3f}  ({detail})  embedding-only {dense:.3f}")
    out["sweep"] = sweep

    print(f"\nanswer rule: selector F1 by answer_penalty at t={DEFAULT_THRESHOLD}")
    penalty_rows = []
    for p in PENALTIES:
        per = {s: fscore(split[s], {"answer_penalty": p}) for s in sources}
        both = fscore(retrieval, {"answer_penalty": p})
        penalty_rows.append({"answer_penalty": p, "all": both, **per})
        detail = "  ".join(f"{s} {v:.3f}" for s, v in per.items())
        print(f"  p={p:.2f}  all {both:.3f}  ({detail})")
    out["penalty_sweep"] = penalty_rows

    print("\ncross-validated selector (tune on one source, test on the other)")
    grid = [
        {"threshold": t, "answer_penalty": p, "smoothing": s}
        for p in PENALTIES
        for s in SMOOTHINGS
        for t in THRESHOLDS
    ]
    cv = cross_validate(retrieval, fscore, grid)
    out["cv_fused"] = cv
    print_cv("fused", cv, describe)
    macro = macro_best(retrieval, fscore, grid)
    out["macro_fused"] = macro
    library = {
        "threshold": DEFAULT_THRESHOLD,
        "answer_penalty": DEFAULT_ANSWER_PENALTY,
        "smoothing": DEFAULT_SMOOTHING,
    }
    print(
        f"  fused, best mean of the two sources: {describe(macro)} "
        + ("(the library default)" if macro == library else f"(library: {describe(library)})")
    )
    fixed = [g for g in grid if g["answer_penalty"] == DEFAULT_ANSWER_PENALTY]
    cv = cross_validate(retrieval, fscore, fixed)
    out["cv_fused_rule_fixed"] = cv
    print_cv(f"fused, answer_penalty held at {DEFAULT_ANSWER_PENALTY}", cv, describe)
    cv = cross_validate(retrieval, fscore, [{**dense_only, "threshold": t} for t in THRESHOLDS])
    out["cv_embedding-only"] = cv
    print_cv("embedding-only", cv, lambda g: f"t={g['threshold']:.2f}")

    print(
        "\nanswer rule by split-half cross-validation within each source "
        "(even / odd items; the other source cannot choose it)"
    )
    for s in sources:
        rows_p = cross_validate(
            split[s], fscore, [{"answer_penalty": p} for p in PENALTIES], group=by_half
        )
        out[f"cv_answer_rule_{s}"] = rows_p
        print_cv(s, rows_p, lambda g: f"penalty={g['answer_penalty']:.2f}")
        for p0 in (0.0, DEFAULT_ANSWER_PENALTY):
            halves = {
                h: fscore([it for it in split[s] if by_half(it) == h], {"answer_penalty": p0})
                for h in ("even", "odd")
            }
            print(f"  {s}: penalty {p0:.2f}: even {halves['even']:.3f}, odd {halves['odd']:.3f}")

    print("\ndecision-rule variants on the default scores (cross-validated over the sources)")
    variants: dict[str, list[Setting]] = {
        "vote (default rule)": [{"threshold": t} for t in THRESHOLDS],
        "relative margin": [
            {"rule": "margin", "threshold": t, "margin": m}
            for m in (0.01, 0.02, 0.05, 0.1)
            for t in THRESHOLDS[:5]
        ],
        "lead rule": [
            {"rule": "lead", "threshold": t, "lead": m}
            for m in (0.01, 0.02, 0.03, 0.05, 0.08)
            for t in THRESHOLDS[:5]
        ],
        "relative cutoff": [
            {"rule": "cutoff", "threshold": t, "ratio": r}
            for r in (0.5, 0.6, 0.7, 0.8, 0.9)
            for t in THRESHOLDS[:5]
        ],
        "expected F1": [
            {"rule": "expected_f1", "tau": tau, "noto_logit": nu}
            for tau in (0.02, 0.05, 0.1, 0.2)
            for nu in (-0.2, 0.0, 0.1, 0.2)
        ],
    }
    if args.cross_encoder:
        from memories_core.retrieval.cross_encoder import OnnxCrossEncoder

        scorer.cross_encoder = OnnxCrossEncoder(max_length=128)
        for item in tqdm(retrieval, desc="cross-encoder", leave=False):
            if real_options(item):
                scorer.ce(item)
        variants["fused + cross-encoder"] = [
            {"threshold": t, "ce_weight": w} for w in (0.05, 0.1, 0.2, 0.4) for t in THRESHOLDS[:5]
        ]
    out["variants"] = {}
    for name, vgrid in variants.items():
        cv = cross_validate(retrieval, fscore, vgrid)
        best = macro_best(retrieval, fscore, vgrid)
        per = {s: fscore(split[s], best) for s in sources}
        out["variants"][name] = {"cv": cv, "macro": best, "macro_per_source": per}
        held = " / ".join(f"{r['tune'][:2]}->{r['test'][:2]} {r['test_f1']:.3f}" for r in cv)
        detail = ", ".join(f"{s} {v:.3f}" for s, v in per.items())
        print(f"  {name:22s} held-out {held}; best mean: {describe(best)} ({detail})")

    print("\nranking ceiling: F1 of the top-k options by best sentence score, k given (non-NOTO)")
    ceilings: dict[str, Setting] = {
        "fused (default scores)": {},
        "embedding-only": dense_only,
    }
    if args.cross_encoder:
        ceilings["cross-encoder alone"] = {"dense_weight": 0.0, "ce_weight": 1000.0}
    out["ranking_ceiling"] = {}
    for name, setting in ceilings.items():
        per = {s: ranking_ceiling(split[s], scorer, setting) for s in sources}
        out["ranking_ceiling"][name] = per
        print(f"  {name:22s} " + "  ".join(f"{s} {v:.3f}" for s, v in per.items()))

    if args.bge:
        from memories_core.embedders import OnnxEmbedder

        bge_file = cache.with_name("memochat_bge.npz")
        bge = CachedEmbedder(OnnxEmbedder(), bge_file.parent, file=bge_file)
        bge_scorer = Scorer(bge)
        print("\nbge-small-en-v1.5 (OnnxEmbedder) in place of MiniLM, default settings")
        out["bge"] = {}
        for name, setting in (("fused", {}), ("embedding-only", dense_only)):
            per = {s: selector_f1(split[s], bge_scorer, setting) for s in sources}
            ceiling = {s: ranking_ceiling(split[s], bge_scorer, setting) for s in sources}
            out["bge"][name] = {"f1": per, "ranking_ceiling": ceiling}
            print(
                f"  {name:15s} F1 "
                + "  ".join(f"{s} {v:.3f}" for s, v in per.items())
                + "  | ceiling "
                + "  ".join(f"{s} {v:.3f}" for s, v in ceiling.items())
            )
        bge.save()

    print("\nsegmenter boundary P/R/F1 (LLM-free, TextTiling-style + speaker-turn cues)")

    def seg_prf(items: Sequence[dict[str, Any]], g: Any) -> tuple[float, float, float]:
        return boundary_prf(
            items,
            embedder,
            window=g[0],
            depth_cutoff=g[1],
            shift_cue=g[2],
            continuation_cue=g[3],
        )

    def seg_score(items: Sequence[dict[str, Any]], g: Any) -> float:
        return seg_prf(items, g)[2]

    cv = cross_validate(writing, seg_score, SEGMENTER_GRID)
    out["cv_segmenter"] = cv
    for row in cv:
        p, r, f = seg_prf([it for it in writing if it["source"] == row["test"]], row["chosen"])
        w, c, shift, cont = row["chosen"]
        row["test_prf"] = (p, r, f)
        print(
            f"  tune {row['tune']:9s} -> window={w}, cutoff={c}, shift={shift}, "
            f"continuation={cont} (F1 {row['tune_f1']:.3f} there), on {row['test']}: "
            f"P {p:.3f} R {r:.3f} F1 {f:.3f}"
        )
    print(f"  {cv_summary(cv)}")
    seg_macro = macro_best(writing, seg_score, SEGMENTER_GRID)
    out["macro_segmenter"] = seg_macro
    print(
        "  best mean of the two sources: window={}, cutoff={}, shift={}, continuation={}".format(
            *seg_macro
        )
    )
    for label, kw in (
        ("TextTiling only (no cues), window 2, cutoff 0.75", dict(window=2, depth_cutoff=0.75)),
        ("TextTiling only (no cues), window 3, cutoff 1.0", dict(window=3, depth_cutoff=1.0)),
    ):
        p, r, f = boundary_prf(writing, embedder, shift_cue=0.0, continuation_cue=0.0, **kw)
        print(f"  {label}: P {p:.3f} R {r:.3f} F1 {f:.3f}")
    for s in sorted({it["source"] for it in writing}):
        p, r, f = boundary_prf([it for it in writing if it["source"] == s], embedder)
        print(f"  default on {s}: P {p:.3f} R {r:.3f} F1 {f:.3f}")

    print("\ncost (prompt tokens, estimated at about 4 characters a token)")
    wc, rc = writing_cost(writing), retrieval_cost(retrieval)
    out["cost"] = {**wc, **rc}
    print(
        f"  writing: {wc['calls_per_100_lines']:.1f} calls, {wc['tokens_per_100_lines']:.0f} "
        f"tokens per 100 lines; retrieval: 1 call, {rc['tokens_per_query']:.0f} tokens per query"
    )
    print("  LLM-free mode: 0 calls (one embedding per line and per query sentence)")

    if args.llm == "local":
        from memories_core.llms import LocalLLM

        half = max(1, args.llm_items // 2)  # the first items of each source
        sample = [it for s in sources for it in split[s][:half]]
        llm = LocalLLM() if args.model == "smollm2-135m" else LocalLLM(model=args.model)
        llm_f1, seconds = llm_selector(sample, llm)
        fused_same = fscore(sample, {})
        every = statistics.fmean(
            f1(
                {i for i in range(1, len(it["options"]) + 1) if i != it["noto"]} or {it["noto"]},
                it["gold"],
            )
            for it in sample
        )
        usage = getattr(llm, "usage", None)
        out["llm"] = {
            "model": llm.name,
            "items": len(sample),
            "f1": llm_f1,
            "seconds_per_query": seconds,
            "fused_on_same_items": fused_same,
            "every_option_on_same_items": every,
            "usage": repr(usage),
        }
        print(
            f"\nLLM selector ({llm.name}) on {len(sample)} items: F1 {llm_f1:.3f}, "
            f"{seconds:.1f} s/query (fused selector on the same items: {fused_same:.3f}; "
            f"choosing every option: {every:.3f}); usage {usage!r}"
        )

    default_selector = fscore(retrieval, {})
    default_segmenter = boundary_prf(writing, embedder)
    embedder.save()
    out["default"] = {"selector_f1": default_selector, "segmenter": default_segmenter}
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2, default=list))
    sys.stdout.flush()
    print(f"selector F1: {default_selector:.3f}")
    print(f"segmenter boundary F1: {default_segmenter[2]:.3f}")


if __name__ == "__main__":
    main()
