"""LangChain's standard retriever suite, run offline over an in-memory HistoryMemory."""

from __future__ import annotations

from typing import Any

from langchain_tests.integration_tests import RetrieversIntegrationTests
from lc_fakes import history_memory

from langchain_memories import MemoryRetriever
from memories_core import Scope, Turn

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
