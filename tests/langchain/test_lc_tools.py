from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any
from uuid import UUID

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from lc_fakes import chat_model, history_memory

from langchain_memories import create_memory_tools
from memories_core import ChatMessage, HistoryMemory, MemoChatMemory, MissingUserError, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.memochat import rule_following_reply


def call(name: str, args: dict[str, Any], cid: str = "c1") -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": args, "id": cid}])


def run(agent: Any, text: str, user: str, **kwargs: Any) -> list[Any]:
    state = agent.invoke({"messages": [HumanMessage(text)]}, context={"user_id": user}, **kwargs)
    return list(state["messages"])


def tool_replies(messages: list[Any]) -> list[str]:
    return [m.text for m in messages if isinstance(m, ToolMessage)]


def memories(memory: HistoryMemory, user: str) -> list[str]:
    return [r.text for r in memory.engine.records(user, where={"kind": "memory"})]


def test_agent_saves_searches_updates_and_forgets() -> None:
    memory = history_memory()
    tools = create_memory_tools(memory)
    model = chat_model(call("save_memory", {"text": "Alice is vegetarian"}), "Noted.")
    agent = create_agent(model=model, tools=tools)
    replies = tool_replies(run(agent, "I am vegetarian", "alice"))
    assert replies[0].startswith("Saved memory ")
    (record,) = memory.engine.records("alice", where={"kind": "memory"})
    assert record.text == "Alice is vegetarian"

    model = chat_model(
        call("search_memory", {"query": "diet"}, "c1"),
        call("update_memory", {"memory_id": record.id, "text": "Alice is vegan"}, "c2"),
        "Updated.",
    )
    agent = create_agent(model=model, tools=tools)
    replies = tool_replies(run(agent, "Actually I am vegan now", "alice"))
    assert record.id in replies[0] and "vegetarian" in replies[0]
    assert replies[1] == f"Updated memory {record.id}."
    assert memories(memory, "alice") == ["Alice is vegan"]
    (edit,) = memory.engine.history("alice", record_id=record.id)
    assert edit.old == {"text": "Alice is vegetarian"} and "update_memory" in (edit.reason or "")

    model = chat_model(call("forget_memory", {"memory_id": record.id, "reason": "asked"}), "Ok")
    agent = create_agent(model=model, tools=tools)
    assert tool_replies(run(agent, "Forget my diet", "alice")) == [f"Forgot memory {record.id}."]
    assert memories(memory, "alice") == []
    assert memory.engine.history("alice", record_id=record.id)[-1].new == {"deleted": True}


def test_bad_input_returns_a_tool_error_and_changes_nothing() -> None:
    memory = history_memory()
    tools = create_memory_tools(memory)
    bob = create_agent(
        model=chat_model(call("save_memory", {"text": "Bob's PIN is 1234"}), "ok"), tools=tools
    )
    run(bob, "remember my pin", "bob")
    (bobs,) = memory.engine.records("bob", where={"kind": "memory"})
    model = chat_model(
        call("save_memory", {"text": "   "}, "c1"),
        call("update_memory", {"memory_id": "no-such-id", "text": "x"}, "c2"),
        call("update_memory", {"memory_id": bobs.id, "text": "Bob's PIN is 0000"}, "c3"),
        call("forget_memory", {"memory_id": bobs.id}, "c4"),
        call("update_memory", {"memory_id": bobs.id, "text": ""}, "c5"),
        "done",
    )
    messages = run(create_agent(model=model, tools=tools), "do things", "alice")
    replies = tool_replies(messages)
    assert len(replies) == 5
    assert "text is empty" in replies[0]
    assert "no memory with id 'no-such-id'" in replies[1]
    # Another user's id is reported exactly like an unknown one.
    assert f"no memory with id '{bobs.id}'" in replies[2]
    assert f"no memory with id '{bobs.id}'" in replies[3]
    assert "text is empty" in replies[4]
    statuses = [m.status for m in messages if isinstance(m, ToolMessage)]
    assert statuses == ["error"] * 5
    assert memory.engine.records("alice") == []
    assert memories(memory, "bob") == ["Bob's PIN is 1234"]
    assert memory.engine.history("bob") == []


def test_a_model_argument_with_a_lone_surrogate_is_saved_as_turns_are() -> None:
    """A tool argument decoded from a JSON "\\udfff" escape used to raise UnicodeEncodeError."""
    memory = history_memory()
    model = chat_model(call("save_memory", {"text": "Cara's code is 7\udfff7"}), "saved")
    messages = run(create_agent(model=model, tools=create_memory_tools(memory)), "save", "cara")
    assert [m.status for m in messages if isinstance(m, ToolMessage)] == ["success"]
    assert memories(memory, "cara") == ["Cara's code is 7\ufffd7"]


def test_two_users_in_one_process_are_isolated() -> None:
    memory = history_memory()
    tools = create_memory_tools(memory)
    for user, fact in [("alice", "likes jazz"), ("bob", "likes metal")]:
        agent = create_agent(
            model=chat_model(call("save_memory", {"text": fact}), "ok"), tools=tools
        )
        run(agent, "remember", user)
    for user, fact, other in [("alice", "jazz", "metal"), ("bob", "metal", "jazz")]:
        model = chat_model(call("search_memory", {"query": "music likes", "k": 10}), "ok")
        (reply,) = tool_replies(run(create_agent(model=model, tools=tools), "music?", user))
        assert fact in reply and other not in reply
    # The user may also come from config, or be fixed at construction.
    model = chat_model(call("search_memory", {"query": "likes"}), "ok")
    agent = create_agent(model=model, tools=tools)
    state = agent.invoke({"messages": [HumanMessage("?")]}, {"configurable": {"user_id": "bob"}})
    assert "metal" in tool_replies(state["messages"])[0]
    fixed = create_memory_tools(memory, user_id="alice")
    assert "jazz" in fixed[1].invoke({"query": "likes"})


def test_the_user_is_not_a_tool_argument_and_is_required() -> None:
    memory = history_memory()
    tools = create_memory_tools(memory)
    assert [t.name for t in tools] == [
        "save_memory",
        "search_memory",
        "update_memory",
        "forget_memory",
    ]
    for tool in tools:
        assert "user_id" not in tool.args
    # Without a user the tool answers with an error message and writes nothing ...
    assert "need a user id" in tools[0].invoke({"text": "x"})
    assert memory.engine.users() == []
    with pytest.raises(MissingUserError):
        create_memory_tools(memory, user_id="")


def test_a_run_without_a_user_gets_a_tool_error_not_an_exception() -> None:
    memory = history_memory()
    model = chat_model(call("save_memory", {"text": "Alice is vegetarian"}), "I could not save.")
    agent = create_agent(model=model, tools=create_memory_tools(memory))
    state = agent.invoke({"messages": [HumanMessage("remember I am vegetarian")]})
    (reply,) = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    assert reply.status == "error" and "need a user id" in reply.text
    assert state["messages"][-1].text == "I could not save."
    assert memory.engine.users() == []


def _memochat_that_chooses_none() -> MemoChatMemory:
    """MemoChat whose model writes memos by the rules but answers every memo choice NOTO."""

    def reply(messages: Sequence[ChatMessage]) -> str:
        text = messages[-1].content
        noto = re.search(r"\((\d+)\) NOTO\.", text)
        if "Topic options" in text and noto:
            return noto.group(1)
        return rule_following_reply(messages) or ""

    memory = MemoChatMemory(llm=ScriptedLLM(default=reply), embedder=HashingEmbedder(), max_lines=6)
    memory.save(
        [
            Turn("user", "Next week I meet business partners in Japan. How should I bow?"),
            Turn("assistant", "In Japan a business bow is about fifteen degrees."),
            Turn("user", "Is a gift expected at a Japanese business meeting?"),
            Turn("assistant", "A modest wrapped gift is polite at Japanese business meetings."),
            Turn("user", "Can you factor the polynomial x squared minus five x plus six?"),
            Turn("assistant", "The polynomial factors as (x - 2)(x - 3)."),
        ],
        Scope("ann"),
    )
    memory.engine.flush("ann")
    return memory


def test_search_tool_goes_through_the_mechanisms_recall() -> None:
    memory = _memochat_that_chooses_none()
    query = "business bow in Japan"
    # The engine alone would answer; MemoChat's model chose none of the memos.
    assert memory.engine.search(query, "ann", k=3)
    assert memory.recall(query, Scope("ann")).records == ()
    model = chat_model(call("search_memory", {"query": query}), "Nothing stored.")
    agent = create_agent(model=model, tools=create_memory_tools(memory))
    assert tool_replies(run(agent, "how do I bow?", "ann")) == ["No memories found."]


def test_search_tool_honours_k_and_scores_are_similarities() -> None:
    memory = history_memory()
    tools = create_memory_tools(memory, user_id="alice")
    for fact in ["Alice likes jazz", "Alice likes tea", "Alice likes hiking", "Alice likes chess"]:
        tools[0].invoke({"text": fact})
    model = chat_model(call("search_memory", {"query": "Alice likes jazz", "k": 2}), "ok")
    (reply,) = tool_replies(run(create_agent(model=model, tools=tools), "?", "alice"))
    hits = [json.loads(line) for line in reply.splitlines()]
    assert len(hits) == 2 and hits[0]["text"] == "Alice likes jazz"
    assert all(0.0 <= h["score"] <= 1.0 for h in hits)
    assert hits[0]["score"] >= hits[1]["score"] and "fused_score" in hits[0]


async def test_async_agent_and_custom_events() -> None:
    memory = history_memory()
    events: list[tuple[str, Any]] = []

    class Handler(BaseCallbackHandler):
        def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
            events.append((name, data))

    model = chat_model(call("save_memory", {"text": "Alice flies on Monday"}), "ok")
    agent = create_agent(model=model, tools=create_memory_tools(memory))
    await agent.ainvoke(
        {"messages": [HumanMessage("I fly Monday")]},
        context={"user_id": "alice"},
        config={"callbacks": [Handler()]},
    )
    assert memories(memory, "alice") == ["Alice flies on Monday"]
    assert events and events[0][0] == "memory_saved"
    assert events[0][1]["user_id"] == "alice"


def test_example_agent_remembers_across_two_processes(tmp_path: Any) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root / 'shared'}{os.pathsep}{root}"}
    done = subprocess.run(
        [
            sys.executable,
            str(root / "examples" / "agent_with_memory_tools.py"),
            "--path",
            str(tmp_path / "mem"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    run_2 = done.stdout.split("--- run 2")[1]
    assert "agent: From memory: The user is allergic to shellfish" in run_2
    assert "agent: From memory: The user's daughter is called Inês" in run_2
    assert "weather" not in done.stdout.split("memories:")[1]
