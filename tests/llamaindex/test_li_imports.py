"""Pin the public API of llamaindex_memories: it only changes on purpose."""

from __future__ import annotations

import importlib
import sys

import pytest

import llamaindex_memories
from memories_core.errors import MissingExtraError

EXPECTED_ALL = [
    "ConditionalMemoryBlock",
    "ConditionalMemoryLLM",
    "CoreEmbedding",
    "CoreLLM",
    "EMGToolSpec",
    "ForgettingCurvePostprocessor",
    "LlamaIndexEmbedder",
    "LlamaIndexLLM",
    "MemoChatEngine",
    "MemoryBankBlock",
    "MemoryBlock",
    "MemoryRecallEvent",
    "MemoryRetriever",
    "MemorySaveEvent",
    "MemoryToolSpec",
    "PersonalizedLlamaLLM",
    "SelfReflectiveFilter",
    "SelfReflectiveRetriever",
    "dpem_retriever",
    "emg_retriever",
    "memochat_retriever",
]


def test_all_is_pinned() -> None:
    assert sorted(llamaindex_memories.__all__) == EXPECTED_ALL


def test_every_name_is_importable() -> None:
    for name in EXPECTED_ALL:
        assert getattr(llamaindex_memories, name) is not None


def test_missing_llamaindex_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_index.core", None)  # makes the import fail
    for name in [m for m in sys.modules if m.startswith("llamaindex_memories")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(MissingExtraError, match=r"llm-memories\[llamaindex\]"):
        importlib.import_module("llamaindex_memories")
