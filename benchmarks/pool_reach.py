"""Is session R@10 held back by what the first stage reaches? A wider pool, a second dense list.

The late-interaction reranker scores a pool: the first 250 of the first stage (MiniLM +
BM25, depth 150). Its misses on LoCoMo dev are mostly list questions whose evidence
sessions the first stage ranks low (BENCHMARKS.md, "Other ways to order, for session
R@10"), so a reader would suspect the pool. This script scores *every* turn of a
conversation with the reranker's MaxSim (128 dimensions, the records' texts in context, as
the library encodes them) and asks two questions, each family cross-validated like the
library's knobs (leave one conversation out, objective R@5 + R@10 + session R@10, first 50
results):

* ``wider pool``: the first stage's order continued past its top 225 by its own dense list
  (MiniLM cosine), the pool taken from 250 up to every turn, with the head size and the
  blend weight of the library's grid;
* ``second dense list``: bge-small-en-v1.5 (the ``rerank`` extra's ONNX model) fused into the
  first stage by reciprocal rank (Cormack, Clarke and Buettcher, 2009) at weight ``w`` and
  constant ``k`` before the library's rerank.

It also reports each family's *reach*: the share of evidence turns inside the pool.

It reads ``rerank_late.py``'s first-stage cache and MiniLM's cached vectors (as
``session_order.py`` does), encodes every dev turn with the late-interaction encoder
(about 2.5 minutes on 2 cores, cached in ``benchmarks/out/cache``) and embeds every turn
and question with bge-small (about 40 s, cached)::

    python benchmarks/pool_reach.py

Writes ``benchmarks/out/pool_reach.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_retrieval as lr
import rerank_late as rl
import session_order as so
from latency import OUT, add_output_options, command_line, run_or_redraw
from machine_info import machine, save_figure

from memories_core.embedders.base import l2_normalise
from memories_core.retrieval.late_interaction import (
    DEFAULT_LATE_CANDIDATES,
    DEFAULT_LATE_POOL,
    DEFAULT_LATE_WEIGHT,
    maxsim,
)

#: The late encoder's width in the library's default.
LATE_DIM = 128
#: The file of every dev turn's token vectors (keyed by the SHA-1 of the text encoded).
LATE_CACHE = f"pool_reach_late{LATE_DIM}.npz"
POOLS = (250, 350, 500, 10_000)
CANDIDATES = (DEFAULT_LATE_CANDIDATES, 60)
WEIGHTS = (0.6, DEFAULT_LATE_WEIGHT, 0.8)
RRF_WEIGHTS = (0.1, 0.25, 0.5, 0.75)
RRF_KS = (10, 60)
#: The library's default rerank cell (score key, candidates, pool, weight).
LIBRARY: rl.Cell = (so.SCORE_KEY, DEFAULT_LATE_CANDIDATES, DEFAULT_LATE_POOL, DEFAULT_LATE_WEIGHT)


class Scored:
    """One question with every turn of its conversation scored three ways.

    ``first``/``fused``: the first stage's order and fused scores (its top 225);
    ``dense``/``second``: MiniLM's and bge-small's cosine of every turn; ``late``: MaxSim.
    """

    def __init__(
        self,
        question: so.Question,
        dense: dict[str, float],
        second: dict[str, float],
        late: dict[str, float],
    ) -> None:
        self.sid = question.sid
        self.evidence = question.evidence
        self.first: list[str] = list(question.row["ids"])
        self.fused: list[float] = list(question.row["fused"])
        self.dense, self.second, self.late = dense, second, late


def continued(q: Scored) -> tuple[list[str], list[float]]:
    """The first stage's order, then the rest of the turns by their dense cosine.

    The rest keep fused scores below the first stage's lowest, in that order, so the
    library's blend sees them as the weakest candidates they are.
    """
    have = set(q.first)
    rest = sorted((i for i in q.dense if i not in have), key=lambda i: -q.dense[i])
    low = min(q.fused) - 1.0
    return q.first + rest, q.fused + [low - 1e-6 * n for n in range(len(rest))]


def fused_with_second(q: Scored, weight: float, k: float) -> tuple[list[str], list[float]]:
    """Reciprocal-rank fusion of the continued first stage and bge-small's order."""
    order, _ = continued(q)
    first = {item: n for n, item in enumerate(order)}
    second = {item: n for n, item in enumerate(sorted(q.second, key=lambda i: -q.second[i]))}
    score = {i: 1 / (k + first[i]) + weight / (k + second[i]) for i in order}
    ranked = sorted(order, key=lambda i: -score[i])
    return ranked, [score[i] for i in ranked]


def reranked(
    order: Sequence[str], fused: Sequence[float], late: dict[str, float], cell: rl.Cell
) -> list[str]:
    """The library's rerank (``pool_head`` then ``blend_head``) of ``order`` at ``cell``."""
    _, candidates, pool, _ = cell
    values = [late[i] for i in order[: max(pool, candidates)]]
    return rl.blended_ranking({"ids": list(order), "fused": list(fused)}, values, cell)


Order = Callable[[Scored], list[str]]


def library(q: Scored) -> list[str]:
    """The library's rerank: its pool is the first stage's own results (225 at depth 150)."""
    return reranked(q.first, q.fused, q.late, LIBRARY)


def families() -> dict[str, list[tuple[str, Order]]]:
    """Per family: (label, order) settings; each family's first is the library's."""
    wider: list[tuple[str, Order]] = [(f"the library's ({_label(LIBRARY)})", library)]
    for pool in POOLS:
        for candidates in CANDIDATES:
            for weight in WEIGHTS:
                cell = (so.SCORE_KEY, candidates, pool, weight)

                def order(q: Scored, cell: rl.Cell = cell) -> list[str]:
                    return reranked(*continued(q), q.late, cell)

                wider.append((f"continued, {_label(cell)}", order))
    second: list[tuple[str, Order]] = [("no second list (the library's)", library)]
    for weight in RRF_WEIGHTS:
        for k in RRF_KS:

            def fused_order(q: Scored, weight: float = weight, k: float = k) -> list[str]:
                return reranked(*fused_with_second(q, weight, k), q.late, LIBRARY)

            second.append((f"w {weight}, k {k}", fused_order))
    return {"wider pool": wider, "second dense list (bge-small)": second}


def _label(cell: rl.Cell) -> str:
    _, candidates, pool, weight = cell
    return f"pool {pool if pool < 10_000 else 'all'}, {candidates} candidates, weight {weight}"


def reach(
    questions: Sequence[Scored], pool_order: Callable[[Scored], list[str]], pool: int
) -> float:
    """Mean share of a question's evidence turns inside the first ``pool`` of its order."""
    shares = []
    for q in questions:
        wanted = set(q.evidence)
        shares.append(len(wanted & set(pool_order(q)[:pool])) / len(wanted))
    return float(np.mean(shares))


def late_vectors(
    texts: Sequence[str], cache: Path, encode: Callable[[str], npt.NDArray[np.float32]]
) -> dict[str, npt.NDArray[np.float16]]:
    """Token vectors of ``texts`` (float16, keyed by SHA-1), read from and added to ``cache``."""
    from tqdm.auto import tqdm

    found: dict[str, npt.NDArray[np.float16]] = {}
    if cache.is_file():
        with np.load(cache) as data:
            found = {name: data[name] for name in data.files}
    missing = {hashlib.sha1(t.encode("utf-8")).hexdigest(): t for t in texts}
    missing = {key: t for key, t in missing.items() if key not in found}
    for key, text in tqdm(missing.items(), desc="late vectors of the turns"):
        found[key] = np.asarray(encode(text), dtype=np.float16)
    if missing:
        np.savez(cache, **found)  # type: ignore[arg-type]
    return found


def load(out: Path) -> list[Scored]:
    """Every dev question, every turn of its conversation scored by MiniLM, bge-small, MaxSim."""
    from memories_core.embedders.onnx import OnnxEmbedder
    from memories_core.retrieval.late_encoder import OnnxLateInteractionEncoder

    questions = so.load(out)
    stage = json.loads((out / "cache" / so.STAGE_CACHE).read_text())
    stage["prev"] = {(sid, item): text for sid, item, text in stage["prev"]}
    turns = {sid: list(texts) for sid, texts in stage["text"].items()}
    pair = {
        (sid, item): rl.pair_text(stage, sid, item, True) for sid in turns for item in turns[sid]
    }
    encoder = OnnxLateInteractionEncoder(threads=2, dim=LATE_DIM)
    vectors = late_vectors(list(pair.values()), out / "cache" / LATE_CACHE, encoder.encode_document)
    bge = lr.CachedEmbedder(OnnxEmbedder(), out / "cache")
    bge.warm([t for sid in turns for t in stage["text"][sid].values()], query=False)
    bge.warm([q.row["q"] for q in questions], query=True)
    bge.save()
    questions_of: dict[str, list[so.Question]] = {}
    for q in questions:
        questions_of.setdefault(q.sid, []).append(q)

    def unit(matrix: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
        return l2_normalise(np.asarray(matrix, dtype=np.float32))

    # Each conversation's matrices once, not once per question.
    second_docs = {
        sid: unit(np.stack([bge.vectors[bge.key("d", stage["text"][sid][i])] for i in ids]))
        for sid, ids in turns.items()
    }
    dense_docs = {sid: unit(questions_of[sid][0].vectors(ids)) for sid, ids in turns.items()}
    late_docs = {key: vectors[_sha(text)].astype(np.float32) for key, text in pair.items()}
    scored = []
    for q in questions:
        ids = turns[q.sid]
        query = np.asarray(encoder.encode_query(q.row["q"]), dtype=np.float32)
        late = {i: maxsim(query, late_docs[(q.sid, i)]) for i in ids}
        assert q.query is not None
        dense = dense_docs[q.sid] @ unit(q.query[None])[0]
        second = second_docs[q.sid] @ unit(bge.embed_query(q.row["q"])[None])[0]
        scored.append(
            Scored(
                q,
                dict(zip(ids, dense.tolist(), strict=True)),
                dict(zip(ids, second.tolist(), strict=True)),
                late,
            )
        )
    return scored


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def _alone(q: Scored, signal: str) -> list[str]:
    """Every turn of the conversation ordered by one signal alone."""
    values: dict[str, float] = getattr(q, signal)
    return sorted(values, key=lambda i: -values[i])


def _own(q: Scored) -> list[str]:
    return q.first


def _first(q: Scored) -> list[str]:
    return continued(q)[0]


def _with_second(q: Scored, weight: float) -> list[str]:
    return fused_with_second(q, weight, 10)[0]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm.auto import tqdm

    questions = load(args.out)
    result: dict[str, Any] = {
        "command": command_line(),
        "machine": machine(),
        "questions": len(questions),
        "default": so.means(so.scored(questions, library)),
        "first stage": so.means(so.scored(questions, lambda q: q.first)),
        "families": {},
        "reach": {},
    }
    pools: dict[str, tuple[Order, int]] = {"first stage (library)": (_own, DEFAULT_LATE_POOL)}
    for p in POOLS:
        pools[f"first stage continued, pool {p if p < 10_000 else 'all'}"] = (_first, p)
    for w in RRF_WEIGHTS:
        pools[f"with bge-small, w {w}, k 10"] = (partial(_with_second, weight=w), DEFAULT_LATE_POOL)
    result["alone"] = {
        name: so.means(so.scored(questions, partial(_alone, signal=signal)))
        for name, signal in (
            ("MaxSim", "late"),
            ("MiniLM cosine", "dense"),
            ("bge-small cosine", "second"),
        )
    }
    for label, (order, pool) in pools.items():
        result["reach"][label] = reach(questions, order, pool)
    for name, settings in families().items():
        per_setting = {
            label: so.scored(questions, order) for label, order in tqdm(settings, desc=name)
        }
        result["families"][name] = so.cross_validated(per_setting)
    return result


def report(result: dict[str, Any]) -> str:
    lines = so.report(result).splitlines()
    first = result["first stage"]
    lines[2] += " The first stage alone: " + " / ".join(f"{first[m]:.3f}" for m in so.METRICS) + "."
    lines += [
        "",
        "Every turn ordered by one signal alone (in-sample): "
        + "; ".join(
            f"{name} " + " / ".join(f"{v[m]:.3f}" for m in so.METRICS)
            for name, v in result["alone"].items()
        )
        + ".",
        "",
        "| pool | evidence turns inside it |",
        "| --- | ---: |",
        *(f"| {label} | {share:.3f} |" for label, share in result["reach"].items()),
    ]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    labels = list(result["reach"])
    left.barh(labels, list(result["reach"].values()), color="tab:gray")
    left.set_xlim(0.95, 1.0)
    left.set_xlabel("evidence turns inside the pool")
    left.invert_yaxis()
    so.session_bars(right, result)
    right.axhline(result["default"]["S@10"], color="tab:blue", linewidth=1, label="library")
    right.legend(fontsize=8, loc="lower right")
    fig.suptitle("A wider reach for the late-interaction pool, LoCoMo dev")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT, help="where the caches are")
    add_output_options(parser, "pool_reach")
    run_or_redraw(parser.parse_args(argv), run, report, plot)


if __name__ == "__main__":
    main()
