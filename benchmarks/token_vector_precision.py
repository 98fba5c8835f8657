"""Late interaction with stored token vectors: does int8 storage change what is recalled?

The token vectors a memory keeps with its records (``memories_core.token_vectors``) are int8
with one scale per record, a quarter of float32. This measures what that costs in recall, on
the library's late-interaction default (``late_interaction_pipeline()``: the default first
stage at 150 candidates per source, MaxSim over a pool of 250, 30 candidates blended at
weight 0.7, each turn encoded after the turn before it), on LoCoMo dev without session ids
(the setting of ``rerank_late.py``, whose first stage this reuses).

Every candidate text is encoded once in float32; the same vectors are then scored as
float32, as float16 (what ``rerank_late.py`` caches), after the library's own int8
round trip (``quantize`` then ``TokenVectors.floats``, the path a stored row takes: one
scale per record), and as int8 with one scale per row (an alternative codec). Per
precision: R@5, R@10 and session R@10 of the first 50 results, the share of questions whose
top 10 is the same list as with float32, and how far MaxSim moved.

    python benchmarks/token_vector_precision.py --data ../shared/datasets/locomo/locomo_dev.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_retrieval as lr
import rerank_late as rl
from machine_info import command_line, machine_line
from tqdm import tqdm

from memories_core.evaluation import load_locomo
from memories_core.retrieval.late_interaction import (
    DEFAULT_LATE_CANDIDATES,
    DEFAULT_LATE_DEPTH,
    DEFAULT_LATE_POOL,
    DEFAULT_LATE_WEIGHT,
    OnnxLateInteractionEncoder,
    maxsim,
)
from memories_core.token_vectors import quantize

Matrix = npt.NDArray[np.float32]
_HEX = "0" * 32


def _int8(rows: Matrix) -> Matrix:
    """The library's storage round trip: int8 with one scale, read back as float32."""
    return quantize("r", _HEX, _HEX, rows).floats()


def _int8_per_row(rows: Matrix) -> Matrix:
    """An alternative: int8 with one scale per row (word piece) instead of per record."""
    peaks = np.abs(rows).max(axis=1, keepdims=True)
    scales = np.where(peaks > 0, peaks / 127.0, 1.0).astype(np.float32)
    return np.clip(np.rint(rows / scales), -127, 127).astype(np.int8).astype(np.float32) * scales


def _float16(rows: Matrix) -> Matrix:
    return rows.astype(np.float16).astype(np.float32)


PRECISIONS: dict[str, tuple[Callable[[Matrix], Matrix], int]] = {
    "float32": (lambda rows: rows, 4),
    "float16": (_float16, 2),
    "int8": (_int8, 1),
    "int8, a scale per row": (_int8_per_row, 1),
}


def score_all(
    stage: dict[str, Any], rows: Sequence[dict[str, Any]], pool: int
) -> tuple[dict[str, list[list[float]]], list[int]]:
    """MaxSim of the first ``pool`` candidates of every row, per precision; token counts."""
    encoder = OnnxLateInteractionEncoder(markers=False, augment=False, threads=1)
    docs: dict[str, dict[str, Matrix]] = {}
    tokens: list[int] = []
    scores: dict[str, list[list[float]]] = {name: [] for name in PRECISIONS}
    for row in tqdm(rows, desc="MaxSim per precision", unit="q"):
        query = encoder.encode_query(row["q"])
        per: dict[str, list[float]] = {name: [] for name in PRECISIONS}
        for item in row["ids"][:pool]:
            text = rl.pair_text(stage, row["sid"], item, True)
            if text not in docs:
                full = encoder.encode_document(text).astype(np.float32)
                tokens.append(int(full.shape[0]))
                docs[text] = {name: convert(full) for name, (convert, _) in PRECISIONS.items()}
            for name in PRECISIONS:
                per[name].append(maxsim(query, docs[text][name]))
        for name in PRECISIONS:
            scores[name].append(per[name])
    return scores, tokens


def summarise(
    rows: Sequence[dict[str, Any]],
    scores: dict[str, list[list[float]]],
    tokens: Sequence[int],
    cell: rl.Cell,
) -> dict[str, Any]:
    """Recall per precision, top-10 agreement with float32, and MaxSim differences."""
    everything = list(range(len(rows)))
    ranked: dict[str, list[list[str]]] = {}
    result: dict[str, Any] = {}
    dim = 384
    mean_tokens = statistics.fmean(tokens)
    for name in PRECISIONS:
        scored = rl.blended_rows(rows, {"late": scores[name]}, cell, everything)
        result[name] = {m: statistics.fmean(r[2][m] for r in scored) for m in rl.METRICS}
        ranked[name] = [
            rl.blended_ranking(row, values, cell)[:10]
            for row, values in zip(rows, scores[name], strict=True)
        ]
    reference = scores["float32"]
    for name in PRECISIONS:
        diffs = [
            abs(a - b)
            for mine, ref in zip(scores[name], reference, strict=True)
            for a, b in zip(mine, ref, strict=True)
        ]
        same = sum(
            1 for a, b in zip(ranked[name], ranked["float32"], strict=True) if a[:10] == b[:10]
        )
        result[name] |= {
            "same_top10": same / len(rows),
            "maxsim_diff_mean": statistics.fmean(diffs),
            "maxsim_diff_max": max(diffs),
            "bytes_per_record": round(mean_tokens * dim * PRECISIONS[name][1]),
        }
    result["gaps"] = _gaps(reference, cell)
    return result


def _gaps(reference: list[list[float]], cell: rl.Cell) -> dict[str, float]:
    """Gaps between neighbouring MaxSim scores among each question's pool (float32)."""
    gaps = []
    for values in reference:
        ordered = sorted(values[: max(cell[1], cell[2])], reverse=True)
        gaps += [a - b for a, b in itertools.pairwise(ordered)]
    gaps.sort()
    return {"median": gaps[len(gaps) // 2], "p10": gaps[len(gaps) // 10]}


def table(result: dict[str, Any]) -> str:
    lines = [
        "| stored as | bytes per record | R@5 | R@10 | session R@10 | same top 10 as float32 "
        "| MaxSim change mean / max |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in PRECISIONS:
        r = result[name]
        lines.append(
            f"| {name} | {r['bytes_per_record']:,} | {r['R@5']:.3f} | {r['R@10']:.3f} | "
            f"{r['S@10']:.3f} | {r['same_top10']:.1%} | "
            f"{r['maxsim_diff_mean']:.4f} / {r['maxsim_diff_max']:.4f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=lr.DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=lr.OUT)
    parser.add_argument("--questions", type=int, default=0, help="first N questions (0: all)")
    args = parser.parse_args(argv)
    pool, candidates = DEFAULT_LATE_POOL, DEFAULT_LATE_CANDIDATES
    rl.HEAD = max(pool, candidates)  # the first stage keeps the whole pool
    stage_args = argparse.Namespace(
        data=args.data, out=args.out, depth=DEFAULT_LATE_DEPTH, first_stage="default"
    )
    started = time.perf_counter()
    stage = rl.first_stage(stage_args, load_locomo(args.data))
    rows = stage["rows"][: args.questions or None]
    scores, tokens = score_all(stage, rows, pool)
    cell: rl.Cell = ("late", candidates, pool, DEFAULT_LATE_WEIGHT)
    result = summarise(rows, scores, tokens, cell)
    report = {
        "command": command_line("token_vector_precision.py", list(argv or sys.argv[1:])),
        "machine": machine_line(),
        "questions": len(rows),
        "records_encoded": len(tokens),
        "tokens_per_record_mean": statistics.fmean(tokens),
        "setting": {
            "depth": DEFAULT_LATE_DEPTH,
            "pool": pool,
            "candidates": candidates,
            "weight": DEFAULT_LATE_WEIGHT,
            "context": True,
            "markers": False,
        },
        "wall_s": round(time.perf_counter() - started, 1),
        "results": result,
    }
    text = table(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "token_vector_precision.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / "token_vector_precision.md").write_text(text + "\n")
    print(text)
    print(
        f"{len(rows)} questions, {len(tokens)} records encoded "
        f"({report['tokens_per_record_mean']:.1f} word pieces each); neighbouring MaxSim "
        f"scores in a pool differ by {result['gaps']['median']:.4f} (median), "
        f"{result['gaps']['p10']:.4f} (10th percentile)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
