"""LlamaIndex adapters over a memory that derives in the background (the default)."""

from __future__ import annotations

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.memory import Memory

from llamaindex_memories import MemoryBlock, MemoryRetriever
from memories_core import SummaryMemory
from memories_core.embedders import HashingEmbedder
from memories_core.testing import GatedLLM

pytestmark = pytest.mark.background

SUMMARY = "The user said they love spicy Thai food"


def user(text: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.USER, content=text)


async def test_memory_block_session_summary_after_wait() -> None:
    llm = GatedLLM(lambda messages: SUMMARY)
    core = SummaryMemory(llm=llm, embedder=HashingEmbedder())
    try:
        block = MemoryBlock(memory=core, user_id="alice")
        memory = Memory.from_defaults(session_id="s1", memory_blocks=[block], token_limit=30_000)
        await memory.aput_messages([user("I love spicy Thai food")])
        assert await block.aflush(memory) == 1  # ends the session without waiting for the model
        assert llm.entered.wait(10)
        status = block.status()
        assert status is not None and status.running == 1
        assert SUMMARY not in await block.aget([user("what food do I love?")])
        llm.gate.set()
        assert block.wait() == 0
        assert SUMMARY in await block.aget([user("what food do I love?")])
        retriever = MemoryRetriever(core, user_id="alice")
        assert retriever.flush() == 0
        assert SUMMARY in [n.node.get_content() for n in retriever.retrieve("food")]
    finally:
        llm.gate.set()
        core.close()
