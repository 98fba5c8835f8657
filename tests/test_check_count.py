"""One check for every count-like setting: whole numbers only (never a bool), at least a minimum."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from memories_core import ConfigurationError, HistoryMemory, InvalidInputError, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.engine_parts.rules import check_k
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


@pytest.mark.parametrize("whole", [np.int64(3), np.int32(3), np.uint8(3)])
def test_a_numpy_integer_is_a_whole_number_and_comes_back_a_plain_int(whole: Any) -> None:
    got = check_count("size", whole)
    assert got == 3 and type(got) is int
    assert type(check_k(whole)) is int


@pytest.mark.parametrize("bad", [np.bool_(True), np.float64(3.0), np.array([3])])
def test_numpy_bools_floats_and_arrays_are_still_refused(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="must be a positive int"):
        check_count("size", bad)
    with pytest.raises(InvalidInputError, match="k must be an int"):
        check_k(bad)


def test_settings_given_numpy_integers_store_plain_ints() -> None:
    """What is kept is Python's int, so it serialises (JSON, SQL) like any other setting."""
    assert type(HashingEmbedder(dimension=np.int64(64)).dimension) is int
    assert type(Fusion(rrf_k=np.int64(60)).rrf_k) is int
    assert type(ImportLimits(max_records=np.int64(10)).max_records) is int
    assert type(RecallRequest(query="q", user_id="u", k=np.int64(2)).k) is int
    json.dumps({"dimension": HashingEmbedder(dimension=np.int64(64)).dimension})


def test_recall_and_both_frameworks_retrievers_take_a_numpy_k() -> None:
    from langchain_memories import MemoryRetriever as LangChainRetriever
    from llamaindex_memories import MemoryRetriever as LlamaIndexRetriever

    memory = HistoryMemory(embedder=HashingEmbedder(), path=None)
    memory.save([Turn("user", f"I like tea number {i}") for i in range(4)], Scope("ann"))
    k = np.int64(2)
    assert len(memory.recall("tea", Scope("ann"), k=k).records) == 2
    assert len(LangChainRetriever(memory=memory, user_id="ann", k=k).invoke("tea")) == 2
    found = LlamaIndexRetriever(memory, "ann", similarity_top_k=k).retrieve("tea")
    assert len(found) == 2
    memory.close()
