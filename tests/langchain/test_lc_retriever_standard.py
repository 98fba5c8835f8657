"""LangChain's standard retriever suite, run offline over every mechanism's memory.

A retriever returns at most ``k`` documents, and exactly ``k`` when the user has that many
records: the suite asks for 1 and 3 through the constructor and through ``invoke(k=...)``.
"""

from __future__ import annotations

from typing import Any

from langchain_tests.integration_tests import RetrieversIntegrationTests
from lc_fakes import history_memory

from langchain_memories import MemoryBankRetriever, MemoryRetriever
from memories_core import Scope, Turn
from retriever_scenarios import QUERY, USER, filled

FACTS = [
    "I love hiking in the Alps",
    "My sister lives in Lisbon",
    "I am allergic to peanuts",
    "I play the cello on weekends",
    "My favourite hiking trail is in Norway",
]


class TestMemoryRetrieverStandard(RetrieversIntegrationTests):
    @property
    def retriever_constructor(self) -> type[MemoryRetriever]:
        return MemoryRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        memory = history_memory()
        memory.save([Turn("user", fact) for fact in FACTS], Scope("alice"))
        return {"memory": memory, "user_id": "alice"}

    @property
    def retriever_query_example(self) -> str:
        return "where do I like hiking?"


class _MechanismStandard(RetrieversIntegrationTests):
    """The suite over one mechanism of :mod:`retriever_scenarios`."""

    mechanism = ""

    @property
    def retriever_constructor(self) -> type[MemoryRetriever]:
        return MemoryRetriever

    @property
    def retriever_constructor_params(self) -> dict[str, Any]:
        return {"memory": filled(self.mechanism), "user_id": USER}

    @property
    def retriever_query_example(self) -> str:
        return QUERY


class TestSummaryRetrieverStandard(_MechanismStandard):
    mechanism = "summary"


class TestConditionalRetrieverStandard(_MechanismStandard):
    mechanism = "conditional"


class TestMultiViewRetrieverStandard(_MechanismStandard):
    mechanism = "multiview"


class TestMemoChatLLMFreeRetrieverStandard(_MechanismStandard):
    mechanism = "memochat_llm_free"


class TestMemoryBankRetrieverStandard(_MechanismStandard):
    mechanism = "memorybank"

    @property
    def retriever_constructor(self) -> type[MemoryRetriever]:
        return MemoryBankRetriever


class TestDPeMRetrieverStandard(_MechanismStandard):
    mechanism = "dpem"


class TestEMGRetrieverStandard(_MechanismStandard):
    mechanism = "emg"
