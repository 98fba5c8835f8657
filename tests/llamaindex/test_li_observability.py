"""Recalls and saves are LlamaIndex instrumentation events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.memory import Memory

from llamaindex_memories import (
    MemoryBlock,
    MemoryRecallEvent,
    MemoryRetriever,
    MemorySaveEvent,
    MemoryToolSpec,
)
from memories_core import HistoryMemory, Scope, Turn


class Collector(BaseEventHandler):
    events: list[Any] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "Collector"

    def handle(self, event: Any, **kwargs: Any) -> None:
        if isinstance(event, (MemoryRecallEvent, MemorySaveEvent)):
            self.events.append(event)


@pytest.fixture
def collector() -> Iterator[Collector]:
    root = get_dispatcher()
    handler = Collector(events=[])
    root.add_event_handler(handler)
    yield handler
    root.event_handlers.remove(handler)


async def test_block_save_and_recall_are_events(
    history: HistoryMemory, collector: Collector
) -> None:
    block = MemoryBlock(memory=history, user_id="alice")
    memory = Memory.from_defaults(session_id="s1", memory_blocks=[block])
    await memory.aput_messages(
        [
            ChatMessage(role=MessageRole.USER, content="I love Thai food"),
            ChatMessage(role=MessageRole.ASSISTANT, content="Noted"),
        ]
    )
    await block.aflush(memory)
    await block.aget([ChatMessage(role=MessageRole.USER, content="What food do I like?")])
    kinds = [type(e).__name__ for e in collector.events]
    assert kinds == ["MemorySaveEvent", "MemoryRecallEvent"]
    save, recall = collector.events
    assert save.user_id == "alice" and save.action == "save_turns" and save.count == 2
    assert recall.query == "What food do I like?" and recall.record_ids
    assert "embedder_calls" in recall.usage


def test_retriever_and_tools_dispatch_events(history: HistoryMemory, collector: Collector) -> None:
    spec = MemoryToolSpec(history, user_id="bob")
    spec.save_memory("Bob plays chess")
    history.save([Turn("user", "I play chess on Sundays")], Scope("bob"))
    nodes = MemoryRetriever(history, user_id="bob").retrieve("chess")
    assert nodes
    recall = [e for e in collector.events if isinstance(e, MemoryRecallEvent)]
    save = [e for e in collector.events if isinstance(e, MemorySaveEvent)]
    assert save[0].action == "save" and save[0].record_ids
    assert recall[0].record_ids == [n.node.node_id for n in nodes]
