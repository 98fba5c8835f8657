"""What memory did, in LangChain's own tracing terms (LangSmith and any callback handler).

Recalls through :class:`~langchain_memories.MemoryRetriever` and
:class:`~langchain_memories.MemoryMiddleware` are retriever runs (with the recalled records as
documents); saves, updates and deletions by :class:`~langchain_memories.MemoryMiddleware`, the
memory tools and :class:`~langchain_memories.MemoryStore` are **custom events**
(``on_custom_event``) named ``memory_saved``, ``memory_updated``, ``memory_forgotten``, ...
with the user, the record ids and the LLM usage of the engine so far.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.callbacks.manager import dispatch_custom_event
from langchain_core.runnables.config import (
    ensure_config,
    get_async_callback_manager_for_config,
    get_callback_manager_for_config,
)

from memories_core.types import Recall

__all__ = ["atraced_recall", "emit_memory_event", "traced_recall", "usage_data"]

logger = logging.getLogger(__name__)


def emit_memory_event(name: str, data: dict[str, Any]) -> bool:
    """Dispatch a custom event to the current run's callback handlers.

    Outside of a run (no parent run to attach it to) nothing is sent.

    Returns:
        Whether the event was dispatched.
    """
    try:
        dispatch_custom_event(name, data)
    except RuntimeError:  # not inside a runnable: there is nobody to tell
        logger.debug("memory event %s outside of a run; not dispatched", name)
        return False
    return True


def usage_data(memory: Any) -> dict[str, Any]:
    """The memory's model usage so far (calls and tokens of its LLM and embedder), if known."""
    usage = getattr(memory, "usage", None)
    return {} if usage is None else dict(usage.summary())


def _documents(recall: Recall) -> list[Any]:
    from langchain_memories.retriever import record_to_document

    return [record_to_document(hit) for hit in recall.records]


def traced_recall(name: str, query: str, recall: Callable[[], Recall]) -> Recall:
    """Run ``recall`` as a retriever run of the current run (its documents are the records)."""
    manager = get_callback_manager_for_config(ensure_config())
    run = manager.on_retriever_start({"name": name}, query, name=name)
    try:
        result = recall()
    except BaseException as exc:
        run.on_retriever_error(exc)
        raise
    run.on_retriever_end(_documents(result))
    return result


async def atraced_recall(name: str, query: str, recall: Callable[[], Awaitable[Recall]]) -> Recall:
    """Async twin of :func:`traced_recall`."""
    manager = get_async_callback_manager_for_config(ensure_config())
    run = await manager.on_retriever_start({"name": name}, query, name=name)
    try:
        result = await recall()
    except BaseException as exc:
        await run.on_retriever_error(exc)
        raise
    await run.on_retriever_end(_documents(result))
    return result
