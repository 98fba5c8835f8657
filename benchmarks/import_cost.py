"""Import cost of the adapter packages versus their frameworks alone.

Target: importing ``langchain_memories`` or ``llamaindex_memories`` costs at
most 0.5 s more than importing the framework modules it builds on; sentence-transformers,
torch and chromadb load only when first used.

Each measurement is a fresh interpreter (so nothing is cached in ``sys.modules``), repeated
``--runs`` times; the median is reported.

    python benchmarks/import_cost.py --runs 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).parent / "out"

# The framework modules each adapter package imports, as a user of the framework would.
CASES = {
    "langchain": (
        "import langchain_core.retrievers, langchain_core.language_models, "
        "langchain.agents, langchain.agents.middleware, langchain_classic.base_memory, "
        "langgraph.runtime",
        "import langchain_memories",
    ),
    "llamaindex": (
        "import llama_index.core, llama_index.core.memory, llama_index.core.retrievers, "
        "llama_index.core.llms, llama_index.core.postprocessor",
        "import llamaindex_memories",
    ),
}

PROBE = """
import sys, time
t = time.perf_counter()
{stmt}
elapsed = time.perf_counter() - t
heavy = [m for m in ("torch", "chromadb", "sentence_transformers") if m in sys.modules]
print(elapsed, ",".join(heavy))
"""


def measure(stmt: str, runs: int) -> tuple[float, list[str]]:
    times: list[float] = []
    heavy: list[str] = []
    for _ in range(runs):
        out = subprocess.run(
            [sys.executable, "-c", PROBE.format(stmt=stmt)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        times.append(float(out[0]))
        heavy = out[1].split(",") if len(out) > 1 else []
    return statistics.median(times), heavy


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    for name, (framework, ours) in CASES.items():
        measure(ours, 1)  # warm the OS file cache once
        base, _ = measure(framework, args.runs)
        total, heavy = measure(f"{framework}\n{ours}", args.runs)
        rows.append(
            {
                "framework": name,
                "framework_s": base,
                "with_adapters_s": total,
                "extra_s": total - base,
                "heavy_modules_loaded": heavy,
            }
        )
    lines = [
        "| framework | framework alone (s) | framework + our adapters (s) | extra (s) | "
        "target <= 0.5 s | heavy modules loaded |",
        "| --- | ---: | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        met = "met" if r["extra_s"] <= 0.5 else "NOT met"
        lines.append(
            f"| {r['framework']} | {r['framework_s']:.2f} | {r['with_adapters_s']:.2f} | "
            f"{r['extra_s']:.2f} | {met} | {', '.join(r['heavy_modules_loaded']) or 'none'} |"
        )
    table = "\n".join(lines)
    print(table)
    OUT.mkdir(exist_ok=True)
    (OUT / "import_cost.json").write_text(json.dumps(rows, indent=2))
    (OUT / "import_cost.md").write_text(
        f"Command: `python benchmarks/import_cost.py --runs {args.runs}` (median of fresh "
        f"interpreters)\n\n{table}\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
