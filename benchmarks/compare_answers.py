"""Answer-quality runs compared question by question, on the questions they share.

Two answer runs of ``benchmarks/locomo_qa.py`` (or of ``variant_qa.py``, which writes the
same files) differ in one thing: a recall rule, a default, a memory. Their mean F1s differ by
luck too, more so on a small draw. This script pairs the kept answers by question id and
reports, per run, F1 on the shared questions overall, per conversation and per category,
and against a base run: how many answers scored better and worse, and the exact two-sided
sign test's p over those (ties dropped). A reference run (no memory, another row) is
restricted to the same questions, so a variant answered on a subset of a larger draw is
read beside the larger run's rows on that subset.

    python benchmarks/compare_answers.py --base fused \\
        --run fused=OUT_A:memochat --run choice=OUT_B:memochat \\
        --run none=benchmarks/out/locomo_qa_150:none --out OUT/compare

Each answer is scored again from its kept reply against ``--data`` (the LoCoMo file the runs
asked from, the harness's default unless given), as ``locomo_qa.py`` does when it resumes:
scoring is deterministic and may have improved since a run wrote its figures, and two runs
compared must be scored by the same rule. ``--stored`` reads each answer's F1 as written
instead (runs whose data is not at hand).

Each ``--run`` is ``LABEL=FOLDER:MECHANISM``: the answers are read from
``FOLDER/state/MECHANISM/<conversation>/answers.jsonl``. Only the questions every run
answered are compared; each run's other answers are counted and left out. Writes
``compare.json`` and ``compare.md`` in ``--out`` and prints the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from math import comb
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_qa

from memories_core.evaluation.harness import QAItem, score_answer, select_questions
from memories_core.evaluation.locomo import CATEGORY_NAMES, load_locomo


@dataclass(frozen=True)
class Run:
    """One run's kept answers: ``label``, where they were read and the answers by id."""

    label: str
    source: str
    answers: dict[str, dict[str, Any]]


def parse_run(spec: str) -> tuple[str, Path, str]:
    """``LABEL=FOLDER:MECHANISM`` as its three parts.

    Raises:
        SystemExit: The spec does not have that shape.
    """
    label, sep, rest = spec.partition("=")
    folder, colon, mechanism = rest.rpartition(":")
    if not (sep and colon and label and folder and mechanism):
        raise SystemExit(f"--run {spec!r}: expected LABEL=FOLDER:MECHANISM")
    return label, Path(folder), mechanism


def load_answers(folder: Path, mechanism: str) -> dict[str, dict[str, Any]]:
    """Every kept answer of ``mechanism`` in a run folder, by question id.

    Raises:
        SystemExit: The run kept no answers for that mechanism.
    """
    answers = locomo_qa.kept_answers(folder, mechanism)
    if not answers:
        raise SystemExit(f"{folder}: no kept {mechanism} answers")
    return answers


def load_items(data: Path) -> dict[str, QAItem]:
    """Every question of a LoCoMo file by the harness's question id (``<sample>:<index>``).

    Raises:
        SystemExit: ``data`` is not a file.
    """
    if not Path(data).is_file():
        raise SystemExit(f"--data {data}: no such file (pass the LoCoMo file, or --stored)")
    return {item.id: item for item in select_questions(load_locomo(data))}


def rescore(
    answers: Mapping[str, Mapping[str, Any]], items: Mapping[str, QAItem], *, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """The kept answers with F1 and BLEU-1 scored again from their replies.

    ``seed`` is the run's option-order seed (adversarial questions are multiple choice).

    Raises:
        SystemExit: An answer's question is not in ``items`` (the run asked from other data),
            or it kept no reply.
    """
    scored: dict[str, dict[str, Any]] = {}
    for question, row in answers.items():
        item = items.get(question)
        if item is None:
            raise SystemExit(f"{question}: not a question of --data (another LoCoMo file?)")
        if not isinstance(row.get("prediction"), str):
            raise SystemExit(f"{question}: the kept answer has no reply to score (--stored?)")
        f1, bleu1 = score_answer(item, row["prediction"], seed=seed)
        scored[question] = {**row, "f1": f1, "bleu1": bleu1}
    return scored


def sign_test(better: int, worse: int) -> float:
    """Exact two-sided sign test p for ``better`` against ``worse`` (ties already dropped)."""
    n = better + worse
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(better, worse) + 1)) / 2**n
    return min(1.0, 2 * tail)


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def summarise(run: Run, ids: Sequence[str], base: Run | None) -> dict[str, Any]:
    """One run's figures on ``ids``, paired against ``base`` when given."""
    rows = [run.answers[i] for i in ids]
    by_conversation: dict[str, list[float]] = {}
    by_category: dict[str, list[float]] = {}
    for question, row in zip(ids, rows, strict=True):
        by_conversation.setdefault(question.split(":")[0], []).append(row["f1"])
        name = CATEGORY_NAMES.get(int(row["category"]), str(row["category"]))
        by_category.setdefault(name, []).append(row["f1"])
    recall = [row["recall_ms"] for row in rows if row.get("recall_ms") is not None]
    out: dict[str, Any] = {
        "label": run.label,
        "source": run.source,
        "questions": len(rows),
        "left_out": len(run.answers) - len(rows),
        "f1": _mean([row["f1"] for row in rows]),
        "conversations": {k: _mean(v) for k, v in sorted(by_conversation.items())},
        "categories": {k: _mean(v) for k, v in sorted(by_category.items())},
        "records": _mean([row.get("records", 0) for row in rows]),
        "empty_contexts": sum(1 for row in rows if not row.get("records")),
        "context_chars": _mean([row.get("context_chars", 0) for row in rows]),
        "recall_s_p50": statistics.median(recall) / 1000 if recall else None,
    }
    if base is not None:
        better = sum(1 for i in ids if run.answers[i]["f1"] > base.answers[i]["f1"])
        worse = sum(1 for i in ids if run.answers[i]["f1"] < base.answers[i]["f1"])
        out.update(better=better, worse=worse, p=sign_test(better, worse))
    return out


def compare(runs: Sequence[Run], base_label: str | None = None) -> dict[str, Any]:
    """Every run's figures on the questions all runs answered, paired against the base."""
    if not runs:
        raise SystemExit("no --run given")
    labels = [run.label for run in runs]
    if len(set(labels)) != len(labels):
        raise SystemExit(f"--run labels must differ: {labels}")
    by_label = {run.label: run for run in runs}
    if base_label is not None and base_label not in by_label:
        raise SystemExit(f"--base {base_label!r} is not one of {labels}")
    shared = set(runs[0].answers)
    for run in runs[1:]:
        shared &= set(run.answers)
    if not shared:
        raise SystemExit("the runs share no question")
    ids = sorted(shared, key=_question_order)
    base = by_label[base_label] if base_label is not None else None
    return {
        "base": base_label,
        "questions": len(ids),
        "ids": ids,
        "runs": {run.label: summarise(run, ids, base if run is not base else None) for run in runs},
    }


def _question_order(question: str) -> tuple[str, int]:
    conversation, _, index = question.rpartition(":")
    return conversation, int(index) if index.isdigit() else -1


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def table(result: Mapping[str, Any]) -> str:
    """The comparison as a Markdown table, one row per run."""
    runs = list(result["runs"].values())
    conversations = sorted({c for run in runs for c in run["conversations"]})
    categories = [n for n in CATEGORY_NAMES.values() if any(n in r["categories"] for r in runs)]
    head = ["run", "F1", *conversations, *categories, "records", "empty", "context chars"]
    head += ["recall s (p50)", f"vs {result['base']}: better / worse (p)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" + " ---: |" * (len(head) - 1)]
    for run in runs:
        paired = f"{run['better']} / {run['worse']} ({run['p']:.2f})" if "better" in run else "base"
        cells = [run["label"], _fmt(run["f1"])]
        cells += [_fmt(run["conversations"].get(c)) for c in conversations]
        cells += [_fmt(run["categories"].get(c)) for c in categories]
        cells += [_fmt(run["records"], ".2f"), str(run["empty_contexts"])]
        cells += [_fmt(run["context_chars"], ",.0f"), _fmt(run["recall_s_p50"], ".1f"), paired]
        lines.append("| " + " | ".join(cells) + " |")
    note = f"{result['questions']} shared questions"
    if result["base"] is None:
        note += "; no base run"
    return "\n".join(lines) + f"\n\n{note}.\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", default=[], help="LABEL=FOLDER:MECHANISM")
    parser.add_argument("--base", default=None, help="the label others are paired against")
    parser.add_argument("--out", type=Path, default=None, help="folder for compare.json/.md")
    parser.add_argument(
        "--data", type=Path, default=locomo_qa.DEFAULT_DATA, help="the LoCoMo file asked from"
    )
    parser.add_argument("--seed", type=int, default=0, help="the runs' option-order seed")
    parser.add_argument(
        "--stored", action="store_true", help="each answer's F1 as written, not scored again"
    )
    args = parser.parse_args(argv)
    items = None if args.stored else load_items(args.data)
    runs = []
    for spec in args.run:
        label, folder, mechanism = parse_run(spec)
        answers = load_answers(folder, mechanism)
        if items is not None:
            answers = rescore(answers, items, seed=args.seed)
        runs.append(Run(label, f"{folder.as_posix()}:{mechanism}", answers))
    result = compare(runs, args.base)
    text = table(result)
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
        (args.out / "compare.md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
