"""Parse rate of every prompt spec with the bundled SmolLM2, before and after constrained decoding.

For each prompt of :mod:`memories_core.prompts` (decision, respond+decide, record, session
summary, reflection) and a fixed set of 8 inputs, the bundled model (``LocalLLM()``, offline,
greedy) answers in two layers:

* ``prompt``: the prompt-only layer (the paper's tagged format; prose for summaries). This is
  what every call did before structured output ("before").
* ``json_schema``: the spec's JSON twin with decoding constrained by lm-format-enforcer
  ("after").

A reply counts as parsed when the spec's parser accepts the first answer (no repair retry,
so the rate is the model's, not the retry's). Seconds per call are wall time, prompt
processing included; the machine is shared, so the 1-minute load average is recorded at the
start and the end.

    python benchmarks/parse_rate.py                 # writes out/parse_rate.json and .md
    python benchmarks/parse_rate.py --limit 2       # quick check

On a loaded machine the 80 calls can take longer than wanted; the committed results were
run in two halves and joined (the second half reads the first's JSON):

    python benchmarks/parse_rate.py --limit 4 --threads 2
    cp benchmarks/out/parse_rate.json part1.json
    python benchmarks/parse_rate.py --start 4 --limit 4 --threads 2 --merge part1.json

After the JSON prompts changed (their example answers were dropped, because the model
copied them), only the ``json_schema`` layer was run again, reusing the prompt layer:

    cp benchmarks/out/parse_rate.json full.json
    python benchmarks/parse_rate.py --threads 2 --only-json full.json

Generation limits are small (16-96 tokens, :data:`MAX_TOKENS`) to bound the runtime; a JSON
answer cut by the limit does not parse, which the real calls (up to 200 tokens) avoid.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_info import machine

from memories_core.errors import ParseError
from memories_core.prompts import conditional as c
from memories_core.prompts.reflection import REFLECTION, ReflectionInput
from memories_core.prompts.spec import PromptSpec
from memories_core.prompts.summary import SESSION_SUMMARY, SESSION_SUMMARY_JSON, SummaryInput

OUT_DIR = Path(__file__).resolve().parent / "out"

USER_TURNS = [
    "I'm vegetarian and allergic to peanuts.",
    "What's the capital of Australia?",
    "No, I meant capitalize ALL the letters, not just the first one.",
    "Thanks, that's all for today!",
    "My daughter Mia starts school in Berlin next September.",
    "From now on, always answer me in metric units.",
    "Can you translate 'good morning' into Spanish?",
    "I work night shifts at the hospital, so I sleep during the day.",
]

DIALOGUES = [
    ("user: I adopted a cat named Tom last week.", "assistant: Congratulations! How is he?"),
    ("user: I'm planning a trip to Japan in April.", "assistant: Cherry blossom season!"),
    ("user: My knee hurts after running.", "assistant: Rest it and see a doctor if it stays."),
    ("user: I prefer short answers.", "assistant: Understood."),
    ("user: I'm learning Rust at work.", "assistant: Nice, what are you building?"),
    ("user: We moved to Lisbon in May.", "assistant: How do you like it so far?"),
    ("user: I'm allergic to penicillin.", "assistant: Good to know, I'll keep that in mind."),
    ("user: My sister's wedding is on June 3rd.", "assistant: Do you need gift ideas?"),
]

REFLECTION_CASES = [
    ("What should I cook tonight?", ("user: I'm vegetarian", "user: I love Thai food")),
    ("When is my sister's wedding?", ("user: My sister's wedding is on June 3rd",)),
    ("What's my cat called?", ("user: I like hiking",)),
    ("Which medicine should I avoid?", ("user: I'm allergic to penicillin",)),
    ("Where do I live now?", ("user: We moved to Lisbon in May", "user: I like fado")),
    ("What language am I learning?", ()),
    ("Plan my weekend", ("user: I work night shifts", "user: I love the beach")),
    ("How should you format answers?", ("user: I prefer short answers",)),
]


def cases() -> list[tuple[PromptSpec[Any, Any], list[Any]]]:
    """The fixed inputs, 8 per prompt."""
    return [
        (c.DECISION, [c.DecisionInput(t) for t in USER_TURNS]),
        (c.RESPOND_AND_DECIDE, [c.RespondInput(t) for t in USER_TURNS]),
        (
            c.RECORD,
            [
                c.RecordInput((*d, f"user: {t}"), t)
                for d, t in zip(DIALOGUES, USER_TURNS, strict=True)
            ],
        ),
        (SESSION_SUMMARY, [SummaryInput(d) for d in DIALOGUES]),
        (REFLECTION, [ReflectionInput(q, cands) for q, cands in REFLECTION_CASES]),
    ]


JSON_FORMS: dict[str, PromptSpec[Any, Any]] = {SESSION_SUMMARY.name: SESSION_SUMMARY_JSON}

MAX_TOKENS = {
    "conditional.decision": 16,
    "conditional.respond_and_decide": 64,
    "conditional.record": 96,
    "summary.session": 64,
    "reflection": 64,
}


def run(
    limit: int,
    threads: int | None,
    start: int = 0,
    layers: tuple[str, ...] = ("prompt", "json_schema"),
    keep: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every prompt and layer; return the results."""
    from memories_core.llms import LocalLLM

    info = machine()
    llm = LocalLLM(n_threads=threads)
    started = time.perf_counter()
    llm.load()
    load_s = time.perf_counter() - started
    rows: list[dict[str, Any]] = []
    for spec, inputs in cases():
        for layer in ("prompt", "json_schema"):
            if layer not in layers and keep is not None:
                # Reuse an earlier run's row for a layer whose prompt did not change.
                rows.append(
                    next(r for r in keep["rows"] if (r["prompt"], r["layer"]) == (spec.name, layer))
                )
                continue
            # The summary's JSON form is not the runner's choice (see prompts/summary.py) but
            # is still measured here.
            variant = spec if layer == "prompt" else (spec.json_variant() or JSON_FORMS[spec.name])
            ok = 0
            seconds: list[float] = []
            samples: list[dict[str, Any]] = []
            for item in inputs[start : start + limit]:
                messages = variant.build(item)
                fmt = variant.response_format() if layer == "json_schema" else None
                t0 = time.perf_counter()
                text = llm.generate(messages, max_tokens=MAX_TOKENS[spec.name], response_format=fmt)
                seconds.append(time.perf_counter() - t0)
                try:
                    value = variant.parse(text, item)
                    ok += 1
                    error = None
                except ParseError as exc:
                    value, error = None, str(exc)[:160]
                samples.append({"reply": text[:300], "parsed": repr(value)[:200], "error": error})
            row = _row(spec.name, layer, samples, seconds)
            print(
                f"{spec.name:32s} {layer:12s} {ok}/{row['total']}  {row['seconds_per_call']} s/call"
            )
            rows.append(row)
    return {
        "benchmark": "parse_rate",
        "model": llm.name,
        "backend": llm.backend,
        "load_seconds": round(load_s, 1),
        "retries": 0,
        "machine": info,
        "load_avg_1min_at_end": round(os.getloadavg()[0], 2),
        "rows": rows,
    }


def _row(
    name: str, layer: str, samples: list[dict[str, Any]], seconds: list[float]
) -> dict[str, Any]:
    """One prompt and layer; ``readable`` also requires the respond prompt's decision."""
    n = len(samples)
    parsed = sum(s["error"] is None for s in samples)
    # The respond parser always keeps some response text; its decision may be unreadable.
    readable = sum(s["error"] is None and "decision=None" not in s["parsed"] for s in samples)
    return {
        "prompt": name,
        "layer": layer,
        "parsed": parsed,
        "readable": readable,
        "total": n,
        "rate": round(parsed / n, 3) if n else None,
        "seconds_per_call": round(sum(seconds) / n, 2) if n else None,
        "seconds": [round(x, 2) for x in seconds],
        "samples": samples,
    }


def merge(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Join two runs over different slices of the inputs (``--start``)."""
    rows = []
    for a, b in zip(first["rows"], second["rows"], strict=True):
        seconds = a.get("seconds") or [a["seconds_per_call"]] * a["total"]
        rows.append(
            _row(a["prompt"], a["layer"], a["samples"] + b["samples"], seconds + b["seconds"])
        )
    runs = [
        {k: r[k] for k in ("machine", "load_avg_1min_at_end", "load_seconds")}
        for r in (first, second)
    ]
    return {**second, "rows": rows, "runs": runs}


def with_kept_prompt_layer(result: dict[str, Any], keep: dict[str, Any]) -> dict[str, Any]:
    """Record which runs the reused prompt-layer rows came from."""
    this_run = {
        "machine": result["machine"],
        "load_avg_1min_at_end": result["load_avg_1min_at_end"],
        "load_seconds": result["load_seconds"],
        "layers": ["json_schema"],
    }
    earlier = [{**r, "layers": ["prompt"]} for r in keep.get("runs", [])]
    return {**result, "runs": [*earlier, this_run]}


def markdown(result: dict[str, Any]) -> str:
    """A Markdown table of parse rates per prompt and layer."""
    m = result["machine"]
    lines = [
        "# Parse rate of the prompt specs with the bundled SmolLM2",
        "",
        f"Model `{result['model']}` ({result['backend']}), greedy, first answer only "
        "(no repair retry). `prompt` = prompt-only layer (the paper's tagged format, before); "
        "`json_schema` = JSON twin with lm-format-enforcer constrained decoding (after).",
        "",
        f"Machine: {m['nproc']} cores ({m['cpu']}), shared with other jobs; load average "
        f"{m['load_avg_1min_at_start']} at start, {result['load_avg_1min_at_end']} at end, so "
        "timings are noisy. Code: " + str(m.get("code")),
        "",
        "| prompt | before: prompt-only | after: json_schema | s/call before | s/call after |",
        "|---|---|---|---|---|",
        # (filled below; "readable" for respond+decide also needs a readable decision)
    ]
    by = {(r["prompt"], r["layer"]): r for r in result["rows"]}
    for name in dict.fromkeys(r["prompt"] for r in result["rows"]):
        before, after = by[(name, "prompt")], by[(name, "json_schema")]
        lines.append(
            f"| {name} | {_rate(before)} | {_rate(after)}"
            f" | {before['seconds_per_call']} | {after['seconds_per_call']} |"
        )
    lines += [
        "",
        "For `conditional.respond_and_decide` the parser always keeps the text as the response "
        "(graceful fallback), so the rate in brackets counts replies whose decision was also "
        "readable.",
        "",
    ]
    for run_info in result.get("runs", []):
        m = run_info["machine"]
        layers = ", ".join(run_info.get("layers", ["prompt", "json_schema"]))
        lines.append(
            f"- run ({layers}): load average {m['load_avg_1min_at_start']} at start, "
            f"{run_info['load_avg_1min_at_end']} at end; model load {run_info['load_seconds']} s"
        )
    lines.append("")
    return "\n".join(lines)


def _rate(row: dict[str, Any]) -> str:
    text = f"{row['parsed']}/{row['total']}"
    if row["prompt"] == "conditional.respond_and_decide":
        text += f" ({row.get('readable', row['parsed'])}/{row['total']} with decision)"
    return text


def main() -> None:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=8, help="inputs per prompt (max 8)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--start", type=int, default=0, help="first input index")
    parser.add_argument(
        "--only-json",
        type=Path,
        default=None,
        help="run only the json_schema layer; copy the prompt layer from this earlier JSON",
    )
    parser.add_argument(
        "--merge", type=Path, default=None, help="a previous run's JSON to join this run to"
    )
    args = parser.parse_args()
    keep = json.loads(args.only_json.read_text()) if args.only_json else None
    layers = ("json_schema",) if keep is not None else ("prompt", "json_schema")
    result = run(args.limit, args.threads, args.start, layers, keep)
    if keep is not None:
        result = with_kept_prompt_layer(result, keep)
    if args.merge is not None:
        result = merge(json.loads(args.merge.read_text()), result)
    OUT_DIR.mkdir(exist_ok=True)
    (OUT_DIR / "parse_rate.json").write_text(json.dumps(result, indent=2) + "\n")
    (OUT_DIR / "parse_rate.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
