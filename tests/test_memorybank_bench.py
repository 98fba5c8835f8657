"""``benchmarks/memorybank_bench.py``: its ingest and its LoCoMo part, on tiny data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmark_scripts import load_script
from locomo_fixture import write_dataset
from memories_core.embedders import HashingEmbedder
from memories_core.retrieval import Pipeline, TimeDecay

bench = load_script("memorybank_bench")


def test_every_forgetting_row_is_the_default_pipeline_plus_the_decay() -> None:
    base = Pipeline().rerankers
    variants = bench.forgetting_variants()
    assert variants["no forgetting"].rerankers == base
    for label, pipeline in variants.items():
        if label == "no forgetting":
            continue
        assert pipeline.rerankers[: len(base)] == base
        assert isinstance(pipeline.rerankers[-1], TimeDecay)


def test_the_locomo_part_runs_and_forgetting_by_days_loses_old_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "OUT", tmp_path)  # the embedding cache goes here
    results = bench.locomo(write_dataset(tmp_path / "locomo.json"), False)
    assert results["conversations"] == 1
    kept = results["no forgetting"]["overall"]
    faded = results["forgetting, t in days, weight 1 (score x R)"]["overall"]
    # The questions come the day after the last session; most evidence is weeks old.
    assert kept["R@1"] > faded["R@1"]


def _bank(path: Path) -> Path:
    """Two users over three days; the second user's turns come earlier in the evening."""

    topics = ("gardening tomatoes", "painting lighthouses", "baking sourdough", "hiking trails")

    def day(n: int) -> list[dict[str, str]]:
        return [
            {
                "query": f"Yesterday I enjoyed {topics[i]} with my sister.",
                "response": f"That sounds wonderful; {topics[i]} is relaxing.",
            }
            for i in range(n + 1)
        ]

    users = {
        "ann": {"history": {f"2023-05-0{d}": day(3) for d in (1, 2, 3)}},
        "bo": {"history": {f"2023-05-0{d}": day(0) for d in (1, 2, 3)}},
    }
    path.write_text(json.dumps(users), encoding="utf-8")
    return path


def test_ingest_leaves_no_day_undone(tmp_path: Path) -> None:
    # A smoke test: whether a day's job was left not yet due depended on a race between the
    # engine's worker and the next user's save, which this small run does not force.
    result = bench.ingest(_bank(tmp_path / "bank.json"), HashingEmbedder())
    assert result["pending_after"] == 0 and result["failures"] == {}
    # One daily summary per user and day: the last day's by the final consolidate.
    assert result["records_per_user"]["daily_summary"] == 3
    assert sum(day["llm_calls"] for day in result["per_day"]) == result["llm_calls"]
