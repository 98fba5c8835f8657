"""MemoryBlock inside real LlamaIndex engines: a later session's prompt holds an earlier fact."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from li_fakes import RecordingLLM, message_text
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.chat_engine import CondensePlusContextChatEngine, SimpleChatEngine
from llama_index.core.llms import MockFunctionCallingLLM
from llama_index.core.memory import Memory
from llama_index.core.tools import FunctionTool

from llamaindex_memories import MemoryBlock
from memories_core import HistoryMemory, Scope


def new_memory(history: HistoryMemory, user_id: str, session_id: str) -> tuple[Memory, MemoryBlock]:
    block = MemoryBlock(memory=history, user_id=user_id)
    return Memory.from_defaults(session_id=session_id, memory_blocks=[block]), block


def test_simple_chat_engine_recalls_the_previous_session(
    history: HistoryMemory, recording_llm: RecordingLLM
) -> None:
    for user_id, fact in [("alice", "I love spicy Thai food"), ("bob", "I love pepperoni pizza")]:
        memory, block = new_memory(history, user_id, f"{user_id}-1")
        engine = SimpleChatEngine.from_defaults(llm=recording_llm, memory=memory)
        engine.chat(fact)
        block.flush(memory)

    memory, _ = new_memory(history, "alice", "alice-2")
    engine = SimpleChatEngine.from_defaults(llm=recording_llm, memory=memory)
    engine.chat("What food do I love?")
    prompt = recording_llm.prompts[-1]
    assert "user: I love spicy Thai food" in prompt
    assert "pizza" not in prompt


async def test_simple_chat_engine_async(
    history: HistoryMemory, recording_llm: RecordingLLM
) -> None:
    memory, block = new_memory(history, "alice", "s1")
    engine = SimpleChatEngine.from_defaults(llm=recording_llm, memory=memory)
    await engine.achat("My cat is called Miso")
    await block.aflush(memory)

    memory, _ = new_memory(history, "alice", "s2")
    engine = SimpleChatEngine.from_defaults(llm=recording_llm, memory=memory)
    await engine.achat("What is my cat called?")
    assert "My cat is called Miso" in recording_llm.prompts[-1]
    assert "long_term_memory" not in recording_llm.prompts[0]  # nothing known at first


async def test_condense_plus_context_chat_engine_gets_documents_and_memories(
    history: HistoryMemory, recording_llm: RecordingLLM
) -> None:
    index = VectorStoreIndex.from_documents(
        [Document(text="The office opens at 9am."), Document(text="Parking is on level two.")]
    )
    memory, block = new_memory(history, "alice", "s1")
    await memory.aput_messages(
        [
            ChatMessage(role=MessageRole.USER, content="I always cycle to the office"),
            ChatMessage(role=MessageRole.ASSISTANT, content="Good for you!"),
        ]
    )
    await block.aflush(memory)

    memory, _ = new_memory(history, "alice", "s2")
    engine = CondensePlusContextChatEngine.from_defaults(
        index.as_retriever(similarity_top_k=1), llm=recording_llm, memory=memory
    )
    # The memory block makes a non-empty history, so the engine condenses first.
    recording_llm.replies = ["When does the office open for a cyclist?", "At 9am."]
    response = await engine.achat("When does the office open? I cycle there.")
    assert str(response) == "At 9am."
    prompt = recording_llm.prompts[-1]
    assert "The office opens at 9am." in prompt
    assert "Parking" not in prompt
    assert "user: I always cycle to the office" in prompt


def scripted_agent_llm(seen: list[Sequence[ChatMessage]]) -> MockFunctionCallingLLM:
    """A function-calling fake: first call asks for the weather tool, then answers."""

    def respond(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        seen.append(list(messages))
        if not any(m.role == MessageRole.TOOL for m in messages):
            call = ToolCallBlock(
                tool_call_id="c1", tool_name="weather", tool_kwargs={"city": "Oslo"}
            )
            return ChatMessage(role=MessageRole.ASSISTANT, blocks=[call])
        return ChatMessage(role=MessageRole.ASSISTANT, content="Rainy: cook Thai food at home.")

    return MockFunctionCallingLLM(response_generator=respond)


async def test_function_agent_recalls_the_previous_session(history: HistoryMemory) -> None:
    def weather(city: str) -> str:
        """Return the weather in a city."""
        return f"Rain in {city}"

    memory, block = new_memory(history, "alice", "s1")
    await memory.aput_messages(
        [
            ChatMessage(role=MessageRole.USER, content="I love spicy Thai food"),
            ChatMessage(role=MessageRole.ASSISTANT, content="Noted!"),
        ]
    )
    await block.aflush(memory)

    seen: list[Sequence[ChatMessage]] = []
    agent = FunctionAgent(tools=[FunctionTool.from_defaults(weather)], llm=scripted_agent_llm(seen))
    memory, block = new_memory(history, "alice", "s2")
    result = await agent.run("What food should I have tonight?", memory=memory)

    assert str(result) == "Rainy: cook Thai food at home."
    assert len(seen) == 2
    assert "user: I love spicy Thai food" in message_text(seen[0])
    assert "Rain in Oslo" in message_text(seen[1])
    # user, assistant tool call, tool result, answer: only the user/assistant text is kept.
    assert await block.aflush(memory) == 4
    assert [t.role for t in history.turns(Scope("alice", "s2"))] == ["user", "assistant"]
