"""Fit the basis that narrows the bundled late-interaction model's token vectors.

The ONNX export of answerai-colbert-small-v1 that the library runs gives 384-dimension
hidden states; the model's trained 384 -> 96 projection (ColBERT §3.2) is not in it. This
script fits what replaces it: the principal directions of the model's unit token vectors
(the eigenvectors of their uncentred second moment, strongest first, so that the first
``d`` columns keep as much of every dot product as ``d`` dimensions can), over dialogue
text that is *not* LoCoMo, on which the width is then chosen:

* every user query and assistant reply of MemoryBank's simulated users;
* ``--memochat-lines`` distinct lines of MemoChat's test items (30-400 characters, shuffled
  with ``--seed``): the dialogues and memos its prompts quote. The 3,000 is not tuned:
  bases fitted on either source alone gave held-out figures within 0.005 of each other
  (BENCHMARKS.md, "Token vectors at 128 dimensions").

It writes the ``(384, 384)`` float32 matrix to the package
(``shared/memories_core/retrieval/data/colbert_small_basis.npy``, ``--basis``) and, in
``benchmarks/out/<name>.{json,md,png}``, the corpus sizes and the share of the vectors'
energy the first 32-384 directions hold. Which width the library uses is chosen by
``rerank_late.py --late-dim`` (leave one LoCoMo conversation out), not here.

    python benchmarks/fit_late_basis.py --data ../shared/datasets
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency import add_output_options, command_line, run_or_redraw
from machine_info import datasets_dir, machine, save_figure
from tqdm import tqdm

from memories_core.retrieval.late_encoder import BUNDLED_HIDDEN_DIM, OnnxLateInteractionEncoder

DEFAULT_DATA = datasets_dir()
BASIS = Path(__file__).resolve().parents[1] / "shared/memories_core/retrieval/data"
WIDTHS = (32, 64, 96, 128, 192, 256, 384)


def memorybank_texts(folder: Path) -> list[str]:
    """Every query and reply of MemoryBank's users, in file order, without repeats."""
    users = json.loads((folder / "memorybank" / "memory_bank_en.json").read_text("utf-8"))
    texts: list[str] = []
    for user in users.values():
        for day in user["history"].values():
            for exchange in day:
                texts += [exchange["query"], exchange["response"]]
    return list(dict.fromkeys(t for t in texts if isinstance(t, str) and t.strip()))


def memochat_texts(folder: Path, count: int, seed: int) -> list[str]:
    """``count`` distinct lines of MemoChat's test prompts, shuffled with ``seed``."""
    lines: list[str] = []
    with (folder / "memochat" / "test.jsonl").open(encoding="utf-8") as handle:
        for raw in handle:
            for part in re.split(r"\n+", json.loads(raw)["text"]):
                part = part.strip()
                if 30 < len(part) < 400 and not part.startswith("```"):
                    lines.append(part)
    unique = list(dict.fromkeys(lines))
    random.Random(seed).shuffle(unique)
    return unique[:count]


def fit(texts: list[str], threads: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Eigenvectors (columns, strongest first), eigenvalues and the token count."""
    encoder = OnnxLateInteractionEncoder(dim=BUNDLED_HIDDEN_DIM, threads=threads)
    moment = np.zeros((BUNDLED_HIDDEN_DIM, BUNDLED_HIDDEN_DIM), dtype=np.float64)
    tokens = 0
    for text in tqdm(texts, desc="encoding"):
        rows = encoder.encode_document(text).astype(np.float64)
        moment += rows.T @ rows
        tokens += len(rows)
    values, vectors = np.linalg.eigh(moment / tokens)
    order = np.argsort(values)[::-1]
    return vectors[:, order].astype(np.float32), values[order], tokens


def report(result: dict[str, Any]) -> str:
    """Markdown: corpus and the energy the first directions keep."""
    lines = [
        "# Late-interaction basis",
        "",
        f"`{result['command']}`; {result['texts']['memorybank']} MemoryBank texts and "
        f"{result['texts']['memochat']} MemoChat lines, {result['tokens']:,} token vectors, "
        f"{result['seconds']:.0f} s.",
        "",
        "| directions | share of the energy |",
        "| --- | --- |",
    ]
    lines += [f"| {w} | {share:.3f} |" for w, share in result["energy"].items()]
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    """Energy kept against the number of directions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = result["curve"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(curve) + 1), curve)
    ax.axvline(128, linestyle="--", color="grey", label="128 (the default width)")
    ax.set_xlabel("principal directions kept")
    ax.set_ylabel("share of the token vectors' energy")
    ax.set_ylim(0, 1)
    ax.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--memochat-lines", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--basis", type=Path, default=BASIS / "colbert_small_basis.npy")
    add_output_options(parser, "late_basis")
    run_or_redraw(parser.parse_args(argv), run, report, plot)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Fit the basis, write it (atomically) and return the figures."""
    bank = memorybank_texts(args.data)
    chat = memochat_texts(args.data, args.memochat_lines, args.seed)
    started = time.perf_counter()
    basis, values, tokens = fit(list(dict.fromkeys(bank + chat)), args.threads)
    cumulative = np.cumsum(values) / values.sum()
    args.basis.parent.mkdir(parents=True, exist_ok=True)
    partial = args.basis.with_suffix(".tmp.npy")
    np.save(partial, basis, allow_pickle=False)
    partial.replace(args.basis)  # atomic: a reader never sees half a file
    return {
        "command": command_line(),
        "machine": machine(),
        "texts": {"memorybank": len(bank), "memochat": len(chat)},
        "tokens": tokens,
        "seconds": time.perf_counter() - started,
        "energy": {str(w): float(cumulative[w - 1]) for w in WIDTHS},
        "curve": [float(c) for c in cumulative],
    }


if __name__ == "__main__":
    main()
