"""One clock: every recall takes its time from the injected clock, settled once per call.

A ``FixedClock`` set years away from the wall clock makes any stray wall-clock read visible.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.schema import NodeWithScore, TextNode

from langchain_memories import ForgettingCurveRetriever, MemoryBankRetriever
from llamaindex_memories import ForgettingCurvePostprocessor, MemoryBankBlock
from memories_core import FixedClock, HistoryMemory, MemoryBankMemory, Scope, Turn
from memories_core.clock import dated_line, metadata_time, parse_time, resolve_now
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.memorybank import GLOBAL_PORTRAIT
from memories_core.prompts.memorybank import memorybank_reply
from memories_core.retrieval import Pipeline, RecallRequest
from memories_core.retrieval.memory_backend import InMemoryBackend
from memories_core.types import MemoryRecord, ScoredRecord

T = datetime(2031, 5, 4, 12, 0, tzinfo=timezone.utc)  # far from the wall clock


def test_resolve_now_prefers_the_given_time_then_the_clock() -> None:
    clock = FixedClock(T)
    given = datetime(2030, 1, 1)  # naive: taken as UTC
    assert resolve_now(given, clock) == given.replace(tzinfo=timezone.utc)
    assert resolve_now(None, clock) == T
    assert abs(resolve_now().timestamp() - datetime.now(timezone.utc).timestamp()) < 60


def test_times_in_untrusted_metadata_are_parsed_or_ignored() -> None:
    when = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
    for value in (when, when.replace(tzinfo=None), "2023-05-08T13:56:00Z", when.timestamp()):
        assert parse_time(value) == when
    for junk in (None, True, "", "  ", "soon", float("nan"), float("inf"), 1e300, [when]):
        assert parse_time(junk) is None
    # created_at first, then timestamp (also when created_at is present but unusable).
    assert metadata_time({"created_at": "soon", "timestamp": int(when.timestamp())}) == when
    assert metadata_time({"created_at": when, "timestamp": 0}) == when
    assert metadata_time({}) is None
    assert dated_line("hi", when) == "[8 May 2023, 13:56] hi"
    assert dated_line("hi", None) == "hi"


def test_pipeline_takes_now_from_the_backends_clock() -> None:
    seen: list[datetime] = []

    def capture(hits: list[ScoredRecord], now: datetime) -> None:
        seen.append(now)

    backend = InMemoryBackend(HashingEmbedder(), clock=FixedClock(T))
    backend.add([MemoryRecord("r1", "alice", "turn", "I sail on the lake", T)])
    Pipeline(on_recalled=capture).run(RecallRequest("sail", user_id="alice", k=1), backend)
    assert seen == [T]


def test_engine_search_and_hybrid_retriever_use_the_engines_clock() -> None:
    memory = HistoryMemory(embedder=HashingEmbedder(), clock=FixedClock(T))
    memory.save([Turn("user", "I sail on the lake", timestamp=T)], Scope("alice"))
    assert memory.engine.retriever.clock is memory.clock
    assert memory.engine.retriever.search("sail", user_id="alice", k=1)
    seen: list[datetime] = []
    memory.engine.search("sail", "alice", k=1, on_recalled=lambda hits, now: seen.append(now))
    assert seen == [T]


def _bank(clock: FixedClock) -> MemoryBankMemory:
    """A MemoryBank with two days of talk, consolidated: a portrait exists from day 1."""
    memory = MemoryBankMemory(
        llm=ScriptedLLM(default=memorybank_reply), embedder=HashingEmbedder(), clock=clock
    )
    memory.save([Turn("user", "Work stress is high; a walk helps me", timestamp=T)], Scope("gary"))
    clock.set(T + timedelta(days=1))
    memory.save([Turn("user", "New day, new plans", timestamp=clock.now())], Scope("gary"))
    return memory


def _expire_portrait(memory: MemoryBankMemory, at: datetime) -> None:
    (portrait,) = [
        r
        for r in memory.engine.records("gary", where={"kind": GLOBAL_PORTRAIT})
        if not r.state.archived
    ]
    memory.engine.update_state("gary", {portrait.id: {"valid_until": at}}, reason="test")


def test_memorybank_recall_uses_the_clocks_time_through_the_langchain_adapter() -> None:
    clock = FixedClock(T)
    memory = _bank(clock)
    assert memory.portrait("gary")
    _expire_portrait(memory, T + timedelta(days=3))
    retriever = MemoryBankRetriever(memory=memory, user_id="gary", k=2)

    clock.set(T + timedelta(days=2))
    docs = retriever.invoke("how do I relieve stress?")
    assert docs and all("global_portrait" in d.metadata for d in docs)
    recalled = memory.engine.get("gary", [d.metadata["record_id"] for d in docs])
    assert {r.state.last_recalled_at for r in recalled} == {clock.now()}

    clock.set(T + timedelta(days=4))  # the portrait expired at day 3, by the clock
    docs = retriever.invoke("how do I relieve stress?")
    assert docs and not any("global_portrait" in d.metadata for d in docs)
    assert "User portrait" not in memory.recall("stress", Scope("gary")).context
    assert (
        "User portrait" in memory.recall("stress", Scope("gary"), now=T + timedelta(days=2)).context
    )


async def test_memorybank_block_context_uses_the_clocks_time() -> None:
    clock = FixedClock(T)
    memory = _bank(clock)
    _expire_portrait(memory, T + timedelta(days=3))
    block = MemoryBankBlock(memory=memory, user_id="gary")
    question = [ChatMessage(role="user", content="how do I relieve stress?")]
    clock.set(T + timedelta(days=2))
    assert "User portrait" in await block.aget(question)
    clock.set(T + timedelta(days=4))
    assert "User portrait" not in await block.aget(question)


class _Fixed(BaseRetriever):
    documents: list[Document]

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        return list(self.documents)


def test_forgetting_adapters_read_the_memorys_clock() -> None:
    clock = FixedClock(T)
    memory = MemoryBankMemory(
        llm=ScriptedLLM(default=memorybank_reply), embedder=HashingEmbedder(), clock=clock
    )
    day_old = {"created_at": (T - timedelta(days=1)).isoformat(), "score": 1.0}
    lc = ForgettingCurveRetriever(
        base_retriever=_Fixed(documents=[Document("a walk helps", metadata=day_old)]),
        memory=memory,
    )
    (doc,) = lc.invoke("stress")
    li = ForgettingCurvePostprocessor(memory=memory)
    (node,) = li.postprocess_nodes([NodeWithScore(node=TextNode(text="x", metadata=day_old))])
    # One day at strength 1: R = exp(-1) by the memory's clock, not by the wall clock.
    assert doc.metadata["retention"] == node.node.metadata["retention"]
    assert abs(doc.metadata["retention"] - 0.36787944) < 1e-6
