"""DPeM in LlamaIndex: a memory block flush counts one round per exchange, like LangChain."""

from __future__ import annotations

import pytest
from li_fakes import RecordingLLM
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.memory import Memory

from llamaindex_memories import MemoryBlock
from memories_core import DualProcessMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.dpem import dpem_reply


def _memory(batch: int = 1, **options: object) -> DualProcessMemory:
    return DualProcessMemory(
        llm=ScriptedLLM(default=dpem_reply, batch_capacity=batch),
        embedder=HashingEmbedder(),
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("batch", [1, 4], ids=["one-by-one", "batched"])
def test_a_block_flush_of_three_exchanges_promotes_like_three_saves(
    recording_llm: RecordingLLM, batch: int
) -> None:
    flushed, saved = _memory(batch, theta=3), _memory(theta=3)
    block = MemoryBlock(memory=flushed, user_id="ann")
    chat_memory = Memory.from_defaults(session_id="s1", memory_blocks=[block])
    recording_llm.default = "Noted."
    engine = SimpleChatEngine.from_defaults(llm=recording_llm, memory=chat_memory)
    for _ in range(3):
        engine.chat("I have type 2 diabetes.")
    assert flushed.rounds("ann") == 0
    block.flush(chat_memory)  # one save of six turns
    for _ in range(3):
        saved.save(
            [Turn("user", "I have type 2 diabetes."), Turn("assistant", "Noted.")], Scope("ann")
        )
    assert flushed.rounds("ann") == saved.rounds("ann") == 3
    assert [i.text for i in flushed.ltm("ann")] == [i.text for i in saved.ltm("ann")]
    assert "The user said: I have type 2 diabetes." in [i.text for i in flushed.ltm("ann")]
    coordinator = flushed.llm
    assert isinstance(coordinator, ScriptedLLM)
    # Batched: the flush's three rounds are asked each step together.
    assert coordinator.batches == ([3, 3, 3] if batch > 1 else [])


async def test_the_block_adds_no_stm_item_below_the_cut() -> None:
    memory = _memory(theta=9, stm_cut=0.4)
    memory.save([Turn("user", "My feet tingle at night."), Turn("assistant", "Ok.")], Scope("ann"))
    block = MemoryBlock(memory=memory, user_id="ann")
    from llama_index.core.base.llms.types import ChatMessage

    chat_memory = Memory.from_defaults(session_id="s2", memory_blocks=[block])
    await chat_memory.aput(ChatMessage(role="user", content="zebra stripes"))
    assert [m.content for m in await chat_memory.aget()] == ["zebra stripes"]
    await chat_memory.aput(ChatMessage(role="user", content="my feet tingle at nite"))
    assert "feet tingle at night" in str(await chat_memory.aget())
