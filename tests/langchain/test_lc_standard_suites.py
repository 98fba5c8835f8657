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


class _ToolSuite:
    """The suites' fixtures for the tool called :attr:`name` among :meth:`tools`."""

    name = ""

    def tools(self) -> list[BaseTool]:
        raise NotImplementedError

    def examples(self) -> dict[str, dict[str, Any]]:
        raise NotImplementedError

    @property
    def tool_constructor(self) -> BaseTool:
        (tool,) = [t for t in self.tools() if t.name == self.name]
        return tool

    @property
    def tool_constructor_params(self) -> dict[str, Any]:
        return {}

    @property
    def tool_invoke_params_example(self) -> dict[str, Any]:
        return self.examples()[self.name]


class _MemoryToolSuite(_ToolSuite):
    """One tool of ``create_memory_tools`` over a memory holding one of ``alice``'s facts."""

    @cached_property
    def _memory_and_id(self) -> tuple[Any, str]:
        memory = history_memory()
        (save,) = [t for t in create_memory_tools(memory, user_id=USER) if t.name == "save_memory"]
        save.invoke({"text": "I am allergic to peanuts"})
        (record,) = memory.engine.records(USER, where={"kind": "memory"})
        return memory, record.id

    def tools(self) -> list[BaseTool]:
        return create_memory_tools(self._memory_and_id[0], user_id=USER)

    def examples(self) -> dict[str, dict[str, Any]]:
        record_id = self._memory_and_id[1]
        return {
            "save_memory": {"text": "My sister lives in Lisbon"},
            "search_memory": {"query": "what am I allergic to?", "k": 2},
            "update_memory": {"memory_id": record_id, "text": "I am allergic to cashews"},
            "forget_memory": {"memory_id": record_id, "reason": "no longer true"},
        }


class _EMGToolSuite(_ToolSuite):
    """One tool of ``create_emg_tools`` over the secretary's story (``ann``'s memories)."""

    def tools(self) -> list[BaseTool]:
        return create_emg_tools(story_memory(), user_id="ann")

    def examples(self) -> dict[str, dict[str, Any]]:
        return {
            "answer_from_memory": {"question": QUESTION},
            "autofill_form": {"fields": ["phone number", "passport number"]},
            "upcoming_reminders": {"days": 7},
        }


def _suites(mixin: type, names: list[str]) -> None:
    """A unit and an integration test class of ``mixin`` per tool name, for pytest to find."""
    for name in names:
        camel = "".join(part.title() for part in name.split("_"))
        for suite in (ToolsUnitTests, ToolsIntegrationTests):
            kind = "Unit" if suite is ToolsUnitTests else "Integration"
            title = f"Test{camel}{kind}"
            globals()[title] = type(title, (mixin, suite), {"name": name})


_suites(_MemoryToolSuite, ["save_memory", "search_memory", "update_memory", "forget_memory"])
_suites(_EMGToolSuite, ["answer_from_memory", "autofill_form", "upcoming_reminders"])
