"""Recalls and saves appear in LangChain callbacks: a retriever run and custom events."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.messages import HumanMessage
from lc_fakes import chat_model, history_memory

from langchain_memories import MemoryMiddleware, MemoryRetriever
from memories_core import Scope, Turn


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.retrievals: list[tuple[str, list[Document]]] = []
        self._queries: dict[UUID, str] = {}

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.events.append((name, data))

    def on_retriever_start(
        self, serialized: Any, query: str, *, run_id: UUID, **kwargs: Any
    ) -> None:
        self._queries[run_id] = query

    def on_retriever_end(self, documents: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self.retrievals.append((self._queries[run_id], list(documents)))


def test_a_recall_is_a_retriever_run_with_its_documents() -> None:
    memory = history_memory()
    memory.save([Turn("user", "I love Thai food")], Scope("alice"))
    recorder = Recorder()
    retriever = MemoryRetriever(memory=memory, user_id="alice", k=1)
    docs = retriever.invoke("food", config={"callbacks": [recorder]})
    assert recorder.retrievals == [("food", docs)]
    assert "Thai" in docs[0].page_content


def test_a_middleware_save_is_a_custom_event() -> None:
    memory = history_memory()
    recorder = Recorder()
    agent = create_agent(
        model=chat_model("Noted."), tools=[], middleware=[MemoryMiddleware(memory)]
    )
    agent.invoke(
        {"messages": [HumanMessage("I love Thai food")]},
        context={"user_id": "alice"},
        config={"callbacks": [recorder]},
    )
    # The recall before the model call is a retriever run too (nothing to find yet).
    assert recorder.retrievals == [("I love Thai food", [])]
    (event,) = [e for e in recorder.events if e[0] == "memory_saved"]
    assert event[1]["user_id"] == "alice" and event[1]["turns"] == 2
    assert event[1]["source"] == "MemoryMiddleware"
    assert "embedder_calls" in event[1]


async def test_a_middleware_recall_is_a_retriever_run_async() -> None:
    memory = history_memory()
    memory.save([Turn("user", "I love Thai food")], Scope("alice"))
    recorder = Recorder()
    agent = create_agent(model=chat_model("Thai."), tools=[], middleware=[MemoryMiddleware(memory)])
    await agent.ainvoke(
        {"messages": [HumanMessage("What food do I like?")]},
        context={"user_id": "alice"},
        config={"callbacks": [recorder]},
    )
    ((query, docs),) = recorder.retrievals
    assert query == "What food do I like?"
    assert docs and "Thai" in docs[0].page_content
    assert [e[0] for e in recorder.events] == ["memory_saved"]
