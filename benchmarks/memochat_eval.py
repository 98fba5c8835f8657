"""MemoChat (Lu et al., 2023): memo retrieval F1, LLM-free segmentation, cost.

Reads MemoChat test items (``test.jsonl``'s format: ``question_id``, ``text``, ``type``,
``answer``) and measures:

* **selector F1** on the ``retrieval_*`` items: the paper's option-selection F1 (Table 3's
  regular F1; per item, between the chosen and the reference option sets, NOTO included,
  averaged over items) for the fused dense + BM25 selector
  (:func:`memories_core.mechanisms.memochat.select_options`) at several thresholds, for an
  embedding-only selector (each query sentence's best option above a cosine threshold), and,
  with ``--llm local --llm-items N``, for the LLM selector on the first N/2 items of each
  source (the bundled SmolLM2-135M; slow: about 14 s a query on 2 shared cores);
* thresholds by **cross-validation over the two sources** (tune on dialogsum, test on
  topiocqa, and the other way round): the figures a setting tuned on one source reaches on
  the other, and the setting with the best mean of the two per-source figures (the
  documented defaults come from that rule, both sources weighing alike);
* the **answer rule** of the selector (``answer_penalty``) swept at the default threshold;
* **segmenter boundary P/R/F1** of the LLM-free segmenter
  (:func:`memories_core.mechanisms.memochat.segment_lines`) on the ``writing_*`` items: a
  boundary is the first line of a topic other than the first; exact matches;
* **cost**: LLM calls and (estimated) tokens per 100 dialogue lines for memo writing and
  per query for retrieval, counted on the prompts the library sends.

The last two lines printed are always ``selector F1: 0.xxx`` and
``segmenter boundary F1: 0.xxx``: the default LLM-free selector and segmenter with their
documented defaults (no tuning on the file).

    python benchmarks/memochat_eval.py [ITEMS] [--llm local --llm-items 20] [--write-md]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memories_core.embedders import SentenceTransformerEmbedder
from memories_core.mechanisms.memochat import (
    DEFAULT_THRESHOLD,
    choose_memos,
    segment_lines,
    select_options,
)
from memories_core.prompts.memochat import build_retrieval_messages, build_writing_messages
from memories_core.usage import estimate_tokens

DEFAULT_ITEMS = (
    Path(__file__).resolve().parents[1].parent / "shared" / "datasets" / "memochat" / "test.jsonl"
)
THRESHOLDS = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4)
PENALTIES = (0.0, 0.25, 0.5, 0.75, 1.0)
SEGMENTER_GRID = [
    (w, c, shift, cont)
    for w in (2, 3)
    for c in (0.5, 1.0, 1.5)
    for shift in (0.0, 0.4, 0.8)
    for cont in (0.0, 0.2, 0.4)
]
_OPTION = re.compile(r"^\((\d+)\) ?(.*)$", re.M)
_LINE = re.compile(r"^\(line \d+\) (.*)$", re.M)


class CachedEmbedder:
    """Wraps an embedder with a text -> vector cache (the sweeps embed the same texts).

    With ``file`` set, vectors persist in that ``.npz`` (keyed by the text's SHA-1) between
    runs; :meth:`save` writes it.
    """

    def __init__(self, inner: Any, file: Path | None = None) -> None:
        self.inner = inner
        self.file = file
        self.cache: dict[str, np.ndarray] = {}
        self.stored: dict[str, np.ndarray] = {}
        if file is not None and file.exists():
            data = np.load(file)
            self.stored = {key: data[key] for key in data.files}
        self.dirty = False

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    def save(self) -> None:
        if self.file is not None and self.dirty:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            np.savez(self.file, **self.stored)  # type: ignore[arg-type]
            self.dirty = False

    @property
    def usage(self) -> Any:
        return self.inner.usage

    def embed_documents(self, texts: Sequence[str]) -> np.ndarray:
        for text in texts:
            if text not in self.cache and self.key(text) in self.stored:
                self.cache[text] = self.stored[self.key(text)]
        missing = list(dict.fromkeys(t for t in texts if t not in self.cache))
        if missing:
            self.dirty = True
            for text, vector in zip(missing, self.inner.embed_documents(missing), strict=True):
                self.cache[text] = vector
                self.stored[self.key(text)] = np.asarray(vector)
        return np.array([self.cache[t] for t in texts])

    def embed_query(self, text: str) -> np.ndarray:
        return self.embed_documents([text])[0]


def retrieval_items(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
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
        out.append(
            {"query": query, "options": options, "noto": noto, "gold": gold, "source": source}
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


def select(item: dict[str, Any], embedder: Any, **kwargs: Any) -> set[int]:
    """Run a selector on one item; map back to the item's option numbers (NOTO if none)."""
    real = [i for i in range(1, len(item["options"]) + 1) if i != item["noto"]]
    chosen = select_options(
        item["query"], [item["options"][i - 1] for i in real], embedder, **kwargs
    )
    return {real[c] for c in chosen} or {item["noto"]}


def selector_f1(items: Sequence[dict[str, Any]], embedder: Any, **kwargs: Any) -> float:
    if not items:
        return float("nan")
    return statistics.fmean(f1(select(it, embedder, **kwargs), it["gold"]) for it in items)


def boundaries(item: dict[str, Any], embedder: Any, **kwargs: Any) -> set[int]:
    return {start for start, _ in segment_lines(item["lines"], embedder, **kwargs) if start > 1}


def boundary_prf(
    items: Sequence[dict[str, Any]], embedder: Any, **kwargs: Any
) -> tuple[float, ...]:
    tp = fp = fn = 0
    for item in items:
        pred = boundaries(item, embedder, **kwargs)
        tp += len(pred & item["gold"])
        fp += len(pred - item["gold"])
        fn += len(item["gold"] - pred)
    p = tp / (tp + fp) if tp + fp else 0.0
    r = tp / (tp + fn) if tp + fn else 0.0
    return p, r, (2 * p * r / (p + r) if p + r else 0.0)


def cross_validate(
    items: Sequence[dict[str, Any]], score: Any, grid: Sequence[Any]
) -> list[dict[str, Any]]:
    """Tune on one source, test on the other, both ways."""
    sources = sorted({it["source"] for it in items})
    rows = []
    for tune in sources:
        for test in sources:
            if tune == test:
                continue
            on_tune = [it for it in items if it["source"] == tune]
            on_test = [it for it in items if it["source"] == test]
            best = max(grid, key=lambda g: score(on_tune, g))  # ties: the earliest point
            rows.append(
                {
                    "tune": tune,
                    "test": test,
                    "chosen": best,
                    "tune_f1": score(on_tune, best),
                    "test_f1": score(on_test, best),
                }
            )
    return rows


def macro_best(items: Sequence[dict[str, Any]], score: Any, grid: Sequence[Any]) -> Any:
    """The grid point with the best mean of the per-source figures (sources weigh alike)."""
    sources = sorted({it["source"] for it in items})
    split = [[it for it in items if it["source"] == s] for s in sources]
    return max(grid, key=lambda g: statistics.fmean(score(part, g) for part in split))


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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("items", nargs="?", default=str(DEFAULT_ITEMS))
    parser.add_argument("--llm", choices=["none", "local"], default="none")
    parser.add_argument("--llm-items", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args(argv)

    rows = [json.loads(line) for line in Path(args.items).read_text().splitlines() if line.strip()]
    retrieval = retrieval_items(rows)
    writing = writing_items(rows)
    cache = Path(__file__).resolve().parent / "out" / "cache" / "memochat_minilm.npz"
    embedder = CachedEmbedder(SentenceTransformerEmbedder(), cache)
    out: dict[str, Any] = {
        "items": args.items,
        "retrieval": len(retrieval),
        "writing": len(writing),
    }
    sources = sorted({it["source"] for it in retrieval})

    print(f"{len(retrieval)} retrieval items, {len(writing)} writing items ({args.items})")
    print("\nselector F1 by threshold (fused dense+BM25 | embedding-only), all / per source")
    sweep = []
    for t in THRESHOLDS:
        fused = selector_f1(retrieval, embedder, threshold=t)
        dense = selector_f1(
            retrieval, embedder, threshold=t, dense_weight=1.0, smoothing=0.0, answer_penalty=0.0
        )
        per = {
            s: selector_f1([it for it in retrieval if it["source"] == s], embedder, threshold=t)
            for s in sources
        }
        sweep.append({"threshold": t, "fused": fused, "dense": dense, **per})
        detail = "  ".join(f"{s} {v:.3f}" for s, v in per.items())
        print(f"  t={t:.2f}  fused {fused:.3f}  ({detail})  embedding-only {dense:.3f}")
    out["sweep"] = sweep

    print(f"\nanswer rule: selector F1 by answer_penalty at t={DEFAULT_THRESHOLD}")
    penalty_rows = []
    for p in PENALTIES:
        per = {
            s: selector_f1(
                [it for it in retrieval if it["source"] == s],
                embedder,
                answer_penalty=p,
            )
            for s in sources
        }
        both = selector_f1(retrieval, embedder, answer_penalty=p)
        penalty_rows.append({"answer_penalty": p, "all": both, **per})
        detail = "  ".join(f"{s} {v:.3f}" for s, v in per.items())
        print(f"  p={p:.2f}  all {both:.3f}  ({detail})")
    out["penalty_sweep"] = penalty_rows

    def fused_score(items: Sequence[dict[str, Any]], g: tuple[float, float]) -> float:
        return selector_f1(items, embedder, threshold=g[0], answer_penalty=g[1])

    def dense_score(items: Sequence[dict[str, Any]], t: float) -> float:
        return selector_f1(
            items, embedder, threshold=t, dense_weight=1.0, smoothing=0.0, answer_penalty=0.0
        )

    print("\ncross-validated selector (tune on one source, test on the other)")
    fused_grid = [(t, p) for p in PENALTIES for t in THRESHOLDS]
    cv = cross_validate(retrieval, fused_score, fused_grid)
    out["cv_fused"] = cv
    for row in cv:
        print(
            f"  fused           tune {row['tune']:9s} -> t={row['chosen'][0]:.2f}, "
            f"penalty={row['chosen'][1]:.2f} (F1 {row['tune_f1']:.3f} there), "
            f"F1 on {row['test']}: {row['test_f1']:.3f}"
        )
    macro = macro_best(retrieval, fused_score, fused_grid)
    out["macro_fused"] = macro
    print(f"  fused, best mean of the two sources: t={macro[0]:.2f}, penalty={macro[1]:.2f}")
    cv = cross_validate(retrieval, dense_score, THRESHOLDS)
    out["cv_embedding-only"] = cv
    for row in cv:
        print(
            f"  embedding-only  tune {row['tune']:9s} -> t={row['chosen']:.2f}, "
            f"F1 on {row['test']}: {row['test_f1']:.3f}"
        )

    print("\nsegmenter boundary P/R/F1 (LLM-free, TextTiling-style + speaker-turn cues)")

    def seg_score(items: Sequence[dict[str, Any]], g: tuple[int, float, float, float]) -> float:
        return boundary_prf(
            items,
            embedder,
            window=g[0],
            depth_cutoff=g[1],
            shift_cue=g[2],
            continuation_cue=g[3],
        )[2]

    for row in cross_validate(writing, seg_score, SEGMENTER_GRID):
        w, c, shift, cont = row["chosen"]
        print(
            f"  tune {row['tune']:9s} -> window={w}, cutoff={c}, shift={shift}, "
            f"continuation={cont} (F1 {row['tune_f1']:.3f} there), "
            f"F1 on {row['test']}: {row['test_f1']:.3f}"
        )
        out.setdefault("cv_segmenter", []).append(row)
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
        sample = [it for s in sources for it in [r for r in retrieval if r["source"] == s][:half]]
        llm_f1, seconds = llm_selector(sample, LocalLLM())
        fused_same = selector_f1(sample, embedder, threshold=DEFAULT_THRESHOLD)
        every = statistics.fmean(
            f1(
                {i for i in range(1, len(it["options"]) + 1) if i != it["noto"]} or {it["noto"]},
                it["gold"],
            )
            for it in sample
        )
        out["llm"] = {
            "items": len(sample),
            "f1": llm_f1,
            "seconds_per_query": seconds,
            "fused_on_same_items": fused_same,
            "every_option_on_same_items": every,
        }
        print(
            f"\nLLM selector (bundled LocalLLM) on {len(sample)} items: F1 {llm_f1:.3f}, "
            f"{seconds:.1f} s/query (fused selector on the same items: {fused_same:.3f}; "
            f"choosing every option: {every:.3f})"
        )

    default_selector = selector_f1(retrieval, embedder)
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
