"""``benchmarks/cold_recall.py``: reopens of a kept store, timed per condition, offline."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmark_scripts import load_script
from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.retrieval import late_interaction
from memories_core.retrieval.late_interaction import (
    LateInteractionReranker,
    late_interaction_pipeline,
)
from reranker_scenarios import FakeEncoder

needs_fadvise = pytest.mark.skipif(
    not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux's"
)


def _trial(first: float, later: list[float]) -> dict[str, Any]:
    return {"open_ms": 50.0, "first_ms": first, "later_ms": later}


def test_summary_compares_each_condition_with_the_warm_recalls() -> None:
    bench = load_script("cold_recall")
    trials = [
        {
            "disk": _trial(100.0, [30.0, 50.0]),
            "disk + prefetch": _trial(40.0, [20.0, 20.0]) | {"prefetch_ms": 700.0},
            "reopen": _trial(50.0, [20.0, 30.0]),
            "new process": _trial(90.0, [40.0, 30.0]),
        },
        {
            "disk": _trial(130.0, [30.0, 30.0]),
            "disk + prefetch": _trial(35.0, [20.0, 20.0]) | {"prefetch_ms": 900.0},
            "reopen": _trial(70.0, [10.0, 20.0]),
            "new process": _trial(60.0, [25.0, 25.0]),
        },
    ]
    summary = bench.summarise(trials)
    assert summary["warm_p50_ms"] == 20.0  # the reopen trials' later recalls only
    assert summary["disk"]["first_median_ms"] == 115.0
    assert summary["disk"]["ratio_to_warm"] == 5.75
    assert summary["disk"]["trials_within_2x"] == 0
    assert summary["reopen"]["trials_within_2x"] == 0
    assert summary["disk + prefetch"]["trials_within_2x"] == 2
    assert summary["disk + prefetch"]["prefetch_median_ms"] == 800.0
    assert "prefetch_median_ms" not in summary["reopen"]
    assert summary["new process"]["first_median_ms"] == 75.0
    assert summary["new process"]["later_p50_median_ms"] == 30.0
    table = bench.report(
        {
            "command": "cold_recall.py",
            "records": 10,
            "trials": trials,
            "summary": summary,
            "load_average": {"start": [0.5], "end": [0.7]},
        }
    )
    assert "| disk | 50.0 | - | 115.0 (100.0-130.0) | 5.75x | 0 of 2 |" in table


@needs_fadvise
def test_a_run_on_a_kept_store_times_every_condition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_script("cold_recall")
    folder = tmp_path / "kept" / "late"

    def reranker(**_: Any) -> LateInteractionReranker:
        return LateInteractionReranker(FakeEncoder(), candidates=3, pool=10)

    memory = HistoryMemory(
        path=folder,
        embedder=HashingEmbedder(),
        pipeline=late_interaction_pipeline(reranker=reranker()),
    )
    for i in range(12):
        memory.save([Turn("user", f"turn {i} about the cat and the garden")], Scope(bench.TARGET))
    memory.flush()
    memory.close()
    monkeypatch.setattr(sys.modules["latency"], "OUT", tmp_path / "out")  # save_results' folder
    monkeypatch.setattr(bench, "real_embedder", lambda threads: HashingEmbedder())
    monkeypatch.setattr(bench, "plot", lambda *a, **k: None)
    monkeypatch.setattr(late_interaction, "late_interaction_reranker", reranker)
    children: list[int] = []

    def in_process(args: Any, first: int) -> dict[str, Any]:
        children.append(first)
        queries = bench.make_queries(2 * len(bench.CONDITIONS) * 4, args.seed)
        return dict(bench.child(folder, queries[first : first + 4], args))

    monkeypatch.setattr(bench, "new_process", in_process)
    bench.main(["--store", str(tmp_path / "kept"), "--trials", "2", "--later", "3"])
    per_trial = len(bench.CONDITIONS) * 4
    assert children == [3 * 4, per_trial + 3 * 4]  # the new process asks its own queries
    result = json.loads((tmp_path / "out" / "cold_recall.json").read_text())
    assert result["records"] == 12
    assert len(result["trials"]) == 2
    for trial in result["trials"]:
        assert set(trial) == set(bench.CONDITIONS)
        assert all(len(row["later_ms"]) == 3 for row in trial.values())
        assert "prefetch_ms" in trial["disk + prefetch"]
    assert (tmp_path / "out" / "cold_recall.md").read_text().count("|") > 20
    # What the parent runs in a fresh interpreter: one JSON line of its reopen's timings.
    capsys.readouterr()
    kept = ["--store", str(tmp_path / "kept"), "--trials", "2", "--later", "3"]
    bench.main([*kept, "--child", "12"])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"open_ms", "first_ms", "later_ms"} <= set(line) and len(line["later_ms"]) == 3
    assert set(result["disk_probe"]) == {"1_thread", "4_thread"}
    assert all(rate > 0 for rate in result["disk_probe"].values())
    assert result["pipeline"] == "late"


@needs_fadvise
def test_the_first_stage_alone_is_timed_without_a_reranker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = load_script("cold_recall")
    folder = tmp_path / "kept" / "late"
    with HistoryMemory(path=folder, embedder=HashingEmbedder()) as memory:
        for i in range(8):
            memory.save([Turn("user", f"turn {i} about the boat")], Scope(bench.TARGET))
        memory.flush()
    monkeypatch.setattr(sys.modules["latency"], "OUT", tmp_path / "out")
    monkeypatch.setattr(bench, "real_embedder", lambda threads: HashingEmbedder())
    monkeypatch.setattr(bench, "plot", lambda *a, **k: None)

    def no_reranker(**_: Any) -> LateInteractionReranker:
        raise AssertionError("the first stage needs no late-interaction model")

    monkeypatch.setattr(late_interaction, "late_interaction_reranker", no_reranker)
    pipelines: list[Any] = []
    opened = bench.reopened

    def spy(folder: Path, embedder: Any, reranker: Any, *args: Any, **kwargs: Any) -> Any:
        pipelines.append(reranker)
        return opened(folder, embedder, reranker, *args, **kwargs)

    monkeypatch.setattr(bench, "reopened", spy)
    queries = bench.make_queries(12, 29)
    monkeypatch.setattr(
        bench, "new_process", lambda args, first: bench.child(folder, queries[first:], args)
    )
    bench.main(
        [
            "--store",
            str(tmp_path / "kept"),
            "--trials",
            "1",
            "--later",
            "2",
            "--pipeline",
            "first-stage",
            "--name",
            "fs",
        ]
    )
    result = json.loads((tmp_path / "out" / "fs.json").read_text())
    assert result["pipeline"] == "first-stage"
    assert pipelines and all(reranker is None for reranker in pipelines)
    assert "pipeline first-stage" in (tmp_path / "out" / "fs.md").read_text()


def test_a_folder_without_a_store_is_refused(tmp_path: Path) -> None:
    bench = load_script("cold_recall")
    with pytest.raises(SystemExit, match="no store"):
        bench.main(["--store", str(tmp_path)])
