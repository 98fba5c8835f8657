"""ForgettingCurvePostprocessor inside a real LlamaIndex query engine."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.llms import MockLLM
from llama_index.core.schema import NodeWithScore, TextNode

from llamaindex_memories import CoreEmbedding, ForgettingCurvePostprocessor, MemoryRetriever
from memories_core import FixedClock, MemoryBankMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.memorybank import memorybank_reply

NOW = datetime(2024, 6, 30, tzinfo=timezone.utc)


def _index() -> VectorStoreIndex:
    Settings.llm = MockLLM()
    Settings.embed_model = CoreEmbedding(HashingEmbedder())
    docs = [
        Document(text="The user likes green tea.", metadata={"created_at": "2024-06-29"}),
        Document(
            text="The user likes green tea very much.",
            metadata={"created_at": "2024-01-01", "strength": 1},
        ),
        Document(text="The user likes green tea, no date."),
    ]
    return VectorStoreIndex.from_documents(docs)


def test_query_engine_drops_faded_nodes_of_any_index() -> None:
    forgetting = ForgettingCurvePostprocessor(now=NOW, min_retention=0.05)
    engine = _index().as_query_engine(similarity_top_k=3, node_postprocessors=[forgetting])
    response = engine.query("green tea")
    texts = [n.node.get_content() for n in response.source_nodes]
    # Six months old with S = 1: dropped; no timestamp: kept as it is.
    assert sorted(texts) == ["The user likes green tea, no date.", "The user likes green tea."]
    (fresh,) = [n for n in response.source_nodes if "retention" in n.node.metadata]
    assert fresh.node.metadata["retention"] == pytest.approx(math.exp(-1))
    assert "retention" in fresh.node.excluded_llm_metadata_keys


def test_reweighting_reorders_and_keeps_originals() -> None:
    old = TextNode(text="old", metadata={"timestamp": (NOW - timedelta(days=3)).timestamp()})
    new = TextNode(text="new", metadata={"created_at": NOW.isoformat(), "strength": 2})
    nodes = [NodeWithScore(node=old, score=0.9), NodeWithScore(node=new, score=0.5)]
    out = ForgettingCurvePostprocessor(now=NOW).postprocess_nodes(nodes)
    assert [n.node.get_content() for n in out] == ["new", "old"]
    assert out[1].score == pytest.approx(0.9 * math.exp(-3))
    assert "retention" not in old.metadata  # copies only
    only_drop = ForgettingCurvePostprocessor(now=NOW, reweight=False, min_retention=0.1)
    assert [n.score for n in only_drop.postprocess_nodes(nodes)] == [0.5]


def test_reinforcement_is_written_back_for_nodes_of_our_store() -> None:
    clock = FixedClock(NOW - timedelta(days=2))
    memory = MemoryBankMemory(
        llm=ScriptedLLM(default=memorybank_reply),
        embedder=HashingEmbedder(),
        clock=clock,
        reinforce=False,  # the recall itself does not reinforce here: the postprocessor does
    )
    memory.save([Turn("user", "I like green tea", timestamp=clock.now())], Scope("ann"))
    clock.set(NOW)
    Settings.llm = MockLLM()
    retriever = MemoryRetriever(memory, "ann", similarity_top_k=2)
    nodes = retriever.retrieve("green tea")
    forgetting = ForgettingCurvePostprocessor(memory=memory)
    out = forgetting.postprocess_nodes(nodes)
    assert out[0].node.metadata["retention"] == pytest.approx(math.exp(-2))
    (record,) = memory.engine.get("ann", [nodes[0].node.metadata["record_id"]])
    assert record.state.strength == 2
    assert record.state.last_recalled_at == NOW


def test_memorybank_block_gives_a_chat_engine_memories_portrait_and_summary() -> None:
    from llama_index.core.chat_engine import SimpleChatEngine
    from llama_index.core.memory import Memory

    from llamaindex_memories import MemoryBankBlock

    Settings.llm = MockLLM()
    Settings.embed_model = CoreEmbedding(HashingEmbedder())
    clock = FixedClock(NOW - timedelta(days=2))
    bank = MemoryBankMemory(
        llm=ScriptedLLM(default=memorybank_reply), embedder=HashingEmbedder(), clock=clock
    )
    bank.save(
        [Turn("user", "A walk after lunch relieves my stress", timestamp=clock.now())],
        Scope("gary"),
    )
    clock.set(NOW)
    bank.save([Turn("user", "Today I start a new project", timestamp=clock.now())], Scope("gary"))
    block = MemoryBankBlock(memory=bank, user_id="gary")
    assert block.name == "memory_bank"
    memory = Memory.from_defaults(session_id="d3", memory_blocks=[block])
    seen: list[str] = []

    class Recording(MockLLM):
        def chat(self, messages, **kwargs):  # type: ignore[no-untyped-def,override]
            seen.append("\n".join(str(m.content) for m in messages))
            return super().chat(messages, **kwargs)

    engine = SimpleChatEngine.from_defaults(llm=Recording(), memory=memory)
    engine.chat("How can I relieve stress?")
    assert "walk after lunch" in seen[0]
    assert bank.portrait("gary") in seen[0]


def test_memorybank_block_forgets_on_schedule_and_restores_in_a_chat_engine() -> None:
    from llama_index.core.chat_engine import SimpleChatEngine
    from llama_index.core.memory import Memory

    from llamaindex_memories import MemoryBankBlock

    Settings.llm = MockLLM()
    Settings.embed_model = CoreEmbedding(HashingEmbedder())
    seen: list[str] = []

    class Recording(MockLLM):
        def chat(self, messages, **kwargs):  # type: ignore[no-untyped-def,override]
            seen.append("\n".join(str(m.content) for m in messages))
            return super().chat(messages, **kwargs)

    def ask(bank: MemoryBankMemory, session: str) -> str:
        block = MemoryBankBlock(memory=bank, user_id="gary", k=1)
        memory = Memory.from_defaults(session_id=session, memory_blocks=[block])
        SimpleChatEngine.from_defaults(llm=Recording(), memory=memory).chat(
            "Where does my sister Ann live?"
        )
        return seen[-1]

    def replay(**kwargs: Any) -> MemoryBankMemory:
        clock = FixedClock(NOW)
        bank = MemoryBankMemory(
            llm=ScriptedLLM(default=memorybank_reply),
            embedder=HashingEmbedder(),
            clock=clock,
            **kwargs,
        )
        bank.save([Turn("user", "My sister Ann lives in Lisbon.", timestamp=NOW)], Scope("gary"))
        clock.set(NOW + timedelta(days=60))
        bank.save([Turn("user", "I visited a museum.", timestamp=clock.now())], Scope("gary"))
        return bank

    line = f"[{NOW.day} {NOW:%B %Y, %H:%M}] user: My sister Ann lives in Lisbon."
    assert line in ask(replay(), "default")  # no query-time decay by default
    bank = replay(archive_below=0.05)  # the day-60 consolidation archives it
    assert line not in ask(bank, "archived")
    assert bank.restore("gary") >= 1
    assert line in ask(bank, "restored")
