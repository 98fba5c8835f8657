"""Does reusing the prompt cache change a greedy reply? A fresh read against a cached one.

:class:`LocalLLM` on transformers keeps the keys and values of its last call and reuses
them for the next prompt's shared start (the instructions every job of one prompt
shares). A greedy reply should depend on its prompt alone. This asks DPeM's note-taking
prompt (Zhang et al., 2023, "DPeM Mechanism", learning) for every exchange of one LoCoMo
session three ways, and compares each reply with the first:

* **fresh**: the cache is dropped first, so the whole prompt is read in one pass;
* **after another prompt**: the previous exchange's prompt ran just before, so its shared
  instructions come from the cache (what every job but the first of a run gets);
* **the same prompt again**: the cache holds this prompt and its reply (a retry).

Each setting of ``--quantize`` is one model: ``none`` decodes with float32 weights,
``int8-decode`` (the 1.5B model's default) with int8 weights and bfloat16 activations.

    python benchmarks/prompt_cache.py [--model smollm2-135m] [--quantize none,int8-decode]
        [--data ../shared/datasets/locomo/locomo_dev.json] [--conversation 0] [--session 1]
        [--max-tokens 64] [--threads N] [--out-dir benchmarks/out]

Writes ``prompt_cache.{json,md,png}`` into ``--out-dir``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from loop_stop import DEFAULT_DATA, OUT_DIR, exchanges
from machine_info import command_line, machine, save_figure
from tqdm import tqdm

from memories_core.llms import LocalLLM
from memories_core.prompts.dpem import NOTES, NotesInput

#: The ways a prompt is read after the fresh read, in table order.
WAYS = ("after another prompt", "the same prompt again")


def _drop_cache(llm: LocalLLM) -> None:
    runtime = llm._runtime  # the benchmark reaches in: no public switch for the cache
    if runtime is not None:
        runtime.cache = runtime.cached_ids = None


def compare(
    model: str,
    quantize: str,
    rounds: list[tuple[str, ...]],
    max_tokens: int,
    max_notes: int,
    threads: int | None,
) -> dict[str, Any]:
    """Replies of every round read fresh, after the previous round's prompt, and again."""
    llm = LocalLLM(
        model=model,
        backend="transformers",
        quantize=quantize,  # type: ignore[arg-type]
        n_threads=threads,
    )
    llm.load()
    prompts = [NOTES.build(NotesInput(dialogue, max_notes)) for dialogue in rounds]
    records: list[dict[str, Any]] = []
    for index, messages in enumerate(tqdm(prompts, desc=quantize, unit="round")):
        _drop_cache(llm)
        fresh = llm.generate(messages, max_tokens=max_tokens)
        other: str | None = None
        if index:
            _drop_cache(llm)
            llm.generate(prompts[index - 1], max_tokens=max_tokens)
            other = llm.generate(messages, max_tokens=max_tokens)
        _drop_cache(llm)
        llm.generate(messages, max_tokens=max_tokens)
        again = llm.generate(messages, max_tokens=max_tokens)
        records.append(
            {
                "round": index + 1,
                "fresh": fresh,
                "after another prompt": other,
                "the same prompt again": again,
            }
        )
    summary = {"quantize": quantize, "rounds": len(records)}
    for way in WAYS:
        asked = [r for r in records if r[way] is not None]
        summary[way] = {
            "asked": len(asked),
            "differ": sum(r[way] != r["fresh"] for r in asked),
        }
    return {"summary": summary, "records": records}


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| decoding weights | " + " | ".join(f"replies that differ: {w}" for w in WAYS) + " |",
        "| --- | " + " | ".join("---:" for _ in WAYS) + " |",
    ]
    for result in results:
        s = result["summary"]
        cells = " | ".join(f"{s[w]['differ']} of {s[w]['asked']}" for w in WAYS)
        lines.append(f"| {s['quantize']} | {cells} |")
    return "\n".join(lines)


def plot(results: list[dict[str, Any]], path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    width = 0.8 / len(WAYS)
    for n, way in enumerate(WAYS):
        shares = [r["summary"][way]["differ"] / max(1, r["summary"][way]["asked"]) for r in results]
        ax.bar([i + (n - 0.5) * width for i in range(len(results))], shares, width, label=way)
    ax.set_xticks(range(len(results)), [r["summary"]["quantize"] for r in results])
    ax.set_ylabel("share of replies unlike the fresh read")
    ax.set_ylim(0, 1)
    ax.set_title(f"Prompt cache reuse, {model}, greedy (lower is better)")
    ax.legend()
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--quantize", default="none,int8-decode")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--conversation", type=int, default=0)
    parser.add_argument("--session", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64, help="reply cap per call")
    parser.add_argument("--max-notes", type=int, default=16, help="DPeM's working memory size")
    parser.add_argument(
        "--threads", type=int, help="torch threads (default: the machine's; 1 beside another run)"
    )
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    args = parser.parse_args()
    rounds = exchanges(args.data, args.conversation, args.session)
    results = [
        compare(args.model, mode.strip(), rounds, args.max_tokens, args.max_notes, args.threads)
        for mode in args.quantize.split(",")
    ]
    text = table(results)
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = {
        "machine": machine(),
        "command": command_line("benchmarks/prompt_cache.py", sys.argv[1:]),
        "model": args.model,
        "conversation": args.conversation,
        "session": args.session,
        "max_tokens": args.max_tokens,
        "results": results,
    }
    (args.out_dir / "prompt_cache.json").write_text(json.dumps(out, indent=2), encoding="utf-8")
    (args.out_dir / "prompt_cache.md").write_text(text + "\n", encoding="utf-8")
    plot(results, args.out_dir / "prompt_cache.png", args.model)


if __name__ == "__main__":
    main()
