"""Int8 weights for the offline 1.5B model: load time, prompt reading and writing speed.

Runs ``LocalLLM(model="qwen2.5-1.5b", quantize=...)`` once per setting (``none``: float32,
``int8``: dynamic int8 linear layers, ``int8-decode``: float32 prompt reading and int8
weights for written tokens; :mod:`memories_core.llms.quantize`), each in a fresh process,
on the same memory-writing prompt: the first 14 turns of a LoCoMo conversation with an
instruction to summarise them (a MemoryBank-style daily summary). It reports

* load seconds (from the safetensors cache, plus the int8 conversion);
* prompt reading, tokens/s (a call that writes one token);
* writing, tokens/s (a greedy call capped at ``--max-tokens``, minus its prompt reading);
* the written text, so the two can be read side by side.

What int8 does to answers is measured by the answer-quality harness
(``benchmarks/locomo_qa.py --quantize``), not here.

    python benchmarks/local_int8.py                       # all settings, table + JSON
    python benchmarks/local_int8.py --data PATH/locomo_dev.json --threads 2
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
from machine_info import command_line, machine, portable_path

OUT = Path(__file__).resolve().parent / "out"
DEFAULT_DATA = (
    Path(__file__).resolve().parents[2] / "shared" / "datasets" / "locomo" / "locomo_dev.json"
)
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


def worker(setting: str, data: Path, threads: int, max_tokens: int) -> dict[str, Any]:
    """Measure one setting in this process."""
    from memories_core.llms import LocalLLM
    from memories_core.types import ChatMessage

    messages = [ChatMessage("system", INSTRUCTION), ChatMessage("user", prompt(data))]
    llm = LocalLLM(model="qwen2.5-1.5b", n_threads=threads, quantize=setting)  # type: ignore[arg-type]
    began = time.perf_counter()
    llm.count_tokens("load")  # loads (and converts) the model
    load = time.perf_counter() - began

    def timed(cap: int) -> tuple[float, str, Any]:
        runtime = llm._runtime
        if runtime is not None:  # no prompt reuse between the measured calls
            runtime.cache = runtime.cached_ids = None
        before = llm.usage
        start = time.perf_counter()
        text = llm.generate(messages, max_tokens=cap, temperature=0.0)
        return time.perf_counter() - start, text, llm.usage - before

    timed(1)  # warm-up
    read_s, _, read = timed(1)
    total_s, text, wrote = timed(max_tokens)
    writing = max(wrote.completion_tokens - 1, 1) / max(total_s - read_s, 1e-9)
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
    }


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
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every setting in its own process and write ``out/local_int8.{json,md}``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON file")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--settings", default="none,int8,int8-decode")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        row = worker(args.worker, args.data, args.threads, args.max_tokens)
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
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "local_int8.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    text = markdown(result)
    (OUT / "local_int8.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
