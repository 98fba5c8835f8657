"""How fast a local model's generation stops when its engine stops (``llms.cancel``).

A derivation on a CPU model can outlive ``close()``'s timeout or the interpreter's exit
wait; the engine then cancels the job in hand's model call. ``LocalLLM`` checks the cancel
between its layers, so that reading a long prompt (one forward pass) can be cut too. For each
installed offline model this script measures, on a prompt of about 1,500 tokens:

* ``prompt pass``: one call that reads the prompt and writes one token (the longest stretch
  a per-token check alone could not cut);
* ``stop while reading``: a call cancelled half way through reading the prompt, the time
  from the cancel to the call's end (``LLMCancelledError``);
* ``stop while writing``: the same, cancelled two seconds after the prompt was read;
* ``close()``: a ``SummaryMemory`` deriving a session summary in the background, closed
  with ``timeout=0.5`` half way through reading; the close's wall time, and after a reopen
  the job's state (pending, failures counted).

::

    python benchmarks/cancel_stop.py

Writes ``benchmarks/out/cancel_stop.{json,md,png}``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from latency import add_output_options, command_line, run_or_redraw
from machine_info import machine, save_figure

#: Notes that make a prompt of about 1,500 tokens.
NOTES = 150
#: ``close()``'s timeout in the engine measurement (seconds).
CLOSE_TIMEOUT = 0.5


def long_prompt() -> str:
    notes = " ".join(f"Note {i}: room {i} has locker code {i * 7 % 100}." for i in range(NOTES))
    return f"{notes}\nWrite a long story about room 3."


def fresh(llm: Any) -> None:
    """Drop the model's kept prompt cache, so the next call reads its prompt whole."""
    runtime = llm._runtime
    if runtime is not None:
        runtime.cache = runtime.cached_ids = None


def stop_after(llm: Any, delay: float) -> dict[str, Any]:
    """Cancel a long generation ``delay`` seconds in; the time from the cancel to its end."""
    from memories_core.llms import cancel
    from memories_core.types import ChatMessage

    fresh(llm)
    event = threading.Event()
    outcome: list[Any] = []

    def call() -> None:
        try:
            with cancel.cancellable(event):
                outcome.append(llm.generate([ChatMessage("user", long_prompt())], max_tokens=400))
        except Exception as exc:
            outcome.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    time.sleep(delay)
    cancelled_at = time.monotonic()
    event.set()
    thread.join()
    return {
        "after_s": round(delay, 2),
        "stopped_ms": round((time.monotonic() - cancelled_at) * 1000, 1),
        "outcome": type(outcome[0]).__name__,
    }


def engine_close(llm: Any, delay: float) -> dict[str, Any]:
    """Close a memory ``delay`` seconds into its summary job; the close's time and the job."""
    from memories_core import Scope, SummaryMemory, Turn
    from memories_core.embedders import HashingEmbedder
    from memories_core.llms import ScriptedLLM

    with tempfile.TemporaryDirectory() as folder:
        fresh(llm)
        memory = SummaryMemory(llm=llm, embedder=HashingEmbedder(), path=folder)
        scope = Scope("ana", session_id="s1")
        memory.save([Turn("user", long_prompt()), Turn("assistant", "A fine story.")], scope)
        memory.end_session(scope)
        while memory.status("ana").running == 0:
            time.sleep(0.02)
        time.sleep(delay)
        started = time.monotonic()
        memory.close(timeout=CLOSE_TIMEOUT)
        took = time.monotonic() - started
        again = SummaryMemory(llm=ScriptedLLM(default="-"), embedder=HashingEmbedder(), path=folder)
        try:
            jobs = again.pending("ana")
            status = again.status("ana")
        finally:
            again.close()
    return {
        "after_s": round(delay, 2),
        "close_s": round(took, 2),
        "jobs_pending": len(jobs),
        "attempts": [j.attempts for j in jobs],
        "failed": status.failed,
    }


def measure(name: str) -> dict[str, Any]:
    from memories_core.llms import LocalLLM
    from memories_core.types import ChatMessage

    llm = LocalLLM(model=name, timeout=None)
    started = time.monotonic()
    llm.load()
    loaded = time.monotonic() - started
    llm.generate([ChatMessage("user", "Hello.")], max_tokens=1)  # first-call set-up
    fresh(llm)
    started = time.monotonic()
    llm.generate([ChatMessage("user", long_prompt())], max_tokens=1)
    one_pass = time.monotonic() - started
    return {
        "model": llm.name,
        "load_s": round(loaded, 1),
        "prompt_pass_s": round(one_pass, 2),
        "stop while reading": stop_after(llm, one_pass / 2),
        "stop while writing": stop_after(llm, one_pass + 2.0),
        "close()": engine_close(llm, one_pass / 2),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    from memories_core.llms.models import installed_models

    names = [m for m in args.models.split(",") if m] or installed_models()
    torch_threads = None
    try:
        import torch

        torch_threads = torch.get_num_threads()
    except ImportError:
        pass
    return {
        "command": command_line(),
        "machine": machine(),
        "torch_threads": torch_threads,
        "close_timeout_s": CLOSE_TIMEOUT,
        "models": {name: measure(name) for name in names},
    }


def report(result: dict[str, Any]) -> str:
    lines = [
        "| model | prompt pass, s | stop while reading, ms | stop while writing, ms "
        f"| close(timeout={result['close_timeout_s']}), s | job after the close |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, row in result["models"].items():
        close = row["close()"]
        job = (
            f"{close['jobs_pending']} pending, attempts {close['attempts']}, "
            f"{close['failed']} failed"
        )
        reading = row["stop while reading"]["stopped_ms"]
        writing = row["stop while writing"]["stopped_ms"]
        lines.append(
            f"| {name} | {row['prompt_pass_s']:.2f} | {reading:.0f} | {writing:.0f} "
            f"| {close['close_s']:.2f} | {job} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["models"])
    rows = [result["models"][n] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.25
    for offset, (label, values) in enumerate(
        [
            ("prompt pass", [r["prompt_pass_s"] for r in rows]),
            ("stop while reading", [r["stop while reading"]["stopped_ms"] / 1000 for r in rows]),
            ("close()", [r["close()"]["close_s"] for r in rows]),
        ]
    ):
        ax.bar([i + (offset - 1) * width for i in range(len(names))], values, width, label=label)
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_ylabel("seconds (log)")
    ax.legend(fontsize=8)
    ax.set_title("A cancelled generation stops within a layer's work")
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models", default="", help="comma-separated offline models (default: every installed)"
    )
    add_output_options(parser, "cancel_stop")
    run_or_redraw(parser.parse_args(argv), run, report, plot)


if __name__ == "__main__":
    main()
