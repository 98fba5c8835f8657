"""Memory as LangChain tools: an agent decides itself what to save, search, update, forget."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool, ToolException
from pydantic import BaseModel, Field

from langchain_memories.middleware import _run_value
from memories_core.agent_tools import MemoryToolbox, ToolInputError
from memories_core.errors import MissingUserError
from memories_core.types import Scope

__all__ = ["create_memory_tools"]


class SaveMemoryInput(BaseModel):
    """Arguments of ``save_memory``."""

    text: str = Field(description="The fact to remember, one self-contained sentence.")


class SearchMemoryInput(BaseModel):
    """Arguments of ``search_memory``."""

    query: str = Field(description="What to look for, in natural language.")
    k: int | None = Field(default=None, description="How many memories to return (1-50).")


class UpdateMemoryInput(BaseModel):
    """Arguments of ``update_memory``."""

    memory_id: str = Field(description="The id of the memory, as search_memory returned it.")
    text: str = Field(description="The corrected text that replaces the memory's text.")


class ForgetMemoryInput(BaseModel):
    """Arguments of ``forget_memory``."""

    memory_id: str = Field(description="The id of the memory, as search_memory returned it.")
    reason: str | None = Field(default=None, description="Why it is forgotten (optional).")


def _runtime_user() -> str | None:
    try:
        from langgraph.runtime import get_runtime

        runtime = get_runtime()
    except (RuntimeError, KeyError):
        runtime = None
    return _run_value(runtime, "user_id")


def create_memory_tools(memory: Any, *, user_id: str | None = None, k: int = 5) -> list[BaseTool]:
    """Build the tools ``save_memory``, ``search_memory``, ``update_memory``, ``forget_memory``.

    The user is never a tool argument: it is ``user_id`` if given, else read from each run's
    context (``context={"user_id": ...}`` of ``create_agent``) or config
    (``config={"configurable": {"user_id": ...}}``), as :class:`MemoryMiddleware` does. A
    model can therefore neither read nor change another user's memories. Bad input (empty
    text, an unknown id, an id of another user) comes back to the model as a tool error
    message and changes nothing.

    Setup:
        ```bash
        pip install "llm-memories[langchain]"
        ```

    Key init args:
        memory: Any mechanism of ``memories_core`` (or a ``MemoryEngine``).
        user_id: A fixed user; ``None`` reads it from each run.
        k: Memories ``search_memory`` returns by default.

    Use in an agent:
        ```python
        from langchain.agents import create_agent
        from langchain_memories import create_memory_tools

        agent = create_agent(model=llm, tools=create_memory_tools(memory))
        agent.invoke({"messages": [...]}, context={"user_id": "alice"})
        ```

    Returns:
        Four ``StructuredTool``s with typed argument schemas (sync and async).

    Raises:
        MissingUserError: at construction on an empty ``user_id``. At run time a missing
            user is not raised: the tool returns the error message (an agent's
            ``ToolMessage`` with ``status="error"``) and changes nothing.
    """
    if user_id is not None:
        Scope(user_id)  # reject an empty user id up front
    box = MemoryToolbox(memory, k=k)

    def user() -> str:
        found = user_id or _runtime_user()
        if found is None:
            raise MissingUserError(
                "memory tools need a user id: create_memory_tools(..., user_id=...), or run "
                "the agent with context={'user_id': ...} or config={'configurable': ...}"
            )
        return found

    def guarded(run: Callable[..., str]) -> Callable[..., str]:
        def call(**kwargs: Any) -> str:
            try:
                return run(user(), **kwargs)
            except (ToolInputError, MissingUserError) as exc:
                # Both are the model's or the run's input: the agent gets a tool error.
                raise ToolException(str(exc)) from exc

        return call

    def save(uid: str, text: str) -> str:
        record = box.save(uid, text)
        _emit("memory_saved", {"user_id": uid, "record_id": record.id, "kind": record.kind})
        return f"Saved memory {record.id}."

    def search(uid: str, query: str, k: int | None = None) -> str:
        return box.render(box.search(uid, query, k=k))

    def update(uid: str, memory_id: str, text: str) -> str:
        record = box.update(uid, memory_id, text)
        _emit("memory_updated", {"user_id": uid, "record_id": record.id})
        return f"Updated memory {record.id}."

    def forget(uid: str, memory_id: str, reason: str | None = None) -> str:
        record = box.forget(uid, memory_id, reason=reason)
        _emit("memory_forgotten", {"user_id": uid, "record_id": record.id})
        return f"Forgot memory {record.id}."

    specs: list[tuple[str, str, type[BaseModel], Callable[..., str]]] = [
        (
            "save_memory",
            "Remember a fact about the user for future conversations (a preference, a plan, "
            "a correction). Returns the new memory's id.",
            SaveMemoryInput,
            save,
        ),
        (
            "search_memory",
            "Search the user's long-term memories; returns one JSON object per memory "
            "(id, text, kind, created_at, score from 0 to 1).",
            SearchMemoryInput,
            search,
        ),
        (
            "update_memory",
            "Correct a memory: replace its text (the old text is kept in the history).",
            UpdateMemoryInput,
            update,
        ),
        (
            "forget_memory",
            "Forget a memory that is wrong or that the user asked to forget.",
            ForgetMemoryInput,
            forget,
        ),
    ]
    return [_tool(name, text, schema, guarded(run)) for name, text, schema, run in specs]


def _tool(
    name: str, description: str, schema: type[BaseModel], func: Callable[..., str]
) -> StructuredTool:
    async def coroutine(**kwargs: Any) -> str:
        return await asyncio.to_thread(func, **kwargs)

    return StructuredTool.from_function(
        func=func,
        coroutine=coroutine,
        name=name,
        description=description,
        args_schema=schema,
        handle_tool_error=True,
    )


def _emit(name: str, data: dict[str, Any]) -> None:
    """Report a memory write as a LangChain custom event (seen by callback handlers)."""
    from langchain_memories.observability import emit_memory_event

    emit_memory_event(name, data)
