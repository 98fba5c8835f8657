"""Int8 weights for the offline 1.5B model: load time, prompt reading and writing speed.

Runs ``LocalLLM(model="qwen2.5-1.5b", quantize=...)`` once per setting (``none``: float32,
``int8``: dynamic int8 linear layers, ``int8-decode``: float32 prompt reading and int8
weights for written tokens; :mod:`memories_core.llms.quantize`), each in a fresh process,
on the same memory-writing prompt: the first 14 turns of a LoCoMo conversation with an
instruction to summarise them (a MemoryBank-style daily summary). It reports

* load seconds (from the safetensors cache, plus the int8 conversion);
* prompt reading, tokens/s (a call that writes one token);
* writing, tokens/s (a greedy call capped at ``--max-tokens``, minus its prompt reading);
* the written text, so the settings can be read side by side;
* with ``--agreement K``: MemoryBank's own daily-summary prompt (its output cap) on the first
  session of each of ``K`` conversations, and how often each setting writes the same summary
  as float32 (identical texts; token F1 against float32's text), so the check spans
  conversations, not one prompt.

What int8 does to answers is measured by the answer-quality harness
(``benchmarks/locomo_qa.py --quantize``), not here.

    python benchmarks/local_int8.py                       # all settings, table + JSON
    python benchmarks/local_int8.py --data PATH/locomo_dev.json --threads 2
    python benchmarks/local_int8.py --settings none,int8-decode --agreement 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import command_line, datasets_dir, machine, portable_path

OUT = Path(__file__).resolve().parent / "out"
DEFAULT_DATA = datasets_dir() / "locomo" / "locomo_dev.json"
INSTRUCTION = (
    "Summarise the events and key information of this day's dialogue in two or three "
    "sentences. Only state what the dialogue says."
)


LABELS = {
    "none": "float32",
    "int8": "int8 (dynamic)",
    "int8-decode": "int8 for decoding (prompts float32)",
}


def prompt(data: Path, turns: int = 14) -> str:
    """The first ``turns`` turns of the first conversation in ``data``, one per line."""
    sample = json.loads(data.read_text(encoding="utf-8"))[0]
    session = sample["conversation"]["session_1"]
    return "\n".join(f"{t['speaker']}: {t['text']}" for t in session[:turns])


def daily_prompts(data: Path, count: int) -> list[tuple[str, Any]]:
    """MemoryBank's daily-summary messages for the first session of ``count`` conversations."""
    from memories_core.prompts.memorybank import DAILY_SUMMARY_PROMPT, DayInput

    out = []
    for sample in json.loads(data.read_text(encoding="utf-8"))[:count]:
        conversation = sample["conversation"]
        turns = tuple(f"{t['speaker']}: {t['text']}" for t in conversation["session_1"])
        day = str(conversation.get("session_1_date_time", "day 1"))
        out.append((str(sample["sample_id"]), DAILY_SUMMARY_PROMPT.build(DayInput(day, turns))))
    return out


def worker(
    setting: str, data: Path, threads: int, max_tokens: int, agreement: int = 0
) -> dict[str, Any]:
    """Measure one setting in this process."""
    from memories_core.llms import LocalLLM
    from memories_core.types import ChatMessage

    messages = [ChatMessage("system", INSTRUCTION), ChatMessage("user", prompt(data))]
    llm = LocalLLM(model="qwen2.5-1.5b", n_threads=threads, quantize=setting)  # type: ignore[arg-type]
    began = time.perf_counter()
    llm.count_tokens("load")  # loads (and converts) the model
    load = time.perf_counter() - began

    def timed(cap: int, chat: list[Any]) -> tuple[float, str, Any]:
        runtime = llm._runtime
        if runtime is not None:  # no prompt reuse between the measured calls
            runtime.cache = runtime.cached_ids = None
        before = llm.usage
        start = time.perf_counter()
        text = llm.generate(chat, max_tokens=cap, temperature=0.0)
        return time.perf_counter() - start, text, llm.usage - before

    timed(1, messages)  # warm-up
    read_s, _, read = timed(1, messages)
    total_s, text, wrote = timed(max_tokens, messages)
    writing = max(wrote.completion_tokens - 1, 1) / max(total_s - read_s, 1e-9)
    from memories_core.mechanisms.memorybank import OUTPUT_TOKENS

    summaries = []
    for sample_id, daily in daily_prompts(data, agreement):
        started = time.perf_counter()
        written = timed(OUTPUT_TOKENS["memorybank.daily_summary"], list(daily))[1]
        summaries.append(
            {
                "conversation": sample_id,
                "text": written,
                "s": round(time.perf_counter() - started, 1),
            }
        )
    return {
        "setting": setting,
        "int8": llm.int8,
        "quantized": llm.quantized,
        "threads": threads,
        "load_s": round(load, 1),
        "prompt_tokens": read.prompt_tokens,
        "prompt_tok_per_s": round(read.prompt_tokens / read_s, 1),
        "written_tokens": wrote.completion_tokens,
        "writing_tok_per_s": round(writing, 2),
        "call_s": round(total_s, 1),
        "text": text,
        "summaries": summaries,
    }


def agreement(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each setting's daily summaries against float32's (empty without a float32 row)."""
    from memories_core.evaluation.qa import token_f1

    base = next((r for r in rows if r.get("quantized") == "none"), None)
    if base is None or not base.get("summaries"):
        return []
    reference = {s["conversation"]: s["text"] for s in base["summaries"]}
    out = []
    for row in rows:
        if row is base:
            continue
        pairs = [
            (s["text"], reference[s["conversation"]])
            for s in row.get("summaries", [])
            if s["conversation"] in reference
        ]
        if not pairs:
            continue
        out.append(
            {
                "quantized": row.get("quantized"),
                "summaries": len(pairs),
                "identical": sum(a.strip() == b.strip() for a, b in pairs),
                "token_f1": round(sum(token_f1(a, b) for a, b in pairs) / len(pairs), 3),
                "seconds": round(sum(s["s"] for s in row["summaries"]), 1),
                "float32_seconds": round(sum(s["s"] for s in base["summaries"]), 1),
            }
        )
    return out


def markdown(result: dict[str, Any]) -> str:
    """The table of a run."""
    lines = [
        f"Command: `{result['command']}`",
        "",
        "| weights | load s (with conversion) | prompt tokens | prompt reading tok/s "
        "| written tokens | writing tok/s | whole call s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        label = LABELS[row.get("quantized", "int8" if row["int8"] else "none")]
        lines.append(
            f"| {label} | {row['load_s']} | {row['prompt_tokens']} | {row['prompt_tok_per_s']} "
            f"| {row['written_tokens']} | {row['writing_tok_per_s']} | {row['call_s']} |"
        )
    lines.append("")
    for row in result["rows"]:
        label = LABELS[row.get("quantized", "int8" if row["int8"] else "none")]
        lines.append(f"- {label} wrote: {row['text'].strip()!r}")
    if result.get("agreement"):
        lines += [
            "",
            "MemoryBank daily summaries (first session of each conversation) against float32's:",
            "",
            "| weights | summaries | identical to float32 | token F1 vs float32 | seconds "
            "(float32 seconds) |",
            "|---|---:|---:|---:|---:|",
        ]
        for row in result["agreement"]:
            lines.append(
                f"| {LABELS[row['quantized']]} | {row['summaries']} | {row['identical']} "
                f"| {row['token_f1']:.3f} | {row['seconds']} ({row['float32_seconds']}) |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every setting in its own process and write ``out/local_int8.{json,md}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON file")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--settings", default="none,int8,int8-decode")
    parser.add_argument(
        "--agreement",
        type=int,
        default=0,
        help="daily summaries of this many conversations, compared with float32's",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--report-only", action="store_true", help="redo the comparison and md from the JSON"
    )
    args = parser.parse_args(argv)
    if args.report_only:
        result = json.loads((OUT / "local_int8.json").read_text(encoding="utf-8"))
        result["agreement"] = agreement(result["rows"])
        return write(result)
    if args.worker:
        row = worker(args.worker, args.data, args.threads, args.max_tokens, args.agreement)
        print(json.dumps(row))
        return 0
    rows = []
    for setting in args.settings.split(","):
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                setting,
                "--data",
                str(args.data),
                "--threads",
                str(args.threads),
                "--max-tokens",
                str(args.max_tokens),
                "--agreement",
                str(args.agreement),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    result = {
        "command": command_line("benchmarks/local_int8.py", sys.argv[1:] if argv is None else argv),
        "data": portable_path(args.data),
        "machine": machine(),
        "rows": rows,
        "agreement": agreement(rows),
    }
    return write(result)


def write(result: dict[str, Any]) -> int:
    """Save ``out/local_int8.{json,md}`` and print the table."""
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "local_int8.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    text = markdown(result)
    (OUT / "local_int8.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
