"""EMG-RAG through LlamaIndex: the selection in a query engine, the apps in a FunctionAgent."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from li_fakes import RecordingLLM
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms import MockFunctionCallingLLM
from llama_index.core.query_engine import RetrieverQueryEngine

from emg_scenario import QUESTION, spread_policy, story_memory
from llamaindex_memories import EMGToolSpec, emg_retriever
from memories_core import EMGMemory, MissingUserError


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


async def drive(memory: EMGMemory, user: str, calls: list[tuple[str, dict[str, Any]]]) -> list[str]:
    seen: list[str] = []
    tools = EMGToolSpec(memory, user_id=user).to_tool_list()
    await FunctionAgent(tools=tools, llm=scripted(calls, seen)).run("go")
    return seen


def test_query_engine_gets_the_policys_selection(recording_llm: RecordingLLM) -> None:
    memory = story_memory()
    engine = RetrieverQueryEngine.from_args(emg_retriever(memory, "ann", k=3), llm=recording_llm)
    response = engine.query(QUESTION)
    # Untrained: the activation ranking's top memory only, not a fixed k of 3.
    assert [n.node.get_content() for n in response.source_nodes] == [
        "Flight EK349 departs at 01:30 on 2024-05-12."
    ]
    memory.save_policy(spread_policy())
    selected = [h.record.id for h in memory.select(QUESTION, "ann").memories]
    response = engine.query(QUESTION)
    assert len(selected) > 3
    assert [n.node.node_id for n in response.source_nodes] == selected[:3]


async def test_function_agent_answers_autofills_and_reminds() -> None:
    memory = story_memory()
    mine = {r.id for r in memory.memories("ann")}
    seen = await drive(
        memory,
        "ann",
        [
            ("answer_from_memory", {"question": QUESTION}),
            ("autofill_form", {"fields": ["phone number", "passport number"]}),
            ("upcoming_reminders", {"days": 7}),
            ("upcoming_reminders", {"days": 0}),
        ],
    )
    answer, form, reminders, bad = seen
    used = answer.split("(memories used: ")[1].rstrip(")").split(", ")
    assert "01:30" in answer and set(used) <= mine
    assert json.loads(form) == {"phone number": "+31 6 1234 5678", "passport number": None}
    assert json.loads(reminders)["what"] == "event"
    assert "days must be" in bad  # the error goes back to the model
    (bobs,) = await drive(memory, "bob", [("answer_from_memory", {"question": QUESTION})])
    assert (
        "01:30" not in bobs and not set(bobs.split("(memories used: ")[1][:-1].split(", ")) & mine
    )


def test_spec_needs_a_user() -> None:
    with pytest.raises(MissingUserError):
        EMGToolSpec(story_memory(), user_id="")
