"""DPeM's note-taking call on a LoCoMo session, with and without the local model's loop stop.

Greedy decoding of the offline 1.5B model can fall into a cycle: the same note, or the same
few notes, written again and again until the token cap. :class:`LocalLLM`'s ``stop_loops``
(:func:`memories_core.llms.loops.loop_end`) ends such a reply once one span
is written three times in a row. This replays DPeM's first step (the coordinator's notes,
Zhang et al., 2023, "DPeM Mechanism", learning) for every exchange of one session, once
with ``stop_loops=False`` and once with ``True``, with the default model, and records per
round: seconds, written tokens, whether the reply was capped (or stopped in a loop), and
whether it parsed (with one repair attempt, as the mechanism runs it).

    python benchmarks/loop_stop.py [--data ../shared/datasets/locomo/locomo_dev.json]
        [--conversation 0] [--session 1] [--out-dir benchmarks/out]

Writes ``loop_stop.json`` and ``loop_stop.png`` into ``--out-dir``. Heavy (minutes per
capped reply on two cores): run it alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from machine_info import command_line, machine
from tqdm import tqdm

from memories_core.errors import ParseError
from memories_core.evaluation.locomo import load_locomo
from memories_core.llms import LocalLLM
from memories_core.llms.models import default_model_name
from memories_core.prompts.dpem import NOTES, NotesInput
from memories_core.prompts.spec import run_spec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = ROOT.parent / "shared" / "datasets" / "locomo" / "locomo_dev.json"
OUT_DIR = ROOT / "benchmarks" / "out"


def exchanges(data: Path, conversation: int, session: int) -> list[tuple[str, ...]]:
    """The session's turns as DPeM's rounds: a first-speaker turn and the replies after it."""
    sample = load_locomo(data)[conversation]
    first = sample.speakers[0]
    rounds: list[list[str]] = []
    for turn in sample.turns:
        if turn.session != session or not turn.text.strip():
            continue
        line = f"{turn.speaker}: {turn.text}"
        if turn.speaker == first or not rounds:
            rounds.append([line])
        else:
            rounds[-1].append(line)
    return [tuple(r) for r in rounds]


def replay(rounds: list[tuple[str, ...]], stop_loops: bool, max_notes: int) -> dict[str, Any]:
    """Run the notes step on every round with one model; per-round records and totals."""
    llm = LocalLLM(model=default_model_name(), stop_loops=stop_loops)
    llm.load()
    records: list[dict[str, Any]] = []
    label = "loop stop on" if stop_loops else "loop stop off"
    for index, dialogue in enumerate(tqdm(rounds, desc=label, unit="round"), 1):
        before = llm.usage
        start = time.perf_counter()
        try:
            notes = run_spec(llm, NOTES, NotesInput(dialogue, max_notes), retries=1)
            parsed, count, error = True, len(notes), ""
        except ParseError as exc:
            parsed, count, error = False, 0, str(exc)[:200]
        spent = llm.usage - before
        records.append(
            {
                "round": index,
                "seconds": round(time.perf_counter() - start, 1),
                "calls": spent.calls,
                "completion_tokens": spent.completion_tokens,
                "capped": spent.capped,
                "parsed": parsed,
                "notes": count,
                "error": error,
            }
        )
    totals = {
        "setting": label,
        "seconds": round(sum(r["seconds"] for r in records), 1),
        "calls": sum(r["calls"] for r in records),
        "completion_tokens": sum(r["completion_tokens"] for r in records),
        "capped": sum(r["capped"] for r in records),
        "rounds_parsed": sum(r["parsed"] for r in records),
        "rounds": len(records),
        "notes": sum(r["notes"] for r in records),
    }
    return {"totals": totals, "rounds": records}


def table(results: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| setting | seconds | calls | written tokens | capped or looped | rounds parsed | notes |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results.values():
        t = result["totals"]
        lines.append(
            f"| {t['setting']} | {t['seconds']:.0f} | {t['calls']} | {t['completion_tokens']} "
            f"| {t['capped']} | {t['rounds_parsed']} of {t['rounds']} | {t['notes']} |"
        )
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.4
    for offset, result in zip((-width / 2, width / 2), results.values(), strict=True):
        rounds = result["rounds"]
        bars = ax.bar(
            [r["round"] + offset for r in rounds],
            [r["seconds"] for r in rounds],
            width,
            label=result["totals"]["setting"],
        )
        for bar, r in zip(bars, rounds, strict=True):
            if not r["parsed"]:
                bar.set_hatch("//")
    ax.set_xlabel("round (exchange) of the session; hatched: no note parsed")
    ax.set_ylabel("seconds (notes call, with repair)")
    ax.set_title("DPeM notes step, Qwen2.5-1.5B greedy, 2 CPU cores (lower is better)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--conversation", type=int, default=0)
    parser.add_argument("--session", type=int, default=1)
    parser.add_argument("--max-notes", type=int, default=16, help="DPeM's working memory size")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    rounds = exchanges(args.data, args.conversation, args.session)
    info = machine()
    results = {
        "off": replay(rounds, False, args.max_notes),
        "on": replay(rounds, True, args.max_notes),
    }
    print(table(results))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = {
        "machine": info,
        "command": command_line("benchmarks/loop_stop.py", sys.argv[1:]),
        "model": default_model_name(),
        "conversation": args.conversation,
        "session": args.session,
        **results,
    }
    (args.out_dir / "loop_stop.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
    plot(results, args.out_dir / "loop_stop.png")


if __name__ == "__main__":
    main()
