"""EMG-RAG for LlamaIndex (Wang et al., 2024, §4.3-4.4): the selection and the applications.

* :func:`emg_retriever`: the generic :class:`~llamaindex_memories.MemoryRetriever` over an
  :class:`~memories_core.EMGMemory`, whose recall is the policy's selection (variable size,
  at most ``similarity_top_k``; the activation ranking's top memory while untrained).
* :class:`EMGToolSpec`: the §4.4 applications as agent tools: question answering, autofill
  forms and reminders, for one user fixed at construction.
"""

from __future__ import annotations

import json
from datetime import timedelta

from llama_index.core.tools.tool_spec.base import BaseToolSpec

from llamaindex_memories.retriever import MemoryRetriever
from memories_core.errors import InvalidInputError
from memories_core.mechanisms.emg import EMGMemory
from memories_core.types import Scope

__all__ = ["EMGToolSpec", "emg_retriever"]


def emg_retriever(memory: EMGMemory, user_id: str, *, k: int | None = None) -> MemoryRetriever:
    """The generic retriever over an EMG-RAG memory: the policy's selection, at most ``k``.

    Raises:
        InvalidInputError: if ``memory`` recalls fused rankings (``recall_mode="fused"``).
    """
    if memory.recall_mode != "selection":
        raise InvalidInputError("emg_retriever needs EMGMemory(recall_mode='selection')")
    return MemoryRetriever(memory, user_id, similarity_top_k=k)


class EMGToolSpec(BaseToolSpec):
    """The tools ``answer_from_memory``, ``autofill_form``, ``upcoming_reminders``.

    One spec serves one user, fixed at construction: the user is never a tool argument.
    Bad input raises :class:`~memories_core.errors.InvalidInputError`, whose message
    LlamaIndex agents return to the model as the tool's (error) output.

    Use in an agent:
        ```python
        from llama_index.core.agent.workflow import FunctionAgent
        from llamaindex_memories import EMGToolSpec

        tools = EMGToolSpec(memory, user_id="ann").to_tool_list()
        agent = FunctionAgent(tools=tools, llm=llm)
        await agent.run("When does my boss's flight leave?")
        ```

    Raises:
        MissingUserError: on an empty ``user_id``.
    """

    spec_functions = [  # noqa: RUF012 (BaseToolSpec declares it as a plain attribute)
        "answer_from_memory",
        "autofill_form",
        "upcoming_reminders",
    ]

    def __init__(self, memory: EMGMemory, *, user_id: str) -> None:
        self._scope = Scope(user_id)
        self._memory = memory

    def answer_from_memory(self, question: str) -> str:
        """Answer a question about the user from their personal memories.

        Returns the answer and the ids of the memories it used.

        Args:
            question: The user's question about their own life or plans.
        """
        result = self._memory.answer(question, self._scope)
        ids = ", ".join(h.record.id for h in result.memories)
        return f"{result.text}\n(memories used: {ids or 'none'})"

    def autofill_form(self, fields: list[str]) -> str:
        """Fill form fields from the user's memories (JSON: field -> value or null).

        Args:
            fields: Form field names, e.g. ["phone number", "address"].
        """
        return json.dumps(self._memory.autofill(fields, self._scope))

    def upcoming_reminders(self, days: int = 7) -> str:
        """List the user's upcoming events and expiring items (JSON lines, soonest first).

        Args:
            days: How many days ahead to look (1-366).
        """
        if isinstance(days, bool) or not isinstance(days, int) or not 1 <= days <= 366:
            raise InvalidInputError("days must be an int from 1 to 366")
        found = self._memory.reminders(self._scope, horizon=timedelta(days=days))
        rows = [{"at": r.at.isoformat(), "what": r.what, "text": r.text} for r in found]
        return "\n".join(json.dumps(row) for row in rows) or "No upcoming reminders."
