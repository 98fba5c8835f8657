"""One check for every count-like setting: ints only (never a bool), at least a minimum."""

from __future__ import annotations

from typing import Any

import pytest

from memories_core import ConfigurationError, InvalidInputError
from memories_core.embedders import HashingEmbedder
from memories_core.errors import check_count
from memories_core.mechanisms.dpem_items import check_typed
from memories_core.portable.format import ImportLimits
from memories_core.retrieval import RecallRequest
from memories_core.retrieval.fusion import Fusion
from memories_core.retrieval.late_cache import TokenVectorCache


def test_check_count_returns_the_value_at_or_above_the_minimum() -> None:
    assert check_count("size", 1) == 1
    assert check_count("size", 0, minimum=0) == 0
    assert check_count("dimension", 8, minimum=8) == 8


@pytest.mark.parametrize("bad", [0, -1, True, False, 1.0, "3", None])
def test_check_count_refuses_what_is_not_a_positive_int(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"size must be a positive int, got "):
        check_count("size", bad)


def test_check_count_names_its_minimum_and_raises_the_error_asked() -> None:
    with pytest.raises(ConfigurationError, match="must be a non-negative int, got -1"):
        check_count("pool", -1, minimum=0)
    with pytest.raises(ConfigurationError, match="must be an int >= 8, got 7"):
        check_count("dimension", 7, minimum=8)
    with pytest.raises(InvalidInputError, match="k must be a positive int"):
        check_count("k", 0, error=InvalidInputError)


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: HashingEmbedder(dimension=True), ConfigurationError),
        (lambda: HashingEmbedder(dimension=7), ConfigurationError),
        (lambda: Fusion(rrf_k=-1), ConfigurationError),
        (lambda: TokenVectorCache(max_bytes="1"), ConfigurationError),
        (lambda: ImportLimits(max_records=0), InvalidInputError),
        (lambda: RecallRequest(query="q", user_id="u", k=True), InvalidInputError),
        (lambda: check_typed("u", 0, []), InvalidInputError),
    ],
)
def test_settings_and_inputs_are_checked_the_same_way(make: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="must be a"):
        make()
