from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from lc_fakes import RecordingChatModel, chat_model, history_memory

from langchain_memories import MemoryMiddleware
from memories_core import ConfigurationError, HistoryMemory, MissingUserError, Scope
from memories_core.errors import BackendError

FACT = "My favourite food is spicy Thai curry"


@tool
def get_weather(city: str) -> str:
    """Return the weather of a city."""
    return f"It is sunny in {city}."


def ask(text: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(text)]}


def make_agent(model: RecordingChatModel, middleware: MemoryMiddleware, **kwargs: Any) -> Any:
    return create_agent(model=model, tools=[get_weather], middleware=[middleware], **kwargs)


def all_text(messages: list[Any]) -> str:
    return "\n".join(m.text for m in messages)


def test_second_run_sees_first_run_fact_in_model_request_only() -> None:
    memory = history_memory()
    model = chat_model("Noted, Thai curry it is.", "You like Thai curry.")
    agent = make_agent(model, MemoryMiddleware(memory, user_id="alice"), system_prompt="Be brief.")

    agent.invoke(ask(FACT))
    state = agent.invoke(ask("What food do I like?"))

    system = model.last_system_text
    assert system.startswith("Be brief.")  # the agent's own prompt is kept, memories follow
    assert "Thai curry" in system
    # The injected memories live in the model request only, never in the agent state.
    assert [type(m) for m in state["messages"]] == [HumanMessage, AIMessage]
    assert "Thai curry" not in state["messages"][0].text
    # Both turns of the first run were saved, the question and answer of the second as well.
    texts = [t.content for t in memory.turns(Scope("alice"))]
    assert texts == [
        FACT,
        "Noted, Thai curry it is.",
        "What food do I like?",
        "You like Thai curry.",
    ]


def test_users_are_isolated_with_user_from_context() -> None:
    @dataclass
    class Ctx:
        user_id: str

    memory = history_memory()
    model = chat_model()
    agent: Any = create_agent(
        model=model, tools=[], middleware=[MemoryMiddleware(memory)], context_schema=Ctx
    )
    agent.invoke(ask(FACT), context=Ctx(user_id="alice"))
    agent.invoke(ask("What food do I like?"), context=Ctx(user_id="bob"))
    assert "Thai" not in all_text(model.prompts[-1])
    agent.invoke(ask("What food do I like?"), context=Ctx(user_id="alice"))
    assert "Thai curry" in model.last_system_text
    assert [t.content for t in memory.turns(Scope("bob"))] == ["What food do I like?", "ok"]


def test_user_and_session_from_config() -> None:
    memory = history_memory()
    agent = make_agent(chat_model(), MemoryMiddleware(memory))
    config = {"configurable": {"user_id": "carol", "session_id": "morning"}}
    agent.invoke(ask(FACT), config=config)
    records = memory.recall("Thai curry", Scope("carol")).records
    assert records and {r.record.session_id for r in records} == {"morning"}


def test_session_falls_back_to_thread_id() -> None:
    memory = history_memory()
    agent = make_agent(chat_model(), MemoryMiddleware(memory, user_id="dan"))
    agent.invoke(ask(FACT), config={"configurable": {"thread_id": "t-1"}})
    assert memory.recall("Thai curry", Scope("dan")).records[0].record.session_id == "t-1"


def test_missing_user_raises_clear_error() -> None:
    agent = make_agent(chat_model(), MemoryMiddleware(history_memory()))
    with pytest.raises(MissingUserError, match="user_id"):
        agent.invoke(ask(FACT))


def test_invalid_construction() -> None:
    with pytest.raises(MissingUserError):
        MemoryMiddleware(history_memory(), user_id="")
    with pytest.raises(ConfigurationError):
        MemoryMiddleware(history_memory(), user_id="a", template="no placeholder")


def test_tool_loop_recalls_once_per_model_call_and_saves_final_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memory = history_memory()
    calls: list[str] = []
    recall = memory.recall

    def counting_recall(query: str, scope: Scope, **kwargs: Any) -> Any:
        calls.append(query)
        return recall(query, scope, **kwargs)

    monkeypatch.setattr(memory, "recall", counting_recall)
    tool_call = AIMessage(
        "Let me check.", tool_calls=[{"name": "get_weather", "args": {"city": "Oslo"}, "id": "c1"}]
    )
    model = chat_model(tool_call, "Sunny in Oslo.")
    agent = make_agent(model, MemoryMiddleware(memory, user_id="eve", k=2))
    state = agent.invoke(ask("Weather in Oslo?"))

    assert len(model.prompts) == 2
    assert calls == ["Weather in Oslo?", "Weather in Oslo?"]
    assert isinstance(state["messages"][2], ToolMessage)
    texts = [t.content for t in memory.turns(Scope("eve"))]
    assert texts == ["Weather in Oslo?", "Sunny in Oslo."]


def test_custom_template() -> None:
    memory = history_memory()
    memory_mw = MemoryMiddleware(memory, user_id="fay", template="<memories>{context}</memories>")
    model = chat_model()
    agent = make_agent(model, memory_mw)
    agent.invoke(ask(FACT))
    agent.invoke(ask("Which food?"))
    text = model.last_system_text
    assert text.startswith("<memories>[") and text.endswith("</memories>")
    assert "] user: My favourite food" in text.splitlines()[0]


def test_nothing_recalled_leaves_request_unchanged() -> None:
    model = chat_model()
    agent = make_agent(model, MemoryMiddleware(history_memory(), user_id="gus"))
    agent.invoke(ask("Hello there"))
    assert [m.type for m in model.prompts[0]] == ["human"]


async def test_async_ainvoke() -> None:
    memory: HistoryMemory = history_memory()
    model = chat_model("Noted.", "Thai curry.")
    agent = make_agent(model, MemoryMiddleware(memory, user_id="alice"))
    await agent.ainvoke(ask(FACT))
    state = await agent.ainvoke(ask("What food do I like?"))
    assert "Thai curry" in model.last_system_text
    assert len(state["messages"]) == 2
    assert len(memory.turns(Scope("alice"))) == 4


def test_content_block_system_prompt_is_extended_not_replaced() -> None:
    memory = history_memory()
    model = chat_model()
    system = SystemMessage(content=[{"type": "text", "text": "Be brief."}])
    agent = make_agent(model, MemoryMiddleware(memory, user_id="hal"), system_prompt=system)
    agent.invoke(ask(FACT))
    agent.invoke(ask("Which food?"))
    sent = model.prompts[-1][0]
    assert isinstance(sent.content, list) and sent.content[0] == {
        "type": "text",
        "text": "Be brief.",
    }
    assert "Thai curry" in sent.text
    assert system.content == [{"type": "text", "text": "Be brief."}]  # the caller's is unchanged


def test_an_empty_answer_does_not_lose_the_users_turn() -> None:
    """A model that answers nothing: the run succeeds and the question is kept."""
    memory = history_memory()
    agent = make_agent(chat_model("   "), MemoryMiddleware(memory, user_id="alice"))
    agent.invoke(ask(FACT))
    assert [t.content for t in memory.turns(Scope("alice"))] == [FACT]


def test_a_message_over_the_turn_limit_is_kept_whole_in_parts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refusing it after the model answered would fail the user's run: it is kept in parts."""
    import memories_core.types

    monkeypatch.setattr(memories_core.types, "MAX_TURN_CHARS", 200)
    memory = history_memory()
    long = " ".join(f"word{n}" for n in range(100))  # 589 characters
    agent = make_agent(chat_model("Noted."), MemoryMiddleware(memory, user_id="alice"))
    agent.invoke(ask(long))
    turns = memory.turns(Scope("alice"))
    parts = [t for t in turns if t.role == "user"]
    assert "".join(t.content for t in parts) == long
    assert all(len(t.content) <= 200 for t in parts)
    assert len(parts) >= 3
    assert [(t.metadata["part"], t.metadata["parts"]) for t in parts] == [
        (n, len(parts)) for n in range(1, len(parts) + 1)
    ]
    assert turns[-1].content == "Noted."


class FlakyModel(RecordingChatModel):
    """A recording model whose first ``failures`` calls fail (a server that is down)."""

    failures: int = 1

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("the model server is down")
        return super()._generate(*args, **kwargs)


def flaky(failures: int, *replies: str) -> FlakyModel:
    return FlakyModel(messages=iter([*replies, *["ok"] * 10]), failures=failures)


def test_a_failed_model_call_does_not_lose_the_users_message() -> None:
    memory = history_memory()
    agent = make_agent(flaky(5), MemoryMiddleware(memory, user_id="alice"))
    with pytest.raises(ConnectionError):
        agent.invoke(ask(FACT))
    assert [t.content for t in memory.turns(Scope("alice"))] == [FACT]


async def test_a_failed_async_model_call_does_not_lose_the_users_message() -> None:
    memory = history_memory()
    agent = make_agent(flaky(5), MemoryMiddleware(memory, user_id="alice"))
    with pytest.raises(ConnectionError):
        await agent.ainvoke(ask(FACT))
    assert [t.content for t in memory.turns(Scope("alice"))] == [FACT]


def test_a_retry_around_the_memory_saves_the_message_once_and_then_the_answer() -> None:
    """A retry middleware outside this one calls it again after the failure."""
    from langchain.agents.middleware import ModelRetryMiddleware

    memory = history_memory()
    middleware = MemoryMiddleware(memory, user_id="alice")
    calls: list[int] = []
    original = middleware.wrap_model_call

    def counted(request: Any, handler: Any) -> Any:
        calls.append(1)
        return original(request, handler)

    middleware.wrap_model_call = counted  # type: ignore[method-assign]
    retry = ModelRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False)
    agent = create_agent(model=flaky(2, "Noted."), tools=[], middleware=[retry, middleware])
    agent.invoke(ask(FACT))
    assert len(calls) == 3  # two failures, then the answer
    assert [t.content for t in memory.turns(Scope("alice"))] == [FACT, "Noted."]


def test_a_failing_save_after_a_failed_model_call_raises_the_models_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    memory = history_memory()

    def failing_save(*args: Any, **kwargs: Any) -> None:
        raise BackendError("the disk is full")

    memory.save = failing_save  # type: ignore[method-assign]
    agent = make_agent(flaky(5), MemoryMiddleware(memory, user_id="alice"))
    with pytest.raises(ConnectionError):
        agent.invoke(ask(FACT))
    assert "could not keep the message of a failed run" in caplog.text


def test_the_same_text_sent_again_after_a_failed_run_is_not_stored_twice() -> None:
    """The user's next run sends the message again (a new message): only the answer is added."""
    memory = history_memory()
    agent = make_agent(flaky(1, "Noted."), MemoryMiddleware(memory, user_id="alice"))
    with pytest.raises(ConnectionError):
        agent.invoke(ask(FACT))
    agent.invoke(ask(FACT))
    assert [t.content for t in memory.turns(Scope("alice"))] == [FACT, "Noted."]
    # The mark is used once: the same text in a later run is a new exchange.
    agent.invoke(ask(FACT))
    assert [t.content for t in memory.turns(Scope("alice"))] == [FACT, "Noted.", FACT, "ok"]


async def test_another_message_after_a_failed_run_keeps_both_messages() -> None:
    memory = history_memory()
    agent = make_agent(flaky(1, "Noted."), MemoryMiddleware(memory, user_id="alice"))
    with pytest.raises(ConnectionError):
        await agent.ainvoke(ask(FACT))
    await agent.ainvoke(ask("Never mind, what is the weather?"))
    contents = [t.content for t in memory.turns(Scope("alice"))]
    assert contents == [FACT, "Never mind, what is the weather?", "Noted."]


def test_a_message_kept_for_one_user_does_not_match_another_users_run() -> None:
    memory = history_memory()
    agent = make_agent(flaky(1, "Noted.", "Sure."), MemoryMiddleware(memory))
    with pytest.raises(ConnectionError):
        agent.invoke(ask(FACT), context={"user_id": "alice"})
    agent.invoke(ask(FACT), context={"user_id": "bob"})
    assert [t.content for t in memory.turns(Scope("bob"))] == [FACT, "Noted."]
    agent.invoke(ask(FACT), context={"user_id": "alice"})
    assert [t.content for t in memory.turns(Scope("alice"))] == [FACT, "Sure."]
