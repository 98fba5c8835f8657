"""MemoryBank's forgetting defaults are chosen by leave-one-conversation-out on recall."""

from __future__ import annotations

from typing import Any

import pytest

from benchmark_scripts import load_script


@pytest.fixture(scope="module")
def cv() -> Any:
    return load_script("memorybank_cv")


def _rows(conv: str, hits: list[tuple[float, float]]) -> list[tuple[str, int, dict[str, float]]]:
    return [(conv, 1, {"R@5": r5, "R@10": r10}) for r5, r10 in hits]


def test_each_fold_chooses_on_the_other_conversations_and_is_scored_on_its_own(cv: Any) -> None:
    off, half, full = cv.Setting(0.0), cv.Setting(0.5), cv.Setting(1.0)
    results = {
        # the first setting is the library default: it wins ties
        off: _rows("a", [(1, 1), (0, 1)]) + _rows("b", [(0, 0), (0, 1)]) + _rows("c", [(1, 1)]),
        half: _rows("a", [(1, 1), (0, 1)]) + _rows("b", [(1, 1), (0, 1)]) + _rows("c", [(0, 0)]),
        full: _rows("a", [(0, 0), (0, 0)]) + _rows("b", [(1, 1), (1, 1)]) + _rows("c", [(0, 1)]),
    }
    out = cv.cross_validate(results, ["a", "b", "c"])
    chosen = {fold: out["folds"][fold]["chosen"] for fold in "abc"}
    # a question scores the mean of its R@5 and R@10; fold a trains on b and c:
    # off (0, 0.5, 1) 0.5, half (1, 0.5, 0) 0.5, full (1, 1, 0.5) 0.83
    assert chosen == {"a": full.label(), "b": off.label(), "c": half.label()}
    assert out["folds"]["a"]["held_out"] == {"R@5": 0.0, "R@10": 0.0, "n": 2}
    assert out["folds"]["a"]["train_objective"] == pytest.approx(2.5 / 3)
    # the held-out figure pools each fold's choice on its own conversation only
    assert out["held_out"]["n"] == 5
    assert out["held_out"]["R@10"] == pytest.approx((0 + 0 + 0 + 1 + 0) / 5)
    assert out["best_on_all"] == off.label()  # level with half (0.6): grid order decides
    one = cv.cross_validate({off: _rows("a", [(1, 1)]), half: _rows("a", [(0, 0)])}, ["a"])
    assert one["folds"] == {} and one["held_out"]["n"] == 0
