"""benchmarks/writer_batch.py offline: DPeM written one round at a time and in batches."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from benchmark_scripts import load_script
from locomo_fixture import write_locomo
from memories_core.embedders import HashingEmbedder
from memories_core.evaluation.locomo import LocomoConversation, LocomoTurn
from memories_core.llms import ScriptedLLM
from memories_core.prompts.dpem import dpem_reply
from memories_core.prompts.emg import emg_reply
from memories_core.prompts.rule_following import rule_following_reply

LINES = [
    ("Ann", "I adopted a cat named Miso last week."),
    ("Bob", "Lovely! How is Miso settling in?"),
    ("Ann", "She sleeps on my keyboard all day."),
    ("Bob", "Cats love warm laptops."),
    ("Ann", "I adopted a cat named Miso last week."),
    ("Bob", "You told me, she sounds sweet."),
    ("Ann", "I also started learning the cello."),
    ("Bob", "Great, how are the lessons?"),
    ("Ann", "I adopted a cat named Miso last week."),
    ("Bob", "Three times now!"),
]


def _data(path: Path) -> Path:
    turns = tuple(LocomoTurn(f"D1:{i + 1}", 1, who, text) for i, (who, text) in enumerate(LINES))
    talk = LocomoConversation("conv-x", ("Ann", "Bob"), turns, (), {1: "1:56 pm on 8 May, 2023"})
    return write_locomo(path, talk)


def _script() -> Any:
    return load_script("writer_batch")


def _factory(models: dict[int, ScriptedLLM], reply: Any) -> Any:
    def factory(size: int) -> ScriptedLLM:
        started = threading.Event()

        def slow_first(messages: Any) -> str:
            # The worker's first call outlasts the other saves (a few ms each), as a real
            # model's does: the jobs saved meanwhile wait together.
            if not started.is_set():
                started.set()
                time.sleep(1.0)
            return str(reply(messages))

        models[size] = ScriptedLLM(default=slow_first, batch_capacity=size)
        return models[size]

    return factory


@pytest.mark.background
def test_writer_batch_writes_the_same_dpem_memory_at_each_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    script = _script()
    models: dict[int, ScriptedLLM] = {}
    factory = _factory(models, dpem_reply)
    out = tmp_path / "out"
    argv = ["--data", str(_data(tmp_path / "locomo.json")), "--exchanges", "5"]
    argv += ["--sizes", "1,4", "--out", str(out)]
    assert script.main(argv, llm_factory=factory, embedder=HashingEmbedder()) == 0
    report = json.loads((out / "writer_batch.json").read_text())
    assert report["mechanism"] == "dpem"
    one, four = report["rows"]
    assert one["exchanges"] == four["exchanges"] == 5 and four["pending_jobs"] == 0
    assert one["memory"] == four["memory"] and four["memory"]["ltm"]
    assert four["same_as_first"] == {"working": 1.0, "stm": 1.0, "ltm": 1.0}
    # Rounds saved while the worker wrote an earlier one wait and go in one batch.
    assert one["batches"] == [] and max(four["batches"]) > 1
    assert one["llm_calls"] == four["llm_calls"] == 3 * 5
    assert (out / "writer_batch.png").is_file()
    assert "| 4 | 5 |" in (out / "writer_batch.md").read_text()
    # A size already measured is kept, not run again.
    models.clear()
    assert script.main(argv, llm_factory=factory, embedder=HashingEmbedder()) == 0
    assert models == {}
    capsys.readouterr()


@pytest.mark.background
@pytest.mark.parametrize(
    ("mechanism", "reply", "part"),
    [("conditional", rule_following_reply, "records"), ("emg", emg_reply, "memories")],
)
def test_writer_batch_measures_conditional_and_emg_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mechanism: str, reply: Any, part: str
) -> None:
    pytest.importorskip("matplotlib")
    script = _script()
    models: dict[int, ScriptedLLM] = {}
    out = tmp_path / "out"
    argv = ["--mechanism", mechanism, "--data", str(_data(tmp_path / "locomo.json"))]
    argv += ["--exchanges", "5", "--sizes", "1,8", "--out", str(out)]
    factory = _factory(models, reply)
    assert script.main(argv, llm_factory=factory, embedder=HashingEmbedder()) == 0
    one, eight = json.loads((out / "writer_batch.json").read_text())["rows"]
    assert one["memory"] == eight["memory"] and eight["memory"][part]
    assert eight["same_as_first"] == {part: 1.0}
    assert one["llm_calls"] == eight["llm_calls"] >= 5  # one or two calls per user turn
    assert max(eight["batches"]) > 1
    capsys.readouterr()
