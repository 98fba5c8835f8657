"""Memory as LlamaIndex tools: a ``BaseToolSpec`` for ``FunctionAgent`` and ``ReActAgent``."""

from __future__ import annotations

from typing import Any

from llama_index.core.tools.tool_spec.base import BaseToolSpec

from llamaindex_memories.observability import save_event
from memories_core.agent_tools import MemoryToolbox
from memories_core.types import Scope

__all__ = ["MemoryToolSpec"]


class MemoryToolSpec(BaseToolSpec):
    """The tools ``save_memory``, ``search_memory``, ``update_memory``, ``forget_memory``.

    One spec serves one user, fixed at construction: the user is never a tool argument, so a
    model can neither read nor change another user's memories. Bad input (empty text, an
    unknown id, an id of another user) raises
    :class:`~memories_core.agent_tools.ToolInputError`; LlamaIndex agents return its message
    to the model as the tool's (error) output, and nothing changes.

    Setup:
        ```bash
        pip install "llm-memories[llamaindex]"
        ```

    Key init args:
        memory: Any mechanism of ``memories_core`` (or a ``MemoryEngine``).
        user_id: Whose memories the tools work on.
        k: Memories ``search_memory`` returns by default.

    Use in an agent:
        ```python
        from llama_index.core.agent.workflow import FunctionAgent
        from llamaindex_memories import MemoryToolSpec

        tools = MemoryToolSpec(memory, user_id="alice").to_tool_list()
        agent = FunctionAgent(tools=tools, llm=llm)
        await agent.run("Remember that I am vegetarian")
        ```

    Raises:
        MissingUserError: on an empty ``user_id``.
    """

    spec_functions = [  # noqa: RUF012 (BaseToolSpec declares it as a plain attribute)
        "save_memory",
        "search_memory",
        "update_memory",
        "forget_memory",
    ]

    def __init__(self, memory: Any, *, user_id: str, k: int = 5) -> None:
        Scope(user_id)  # reject an empty user id up front
        self.user_id = user_id
        self._box = MemoryToolbox(memory, k=k)

    def save_memory(self, text: str) -> str:
        """Remember a fact about the user for future conversations (a preference, a plan).

        Args:
            text: The fact to remember, one self-contained sentence.
        """
        record = self._box.save(self.user_id, text)
        save_event(self._box.engine, self.user_id, "save", record_ids=[record.id])
        return f"Saved memory {record.id}."

    def search_memory(self, query: str, k: int | None = None) -> str:
        """Search the user's long-term memories (one JSON object per memory, with its id).

        Args:
            query: What to look for, in natural language.
            k: How many memories to return (1-50).
        """
        return self._box.render(self._box.search(self.user_id, query, k=k))

    def update_memory(self, memory_id: str, text: str) -> str:
        """Correct a memory: replace its text (the old text is kept in the history).

        Args:
            memory_id: The id of the memory, as search_memory returned it.
            text: The corrected text.
        """
        record = self._box.update(self.user_id, memory_id, text)
        save_event(self._box.engine, self.user_id, "update", record_ids=[record.id])
        return f"Updated memory {record.id}."

    def forget_memory(self, memory_id: str, reason: str | None = None) -> str:
        """Forget a memory that is wrong or that the user asked to forget.

        Args:
            memory_id: The id of the memory, as search_memory returned it.
            reason: Why it is forgotten (optional).
        """
        record = self._box.forget(self.user_id, memory_id, reason=reason)
        save_event(self._box.engine, self.user_id, "forget", record_ids=[record.id])
        return f"Forgot memory {record.id}."
