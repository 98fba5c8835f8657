from __future__ import annotations

import importlib
import sys

import pytest

import langchain_memories
from memories_core import MissingExtraError

EXPECTED_ALL = [
    "ConditionalMemoryChat",
    "CoreChatModel",
    "CoreEmbeddings",
    "ForgettingCurveRetriever",
    "LangChainEmbedder",
    "LangChainLLM",
    "LegacyChainMemory",
    "MemoryBankRetriever",
    "MemoryChatMessageHistory",
    "MemoryMiddleware",
    "MemoryRetriever",
    "MemoryStore",
    "PersonalizedChatModel",
    "SelfReflectiveRetriever",
    "create_emg_tools",
    "create_memochat_chain",
    "create_memory_tools",
    "dpem_retriever",
    "emg_retriever",
    "memochat_retriever",
]


def test_all_imports() -> None:
    assert sorted(langchain_memories.__all__) == EXPECTED_ALL
    for name in EXPECTED_ALL:
        assert getattr(langchain_memories, name) is not None


def test_missing_extra_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "langchain_memories"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "langchain_classic", None)  # as if not installed
    with pytest.raises(MissingExtraError, match=r"langchain-classic.*llm-memories\[langchain\]"):
        importlib.import_module("langchain_memories")
