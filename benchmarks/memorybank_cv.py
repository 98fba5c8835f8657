"""Choose MemoryBank's forgetting defaults on LoCoMo by leave-one-conversation-out CV.

What a user gets: ``MemoryBankMemory.save`` / ``recall`` with the library defaults (bundled
MiniLM, rule-based summariser ``memorybank_reply``) and a :class:`FixedClock` that follows the
conversation: before each session is saved the clock is set to that session's date (turns
30 s apart), so the next session's first save closes the previous day (daily summary, note,
global summary and portrait, §2.1; with ``archive_below`` also the scheduled forgetting,
§2.3). The questions are asked the day after the last session, after a final
``consolidate``, in the dataset's order, through the public ``recall(k=10)``, which
reinforces what it returns (the default). A question's R@k counts its evidence turns among the
first k records recalled (a daily summary takes a slot but is never evidence).

Grid 1 (archive off): ``forgetting_weight`` in 0, 0.1, 0.25, 0.5, 0.75, 1 (0 first: ties
keep it). Grid 2 (weight 0): ``archive_below`` off, 0.01, 0.1. Each grid is
cross-validated leave one conversation out: a fold picks the point with the best mean of R@5
and R@10 on the other conversations and is scored on the held-out one. The previous default
(weight 1, daily summaries not decaying) is measured for the before/after figure.

    python benchmarks/memorybank_cv.py [--limit N] [--hashing]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from locomo_retrieval import (
    CachedEmbedder,
    Row,
    dated_sessions,
    question_time,
    turn_content,
)
from machine_info import datasets_dir

from memories_core import FixedClock, MemoryBankMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.evaluation import (
    CATEGORY_NAMES,
    LocomoConversation,
    leave_one_out,
    load_locomo,
    recall_at_k,
)
from memories_core.interfaces import Embedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.memorybank import memorybank_reply

OUT = Path(__file__).resolve().parent / "out"
KS = (5, 10)
WEIGHTS = (0.0, 0.1, 0.25, 0.5, 0.75, 1.0)
THRESHOLDS = (None, 0.01, 0.1)


@dataclass(frozen=True)
class Setting:
    """One configuration of ``MemoryBankMemory``."""

    forgetting_weight: float
    archive_below: float | None = None
    summaries_decay: bool = True

    def label(self) -> str:
        parts = [f"weight {self.forgetting_weight:g}"]
        parts.append(
            "archive off" if self.archive_below is None else f"archive < {self.archive_below:g}"
        )
        if not self.summaries_decay:
            parts.append("summaries do not decay")
        return ", ".join(parts)


PREVIOUS_DEFAULT = Setting(1.0, None, summaries_decay=False)


def library_default() -> Setting:
    """The setting ``MemoryBankMemory()`` has now (read from its signature)."""
    params = inspect.signature(MemoryBankMemory.__init__).parameters
    return Setting(
        params["forgetting_weight"].default,
        params["archive_below"].default,
        params["summaries_decay"].default,
    )


def replay(
    conversation: LocomoConversation,
    setting: Setting,
    weights: Sequence[float],
    embedder: Embedder,
    every: int = 1,
) -> dict[float, tuple[list[Row], dict[str, Any]]]:
    """Save the conversation session by session once, then ask its questions per weight.

    ``forgetting_weight`` only acts in recall, so the saved memory is shared: before each
    weight's questions, every record's strength, recall count and last recall are set back
    to what they were after saving (the questions of one weight reinforce what they recall,
    as the default does; those of the next weight start from the same state).
    """
    sessions = dated_sessions(conversation)
    first = min(when for dated in sessions.values() for _, when in dated)
    clock = FixedClock(first)
    memory = MemoryBankMemory(
        llm=ScriptedLLM(default=memorybank_reply),
        embedder=embedder,
        clock=clock,
        forgetting_weight=0.0,
        archive_below=setting.archive_below,
        summaries_decay=setting.summaries_decay,
        k=10,
    )
    user = conversation.sample_id
    for number, dated in sorted(sessions.items()):
        clock.set(dated[0][1])
        turns = [
            Turn(
                "user",
                turn_content(t, "caption"),
                speaker=t.speaker,
                timestamp=when,
                metadata={"dia_id": t.dia_id},
            )
            for t, when in dated
        ]
        memory.save(turns, Scope(user, f"session_{number}"))
    clock.set(question_time(conversation))
    memory.consolidate(user)
    archived = len(memory.forgotten(user))
    saved = {
        r.id: {
            "strength": r.state.strength,
            "recall_count": r.state.recall_count,
            "last_recalled_at": r.state.last_recalled_at,
        }
        for r in memory.engine.records(user)
    }
    out: dict[float, tuple[list[Row], dict[str, Any]]] = {}
    for weight in weights:
        memory.engine.update_state(user, saved, reason="benchmark: back to the saved state")
        memory.forgetting_weight = weight
        memory.pipeline = memory.recall_pipeline(forgetting=weight > 0)
        rows: list[Row] = []
        summaries_in_top = 0
        asked = [qa for qa in conversation.qa if qa.evidence][::every]
        for qa in asked:
            hits = memory.recall(qa.question, Scope(user)).records
            ranked = [str(h.record.metadata.get("dia_id", h.record.id)) for h in hits]
            summaries_in_top += sum(h.record.kind != "turn" for h in hits)
            scores = {f"R@{k}": recall_at_k(ranked, qa.evidence, k) for k in KS}
            rows.append((user, qa.category, scores))
        counts = {
            "turns": len(memory.engine.records(user, where={"kind": "turn"})),
            "archived_at_questions": archived,
            "summary_slots_per_question": summaries_in_top / max(1, len(rows)),
        }
        out[weight] = (rows, counts)
    memory.close()
    return out


def mean_of(rows: Sequence[Row]) -> dict[str, float]:
    """Mean R@k of rows, and how many."""
    return {f"R@{k}": statistics.fmean(r[2][f"R@{k}"] for r in rows) for k in KS} | {"n": len(rows)}


def by_category(rows: Sequence[Row]) -> dict[str, dict[str, float]]:
    """Mean R@k per LoCoMo category."""
    cats = sorted({r[1] for r in rows})
    return {CATEGORY_NAMES.get(c, str(c)): mean_of([r for r in rows if r[1] == c]) for c in cats}


def objective(summary: dict[str, float]) -> float:
    """What a fold maximises: the mean of R@5 and R@10."""
    return (summary["R@5"] + summary["R@10"]) / 2


def cross_validate(results: dict[Setting, list[Row]], folds: Sequence[str]) -> dict[str, Any]:
    """Leave one conversation out (:func:`leave_one_out`); ties keep grid order.

    A question's score is the mean of its R@5 and R@10, so a fold's mean score is
    :func:`objective` of its mean R@k.
    """
    settings = {setting.label(): setting for setting in results}
    scores = {
        setting.label(): {
            fold: [objective(row[2]) for row in rows if row[0] == fold] for fold in folds
        }
        for setting, rows in results.items()
    }
    cv = leave_one_out(scores)
    held: list[Row] = []
    per_fold: dict[str, Any] = {}
    for fold, choice in cv["folds"].items():
        test = [r for r in results[settings[choice["chosen"]]] if r[0] == fold]
        held += test
        per_fold[fold] = {
            "chosen": choice["chosen"],
            "train_objective": choice["train"],
            "held_out": mean_of(test),
            "grid_held_out": {
                s.label(): mean_of([r for r in rows if r[0] == fold]) for s, rows in results.items()
            },
        }
    return {
        "held_out": mean_of(held) if held else {"R@5": 0.0, "R@10": 0.0, "n": 0},
        "folds": per_fold,
        "best_on_all": cv["best_on_all"],
    }


def markdown(out: dict[str, Any]) -> str:
    """Tables for BENCHMARKS.md."""
    lines: list[str] = []
    for name in ("weights", "archive"):
        part = out[name]
        lines += [
            "",
            f"**Grid: {part['title']}**",
            "",
            "| setting | R@5 | R@10 | "
            + " | ".join(f"{c} R@10" for c in part["categories_order"])
            + " | summary slots / question | archived at questions |",
        ]
        lines.append(
            "| --- | ---: | ---: | "
            + " | ".join("---:" for _ in part["categories_order"])
            + " | ---: | ---: |"
        )
        for label, row in part["grid"].items():
            cats = " | ".join(
                f"{row['categories'][c]['R@10']:.3f}" for c in part["categories_order"]
            )
            lines.append(
                f"| {label} | {row['overall']['R@5']:.3f} | {row['overall']['R@10']:.3f} | {cats} "
                f"| {row['summary_slots_per_question']:.2f} | {row['archived_at_questions']} |"
            )
        cv = part["cv"]
        lines += [
            "",
            f"Leave-one-conversation-out: held-out R@5 {cv['held_out']['R@5']:.3f}, "
            f"R@10 {cv['held_out']['R@10']:.3f} (n = {cv['held_out']['n']}); "
            f"best on all conversations: {cv['best_on_all']}.",
            "",
            "| held-out conversation | chosen on the other four | held-out R@5 | R@10 |",
            "| --- | --- | ---: | ---: |",
        ]
        for fold, row in cv["folds"].items():
            lines.append(
                f"| {fold} | {row['chosen']} | {row['held_out']['R@5']:.3f} | "
                f"{row['held_out']['R@10']:.3f} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run both grids and the previous default; write JSON and Markdown."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locomo", type=Path, default=datasets_dir() / "locomo/locomo_dev.json")
    parser.add_argument("--limit", type=int, default=None, help="first N conversations only")
    parser.add_argument("--hashing", action="store_true", help="hashing embedder (smoke run)")
    parser.add_argument("--out", type=Path, default=OUT / "memorybank_cv.json")
    parser.add_argument(
        "--every", type=int, default=1, help="ask every N-th question (1: all; a cheaper run)"
    )
    parser.add_argument("--weights", type=float, nargs="+", default=list(WEIGHTS))
    parser.add_argument(
        "--thresholds", type=float, nargs="*", default=[t for t in THRESHOLDS if t is not None]
    )
    args = parser.parse_args(argv)
    conversations = load_locomo(args.locomo)[: args.limit]
    inner: Embedder = HashingEmbedder()
    if not args.hashing:
        from memories_core.embedders import SentenceTransformerEmbedder

        inner = SentenceTransformerEmbedder()
    embedder = CachedEmbedder(inner, OUT / "cache")
    from machine_info import machine

    out: dict[str, Any] = {
        "machine": machine(),
        "embedder": inner.name,
        "every": args.every,
        "command": " ".join(sys.argv),
    }
    folds = [c.sample_id for c in conversations]
    grids = {
        "weights": (
            "forgetting_weight, archive off",
            [Setting(w) for w in args.weights],
        ),
        "archive": (
            "archive_below (scheduled forgetting), weight 0",
            [Setting(0.0, t) for t in [None, *args.thresholds]],
        ),
    }
    # Settings that change what is saved; each is replayed once per conversation, and the
    # weights of the grid that share it are asked on that replay.
    everything = [s for _, settings in grids.values() for s in settings]
    everything.append(PREVIOUS_DEFAULT)
    everything.append(library_default())
    saved_as: dict[tuple[float | None, bool], list[float]] = {}
    for setting in everything:
        key = (setting.archive_below, setting.summaries_decay)
        if setting.forgetting_weight not in saved_as.setdefault(key, []):
            saved_as[key].append(setting.forgetting_weight)
    cache: dict[Setting, tuple[list[Row], list[dict[str, Any]]]] = {}
    for (archive, decay), weights in saved_as.items():
        began = time.perf_counter()
        for conversation in conversations:
            results = replay(
                conversation, Setting(0.0, archive, decay), weights, embedder, args.every
            )
            embedder.save()
            for weight, (rows, counts) in results.items():
                rows_so_far, counts_so_far = cache.setdefault(
                    Setting(weight, archive, decay), ([], [])
                )
                rows_so_far += rows
                counts_so_far.append(counts)
        for weight in weights:
            rows = cache[Setting(weight, archive, decay)][0]
            print(
                f"  {Setting(weight, archive, decay).label()}: R@5 {mean_of(rows)['R@5']:.3f} "
                f"R@10 {mean_of(rows)['R@10']:.3f}",
                flush=True,
            )
        print(f"  ({time.perf_counter() - began:.0f} s)", flush=True)

    def run(setting: Setting) -> tuple[list[Row], list[dict[str, Any]]]:
        return cache[setting]

    def describe(setting: Setting) -> dict[str, Any]:
        rows, counts = run(setting)
        return {
            "overall": mean_of(rows),
            "categories": by_category(rows),
            "per_conversation": {f: mean_of([r for r in rows if r[0] == f]) for f in folds},
            "summary_slots_per_question": statistics.fmean(
                c["summary_slots_per_question"] for c in counts
            ),
            "archived_at_questions": sum(c["archived_at_questions"] for c in counts),
        }

    for name, (title, settings) in grids.items():
        grid = {s.label(): describe(s) for s in settings}
        cv = cross_validate({s: run(s)[0] for s in settings}, folds)
        order = list(next(iter(grid.values()))["categories"])
        out[name] = {"title": title, "grid": grid, "cv": cv, "categories_order": order}
    out["previous_default"] = {PREVIOUS_DEFAULT.label(): describe(PREVIOUS_DEFAULT)}
    out["new_default"] = {library_default().label(): describe(library_default())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str))
    text = markdown(out)
    prev = next(iter(out["previous_default"].values()))["overall"]
    new = next(iter(out["new_default"].values()))["overall"]
    text += (
        f"\n\nPrevious default ({PREVIOUS_DEFAULT.label()}): R@5 {prev['R@5']:.3f}, "
        f"R@10 {prev['R@10']:.3f}; library default ({library_default().label()}): "
        f"R@5 {new['R@5']:.3f}, R@10 {new['R@10']:.3f}.\n"
    )
    args.out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
