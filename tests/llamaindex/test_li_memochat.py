"""MemoChat in LlamaIndex: the chat engine, the retriever in a query engine, the memory block."""

from __future__ import annotations

import pytest
from li_fakes import RecordingLLM
from llama_index.core.base.llms.types import ChatMessage as LIChatMessage
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockLLM
from llama_index.core.memory import Memory
from llama_index.core.query_engine import RetrieverQueryEngine

from llamaindex_memories import MemoChatEngine, MemoryBlock, memochat_retriever
from memories_core import MemoChatMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.memochat import rule_following_reply

TOPICS = [
    ("user", "Next week I meet business partners in Japan. How should I bow?"),
    ("assistant", "In Japan a business bow is about fifteen degrees."),
    ("user", "Is a gift expected at a Japanese business meeting?"),
    ("assistant", "A modest wrapped gift is polite at Japanese business meetings."),
    ("user", "Can you factor the polynomial x squared minus five x plus six?"),
    ("assistant", "The polynomial factors as (x - 2)(x - 3)."),
]


def _memory() -> MemoChatMemory:
    llm = ScriptedLLM(default=lambda m: rule_following_reply(m) or "")
    memory = MemoChatMemory(llm=llm, embedder=HashingEmbedder(), max_lines=6)
    memory.save([Turn(r, t) for r, t in TOPICS], Scope("ann"))
    return memory


def test_chat_engine_uses_the_memo_and_saves(recording_llm: RecordingLLM) -> None:
    memory = _memory()
    recording_llm.replies = ["It was Japan."]
    engine = MemoChatEngine(memory, llm=recording_llm, user_id="ann")
    reply = engine.chat("The business etiquette we talked about belongs to Korea, right?")
    assert reply.response == "It was Japan."
    prompt = recording_llm.prompts[-1]
    assert "Related evidences:" in prompt and "fifteen degrees" in prompt
    assert memory.turns(Scope("ann"))[-1].content == "It was Japan."
    assert len(engine.chat_history) == 2
    engine.reset()
    assert engine.chat_history == []


async def test_chat_engine_async_and_stream() -> None:
    memory = _memory()
    engine = MemoChatEngine(memory, llm=MockLLM(max_tokens=5), user_id="ann")
    reply = await engine.achat("polynomial roots?")
    assert isinstance(reply.response, str)
    streamed = engine.stream_chat("gift in Japan?")
    assert isinstance(streamed.response, str)


def test_retriever_in_a_query_engine() -> None:
    retriever = memochat_retriever(_memory(), "ann", k=4)
    engine = RetrieverQueryEngine.from_args(retriever, llm=MockLLM())
    response = engine.query("business etiquette in japan")
    assert any("business" in n.node.get_content() for n in response.source_nodes)


def test_memory_block_in_simple_chat_engine(recording_llm: RecordingLLM) -> None:
    block = MemoryBlock(memory=_memory(), user_id="ann")
    memory = Memory.from_defaults(session_id="s2", memory_blocks=[block])
    engine = SimpleChatEngine.from_defaults(llm=recording_llm, memory=memory)
    engine.chat("what about the business gift in japan?")
    assert "gift" in recording_llm.prompts[-1]


def _memoized() -> MemoChatMemory:
    """Every line written into a memo (the session ended), so only memos can be recalled."""
    memory = _memory()
    memory.end_session(Scope("ann"))
    assert memory.buffer(Scope("ann")) == []
    return memory


def test_memory_block_in_memory_brings_only_the_memo_the_model_chose(
    recording_llm: RecordingLLM,
) -> None:
    block = MemoryBlock(memory=_memoized(), user_id="ann", k=5)
    memory = Memory.from_defaults(session_id="s2", memory_blocks=[block])
    engine = SimpleChatEngine.from_defaults(llm=recording_llm, memory=memory)
    engine.chat("how do I factor the polynomial again?")
    prompt = recording_llm.prompts[-1]
    assert "(x - 2)(x - 3)" in prompt and "fifteen degrees" not in prompt


async def test_memory_block_in_memory_adds_nothing_when_the_model_says_noto() -> None:
    block = MemoryBlock(memory=_memoized(), user_id="ann", k=5)
    memory = Memory.from_defaults(session_id="s2", memory_blocks=[block])
    await memory.aput(LIChatMessage(role="user", content="zebras gallop across savannahs"))
    messages = await memory.aget()
    assert [m.content for m in messages] == ["zebras gallop across savannahs"]


def test_chat_engine_keeps_the_users_turn_when_the_model_answers_nothing(
    recording_llm: RecordingLLM,
) -> None:
    memory = _memory()
    before = len(memory.turns(Scope("ann")))
    recording_llm.replies = ["  "]
    engine = MemoChatEngine(memory, llm=recording_llm, user_id="ann")
    engine.chat("Which country was it again?")
    turns = memory.turns(Scope("ann"))
    assert len(turns) == before + 1
    assert turns[-1].content == "Which country was it again?"


def test_chat_engine_keeps_the_users_turn_when_the_model_fails() -> None:
    class DownLLM(RecordingLLM):
        def _next(self, prompt: str) -> str:
            raise ConnectionError("the server is down")

    memory = _memory()
    engine = MemoChatEngine(memory, llm=DownLLM(), user_id="ann")
    with pytest.raises(ConnectionError):
        engine.chat("Which country was it again?")
    assert memory.turns(Scope("ann"))[-1].content == "Which country was it again?"
    assert engine.chat_history == []
