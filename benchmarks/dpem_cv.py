"""Choose DPeM's executive settings on answers, leave one conversation out.

The paper leaves DPeM's promotion threshold and STM refresh period open ("a predetermined
threshold theta", "STM is refreshed periodically after certain rounds"; Zhang et al., 2023,
"Executive Process"). This script chooses them on the answer-quality harness, without the
coordinator's calls: each grid point replays the executive process on the DPeM row's
recorded rounds (``variant_qa.py --variant dpem-replay``: the same typed items, merged,
promoted and refreshed under the point's settings) and answers the row's questions with the
same reader. Each question's LoCoMo F1 is a point's score on its conversation, and
:func:`~memories_core.evaluation.leave_one_out` picks a point per held-out conversation on
the others (ties keep the first point: DPeM's settings before this choice). A default
should change only when every fold chooses the same point.

    python benchmarks/dpem_cv.py --source <the DPeM row's --out> --out <a new folder> -- \\
        --conversations 2 --sessions 10 --questions 150 --recall-budget 0

``--point NAME=SETTINGS`` (repeatable) replaces the grid: ``SETTINGS`` as
``variant_qa.py --dpem`` takes them (``theta=1,stm_refresh_rounds=24``; empty: the
library's defaults). Each point answers into ``<out>/<NAME>`` and resumes there. Writes
``dpem_cv.json``, ``dpem_cv.md`` and ``dpem_cv.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import variant_qa
from machine_info import save_figure

from memories_core.evaluation import CATEGORY_NAMES, leave_one_out, mean
from memories_core.evaluation.harness import read_jsonl
from memories_core.files import write_json_atomic

#: The default grid, each point's settings written out: DPeM's settings before this choice
#: (theta 3, STM refreshed every 6 rounds, at most 64 items) first, as ties keep it; no
#: forgetting (no refresh period or capacity is ever reached); promotion on an item's first
#: round.
GRID: dict[str, str] = {
    "theta-3": "theta=3,stm_refresh_rounds=6,stm_capacity=64",
    "no-forgetting": "theta=3,stm_refresh_rounds=100000,stm_capacity=100000",
    "theta-1": "theta=1,stm_refresh_rounds=6,stm_capacity=64",
}
ADVERSARIAL = 5
#: Merge thresholds at which the recorded items' recurrences are counted (88: the library's).
THRESHOLDS = (88.0, 80.0, 70.0, 60.0)


def parse_points(values: Sequence[str]) -> dict[str, str]:
    """``NAME=SETTINGS`` pairs (names are folder names; settings checked as ``--dpem``)."""
    points: dict[str, str] = {}
    for value in values:
        name, sep, settings = value.partition("=")
        if not sep or not name or not name.replace("-", "").replace("_", "").isalnum():
            raise SystemExit(f"--point: expected NAME=SETTINGS with a plain name, got {value!r}")
        variant_qa.dpem_settings(settings)  # fails here, before any answering
        points[name] = settings
    return points


def answers(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """One point's answered questions per conversation, in question order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((folder / "state" / "dpem").glob("*/answers.jsonl")):
        rows = sorted(read_jsonl(path), key=lambda r: str(r["id"]))
        if rows:
            out[path.parent.name] = rows
    return out


def summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """F1 overall, without adversarial questions, per category, and the context size."""
    cats = sorted({int(r["category"]) for r in rows})
    return {
        "f1": mean(float(r["f1"]) for r in rows),
        "f1_answerable": mean(float(r["f1"]) for r in rows if r["category"] != ADVERSARIAL),
        "categories": {
            CATEGORY_NAMES.get(c, str(c)): mean(float(r["f1"]) for r in rows if r["category"] == c)
            for c in cats
        },
        "context_chars": mean(float(r["context_chars"]) for r in rows),
        "n": len(rows),
    }


def recurrences(folder: Path, thresholds: Sequence[float] = THRESHOLDS) -> dict[str, Any]:
    """How often the recorded items recur, per merge threshold, from a point's replays.

    An item recurs at a threshold when an item of an earlier round is its near-duplicate
    there (:func:`~memories_core.mechanisms.dpem_items.near_duplicate`): what the flag table
    counts toward ``theta``. Read from each conversation's recorded rounds, which
    ``dpem-replay`` keeps beside the memory; the first pair per threshold band is kept as an
    example, to read whether the merges would be the same fact.
    """
    from memories_core.mechanisms.dpem_items import duplicate_score

    items: list[tuple[str, int, str]] = []
    for path in sorted((folder / "state" / "dpem").glob(f"*/{variant_qa.ROUNDS_FILE}")):
        for entry in json.loads(path.read_text(encoding="utf-8")):
            items += [(path.parent.name, int(entry["round"]), text) for text, _ in entry["items"]]
    lowest = min(thresholds)
    best: list[tuple[float, int]] = []  # (best score against an earlier round's item, which)
    for i, (conv, number, text) in enumerate(items):
        scores = (
            (duplicate_score(text, other), j)
            for j, (c, n, other) in enumerate(items[:i])
            if c == conv and n < number
        )
        best.append(max((pair for pair in scores if pair[0] >= lowest), default=(0.0, -1)))
    bands = sorted(thresholds, reverse=True)
    out: dict[str, Any] = {"items": len(items), "recurring": {}, "examples": {}}
    for top, low in zip([101.0, *bands], bands, strict=False):
        out["recurring"][f"{low:g}"] = sum(score >= low for score, _ in best)
        pairs = [(i, j) for i, (score, j) in enumerate(best) if low <= score < top]
        if pairs:
            i, j = pairs[0]
            out["examples"][f"{low:g}"] = [items[j][2], items[i][2], round(best[i][0], 1)]
    return out


def evaluate(points: dict[str, str], out: Path) -> dict[str, Any]:
    """Score the answered points and cross-validate them over their common conversations."""
    answered = {name: answers(out / name) for name in points}
    common = sorted(set.intersection(*(set(a) for a in answered.values())))
    if not common:
        raise SystemExit("no conversation is answered by every point")
    for conv in common:
        ids = {name: [r["id"] for r in answered[name][conv]] for name in points}
        if len({tuple(v) for v in ids.values()}) != 1:
            raise SystemExit(f"{conv}: the points answered different questions")
    scores = {
        name: {conv: [float(r["f1"]) for r in answered[name][conv]] for conv in common}
        for name in points
    }
    return {
        "points": points,
        "conversations": common,
        "grid": {
            name: {
                "all": summary([r for conv in common for r in answered[name][conv]]),
                **{conv: summary(answered[name][conv]) for conv in common},
            }
            for name in points
        },
        "cv": leave_one_out(scores),
        "recurrences": recurrences(out / next(iter(points))),
    }


def markdown(result: dict[str, Any]) -> str:
    """The grid and the folds, for BENCHMARKS.md."""
    convs = result["conversations"]
    cats = list(result["grid"][next(iter(result["points"]))]["all"]["categories"])
    lines = [
        "| point | settings | F1 | without adversarial | "
        + " | ".join(cats)
        + " | "
        + " | ".join(f"{c} F1" for c in convs)
        + " | context chars |",
        "| --- | --- | ---: | ---: | " + " | ".join("---:" for _ in cats + convs) + " | ---: |",
    ]
    for name, settings in result["points"].items():
        row = result["grid"][name]
        lines.append(
            f"| {name} | {settings or 'library defaults'} | {row['all']['f1']:.3f} | "
            f"{row['all']['f1_answerable']:.3f} | "
            + " | ".join(f"{row['all']['categories'][c]:.3f}" for c in cats)
            + " | "
            + " | ".join(f"{row[c]['f1']:.3f}" for c in convs)
            + f" | {row['all']['context_chars']:.0f} |"
        )
    cv = result["cv"]
    lines += ["", "| held-out conversation | chosen on the others | held-out F1 | questions |"]
    lines.append("| --- | --- | ---: | ---: |")
    for conv, fold in cv["folds"].items():
        lines.append(f"| {conv} | {fold['chosen']} | {fold['held_out']:.3f} | {fold['n']} |")
    agree = "every fold chose the same point" if cv["agree"] else "the folds disagree"
    lines += [
        "",
        f"Held-out F1 {cv['held_out']:.3f} over {cv['n']} questions; {agree}; "
        f"best on all: {cv['best_on_all']}.",
    ]
    rec = result["recurrences"]
    if rec["items"]:
        counts = ", ".join(f"{n} at {t}" for t, n in rec["recurring"].items())
        lines += [
            "",
            f"Recorded items with a near-duplicate in an earlier round (what counts toward "
            f"theta), of {rec['items']}: {counts}.",
        ]
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> None:
    """F1 per point, one bar per conversation and one for all."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["points"])
    groups = [*result["conversations"], "all"]
    width = 0.8 / len(groups)
    fig, ax = plt.subplots(figsize=(1.8 + 1.6 * len(names), 3.6))
    for i, group in enumerate(groups):
        values = [result["grid"][n][group]["f1"] for n in names]
        ax.bar([x + i * width for x in range(len(names))], values, width, label=group)
    ax.set_xticks([x + width * (len(groups) - 1) / 2 for x in range(len(names))], names)
    ax.set_ylabel("LoCoMo F1")
    ax.set_title("DPeM executive settings (replayed rounds, same reader)")
    ax.legend(fontsize=8)
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    own, rest = variant_qa.split_args(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="the DPeM row's --out")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--point", action="append", default=[], help="NAME=SETTINGS")
    parser.add_argument("--no-run", action="store_true", help="only score what is answered")
    args = parser.parse_args(own)
    points = parse_points(args.point) if args.point else dict(GRID)
    for name, settings in points.items() if not args.no_run else ():
        print(f"== {name}: {settings or 'library defaults'}")
        try:
            variant_qa.main(
                [
                    "--variant",
                    "dpem-replay",
                    "--dpem",
                    settings,
                    "--source",
                    str(args.source),
                    "--out",
                    str(args.out / name),
                    "--",
                    *rest,
                ]
            )
        except SystemExit as stop:
            if not isinstance(stop.code, str):
                raise
            print(f"{name}: stopped: {stop.code}")  # e.g. a conversation not ingested yet
    result = evaluate(points, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "dpem_cv.json", result)
    text = markdown(result)
    (args.out / "dpem_cv.md").write_text(text + "\n", encoding="utf-8")
    plot(result, args.out / "dpem_cv.png")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
