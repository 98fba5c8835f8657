"""MemoryToolSpec inside a real FunctionAgent driven by a scripted function-calling LLM."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms import MockFunctionCallingLLM

from llamaindex_memories import MemoryToolSpec
from memories_core import HistoryMemory, MissingUserError


def scripted(calls: list[tuple[str, dict[str, Any]]], seen: list[str]) -> MockFunctionCallingLLM:
    """Call the tools in order (one per model turn), record their outputs, then answer."""
    script = list(calls)

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        if messages and messages[-1].role == MessageRole.TOOL:
            seen.append(str(messages[-1].content))
        if script:
            name, args = script.pop(0)
            block = ToolCallBlock(tool_call_id=f"c{len(script)}", tool_name=name, tool_kwargs=args)
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=[block])
        return ChatMessage(role=MessageRole.ASSISTANT, content="done")

    return MockFunctionCallingLLM(response_generator=respond)


async def drive(
    memory: HistoryMemory, user: str, calls: list[tuple[str, dict[str, Any]]]
) -> list[str]:
    seen: list[str] = []
    agent = FunctionAgent(
        tools=MemoryToolSpec(memory, user_id=user).to_tool_list(), llm=scripted(calls, seen)
    )
    await agent.run("go")
    return seen


def memories(memory: HistoryMemory, user: str) -> list[str]:
    return [r.text for r in memory.engine.records(user, where={"kind": "memory"})]


async def test_function_agent_saves_updates_and_forgets(history: HistoryMemory) -> None:
    seen = await drive(history, "alice", [("save_memory", {"text": "Alice is vegetarian"})])
    assert seen[0].startswith("Saved memory ")
    (record,) = history.engine.records("alice", where={"kind": "memory"})
    seen = await drive(
        history,
        "alice",
        [
            ("search_memory", {"query": "diet"}),
            ("update_memory", {"memory_id": record.id, "text": "Alice is vegan"}),
        ],
    )
    assert record.id in seen[0] and "vegetarian" in seen[0]
    assert memories(history, "alice") == ["Alice is vegan"]
    assert history.engine.history("alice")[0].old == {"text": "Alice is vegetarian"}
    await drive(history, "alice", [("forget_memory", {"memory_id": record.id})])
    assert memories(history, "alice") == []


async def test_bad_input_is_a_tool_error_and_changes_nothing(history: HistoryMemory) -> None:
    await drive(history, "bob", [("save_memory", {"text": "Bob's PIN is 1234"})])
    (bobs,) = history.engine.records("bob")
    seen = await drive(
        history,
        "alice",
        [
            ("save_memory", {"text": " "}),
            ("update_memory", {"memory_id": "nope", "text": "x"}),
            ("update_memory", {"memory_id": bobs.id, "text": "Bob's PIN is 0000"}),
            ("forget_memory", {"memory_id": bobs.id}),
            ("search_memory", {"query": "PIN"}),
        ],
    )
    assert "text is empty" in seen[0]
    assert "no memory with id 'nope'" in seen[1]
    assert f"no memory with id '{bobs.id}'" in seen[2]
    assert f"no memory with id '{bobs.id}'" in seen[3]
    assert seen[4] == "No memories found."  # alice cannot see bob's memories
    assert history.engine.records("alice") == []
    assert memories(history, "bob") == ["Bob's PIN is 1234"]
    assert history.engine.history("bob") == []


def test_spec_shape(history: HistoryMemory) -> None:
    tools = MemoryToolSpec(history, user_id="alice").to_tool_list()
    assert [t.metadata.name for t in tools] == [
        "save_memory",
        "search_memory",
        "update_memory",
        "forget_memory",
    ]
    for tool in tools:
        assert "user_id" not in tool.metadata.get_parameters_dict()["properties"]
    with pytest.raises(MissingUserError):
        MemoryToolSpec(history, user_id="")
