"""MemoryBlock: recall on aget, save on aput, flush at session end, inside LlamaIndex's Memory."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.memory import Memory
from llama_index.core.storage.chat_store.sql import MessageStatus

from llamaindex_memories import MemoryBlock
from llamaindex_memories.memory_block import messages_to_turns
from memories_core import HistoryMemory, Scope, SummaryMemory, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import Mechanism
from memories_core.llms import ScriptedLLM


def user(text: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.USER, content=text)


def assistant(text: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.ASSISTANT, content=text)


@pytest.fixture
def block(history: HistoryMemory) -> MemoryBlock:
    return MemoryBlock(memory=history, user_id="alice")


async def test_aget_recalls_with_the_latest_user_message(
    history: HistoryMemory, block: MemoryBlock
) -> None:
    history.save([Turn("user", "I love spicy Thai food")], Scope("alice"))
    history.save([Turn("user", "My sister lives in Lisbon")], Scope("alice"))
    messages = [user("my sister visits soon"), assistant("Nice!"), user("what food do I love?")]
    context = await block.aget(messages)
    assert context.splitlines()[0].endswith("] user: I love spicy Thai food")


@pytest.mark.parametrize(
    "messages",
    [None, [], [ChatMessage(role=MessageRole.SYSTEM, content="be nice")], [user("   ")]],
)
async def test_aget_without_a_user_message_is_empty(
    history: HistoryMemory, block: MemoryBlock, messages: list[ChatMessage] | None
) -> None:
    history.save([Turn("user", "I love Thai food")], Scope("alice"))
    assert await block.aget(messages) == ""


async def test_aget_with_nothing_stored_is_empty(block: MemoryBlock) -> None:
    assert await block.aget([user("what food do I love?")]) == ""


async def test_aget_accepts_block_kwargs(history: HistoryMemory, block: MemoryBlock) -> None:
    history.save([Turn("user", "I love Thai food")], Scope("alice"))
    context = await block.aget([user("food?")], session_id="s2", initial_token_count=12)
    assert "Thai" in context


async def test_aget_respects_k_and_user_isolation(history: HistoryMemory) -> None:
    history.save([Turn("user", f"I love food number {i}") for i in range(5)], Scope("alice"))
    history.save([Turn("user", "I love Italian food")], Scope("bob"))
    block = MemoryBlock(memory=history, user_id="alice", k=2)
    context = await block.aget([user("which food do I love?")])
    assert len(context.splitlines()) == 2
    assert "Italian" not in context


async def test_aput_saves_user_and_assistant_text_only(
    history: HistoryMemory, block: MemoryBlock
) -> None:
    messages = [
        ChatMessage(role=MessageRole.SYSTEM, content="You are helpful."),
        user("I love Thai food"),
        ChatMessage(role=MessageRole.ASSISTANT, blocks=[ToolCallBlock(tool_name="lookup")]),
        ChatMessage(role=MessageRole.TOOL, content="lookup result"),
        user("  "),
        assistant("Noted!"),
    ]
    snapshot = [m.model_dump() for m in messages]
    await block.aput(messages)
    turns = history.turns(Scope("alice"))
    assert [(t.role, t.content) for t in turns] == [
        ("user", "I love Thai food"),
        ("assistant", "Noted!"),
    ]
    assert [m.model_dump() for m in messages] == snapshot  # inputs untouched


async def test_aput_uses_memory_session_unless_block_has_one(history: HistoryMemory) -> None:
    await MemoryBlock(memory=history, user_id="alice").aput([user("first")], session_id="s1")
    fixed = MemoryBlock(memory=history, user_id="alice", session_id="fixed")
    await fixed.aput([user("second")], session_id="s2")
    assert [t.content for t in history.turns(Scope("alice", "s1"))] == ["first"]
    assert [t.content for t in history.turns(Scope("alice", "fixed"))] == ["second"]
    assert history.turns(Scope("alice", "s2")) == []


async def test_asave_messages_counts_saved_turns(
    history: HistoryMemory, block: MemoryBlock
) -> None:
    saved = await block.asave_messages([user("hi"), assistant(""), assistant("hello")])
    assert saved == 2
    assert await block.asave_messages([]) == 0


async def test_memory_flushes_into_the_block_past_its_token_limit(history: HistoryMemory) -> None:
    block = MemoryBlock(memory=history, user_id="alice")
    memory = Memory.from_defaults(
        session_id="s1", memory_blocks=[block], token_limit=40, token_flush_size=10
    )
    for i in range(6):
        await memory.aput(user(f"fact number {i} about my garden and tomatoes"))
        await memory.aput(assistant(f"noted fact {i}"))
    stored = history.turns(Scope("alice", "s1"))
    assert stored, "Memory flushed nothing into the block"
    assert stored[0].content == "fact number 0 about my garden and tomatoes"


async def test_aflush_saves_short_term_messages_once(history: HistoryMemory) -> None:
    block = MemoryBlock(memory=history, user_id="alice")
    memory = Memory.from_defaults(session_id="s1", memory_blocks=[block], token_limit=30_000)
    await memory.aput_messages([user("I love Thai food"), assistant("Noted!")])
    assert await block.aflush(memory) == 2
    assert await block.aflush(memory) == 0
    assert await memory.aget_all(status=MessageStatus.ACTIVE) == []
    assert [t.content for t in history.turns(Scope("alice", "s1"))] == [
        "I love Thai food",
        "Noted!",
    ]


def test_flush_sync(history: HistoryMemory) -> None:
    block = MemoryBlock(memory=history, user_id="alice")
    memory = Memory.from_defaults(session_id="s1", memory_blocks=[block])
    memory.put(user("I love Thai food"))
    assert block.flush(memory) == 1
    assert len(history.turns(Scope("alice"))) == 1


async def test_aflush_feeds_every_block_of_the_memory(history: HistoryMemory) -> None:
    ours = MemoryBlock(memory=history, user_id="alice")
    other = MemoryBlock(name="shared", memory=history, user_id="team")
    memory = Memory.from_defaults(session_id="s1", memory_blocks=[ours, other])
    await memory.aput_messages([user("I love Thai food")])
    assert await ours.aflush(memory) == 1
    assert len(history.turns(Scope("alice"))) == 1
    assert len(history.turns(Scope("team"))) == 1


async def test_aflush_needs_the_block_in_the_memory(history: HistoryMemory) -> None:
    memory = Memory.from_defaults(session_id="s1")
    with pytest.raises(ValueError, match="memory_blocks"):
        await MemoryBlock(memory=history, user_id="alice").aflush(memory)


async def test_works_over_summary_memory() -> None:
    llm = ScriptedLLM(["Alice said she loves spicy Thai food."])
    summary = SummaryMemory(llm=llm, embedder=HashingEmbedder())
    block = MemoryBlock(memory=summary, user_id="alice")
    memory = Memory.from_defaults(session_id="s1", memory_blocks=[block])
    await memory.aput_messages([user("I love spicy Thai food"), assistant("Noted!")])
    await block.aflush(memory)  # ends the session: the summary is written now
    context = await block.aget([user("what food do I love?")])
    assert "Thai" in context
    assert llm.usage.calls == 1
    summary.close()


class SessionEndingHistory(HistoryMemory):
    """HistoryMemory that records the scopes whose session ended."""

    def __init__(self) -> None:
        super().__init__(embedder=HashingEmbedder())
        self.ended: list[Scope] = []

    def end_session(self, scope: Scope) -> None:
        self.ended.append(scope)


async def test_aflush_ends_the_session_of_every_block() -> None:
    mechanism = SessionEndingHistory()
    ours = MemoryBlock(memory=mechanism, user_id="alice")
    fixed = MemoryBlock(name="team", memory=mechanism, user_id="team", session_id="fixed")
    memory = Memory.from_defaults(session_id="s1", memory_blocks=[ours, fixed])
    await memory.aput_messages([user("I love Thai food")])
    assert await ours.aflush(memory) == 1
    assert mechanism.ended == [Scope("alice", "s1"), Scope("team", "fixed")]
    assert await ours.aflush(memory) == 0  # nothing left, but the session still ends
    assert len(mechanism.ended) == 4
    mechanism.close()


@pytest.mark.parametrize("user_id", ["", "   "])
def test_user_id_is_required(history: HistoryMemory, user_id: str) -> None:
    with pytest.raises(ValueError, match="user_id"):
        MemoryBlock(memory=history, user_id=user_id)


def test_rejects_a_non_mechanism_and_bad_k(history: HistoryMemory) -> None:
    with pytest.raises(ValueError):
        MemoryBlock(memory=object(), user_id="alice")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        MemoryBlock(memory=history, user_id="alice", k=0)


def test_is_a_mechanism_block_that_serialises_without_the_memory(
    history: HistoryMemory, block: MemoryBlock
) -> None:
    assert isinstance(history, Mechanism)
    assert MemoryBlock.class_name() == "MemoryBlock"
    dumped = block.model_dump()
    assert "memory" not in dumped
    assert dumped["user_id"] == "alice"
    assert dumped["name"] == "long_term_memory"


@given(
    st.lists(
        st.tuples(st.sampled_from(list(MessageRole)), st.text(max_size=20)),
        max_size=8,
    )
)
def test_messages_to_turns_keeps_user_and_assistant_text_in_order(
    pairs: list[tuple[MessageRole, str]],
) -> None:
    messages = [ChatMessage(role=role, content=text) for role, text in pairs]
    snapshot = [m.model_dump() for m in messages]
    turns = messages_to_turns(messages)
    kept = [
        text
        for role, text in pairs
        if role in {MessageRole.USER, MessageRole.ASSISTANT, MessageRole.CHATBOT, MessageRole.MODEL}
        and text.strip()
    ]
    assert [t.content for t in turns] == kept
    assert {t.role for t in turns} <= {"user", "assistant"}
    assert [m.model_dump() for m in messages] == snapshot


async def test_a_block_over_the_token_budget_is_truncated_not_dropped(
    history: HistoryMemory,
) -> None:
    facts = [f"Alice fact number {i} is about her garden and the roses there" for i in range(8)]
    for fact in facts:
        history.save([Turn("user", fact)], Scope("alice"))
    block = MemoryBlock(memory=history, user_id="alice", k=8, priority=1)
    full = await block.aget([user("Alice garden roses fact")])
    assert len(full.splitlines()) == 8
    # Room for the question and part of the recalled context only.
    memory = Memory.from_defaults(session_id="s", token_limit=120, memory_blocks=[block])
    await memory.aput(user("Alice garden roses fact"))
    messages = await memory.aget()
    system = next(m.content for m in messages if m.role == MessageRole.SYSTEM)
    assert system is not None
    kept = [line for line in full.splitlines() if line in system]
    assert kept and kept == full.splitlines()[: len(kept)] and len(kept) < 8
    # The hook itself: whole lines from the end, None when nothing fits.
    shorter = await block.atruncate(full, 30)
    assert shorter is not None and full.startswith(shorter) and len(shorter) < len(full)
    assert await block.atruncate(full, 10_000) is None
    assert await block.atruncate(full, 0) == full
