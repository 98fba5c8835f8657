"""MemoryChatMessageHistory inside a real ``RunnableWithMessageHistory`` chain."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import (
    AIMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import ConfigurableFieldSpec, RunnablePassthrough
from langchain_core.runnables.history import RunnableWithMessageHistory
from lc_fakes import RecordingChatModel, chat_model, history_memory

from langchain_memories import MemoryChatMessageHistory, MemoryRetriever
from memories_core import (
    ConditionalMemory,
    ConfigurationError,
    InvalidInputError,
    MissingUserError,
    Scope,
)
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.rule_following import rule_following_reply

PROMPT = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("human", "{question}")])


def with_history(memory: Any, model: RecordingChatModel) -> Any:
    """The usual LCEL chat chain, its history per user and conversation in ``memory``."""
    return RunnableWithMessageHistory(
        PROMPT | model | StrOutputParser(),
        lambda user_id, session_id: MemoryChatMessageHistory(memory, user_id, session_id),
        input_messages_key="question",
        history_messages_key="history",
        history_factory_config=[
            ConfigurableFieldSpec(id="user_id", annotation=str),
            ConfigurableFieldSpec(id="session_id", annotation=str),
        ],
    )


def ask(chain: Any, question: str, user_id: str, session_id: str) -> str:
    config = {"configurable": {"user_id": user_id, "session_id": session_id}}
    return str(chain.invoke({"question": question}, config=config))


def test_the_chain_sees_its_session_and_the_memory_stores_each_exchange() -> None:
    memory = history_memory()
    model = chat_model("Noted, no meat.", "You are vegetarian.")
    chain = with_history(memory, model)
    ask(chain, "I am vegetarian", "alice", "s1")
    assert ask(chain, "What do I eat?", "alice", "s1") == "You are vegetarian."
    sent = model.prompts[-1]
    assert [m.text for m in sent] == [
        "I am vegetarian",
        "Noted, no meat.",
        "What do I eat?",
    ]
    assert [type(m) for m in sent[:2]] == [HumanMessage, AIMessage]
    stored = memory.turns(Scope("alice", session_id="s1"))
    assert [(t.role, t.content) for t in stored] == [
        ("user", "I am vegetarian"),
        ("assistant", "Noted, no meat."),
        ("user", "What do I eat?"),
        ("assistant", "You are vegetarian."),
    ]


def test_sessions_and_users_are_kept_apart_and_recall_crosses_sessions() -> None:
    memory = history_memory()
    model = chat_model("Noted.")
    chain = with_history(memory, model)
    ask(chain, "My sister lives in Lisbon", "alice", "s1")
    ask(chain, "Hello", "alice", "s2")
    assert [m.text for m in model.prompts[-1]] == ["Hello"]  # a new conversation
    ask(chain, "Hi there", "bob", "s1")
    assert [m.text for m in model.prompts[-1]] == ["Hi there"]  # bob's s1 is his own
    # Long-term: a retriever in the chain finds alice's s1 fact from another session.
    retriever = MemoryRetriever(memory=memory, user_id="alice", k=2)
    assert "Lisbon" in retriever.invoke("where does my sister live?")[0].page_content
    bobs = MemoryRetriever(memory=memory, user_id="bob", k=2).invoke("Lisbon")
    assert all("Lisbon" not in d.page_content for d in bobs)


async def test_async_chain_and_the_async_history() -> None:
    memory = history_memory()
    chain = with_history(memory, chat_model("Noted.", "Blue."))
    config = {"configurable": {"user_id": "ann", "session_id": "s1"}}
    await chain.ainvoke({"question": "My favourite colour is blue"}, config=config)
    assert await chain.ainvoke({"question": "Which colour?"}, config=config) == "Blue."
    history = MemoryChatMessageHistory(memory, "ann", "s1")
    assert [m.text for m in await history.aget_messages()][-1] == "Blue."
    await history.aclear()
    assert await history.aget_messages() == []


def test_the_mechanism_derives_from_what_the_history_saves() -> None:
    """A conditional memory writes its record for the turn worth remembering (Yuan et al.)."""
    memory = ConditionalMemory(
        llm=ScriptedLLM(default=rule_following_reply), embedder=HashingEmbedder(), path=None
    )
    chain = with_history(memory, chat_model("OK: APPLE"))
    ask(chain, "No, capitalize means every letter in upper case, like APPLE.", "ann", "s1")
    assert memory.flush("ann", timeout=30) == 0
    (record,) = memory.records(Scope("ann"))
    assert "upper case" in record.text
    memory.close()


def test_messages_without_text_are_skipped_and_a_long_text_reads_back_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import memories_core.types as types

    monkeypatch.setattr(types, "MAX_TURN_CHARS", 50)
    memory = history_memory()
    history = MemoryChatMessageHistory(memory, "ann", "s1")
    long = " ".join(f"word{n}" for n in range(40))
    history.add_messages(
        [
            SystemMessage("Be brief."),
            HumanMessage(long),
            AIMessage("", tool_calls=[{"name": "f", "args": {}, "id": "c1"}]),
            ToolMessage("42", tool_call_id="c1"),
            AIMessage("Done."),
            ChatMessage(role="user", content="Thanks"),
            ChatMessage(role="critic", content="not a speaker of the conversation"),
        ]
    )
    assert len(memory.turns(Scope("ann", session_id="s1"))) > 4  # the long text in parts
    assert [(m.type, m.text) for m in history.messages] == [
        ("system", "Be brief."),
        ("human", long),
        ("ai", "Done."),
        ("human", "Thanks"),
    ]
    assert [
        m.text for m in MemoryChatMessageHistory(memory, "ann", "s1", max_messages=1).messages
    ] == ["Thanks"]


def test_clear_deletes_one_sessions_turns_and_keeps_the_rest() -> None:
    memory = history_memory()
    chain = with_history(memory, chat_model("a", "b"))
    ask(chain, "first session", "ann", "s1")
    ask(chain, "second session", "ann", "s2")
    MemoryChatMessageHistory(memory, "ann", "s1").clear()
    assert memory.turns(Scope("ann", session_id="s1")) == []
    assert [t.content for t in memory.turns(Scope("ann"))] == ["second session", "b"]
    deleted = memory.engine.history("ann")
    assert {h.reason for h in deleted} == {"chat history cleared"}


def test_bad_arguments_are_typed_errors() -> None:
    memory = history_memory()
    with pytest.raises(MissingUserError):
        MemoryChatMessageHistory(memory, "", "s1")
    with pytest.raises(InvalidInputError):
        MemoryChatMessageHistory(memory, "ann", "")
    with pytest.raises(ConfigurationError, match="max_messages"):
        MemoryChatMessageHistory(memory, "ann", "s1", max_messages=0)
    with pytest.raises(ConfigurationError, match="keeps no turns"):
        MemoryChatMessageHistory(RunnablePassthrough(), "ann", "s1")
