"""``benchmarks/cancel_stop.py``: its measurements on a scripted model, its report and plot."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from benchmark_scripts import load_script
from memories_core.llms import cancel

bench = load_script("cancel_stop")


class SlowModel:
    """Stands in for ``LocalLLM``: writes until its scope is cancelled (or 10 s pass)."""

    _runtime = None
    name = "slow"

    def generate(self, messages: Any, max_tokens: int | None = None) -> str:
        for _ in range(1000):
            cancel.check(self.name)
            time.sleep(0.01)
        return "done"


def test_stop_after_times_the_cancel_of_a_model_that_checks_it() -> None:
    row = bench.stop_after(SlowModel(), 0.05)
    assert row["outcome"] == "LLMCancelledError"
    assert 0 <= row["stopped_ms"] < 2000
    assert not [t for t in threading.enumerate() if t.name.startswith("timed:slow")]


def sample() -> dict[str, Any]:
    row = {
        "model": "local:x",
        "load_s": 1.0,
        "prompt_pass_s": 7.3,
        "stop while reading": {"after_s": 3.6, "stopped_ms": 175.0, "outcome": "LLMCancelledError"},
        "stop while writing": {"after_s": 9.3, "stopped_ms": 1.0, "outcome": "LLMCancelledError"},
        "close()": {
            "after_s": 3.6,
            "close_s": 0.8,
            "jobs_pending": 1,
            "attempts": [0],
            "failed": 0,
        },
    }
    return {"close_timeout_s": 0.5, "models": {"smollm2-135m": row, "qwen2.5-1.5b": row}}


def test_report_has_a_row_per_model(tmp_path: Path) -> None:
    text = bench.report(sample())
    lines = text.splitlines()
    assert lines[0].startswith("| model | prompt pass, s") and "close(timeout=0.5)" in lines[0]
    assert (
        lines[2] == "| smollm2-135m | 7.30 | 175 | 1 | 0.80 | 1 pending, attempts [0], 0 failed |"
    )
    assert len(lines) == 4
    pytest.importorskip("matplotlib")
    bench.plot(sample(), tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000
