"""A model call on a LoCoMo session, with and without the local model's loop stop.

Greedy decoding of the offline 1.5B model can fall into a cycle: the same note, or the same
few notes, written again and again until the token cap. :class:`LocalLLM`'s ``stop_loops``
(:func:`memories_core.llms.loops.loop_end`) ends such a reply once one span
is written three times in a row. This replays one write step of a mechanism for every unit
of one session, with the default model, once per setting of ``stop_loops``, and records per
unit: seconds, written tokens, whether the reply was capped (or stopped in a loop), whether
it parsed (with one repair attempt, as the mechanisms run it) and the items it gave.

``--prompt`` picks the step:

* ``dpem.notes`` (default): DPeM's first step, the coordinator's notes (Zhang et al., 2023,
  "DPeM Mechanism", learning), per exchange (a first-speaker turn and the replies after it);
* ``emg.extract``: EMG-RAG's memory extraction (appendix A.1 step 2), per turn, the first
  speaker's as the user's and the second's as received messages (as the answer-quality
  harness ingests them), at the session's time.

    python benchmarks/loop_stop.py [--prompt dpem.notes] [--settings off,on]
        [--data ../shared/datasets/locomo/locomo_dev.json] [--conversation 0] [--session 1]
        [--name loop_stop] [--out-dir benchmarks/out]

Writes ``<name>.json`` and ``<name>.png`` into ``--out-dir``. Heavy (minutes per capped
reply on two cores): run it alone. The package the script imports is the one measured, so
one prompt's schema before and after a change is measured by running the same command with
the earlier code first on ``PYTHONPATH``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from locomo_qa import SECOND_SPEAKER_ROLE
from machine_info import command_line, datasets_dir, machine, save_figure
from tqdm import tqdm

from memories_core.errors import ParseError
from memories_core.evaluation.harness import dated_sessions
from memories_core.evaluation.locomo import load_locomo
from memories_core.llms import LocalLLM
from memories_core.llms.models import default_model_name
from memories_core.prompts.dpem import NOTES, NotesInput
from memories_core.prompts.emg import EXTRACT, ExtractInput
from memories_core.prompts.spec import run_spec

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA = datasets_dir() / "locomo" / "locomo_dev.json"
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


def turns(data: Path, conversation: int, session: int) -> list[ExtractInput]:
    """The session's turns as EMG's extraction inputs, dated as the harness dates them."""
    sample = load_locomo(data)[conversation]
    first = sample.speakers[0]
    return [
        ExtractInput(
            turn.text,
            at,
            "user" if turn.speaker == first else SECOND_SPEAKER_ROLE["emg"],
            speaker=turn.speaker,
        )
        for turn, at in dated_sessions(sample, session)[session]
        if turn.text.strip()
    ]


def notes_call(llm: LocalLLM, unit: tuple[str, ...], args: argparse.Namespace) -> list[str]:
    """DPeM's notes on one exchange."""
    notes: tuple[str, ...] = run_spec(llm, NOTES, NotesInput(unit, args.max_notes), retries=1)
    return list(notes)


def extract_call(llm: LocalLLM, unit: ExtractInput, args: argparse.Namespace) -> list[str]:
    """EMG's memories from one turn, as their statements."""
    return [memory.text for memory in run_spec(llm, EXTRACT, unit, retries=1)]


class Step(NamedTuple):
    """One ``--prompt``: its units from the session, one call on a unit, what its items are."""

    units: Callable[[Path, int, int], list[Any]]
    call: Callable[[LocalLLM, Any, argparse.Namespace], list[str]]
    items: str


STEPS: dict[str, Step] = {
    "dpem.notes": Step(exchanges, notes_call, "notes"),
    "emg.extract": Step(turns, extract_call, "memories"),
}


def replay(
    units: Sequence[Any], stop_loops: bool, call: Callable[[Any, Any], list[str]], items: str
) -> dict[str, Any]:
    """Run the step on every unit with one model; per-unit records and totals."""
    llm = LocalLLM(model=default_model_name(), stop_loops=stop_loops)
    llm.load()
    records: list[dict[str, Any]] = []
    label = "loop stop on" if stop_loops else "loop stop off"
    for index, unit in enumerate(tqdm(units, desc=label, unit="round"), 1):
        before = llm.usage
        start = time.perf_counter()
        try:
            found = call(llm, unit)
            parsed, error = True, ""
        except ParseError as exc:
            found, parsed, error = [], False, str(exc)[:200]
        spent = llm.usage - before
        records.append(
            {
                "round": index,
                "seconds": round(time.perf_counter() - start, 1),
                "calls": spent.calls,
                "completion_tokens": spent.completion_tokens,
                "capped": spent.capped,
                "parsed": parsed,
                items: len(found),
                "texts": found,
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
        items: sum(r[items] for r in records),
    }
    return {"totals": totals, "rounds": records}


def table(results: dict[str, dict[str, Any]], items: str = "notes") -> str:
    lines = [
        f"| setting | seconds | calls | written tokens | capped or looped | parsed | {items} |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results.values():
        t = result["totals"]
        lines.append(
            f"| {t['setting']} | {t['seconds']:.0f} | {t['calls']} | {t['completion_tokens']} "
            f"| {t['capped']} | {t['rounds_parsed']} of {t['rounds']} | {t[items]} |"
        )
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], path: Path, prompt: str = "dpem.notes") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(results)
    offsets = [width * (i - (len(results) - 1) / 2) for i in range(len(results))]
    for offset, result in zip(offsets, results.values(), strict=True):
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
    unit = "exchange" if prompt == "dpem.notes" else "turn"
    ax.set_xlabel(f"{unit} of the session; hatched: the reply did not parse")
    ax.set_ylabel(f"seconds ({prompt} call, with repair)")
    ax.set_title(f"{prompt}, Qwen2.5-1.5B greedy, 2 CPU cores (lower is better)")
    ax.legend()
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompt", choices=sorted(STEPS), default="dpem.notes")
    parser.add_argument(
        "--settings", default="off,on", help="loop stop settings to run, in order: off, on"
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--conversation", type=int, default=0)
    parser.add_argument("--session", type=int, default=1)
    parser.add_argument("--max-notes", type=int, default=16, help="DPeM's working memory size")
    parser.add_argument("--name", default="loop_stop", help="output file stem")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args(argv)
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not settings or set(settings) - {"off", "on"}:
        parser.error("--settings takes off, on or off,on")
    step = STEPS[args.prompt]
    units = step.units(args.data, args.conversation, args.session)
    items = step.items
    info = machine()
    results = {
        setting: replay(units, setting == "on", lambda llm, unit: step.call(llm, unit, args), items)
        for setting in settings
    }
    print(table(results, items))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = {
        "machine": info,
        "command": command_line(
            "benchmarks/loop_stop.py", list(sys.argv[1:] if argv is None else argv)
        ),
        "model": default_model_name(),
        "prompt": args.prompt,
        "conversation": args.conversation,
        "session": args.session,
        **results,
    }
    (args.out_dir / f"{args.name}.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
    plot(results, args.out_dir / f"{args.name}.png", args.prompt)


if __name__ == "__main__":
    main()
