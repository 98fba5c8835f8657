"""Other ways to order a recall's results, for session R@10, on ``rerank_late.py``'s scores.

The library's late-interaction reranker re-orders a head of the fused ranking by a min-max
blend of MaxSim and the fused score (``pool_head`` then ``blend_head``). Its knobs reach
session R@10 0.967 on LoCoMo dev at best, even in-sample (BENCHMARKS.md, "A wider grid for
session R@10"). This script asks whether another *way* of ordering does better, with no
model run: it reads the scores ``rerank_late.py`` cached (the first stage's top 225 per
question, MaxSim of its top 250 at 128 dimensions) and MiniLM's cached vectors. Families,
each cross-validated on its own grid (leave one conversation out, the library's objective:
the sum of R@5, R@10 and session R@10):

* ``min-max blend``: the library's own rule (candidates x weight, pool 250);
* ``z-score blend`` / ``pool z-score blend``: the two scores standardised over the head, or
  over the whole pool, instead of min-max (zero mean, unit variance: Montague & Aslam, 2001,
  "Relevance Score Normalization for Metasearch");
* ``rank fusion``: reciprocal-rank fusion of the two orders in the head (Cormack, Clarke and
  Buettcher, 2009, "Reciprocal Rank Fusion outperforms Condorcet and individual Rank
  Learning Methods"), ``k`` as its constant;
* ``session mass``: below the top ``H`` of the library's ranking, turns ordered by their
  session's reciprocal-rank mass in the first ``depth`` (sessions with many good turns
  first; the true sessions, as a gap rule of 30 minutes would find them);
* ``relevance feedback``: below the top ``H``, turns ordered by a blend of their position
  and their cosine with the query moved towards the centroid of the top ``m`` turns
  (Rocchio, 1971, "Relevance Feedback in Information Retrieval"; MiniLM vectors).

Every metric is scored on the first 50 results, as ``recall(k=50)`` returns them. Make the
caches first (about an hour; they are kept under ``benchmarks/out/cache``)::

    python benchmarks/rerank_late.py --no-ce --depth 150 --pools 0,100,150,200,250 \
        --candidates 10,20,30,40,50 --late-variants 0/0 --late-dim 128 \
        --objective R@5,R@10,S@10 --name _pool128
    python benchmarks/session_order.py

Writes ``benchmarks/out/session_order.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import statistics
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_retrieval as lr
import rerank_late as rl
from latency import OUT, add_output_options, command_line, run_or_redraw
from machine_info import machine, save_figure

from memories_core.evaluation import leave_one_out
from memories_core.retrieval.late_interaction import (
    DEFAULT_LATE_CANDIDATES,
    DEFAULT_LATE_POOL,
    DEFAULT_LATE_WEIGHT,
    pool_head,
)

#: The cached scores of the library's default first stage and 128-dimension MaxSim.
STAGE_CACHE = "rerank_late_stage1_default_depth150.json"
SCORE_CACHE = "rerank_late_scores_default_depth150_250.json"
SCORE_KEY = "markers=False augment=False context=True dim=128"
VECTOR_CACHE = "sentence_transformers_all_MiniLM_L6_v2.npz"
METRICS = ("R@5", "R@10", "S@10")
#: The library's default cell (``rerank_late.Cell``).
DEFAULT_CELL = (SCORE_KEY, DEFAULT_LATE_CANDIDATES, DEFAULT_LATE_POOL, DEFAULT_LATE_WEIGHT)


class Question:
    """One dev question: the first stage's order and scores, MaxSim of its pool, vectors."""

    def __init__(
        self,
        row: dict[str, Any],
        late: Sequence[float],
        vectors: Callable[[Sequence[str]], npt.NDArray[np.float32]] | None,
        query: npt.NDArray[np.float32] | None,
    ) -> None:
        self.row = row
        self.sid: str = row["sid"]
        self.evidence: list[str] = row["ev"]
        self.late = list(late)
        self.default = rl.blended_ranking(row, self.late, DEFAULT_CELL)
        self._vectors = vectors
        self._unit: npt.NDArray[np.float32] | None = None
        self.query = query

    def vectors(self, ids: Sequence[str]) -> npt.NDArray[np.float32]:
        """MiniLM vectors of any turns of the question's conversation (cached)."""
        assert self._vectors is not None
        return self._vectors(ids)

    def unit_vectors(self, depth: int) -> npt.NDArray[np.float32]:
        """Unit MiniLM vectors of the first ``depth`` of :attr:`default` (kept for reuse)."""
        assert self._vectors is not None
        if self._unit is None or len(self._unit) < depth:
            matrix = self._vectors(self.default[:depth])
            self._unit = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
        return self._unit[:depth]


def _unit(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    low, high = values.min(), values.max()
    return (values - low) / (high - low) if high > low else np.zeros_like(values)


def _standard(
    values: npt.NDArray[np.float64], over: npt.NDArray[np.float64] | None = None
) -> npt.NDArray[np.float64]:
    """``values`` in standard deviations from the mean of ``over`` (default: themselves)."""
    over = values if over is None else over
    spread = over.std()
    return (values - over.mean()) / spread if spread > 0 else np.zeros_like(values)


def _ranks(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """0 for the best value, ties in order."""
    order = np.argsort(-values, kind="stable")
    ranks = np.empty(len(values))
    ranks[order] = np.arange(len(values))
    return ranks


def library_blend(q: Question, candidates: int, weight: float) -> list[str]:
    """The library's own rule (``pool_head`` then ``blend_head``) at one grid point."""
    return rl.blended_ranking(q.row, q.late, (SCORE_KEY, candidates, DEFAULT_LATE_POOL, weight))


def blended(q: Question, candidates: int, weight: float, form: str, k: float = 60.0) -> list[str]:
    """The head of ``pool_head`` ordered by another fusion of MaxSim and the fused score."""
    ids: list[str] = q.row["ids"]
    scored = ids[:DEFAULT_LATE_POOL]
    late = dict(zip(scored, q.late, strict=False))
    head = pool_head(scored, [late[i] for i in scored], candidates)
    fused = dict(zip(ids, q.row["fused"], strict=True))
    model = np.array([late[i] for i in head], dtype=np.float64)
    first = np.array([fused[i] for i in head], dtype=np.float64)
    if form == "z-score":
        mixed = weight * _standard(model) + (1 - weight) * _standard(first)
    elif form == "pool z-score":
        pool_model = np.array([late[i] for i in scored], dtype=np.float64)
        pool_first = np.array([fused[i] for i in scored], dtype=np.float64)
        mixed = weight * _standard(model, pool_model) + (1 - weight) * _standard(first, pool_first)
    elif form == "rank fusion":
        mixed = weight / (k + _ranks(model)) + (1 - weight) / (k + _ranks(first))
    else:
        raise ValueError(form)
    order = sorted(range(len(head)), key=lambda n: (-mixed[n], n))
    block = [head[n] for n in order]
    chosen = set(block)
    return block + [item for item in ids if item not in chosen]


def session_mass(q: Question, top: int, k: float, depth: int, power: float) -> list[str]:
    """Below the first ``top``, turns by their session's reciprocal-rank mass, then position."""
    ranked = q.default
    mass: Counter[str] = Counter()
    for n, item in enumerate(ranked[:depth]):
        mass[lr.session_of(item)] += 1.0 / (k + n + 1) ** power
    position = {item: n for n, item in enumerate(ranked)}
    rest = sorted(ranked[top:], key=lambda i: (-mass[lr.session_of(i)], position[i]))
    return ranked[:top] + rest


def feedback(q: Question, m: int, beta: float, top: int, weight: float, depth: int) -> list[str]:
    """Below the first ``top`` (down to ``depth``), turns by position blended with their
    cosine to the query moved towards the centroid of the first ``m`` turns."""
    ranked = q.default
    assert q.query is not None
    window = ranked[:depth]
    matrix = q.unit_vectors(len(window))
    centroid = matrix[:m].mean(axis=0)
    moved = q.query / np.linalg.norm(q.query) + beta * centroid / np.linalg.norm(centroid)
    similar = (matrix @ moved)[top:]
    place = -np.arange(top, len(window), dtype=np.float64)
    mixed = weight * _unit(similar.astype(np.float64)) + (1 - weight) * _unit(place)
    order = sorted(range(len(mixed)), key=lambda n: (-mixed[n], n))
    return ranked[:top] + [window[top + n] for n in order] + ranked[depth:]


#: Each family's grid: (label, how one setting orders a question).
Setting = tuple[str, Callable[[Question], list[str]]]


def families() -> dict[str, list[Setting]]:
    """Every family's settings; the library's default is the first of its own family."""

    cells = list(itertools.product((40, 30, 50), (0.7, 0.5, 0.6, 0.8, 0.9)))

    def blend_family(form: str) -> list[Setting]:
        return [
            (f"{c} candidates, weight {w}", partial(blended, candidates=c, weight=w, form=form))
            for c, w in cells
        ]

    rank_cells = itertools.product((40, 30, 50), (0.5, 0.6, 0.7, 0.8), (5.0, 20.0, 60.0))
    mass_cells = itertools.product((0, 3, 5, 10), (2.0, 5.0, 10.0, 30.0), (50, 100), (1.0, 0.5))
    feedback_cells = itertools.product((3, 5), (0.5, 1.0, 2.0), (5, 10), (0.2, 0.4, 0.6), (50, 100))
    identity: Setting = ("the library's order", lambda q: q.default)
    return {
        "min-max blend (library)": [
            (f"{c} candidates, weight {w}", partial(library_blend, candidates=c, weight=w))
            for c, w in cells
        ],
        "z-score blend": blend_family("z-score"),
        "pool z-score blend": blend_family("pool z-score"),
        "rank fusion": [
            (
                f"{c} candidates, weight {w}, k {k:g}",
                partial(blended, candidates=c, weight=w, form="rank fusion", k=k),
            )
            for c, w, k in rank_cells
        ],
        "session mass": [identity]
        + [
            (
                f"top {t} kept, k {k:g}, depth {d}, power {p:g}",
                partial(session_mass, top=t, k=k, depth=d, power=p),
            )
            for t, k, d, p in mass_cells
        ],
        "relevance feedback": [identity]
        + [
            (
                f"m {m}, beta {b:g}, top {t} kept, weight {w:g}, depth {d}",
                partial(feedback, m=m, beta=b, top=t, weight=w, depth=d),
            )
            for m, b, t, w, d in feedback_cells
        ],
    }


class Asked(Protocol):
    """What :func:`scored` reads of a question: its conversation and evidence turns."""

    sid: str
    evidence: list[str]


AskedT = TypeVar("AskedT", bound=Asked)


def scored(questions: Sequence[AskedT], order: Callable[[AskedT], list[str]]) -> list[Any]:
    """Per question: (conversation, metrics of the first 50 results)."""
    return [(q.sid, lr.score_question(order(q)[: lr.DEPTH_K], q.evidence)) for q in questions]


def means(rows: Sequence[Any]) -> dict[str, float]:
    return {m: statistics.fmean(r[1][m] for r in rows) for m in METRICS}


def cross_validated(per_setting: dict[str, list[Any]]) -> dict[str, Any]:
    """LOCO CV of one family (objective R@5 + R@10 + session R@10 per question)."""
    objective = {
        label: {
            sid: [sum(r[1][m] for m in METRICS) for r in rows if r[0] == sid]
            for sid in dict.fromkeys(r[0] for r in rows)
        }
        for label, rows in per_setting.items()
    }
    cv = leave_one_out(objective)
    held = [
        r for sid, fold in cv["folds"].items() for r in per_setting[fold["chosen"]] if r[0] == sid
    ]
    all_means = {label: means(rows) for label, rows in per_setting.items()}
    best_s10 = max(all_means, key=lambda label: all_means[label]["S@10"])
    return {
        "held_out": means(held),
        "chosen": dict(Counter(fold["chosen"] for fold in cv["folds"].values())),
        "first_setting": all_means[next(iter(per_setting))],
        "best_in_sample_s10": {"setting": best_s10} | all_means[best_s10],
        "settings": len(per_setting),
    }


def load(out: Path) -> list[Question]:
    """The dev questions with evidence, from ``rerank_late.py``'s and the embedder's caches."""
    cache = out / "cache"
    missing = [n for n in (STAGE_CACHE, SCORE_CACHE, VECTOR_CACHE) if not (cache / n).is_file()]
    if missing:
        raise SystemExit(f"{cache} lacks {missing}: run rerank_late.py first (see --help)")
    stage = json.loads((cache / STAGE_CACHE).read_text())
    late = json.loads((cache / SCORE_CACHE).read_text())
    if SCORE_KEY not in late:
        raise SystemExit(f"{SCORE_CACHE} has no {SCORE_KEY!r} scores: run with --late-dim 128")
    with np.load(cache / VECTOR_CACHE) as data:  # read once: an npz reads on every access
        vectors = {name: data[name] for name in data.files}

    def key(kind: str, text: str) -> str:  # locomo_retrieval.CachedEmbedder's keys
        return kind + hashlib.sha1(text.encode("utf-8")).hexdigest()

    questions = []
    for n, row in enumerate(stage["rows"]):
        if not row["ev"]:
            continue
        texts = stage["text"][row["sid"]]

        def of(ids: Sequence[str], texts: dict[str, str] = texts) -> npt.NDArray[np.float32]:
            return np.stack([vectors[key("d", texts[i])] for i in ids])

        query = vectors.get(key("q", row["q"]))
        if query is None or any(key("d", text) not in vectors for text in texts.values()):
            raise SystemExit(f"{VECTOR_CACHE} lacks vectors of {row['sid']}: run rerank_late.py")
        questions.append(Question(row, late[SCORE_KEY][n], of, query))
    return questions


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm.auto import tqdm

    questions = load(args.out)
    result: dict[str, Any] = {
        "command": command_line(),
        "machine": machine(),
        "questions": len(questions),
        "default": means(scored(questions, lambda q: q.default)),
        "families": {},
    }
    for name, settings in families().items():
        per_setting = {
            label: scored(questions, order) for label, order in tqdm(settings, desc=name)
        }
        result["families"][name] = cross_validated(per_setting)
    return result


def report(result: dict[str, Any]) -> str:
    base = result["default"]
    lines = [
        result["command"],
        "",
        f"{result['questions']} dev questions; the library's default order: "
        + " / ".join(f"{base[m]:.3f}" for m in METRICS)
        + " (R@5 / R@10 / session R@10, in-sample).",
        "",
        "| family | settings | held-out R@5 / R@10 / session R@10 | folds chose "
        "| best session R@10 in-sample (setting) |",
        "| --- | ---: | --- | --- | --- |",
    ]
    for name, fam in result["families"].items():
        held = " / ".join(f"{fam['held_out'][m]:.3f}" for m in METRICS)
        chose = "; ".join(f"{label} ({n})" for label, n in fam["chosen"].items())
        best = fam["best_in_sample_s10"]
        lines.append(
            f"| {name} | {fam['settings']} | {held} | {chose} | "
            f"{best['S@10']:.4f} ({best['setting']}) |"
        )
    return "\n".join(lines) + "\n"


def session_bars(ax: Any, result: dict[str, Any]) -> None:
    """Each family's held-out and best in-sample session R@10 as bars, the goal as a line."""
    names = list(result["families"])
    held = [result["families"][n]["held_out"]["S@10"] for n in names]
    best = [result["families"][n]["best_in_sample_s10"]["S@10"] for n in names]
    x = np.arange(len(names))
    ax.bar(x - 0.2, held, 0.4, label="held-out (LOCO CV)")
    ax.bar(x + 0.2, best, 0.4, label="best setting, in-sample")
    ax.axhline(0.97, color="black", linestyle="--", linewidth=1, label="goal 0.97")
    ax.set_xticks(x, names, rotation=20, ha="right")
    ax.set_ylim(min(held + best) - 0.01, 0.978)
    ax.set_ylabel("session R@10 (first 50 results)")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    session_bars(ax, result)
    ax.set_title("Ways to order a recall, LoCoMo dev")
    ax.legend(loc="upper center", ncol=3, fontsize=8)
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where the caches are")
    add_output_options(parser, "session_order")
    run_or_redraw(parser.parse_args(argv), run, report, plot)


if __name__ == "__main__":
    main()
