"""Batched answers: the reader answering several questions in one pass, against one at a time.

A CPU decodes one token per forward pass and reads every weight in each pass; with the int8
decoding weights (``LocalLLM(quantize="auto")``) a pass over eight sequences costs about what
a pass over one costs, so answers written together cost less each. Prompts are still read
one position after another, padded to the longest of the batch. This script measures what
that gives on the answer-quality harness: ``benchmarks/locomo_qa.py`` answers the same
questions from the same kept ingest with ``--answer-batch`` 1 (one at a time, as the table's
rows were made) and each larger size, and it reports per size the reader's seconds per
question, the speed-up, F1, and how many answers are the same words as one at a time.

    python benchmarks/answer_batch.py --sizes 1,4,8 --out benchmarks/out/answer_batch -- \
        --conversations 1 --sessions 10 --questions 48 --recall-budget 0

The arguments after ``--`` go to ``locomo_qa.py`` (``--mechanisms <--mechanism>
--answer-batch N --resume --out OUT/bN`` are added). The reader is loaded once for every size.
Sizes already answered in ``--out`` are kept (``--resume``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_qa
from machine_info import command_line, machine, run_header, save_figure


def measure(sizes: list[int], mechanism: str, out: Path, rest: list[str]) -> list[dict[str, Any]]:
    """Answer with each batch size; return one summary per size (the first is the baseline).

    The reader and the embedder are loaded once and given to every run of the harness.
    """
    from memories_core.embedders import SentenceTransformerEmbedder

    harness = locomo_qa.parse_args(rest)
    llm = locomo_qa.make_llm(
        harness.llm, harness.model, harness.base_url, harness.threads, harness.quantize
    )
    embedder = SentenceTransformerEmbedder()
    first = out / f"b{sizes[0]}"
    rows = []
    for size in sizes:
        folder = out / f"b{size}"
        if size != sizes[0] and mechanism not in locomo_qa.BASELINES:
            # The same records for every size: the first size's ingest, copied.
            locomo_qa.copy_ingest(first, folder, mechanism, embedder=embedder)
        argv = [*rest, "--mechanisms", mechanism, "--answer-batch", str(size)]
        locomo_qa.main([*argv, "--resume", "--out", str(folder), "-q"], embedder=embedder, llm=llm)
        summary = json.loads((folder / "locomo_qa.json").read_text(encoding="utf-8"))
        row = summary["rows"][0]
        rows.append(
            {
                "batch": size,
                "questions": row["questions"],
                "answer_s": row["answer_s"],
                "answer_s_per_q": row["answer_s"] / max(1, row["questions"]),
                "f1": row["f1"],
                "answers": locomo_qa.kept_answers(folder, mechanism),
            }
        )
    base = rows[0]
    for row in rows:
        same = [
            row["answers"][i]["prediction"] == a["prediction"]
            for i, a in base["answers"].items()
            if i in row["answers"]
        ]
        row["same_as_first"] = sum(same)
        row["speedup"] = base["answer_s_per_q"] / max(1e-9, row["answer_s_per_q"])
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| batch | questions | reader s/question | speed-up | F1 | answers as batch "
        f"{rows[0]['batch']} |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['batch']} | {row['questions']} | {row['answer_s_per_q']:.2f} "
            f"| {row['speedup']:.2f}x | {row['f1']:.3f} "
            f"| {row['same_as_first']} of {len(rows[0]['answers'])} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    sizes = [str(r["batch"]) for r in rows]
    bars = ax.bar(sizes, [r["answer_s_per_q"] for r in rows], color="#4C72B0")
    for bar, row in zip(bars, rows, strict=True):
        ax.annotate(
            f"F1 {row['f1']:.3f}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xlabel("questions answered per batch (--answer-batch)")
    ax.set_ylabel("reader seconds per question")
    ax.set_title("Batched answers, offline reader")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    argv = list(given)
    rest: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,4,8", help="batch sizes; the first is the baseline")
    parser.add_argument("--mechanism", default="history", help="the harness row answered")
    parser.add_argument("--out", type=Path, default=locomo_qa.DEFAULT_OUT.parent / "answer_batch")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < 1:
        raise SystemExit("--sizes: positive batch sizes, the baseline first")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = measure(sizes, args.mechanism, args.out, rest)
    text = table(rows)
    print(text)
    plot(rows, args.out / "answer_batch.png")
    kept = [{k: v for k, v in r.items() if k != "answers"} for r in rows]
    report = {
        "command": command_line("benchmarks/answer_batch.py", given),
        "machine": machine(),
        "mechanism": args.mechanism,
        "rows": kept,
    }
    (args.out / "answer_batch.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    info = report["machine"]
    header = (
        f"{run_header(info, report['command'])} Reader: the harness's (`--model`, default the "
        f"offline default model); row `{args.mechanism}`; the same kept ingest for every size."
    )
    (args.out / "answer_batch.md").write_text(f"{header}\n\n{text}\n", encoding="utf-8")
    best = max(rows, key=lambda r: r["speedup"])
    print(
        f"batch {best['batch']}: {best['speedup']:.2f}x faster answers, F1 {best['f1']:.3f} "
        f"vs {rows[0]['f1']:.3f} one at a time"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
