"""``benchmarks/pool_reach.py``: a wider pool and a second dense list, on synthetic scores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmark_scripts import load_script

bench = load_script("pool_reach")
so = load_script("session_order")

#: The first stage returned four of the conversation's six turns.
FIRST = ["D1:1", "D2:1", "D1:2", "D2:2"]
ALL = [*FIRST, "D3:1", "D3:2"]


def scored(evidence: tuple[str, ...] = ("D3:1",)) -> Any:
    row = {"sid": "conv-x", "ev": list(evidence), "ids": FIRST, "fused": [4.0, 3.0, 2.0, 1.0]}
    row |= {"q": "a question", "cat": 1}
    rng = np.random.default_rng(0)
    table = {item: rng.normal(size=8).astype(np.float32) for item in ALL}

    def vectors(ids: list[str]) -> npt.NDArray[np.float32]:
        return np.stack([table[i] for i in ids])

    question = so.Question(row, [0.5] * len(FIRST), vectors, rng.normal(size=8).astype(np.float32))
    dense = {"D1:1": 0.1, "D2:1": 0.2, "D1:2": 0.3, "D2:2": 0.4, "D3:1": 0.5, "D3:2": 0.9}
    second = {"D1:1": 0.9, "D2:1": 0.1, "D1:2": 0.2, "D2:2": 0.3, "D3:1": 0.8, "D3:2": 0.0}
    late = {"D1:1": 1.0, "D2:1": 2.0, "D1:2": 3.0, "D2:2": 4.0, "D3:1": 9.0, "D3:2": 0.5}
    return bench.Scored(question, dense, second, late)


def test_the_first_stage_is_continued_by_its_dense_list_below_its_own_scores() -> None:
    q = scored()
    order, fused = bench.continued(q)
    assert order == [*FIRST, "D3:2", "D3:1"]  # the rest by MiniLM cosine
    assert fused[:4] == q.fused and max(fused[4:]) < min(q.fused)
    assert fused[4] > fused[5]


def test_the_second_list_at_weight_zero_keeps_the_continued_order() -> None:
    q = scored()
    assert bench.fused_with_second(q, 0.0, 10)[0] == bench.continued(q)[0]
    # Enough weight on bge-small lifts its first turn to the top.
    assert bench.fused_with_second(q, 10.0, 1)[0][0] == "D1:1"


def test_each_family_starts_with_the_library_rerank_of_the_first_stage_alone() -> None:
    q = scored()
    expected = bench.rl.blended_ranking(
        {"ids": FIRST, "fused": q.fused}, [1.0, 2.0, 3.0, 4.0], bench.LIBRARY
    )
    assert bench.library(q) == expected
    assert "D3:1" not in expected  # the library's pool holds only what the first stage found
    for settings in bench.families().values():
        assert settings[0][1](q) == expected
    # A pool over every turn lets MaxSim bring the evidence up.
    wide = dict(bench.families()["wider pool"])
    assert "D3:1" in wide[f"continued, {bench._label((so.SCORE_KEY, 40, 10_000, 0.7))}"](q)[:2]


def test_reach_and_single_signals() -> None:
    q = scored(evidence=("D3:1", "D1:1"))
    assert bench.reach([q], bench._own, 4) == 0.5
    assert bench.reach([q], bench._first, 6) == 1.0
    assert bench._alone(q, "late")[0] == "D3:1"
    assert bench._alone(q, "second")[0] == "D1:1"


def test_late_vectors_are_encoded_once_and_kept(tmp_path: Path) -> None:
    calls: list[str] = []

    def encode(text: str) -> npt.NDArray[np.float32]:
        calls.append(text)
        return np.full((2, 4), len(text), dtype=np.float32)

    cache = tmp_path / "late.npz"
    first = bench.late_vectors(["ab", "abc", "ab"], cache, encode)
    assert calls == ["ab", "abc"] and cache.is_file()
    again = bench.late_vectors(["ab", "abc"], cache, encode)
    assert calls == ["ab", "abc"]  # read back, not encoded again
    assert {k: v.tolist() for k, v in again.items()} == {k: v.tolist() for k, v in first.items()}
    assert all(v.dtype == np.float16 for v in again.values())
