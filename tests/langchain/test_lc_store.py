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
from langchain_memories.store import MAPPED_USER_PREFIX, SHARED_USER_ID, StoreNamespaceError
from memories_core import ConfigurationError, FixedClock, HistoryMemory, InvalidInputError
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


def test_langmem_agent_with_its_default_namespace_writes_the_users_memory(tmp_path: Any) -> None:
    """LangMem's tools in a create_agent graph: items land in the user's own memory file."""
    langmem = pytest.importorskip("langmem")
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from lc_fakes import chat_model

    from memories_core.portable import export_user

    store = MemoryStore(HistoryMemory(embedder=HashingEmbedder(), path=None, clock=FixedClock(T0)))
    layout = ("memories", "{langgraph_user_id}")  # the namespace of LangMem's documentation
    tools = [
        langmem.create_manage_memory_tool(namespace=layout),
        langmem.create_search_memory_tool(namespace=layout),
    ]

    def call(name: str, args: dict[str, Any], cid: str) -> AIMessage:
        return AIMessage("", tool_calls=[{"name": name, "args": args, "id": cid}])

    def run(user: str, *replies: AIMessage | str) -> list[str]:
        agent = create_agent(model=chat_model(*replies), tools=tools, store=store)
        state = agent.invoke(
            {"messages": [HumanMessage("hi")]},
            {"configurable": {"langgraph_user_id": user}},
        )
        return [m.text for m in state["messages"] if isinstance(m, ToolMessage)]

    run(
        "alice",
        call("manage_memory", {"content": "Alice prefers window seats", "action": "create"}, "1"),
        "noted",
    )
    run(
        "bob", call("manage_memory", {"content": "Bob likes aisles", "action": "create"}, "1"), "ok"
    )
    found = run("alice", call("search_memory", {"query": "window seats"}, "1"), "done")
    assert "window seats" in found[0] and "aisles" not in found[0]
    # LangMem's namespace is ("memories", user): the user label is the second one.
    assert sorted(store.engine.users()) == ["alice", "bob"]
    (item,) = store.search(("memories", "alice"))
    assert "window seats" in str(item.value)
    archive = export_user(store.engine, "alice", tmp_path / "alice.zip")
    import zipfile

    with zipfile.ZipFile(archive) as zf:
        dumped = "".join(zf.read(n).decode("utf-8", "replace") for n in zf.namelist())
    assert "window seats" in dumped and "aisles" not in dumped
    store.engine.delete_user("alice")
    assert store.search(("memories", "alice")) == []
    assert [i.value for i in store.search(("memories", "bob"))] != []


def test_values_are_stored_as_json() -> None:
    import dataclasses
    import enum
    import uuid as uuid_module

    class Color(enum.Enum):
        RED = "red"

    @dataclasses.dataclass
    class Point:
        x: int

    store = make_store()
    ident = uuid_module.UUID(int=7)
    store.put(
        ("alice", "v"),
        "k",
        {"when": T0, "id": ident, "color": Color.RED, "tags": {"b"}, "p": Point(1), "t": (1, 2)},
    )
    item = store.get(("alice", "v"), "k")
    assert item is not None
    assert item.value == {
        "when": T0.isoformat(),
        "id": str(ident),
        "color": "red",
        "tags": ["b"],
        "p": {"x": 1},
        "t": [1, 2],
    }
    with pytest.raises(InvalidInputError):
        store.put(("alice", "v"), "bad", {"blob": object()})
    with pytest.raises(InvalidInputError):
        store.batch(
            [PutOp(("alice", "v"), "ok", {"a": 1}), PutOp(("alice", "v"), "x", {"b": b"1"})]
        )
    # Validation comes before any write: the good op of the failed batch was not applied.
    assert store.get(("alice", "v"), "ok") is None


def test_filters_raise_only_where_langgraph_does() -> None:
    store = make_store()
    store.put(("alice", "f"), "a", {"n": 1, "s": "abc"})
    store.put(("alice", "f"), "b", {"m": 2})
    # A missing field never matches an order operator (no error).
    assert [i.key for i in store.search(("alice",), filter={"n": {"$gte": 1}})] == ["a"]
    with pytest.raises(InvalidInputError):
        store.search(("alice",), filter={"s": {"$gt": 1}})  # text that is not a number
    with pytest.raises(InvalidInputError):
        store.search(("alice",), filter={"n": {"$in": [1]}})


def test_user_label_position_and_shared_namespaces() -> None:
    store = MemoryStore(HistoryMemory(embedder=HashingEmbedder(), path=None, clock=FixedClock(T0)))
    store.put(("users", "alice", "prefs"), "k", {"v": 1})
    store.put(("docs",), "k", {"v": 2})
    assert store.engine.users() == sorted(["alice", SHARED_USER_ID])
    assert store.list_namespaces() == [("docs",), ("users", "alice", "prefs")]
    assert [i.value for i in store.search(("docs",))] == [{"v": 2}]
    with pytest.raises(ConfigurationError):
        MemoryStore(store.engine, user_label=-1)


@pytest.mark.parametrize(
    "label", [" ", "__emg_store__", "x" * 1025, "~lg~alice", "~lg~" + "0" * 64]
)
def test_every_user_label_langgraph_accepts_is_a_user_of_its_own(label: str) -> None:
    store = MemoryStore(HistoryMemory(embedder=HashingEmbedder(), path=None, clock=FixedClock(T0)))
    store.put(("users", label, "prefs"), "k", {"text": "green tea"})
    store.put(("users", "alice", "prefs"), "k", {"text": "black coffee"})
    owner = store.user_id_of(("users", label))
    assert owner.startswith(MAPPED_USER_PREFIX) and owner != label and owner != "alice"
    assert store.get(("users", label, "prefs"), "k").value == {"text": "green tea"}
    assert [i.value for i in store.search(("users", label))] == [{"text": "green tea"}]
    assert [i.value for i in store.search(("users", "alice"))] == [{"text": "black coffee"}]
    assert ("users", label, "prefs") in store.list_namespaces()
    # The mapped id is the user in the engine: export and erasure reach exactly these items.
    assert sorted(store.engine.users()) == sorted(["alice", owner])
    store.engine.delete_user(owner)
    assert store.get(("users", label, "prefs"), "k") is None
    assert store.get(("users", "alice", "prefs"), "k") is not None
    assert store.user_id_of(("users", "alice")) == "alice"
    with pytest.raises(StoreNamespaceError):  # as PostgresStore: not storable text
        store.put(("users", "bad\ud800half"), "k", {"v": 1})


def test_a_lone_surrogate_in_a_key_or_a_value_refuses_the_batch() -> None:
    store = MemoryStore(HistoryMemory(embedder=HashingEmbedder(), path=None, clock=FixedClock(T0)))
    ns = ("users", "alice", "prefs")
    bad = [
        PutOp(ns, "k\ud800", {"text": "tea"}),
        PutOp(ns, "k", {"text": "tea \udfff"}),
        PutOp(ns, "k", {"te\ud800xt": "tea"}),
        PutOp(ns, "k", {"nested": [{"deep": "\ud800"}]}),
    ]
    for op in bad:
        with pytest.raises(InvalidInputError, match="lone surrogate"):
            store.batch([PutOp(ns, "first", {"text": "kept?"}), op])
    assert store.search(("users", "alice")) == []  # each batch was refused whole
    store.put(ns, "k", {"text": "tea \ufffd"})  # the replacement character is fine
    assert store.get(ns, "k").value == {"text": "tea \ufffd"}
    store.close()


def test_index_configuration_arguments() -> None:
    store = MemoryStore(index={"embed": "hashing:32", "fields": ["text"]}, clock=FixedClock(T0))
    assert store.index_config["dims"] == 32 and store.index_config["fields"] == ["text"]
    store.put(("memories", "alice"), "a", {"text": "tea with lemon"})
    assert store.search(("memories", "alice"), query="lemon tea")[0].key == "a"
    store.close()

    calls: list[int] = []

    def embed(texts: list[str]) -> list[list[float]]:
        calls.append(len(texts))
        return [[float(len(t)), 1.0, 0.0] for t in texts]

    by_function = MemoryStore(index={"embed": embed, "dims": 3})
    by_function.put(("memories", "alice"), "a", {"text": "x"})
    assert calls and by_function.index_config["dims"] == 3
    by_function.close()
    with pytest.raises(ConfigurationError):
        MemoryStore(index={"embed": embed, "dims": 4})  # dims unlike the vectors
    with pytest.raises(ConfigurationError):
        MemoryStore(make_store().engine, index={"embed": "hashing"})  # memory brings its own
    with pytest.raises(ConfigurationError):
        MemoryStore(index={"embed": "hashing", "field": ["text"]})  # unknown setting


@pytest.mark.slow  # loads the bundled MiniLM
def test_index_embed_minilm_resolves_offline_to_the_bundled_model() -> None:
    store = MemoryStore(index={"embed": "minilm", "fields": ["text"]}, clock=FixedClock(T0))
    assert store.index_config["dims"] == 384
    assert store.engine.embedder.name == "sentence-transformers:all-MiniLM-L6-v2"
    store.put(("memories", "alice"), "pet", {"text": "my cat sleeps on the sofa all day"})
    store.put(("memories", "alice"), "stocks", {"text": "quarterly earnings beat forecasts"})
    hits = store.search(("memories", "alice"), query="which animal does she own?", limit=2)
    assert hits[0].key == "pet" and hits[0].score is not None and 0.0 <= hits[0].score <= 1.0
    store.close()


def test_sweep_ttl_deletes_expired_items_and_their_keys() -> None:
    clock = FixedClock(T0)
    store = MemoryStore(
        index={"embed": "hashing", "fields": ["a", "b"]},
        ttl_config={"default_ttl": 5, "sweep_interval_minutes": 1},
        clock=clock,
    )
    _sweep_and_check(store, clock)


@pytest.mark.postgres
def test_sweep_ttl_on_postgres(postgres_dsn: str, pg_schema: str) -> None:
    from memories_core.backends import postgres_storage
    from memories_core.engine import MemoryEngine

    clock = FixedClock(T0)
    parts = postgres_storage(postgres_dsn, dimension=64, schema=pg_schema, pool_size=2)
    engine = MemoryEngine(**parts, embedder=HashingEmbedder(64), clock=clock)
    store = MemoryStore(
        engine,
        index={"fields": ["a", "b"]},
        ttl_config={"default_ttl": 5, "sweep_interval_minutes": 1},
    )
    _sweep_and_check(store, clock)
    engine.close()


def _sweep_and_check(store: MemoryStore, clock: FixedClock) -> None:
    store.put(("memories", "alice"), "tmp", {"a": "first field", "b": "second field"})
    store.put(("memories", "alice"), "keep", {"a": "stays"}, ttl=None)
    clock.advance(timedelta(minutes=6))
    assert store.sweep_ttl() == 1
    left = store.engine.records("alice")
    assert [r.metadata.get("store.key") for r in left] == ["keep"]  # no orphan search keys
    future = store.start_ttl_sweeper()
    assert store.stop_ttl_sweeper(timeout=5) and future.result(timeout=5) is None
    store.close()


def test_items_of_the_previous_layout_stay_readable() -> None:
    """Items written when the namespace's first label was the user (store.ns = the rest)."""
    import dataclasses
    import json as json_module

    store = make_store()
    namespace = ("alice", "profile")
    store.put(namespace, "food", {"likes": "thai"})
    (record,) = store.engine.records("alice", where={"kind": "store"})
    meta = {k: v for k, v in record.metadata.items() if k != "store.namespace"}
    meta["store.ns"] = json_module.dumps(["profile"])
    store.engine.add_records([dataclasses.replace(record, metadata=meta)])
    item = store.get(namespace, "food")
    assert item is not None and item.namespace == namespace
    assert store.list_namespaces() == [namespace]
