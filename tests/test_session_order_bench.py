"""``benchmarks/session_order.py``: other orders of a recall, on synthetic cached scores."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from benchmark_scripts import load_script

bench = load_script("session_order")

#: Three sessions; D2 has the most turns near the top, D3's single turn is the evidence.
IDS = ["D1:1", "D2:1", "D2:2", "D2:3", "D1:2", "D3:1", "D1:3", "D2:4"]


def question(late: list[float] | None = None, evidence: tuple[str, ...] = ("D3:1",)) -> Any:
    row = {
        "sid": "conv-x",
        "ev": list(evidence),
        "ids": IDS,
        "fused": [1.0 - 0.1 * n for n in range(len(IDS))],
        "q": "a question",
        "cat": 1,
    }
    scores = late if late is not None else [0.5] * len(IDS)
    rng = np.random.default_rng(0)
    table = {item: rng.normal(size=8).astype(np.float32) for item in IDS}

    def vectors(ids: list[str]) -> npt.NDArray[np.float32]:
        return np.stack([table[i] for i in ids])

    return bench.Question(row, scores, vectors, rng.normal(size=8).astype(np.float32))


def test_the_min_max_family_starts_with_the_library_order() -> None:
    q = question(late=[0.1, 0.9, 0.3, 0.2, 0.8, 0.7, 0.0, 0.4])
    label, order = bench.families()["min-max blend (library)"][0]
    assert (
        label == f"{bench.DEFAULT_LATE_CANDIDATES} candidates, weight {bench.DEFAULT_LATE_WEIGHT}"
    )
    assert order(q) == q.default
    assert q.default != IDS  # MaxSim moved something: the test compares real orders


def test_rank_fusion_with_all_weight_on_maxsim_orders_by_it() -> None:
    late = [0.1, 0.9, 0.3, 0.2, 0.8, 0.7, 0.0, 0.4]
    q = question(late=late)
    ranked = bench.blended(q, candidates=40, weight=1.0, form="rank fusion", k=5.0)
    assert ranked == [i for _, i in sorted(zip(late, IDS, strict=True), key=lambda p: -p[0])]


def test_session_mass_moves_whole_sessions_below_the_kept_top() -> None:
    q = question()
    assert bench.session_mass(q, top=len(IDS), k=1.0, depth=50, power=1.0) == q.default
    moved = bench.session_mass(q, top=1, k=1.0, depth=50, power=1.0)
    assert moved[0] == q.default[0]
    # D2 holds the most mass: its turns come right after the kept top.
    assert [bench.lr.session_of(i) for i in moved[1:4]] == ["D2", "D2", "D2"]


def test_feedback_without_weight_keeps_the_order() -> None:
    q = question()
    same = bench.feedback(q, m=2, beta=1.0, top=2, weight=0.0, depth=6)
    assert same == q.default
    moved = bench.feedback(q, m=2, beta=1.0, top=2, weight=1.0, depth=6)
    assert moved[:2] == q.default[:2] and sorted(moved) == sorted(q.default)


def test_cross_validation_keeps_the_first_setting_when_nothing_beats_it() -> None:
    good = {"R@5": 1.0, "R@10": 1.0, "S@10": 1.0}
    worse = {"R@5": 0.0, "R@10": 1.0, "S@10": 0.5}
    rows = {
        "first": [("a", good), ("b", good), ("c", good)],
        "other": [("a", worse), ("b", good), ("c", worse)],
    }
    cv = bench.cross_validated(rows)
    assert cv["chosen"] == {"first": 3}
    assert cv["held_out"] == pytest.approx(good)
    assert cv["best_in_sample_s10"]["setting"] == "first"


def test_missing_caches_say_what_to_run(tmp_path: Any) -> None:
    with pytest.raises(SystemExit, match=r"rerank_late\.py"):
        bench.load(tmp_path)
