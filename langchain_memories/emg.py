"""EMG-RAG for LangChain (Wang et al., 2024, §4.3-4.4): the selection and the applications.

* :func:`emg_retriever`: the generic :class:`~langchain_memories.MemoryRetriever` over an
  :class:`~memories_core.EMGMemory`, whose recall is the policy's selection (variable size,
  at most ``k``; the activation ranking's top memory while no policy is trained).
* :func:`create_emg_tools`: the §4.4 applications as agent tools: ``answer_from_memory``
  (question answering from the selected memories), ``autofill_form`` (form fields) and
  ``upcoming_reminders`` (events and expiries). The user is never a tool argument.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from langchain_core.tools import BaseTool, ToolException
from pydantic import BaseModel, Field

from langchain_memories.retriever import MemoryRetriever
from langchain_memories.tools import _runtime_user, _tool
from memories_core.errors import InvalidInputError, MissingUserError, ParseError
from memories_core.mechanisms.emg import EMGMemory
from memories_core.types import Scope

__all__ = ["create_emg_tools", "emg_retriever"]


def emg_retriever(memory: EMGMemory, user_id: str, *, k: int | None = None) -> MemoryRetriever:
    """The generic retriever over an EMG-RAG memory: the policy's selection, at most ``k``.

    Raises:
        InvalidInputError: if ``memory`` recalls fused rankings (``recall_mode="fused"``).
    """
    if memory.recall_mode != "selection":
        raise InvalidInputError("emg_retriever needs EMGMemory(recall_mode='selection')")
    return MemoryRetriever(memory=memory, user_id=user_id, k=k)


class AnswerInput(BaseModel):
    """Arguments of ``answer_from_memory``."""

    question: str = Field(description="The user's question about their own life or plans.")


class AutofillInput(BaseModel):
    """Arguments of ``autofill_form``."""

    fields: list[str] = Field(description="Form field names, e.g. ['phone number', 'address'].")


class RemindersInput(BaseModel):
    """Arguments of ``upcoming_reminders``."""

    days: int = Field(default=7, ge=1, le=366, description="How many days ahead to look.")


def create_emg_tools(memory: EMGMemory, *, user_id: str | None = None) -> list[BaseTool]:
    """Build the tools ``answer_from_memory``, ``autofill_form``, ``upcoming_reminders``.

    The user is ``user_id`` if given, else read from each run's context
    (``context={"user_id": ...}``) or config, as :func:`create_memory_tools` does. Bad input
    and unusable model answers come back to the model as tool errors.

    Use in an agent:
        ```python
        from langchain.agents import create_agent
        from langchain_memories import create_emg_tools

        agent = create_agent(model=llm, tools=create_emg_tools(memory))
        agent.invoke({"messages": [...]}, context={"user_id": "ann"})
        ```

    Raises:
        MissingUserError: at construction on an empty ``user_id``; at run time (as a tool
            error) when no user is fixed nor given by the run.
    """
    if user_id is not None:
        Scope(user_id)

    def scope() -> Scope:
        found = user_id or _runtime_user()
        if found is None:
            raise MissingUserError("EMG tools need a user id: user_id=... or the run's context")
        return Scope(found)

    def answer(question: str) -> str:
        try:
            result = memory.answer(question, scope())
        except (InvalidInputError, ParseError) as exc:
            raise ToolException(str(exc)) from exc
        ids = ", ".join(h.record.id for h in result.memories)
        return f"{result.text}\n(memories used: {ids or 'none'})"

    def autofill(fields: list[str]) -> str:
        try:
            return json.dumps(memory.autofill(fields, scope()))
        except InvalidInputError as exc:
            raise ToolException(str(exc)) from exc

    def reminders(days: int = 7) -> str:
        found = memory.reminders(scope(), horizon=timedelta(days=days))
        rows = [{"at": r.at.isoformat(), "what": r.what, "text": r.text} for r in found]
        return "\n".join(json.dumps(row) for row in rows) or "No upcoming reminders."

    specs: list[tuple[str, str, type[BaseModel], Any]] = [
        (
            "answer_from_memory",
            "Answer a question about the user from their personal memories (bookings, "
            "people, preferences, plans). Returns the answer and the memory ids it used.",
            AnswerInput,
            answer,
        ),
        (
            "autofill_form",
            "Fill form fields from the user's memories; returns a JSON object field -> "
            "value (null when no memory holds it).",
            AutofillInput,
            autofill,
        ),
        (
            "upcoming_reminders",
            "List the user's upcoming events and expiring items (JSON lines, soonest first).",
            RemindersInput,
            reminders,
        ),
    ]
    return [_tool(name, text, schema, run) for name, text, schema, run in specs]
