"""``benchmarks/loop_stop.py``: one write step replayed per unit of a session, offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmark_scripts import load_script
from locomo_fixture import tiny_conversation, write_dataset
from memories_core.llms.scripted import ScriptedLLM
from memories_core.prompts.dpem import dpem_reply
from memories_core.prompts.emg.questions import emg_reply


def _bench(monkeypatch: pytest.MonkeyPatch, answer: Any, made: list[bool]) -> Any:
    bench = load_script("loop_stop")

    class Model(ScriptedLLM):
        def __init__(self, *, model: str, stop_loops: bool) -> None:
            super().__init__(default=answer)
            made.append(stop_loops)

        def load(self) -> None:
            return None

    monkeypatch.setattr(bench, "LocalLLM", Model)
    monkeypatch.setattr(bench, "default_model_name", lambda: "scripted")
    monkeypatch.setattr(bench, "plot", lambda *a, **k: None)
    return bench


def _run(bench: Any, tmp_path: Path, *args: str) -> Any:
    data = write_dataset(tmp_path / "locomo.json")
    bench.main(["--data", str(data), "--out-dir", str(tmp_path), *args])
    name = args[args.index("--name") + 1] if "--name" in args else "loop_stop"
    return json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8"))


def test_emg_extraction_is_replayed_per_turn_with_the_chosen_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made: list[bool] = []
    bench = _bench(monkeypatch, emg_reply, made)
    out = _run(bench, tmp_path, "--prompt", "emg.extract", "--settings", "on", "--name", "x")
    assert made == [True] and set(out) >= {"on", "prompt"} and "off" not in out
    said = [t.text for t in tiny_conversation().turns if t.session == 1]
    rounds = out["on"]["rounds"]
    assert len(rounds) == len(said) == out["on"]["totals"]["rounds"]
    assert all(r["parsed"] and r["calls"] >= 1 for r in rounds)
    assert out["on"]["totals"]["memories"] == sum(len(r["texts"]) for r in rounds) > 0
    assert any("Miso" in text for text in rounds[0]["texts"])


def test_dpem_notes_run_off_then_on_per_exchange(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    made: list[bool] = []
    out = _run(_bench(monkeypatch, dpem_reply, made), tmp_path)
    assert made == [False, True]
    for setting in ("off", "on"):
        totals = out[setting]["totals"]  # two exchanges: Ann then Bob, twice
        assert totals["rounds"] == totals["rounds_parsed"] == 2 and totals["notes"] > 0


def test_an_unreadable_reply_counts_as_unparsed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    bench = _bench(monkeypatch, "not a memory", [])
    out = _run(bench, tmp_path, "--prompt", "emg.extract", "--settings", "on")
    totals = out["on"]["totals"]
    assert totals["rounds_parsed"] == 0 and totals["memories"] == 0
    assert all(r["error"] and r["calls"] == 2 for r in out["on"]["rounds"])  # one repair


def test_an_unknown_setting_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bench = _bench(monkeypatch, emg_reply, [])
    with pytest.raises(SystemExit):
        _run(bench, tmp_path, "--settings", "sometimes")
