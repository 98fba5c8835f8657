"""MemoryStore: a LangGraph BaseStore on the engine (graph across threads, isolation, TTL)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, TypedDict

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.config import get_store
from langgraph.graph import END, START, StateGraph
from langgraph.store.base import BaseStore, PutOp

from langchain_memories import MemoryStore
from memories_core import FixedClock, HistoryMemory, InvalidInputError
from memories_core.embedders import HashingEmbedder

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)


def make_store(clock: FixedClock | None = None) -> MemoryStore:
    memory = HistoryMemory(embedder=HashingEmbedder(), path=None, clock=clock or FixedClock(T0))
    return MemoryStore(memory, user_label=0)


class State(TypedDict):
    text: str
    answer: str


def build(store: BaseStore) -> Any:
    """A graph that remembers 'remember: ...' messages and answers questions from the store."""

    def respond(state: State, config: RunnableConfig) -> dict[str, str]:
        user = config["configurable"]["user_id"]
        text = state["text"]
        namespace = (user, "memories")
        store = get_store()
        if text.startswith("remember:"):
            fact = text.removeprefix("remember:").strip()
            store.put(namespace, f"fact-{len(store.search(namespace))}", {"text": fact})
            return {"answer": "ok"}
        hits = store.search(namespace, query=text, limit=1)
        return {"answer": hits[0].value["text"] if hits else "I don't know"}

    builder = StateGraph(State)
    builder.add_node("respond", respond)
    builder.add_edge(START, "respond")
    builder.add_edge("respond", END)
    return builder.compile(store=store, checkpointer=InMemorySaver())


def ask(graph: Any, text: str, user: str, thread: str) -> str:
    config = {"configurable": {"user_id": user, "thread_id": thread}}
    return str(graph.invoke({"text": text, "answer": ""}, config)["answer"])


def test_graph_reads_and_writes_across_two_threads() -> None:
    store = make_store()
    graph = build(store)
    assert ask(graph, "remember: Alice is allergic to peanuts", "alice", "t1") == "ok"
    assert ask(graph, "remember: Alice lives in Lisbon", "alice", "t1") == "ok"
    # Another thread of conversation finds what the first one stored.
    assert ask(graph, "which allergy does she have? peanuts?", "alice", "t2") == (
        "Alice is allergic to peanuts"
    )
    assert ask(graph, "where in Lisbon", "alice", "t2") == "Alice lives in Lisbon"
    # Two users in one process: bob sees nothing of alice.
    assert ask(graph, "peanuts allergy Lisbon", "bob", "t3") == "I don't know"
    assert store.search(("bob",)) == []
    records = store.engine.records("alice", where={"kind": "store"})
    assert len(records) == 2


def test_get_put_delete_and_items() -> None:
    clock = FixedClock(T0)
    store = make_store(clock)
    store.put(("alice", "profile"), "food", {"likes": "thai", "spice": 3})
    item = store.get(("alice", "profile"), "food")
    assert item is not None
    assert item.value == {"likes": "thai", "spice": 3}
    assert item.namespace == ("alice", "profile") and item.key == "food"
    assert item.created_at == T0
    clock.advance(timedelta(minutes=5))
    store.put(("alice", "profile"), "food", {"likes": "sushi", "spice": 1})
    item = store.get(("alice", "profile"), "food")
    assert item is not None and item.value["likes"] == "sushi"
    assert item.created_at == T0 and item.updated_at == T0 + timedelta(minutes=5)
    assert store.get(("bob", "profile"), "food") is None
    store.delete(("alice", "profile"), "food")
    assert store.get(("alice", "profile"), "food") is None
    assert store.engine.records("alice", where={"kind": "store"}) == []
    with pytest.raises(InvalidInputError):
        store.batch([PutOp((), "k", {"a": 1})])


def test_search_filter_offset_limit_and_namespaces() -> None:
    store = make_store()
    for i in range(5):
        store.put(
            ("alice", "notes", "work" if i % 2 else "home"), f"n{i}", {"n": i, "text": f"t{i}"}
        )
    store.put(("bob", "notes", "home"), "b", {"n": 1, "text": "bob"})
    everything = store.search(("alice",))
    assert [i.key for i in everything] == ["n0", "n1", "n2", "n3", "n4"]
    work = store.search(("alice", "notes", "work"))
    assert [i.key for i in work] == ["n1", "n3"]
    assert [i.key for i in store.search(("alice",), filter={"n": {"$gte": 3}})] == ["n3", "n4"]
    assert [i.key for i in store.search(("alice",), filter={"n": 2})] == ["n2"]
    assert [i.key for i in store.search(("alice",), limit=2, offset=1)] == ["n1", "n2"]
    hits = store.search(("alice", "notes"), query="t3", limit=2)
    assert hits[0].key == "n3" and hits[0].score is not None
    assert store.list_namespaces(prefix=("alice",)) == [
        ("alice", "notes", "home"),
        ("alice", "notes", "work"),
    ]
    assert store.list_namespaces(prefix=("alice",), max_depth=2) == [("alice", "notes")]
    assert store.list_namespaces(suffix=("home",)) == [
        ("alice", "notes", "home"),
        ("bob", "notes", "home"),
    ]


def test_ttl_through_record_validity() -> None:
    clock = FixedClock(T0)
    store = make_store(clock)
    store.put(("alice", "tmp"), "otp", {"code": "123"}, ttl=10)
    (record,) = store.engine.records("alice", where={"kind": "store"})
    assert record.state.valid_until == T0 + timedelta(minutes=10)
    clock.advance(timedelta(minutes=8))
    assert store.get(("alice", "tmp"), "otp", refresh_ttl=True) is not None  # extends
    clock.advance(timedelta(minutes=8))
    assert store.get(("alice", "tmp"), "otp") is not None
    clock.advance(timedelta(minutes=11))
    assert store.get(("alice", "tmp"), "otp") is None
    assert store.search(("alice",)) == []


async def test_async_operations() -> None:
    store = make_store()
    await store.aput(("alice", "a"), "k", {"text": "async works"})
    item = await store.aget(("alice", "a"), "k")
    assert item is not None and item.value == {"text": "async works"}
    assert [i.key for i in await store.asearch(("alice",), query="async")] == ["k"]
    assert await store.alist_namespaces() == [("alice", "a")]


def test_langmem_tools_run_on_the_store() -> None:
    langmem = pytest.importorskip("langmem")
    store = make_store()
    manage = langmem.create_manage_memory_tool(namespace=("{langgraph_user_id}", "memories"))
    search = langmem.create_search_memory_tool(namespace=("{langgraph_user_id}", "memories"))
    graph_input: dict[str, Any] = {}

    class S(TypedDict):
        out: str

    def node(state: S, config: RunnableConfig) -> dict[str, str]:
        manage.invoke({"content": "Alice prefers window seats", "action": "create"})
        found = search.invoke({"query": "seats"})
        graph_input["found"] = found
        return {"out": "done"}

    builder = StateGraph(S)
    builder.add_node("node", node)
    builder.add_edge(START, "node")
    graph = builder.compile(store=store)
    graph.invoke({"out": ""}, {"configurable": {"langgraph_user_id": "alice"}})
    assert "window seats" in str(graph_input["found"])
    items = store.search(("alice", "memories"))
    assert len(items) == 1 and "window seats" in str(items[0].value)
    assert store.search(("bob",)) == []
