"""LangChain's own standard suites over our tools and the embeddings bridge, offline.

Each tool of :func:`create_memory_tools` and :func:`create_emg_tools` runs the unit and
integration suites of ``langchain_tests`` (a name, an input schema that accepts the example,
``invoke``/``ainvoke`` with and without a ``ToolCall``), over a memory that holds the record
the example names. ``CoreEmbeddings`` runs the embeddings suites.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

from langchain_core.tools import BaseTool
from langchain_tests.integration_tests import EmbeddingsIntegrationTests, ToolsIntegrationTests
from langchain_tests.unit_tests import EmbeddingsUnitTests, ToolsUnitTests
from lc_fakes import history_memory

from emg_scenario import QUESTION, story_memory
from langchain_memories import CoreEmbeddings, create_emg_tools, create_memory_tools
from memories_core.embedders import HashingEmbedder

USER = "alice"


class _EmbeddingsSuite:
    @property
    def embeddings_class(self) -> type[CoreEmbeddings]:
        return CoreEmbeddings

    @property
    def embedding_model_params(self) -> dict[str, Any]:
        return {"embedder": HashingEmbedder(dimension=64)}


class TestCoreEmbeddingsUnit(_EmbeddingsSuite, EmbeddingsUnitTests):
    pass


class TestCoreEmbeddingsIntegration(_EmbeddingsSuite, EmbeddingsIntegrationTests):
    pass


class _MemoryToolSuite:
    """One tool of ``create_memory_tools`` over a memory holding one of ``alice``'s facts."""

    name = ""

    @cached_property
    def _memory_and_id(self) -> tuple[Any, str]:
        memory = history_memory()
        (save,) = [t for t in create_memory_tools(memory, user_id=USER) if t.name == "save_memory"]
        save.invoke({"text": "I am allergic to peanuts"})
        (record,) = memory.engine.records(USER, where={"kind": "memory"})
        return memory, record.id

    @property
    def tool_constructor(self) -> BaseTool:
        memory, _ = self._memory_and_id
        (tool,) = [t for t in create_memory_tools(memory, user_id=USER) if t.name == self.name]
        return tool

    @property
    def tool_constructor_params(self) -> dict[str, Any]:
        return {}

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        _, record_id = self._memory_and_id
        return {
            "save_memory": {"text": "My sister lives in Lisbon"},
            "search_memory": {"query": "what am I allergic to?", "k": 2},
            "update_memory": {"memory_id": record_id, "text": "I am allergic to cashews"},
            "forget_memory": {"memory_id": record_id, "reason": "no longer true"},
        }[self.name]


class TestSaveMemoryUnit(_MemoryToolSuite, ToolsUnitTests):
    name = "save_memory"


class TestSaveMemoryIntegration(_MemoryToolSuite, ToolsIntegrationTests):
    name = "save_memory"


class TestSearchMemoryUnit(_MemoryToolSuite, ToolsUnitTests):
    name = "search_memory"


class TestSearchMemoryIntegration(_MemoryToolSuite, ToolsIntegrationTests):
    name = "search_memory"


class TestUpdateMemoryUnit(_MemoryToolSuite, ToolsUnitTests):
    name = "update_memory"


class TestUpdateMemoryIntegration(_MemoryToolSuite, ToolsIntegrationTests):
    name = "update_memory"


class TestForgetMemoryUnit(_MemoryToolSuite, ToolsUnitTests):
    name = "forget_memory"


class TestForgetMemoryIntegration(_MemoryToolSuite, ToolsIntegrationTests):
    name = "forget_memory"


class _EMGToolSuite:
    """One tool of ``create_emg_tools`` over the secretary's story (``ann``'s memories)."""

    name = ""

    @property
    def tool_constructor(self) -> BaseTool:
        tools = create_emg_tools(story_memory(), user_id="ann")
        (tool,) = [t for t in tools if t.name == self.name]
        return tool

    @property
    def tool_constructor_params(self) -> dict[str, Any]:
        return {}

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return {
            "answer_from_memory": {"question": QUESTION},
            "autofill_form": {"fields": ["phone number", "passport number"]},
            "upcoming_reminders": {"days": 7},
        }[self.name]


class TestAnswerFromMemoryUnit(_EMGToolSuite, ToolsUnitTests):
    name = "answer_from_memory"


class TestAnswerFromMemoryIntegration(_EMGToolSuite, ToolsIntegrationTests):
    name = "answer_from_memory"


class TestAutofillFormUnit(_EMGToolSuite, ToolsUnitTests):
    name = "autofill_form"


class TestAutofillFormIntegration(_EMGToolSuite, ToolsIntegrationTests):
    name = "autofill_form"


class TestUpcomingRemindersUnit(_EMGToolSuite, ToolsUnitTests):
    name = "upcoming_reminders"


class TestUpcomingRemindersIntegration(_EMGToolSuite, ToolsIntegrationTests):
    name = "upcoming_reminders"
