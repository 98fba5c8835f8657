"""What memory did, as LlamaIndex instrumentation events (Phoenix, Arize, any event handler).

:class:`MemoryRecallEvent` is dispatched for every recall of
:class:`~llamaindex_memories.MemoryBlock` and :class:`~llamaindex_memories.MemoryRetriever`
(query, record ids, scores); :class:`MemorySaveEvent` for every save (turns saved by the block,
memories saved, updated or forgotten by :class:`~llamaindex_memories.MemoryToolSpec`). Both
carry the memory's model usage so far, so a trace shows what memory did and what it cost.
They are sent through ``llama_index.core.instrumentation`` (the root dispatcher's handlers
receive them, inside the active span).
"""

from __future__ import annotations

from typing import Any

from llama_index.core.bridge.pydantic import Field
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events.base import BaseEvent

from memories_core.types import Recall

__all__ = ["MemoryRecallEvent", "MemorySaveEvent", "dispatcher", "recall_event", "save_event"]

dispatcher = get_dispatcher(__name__)


def _usage(memory: Any) -> dict[str, Any]:
    usage = getattr(memory, "usage", None)
    return {} if usage is None else dict(usage.summary())


class MemoryRecallEvent(BaseEvent):
    """A recall: whose memories, for which query, which records came back."""

    user_id: str = Field(description="Whose memories were searched.")
    query: str = Field(description="The query.")
    record_ids: list[str] = Field(default_factory=list, description="Recalled record ids.")
    scores: list[float] = Field(default_factory=list, description="Their scores, best first.")
    usage: dict[str, Any] = Field(default_factory=dict, description="Model usage so far.")

    @classmethod
    def class_name(cls) -> str:
        """Name of the event class."""
        return "MemoryRecallEvent"


class MemorySaveEvent(BaseEvent):
    """A write: turns saved, or a memory saved / updated / forgotten by a tool."""

    user_id: str = Field(description="Whose memory was written.")
    action: str = Field(description="'save_turns', 'save', 'update' or 'forget'.")
    record_ids: list[str] = Field(default_factory=list, description="Records written.")
    count: int = Field(default=0, description="Turns or records written.")
    usage: dict[str, Any] = Field(default_factory=dict, description="Model usage so far.")

    @classmethod
    def class_name(cls) -> str:
        """Name of the event class."""
        return "MemorySaveEvent"


def recall_event(memory: Any, user_id: str, query: str, recall: Recall) -> None:
    """Dispatch a :class:`MemoryRecallEvent` for ``recall``."""
    dispatcher.event(
        MemoryRecallEvent(
            user_id=user_id,
            query=query,
            record_ids=[hit.record.id for hit in recall.records],
            scores=[hit.score for hit in recall.records],
            usage=_usage(memory),
        )
    )


def save_event(
    memory: Any, user_id: str, action: str, *, record_ids: list[str] | None = None, count: int = 0
) -> None:
    """Dispatch a :class:`MemorySaveEvent`."""
    ids = list(record_ids or [])
    dispatcher.event(
        MemorySaveEvent(
            user_id=user_id,
            action=action,
            record_ids=ids,
            count=count or len(ids),
            usage=_usage(memory),
        )
    )
