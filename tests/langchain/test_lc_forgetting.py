"""ForgettingCurveRetriever around a real LangChain vector store, inside a chain."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from lc_fakes import chat_model

from langchain_memories import CoreEmbeddings, ForgettingCurveRetriever, MemoryRetriever
from memories_core import FixedClock, MemoryBankMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.memorybank import memorybank_reply

NOW = datetime(2024, 6, 30, tzinfo=timezone.utc)


def _store() -> InMemoryVectorStore:
    store = InMemoryVectorStore(CoreEmbeddings(HashingEmbedder()))
    store.add_documents(
        [
            Document("The user likes green tea.", metadata={"created_at": "2024-06-29"}),
            Document("The user likes green tea a lot.", metadata={"created_at": "2024-01-01"}),
            Document("The user likes green tea, undated."),
        ]
    )
    return store


def test_chain_sees_only_what_is_retained() -> None:
    retriever = ForgettingCurveRetriever(
        base_retriever=_store().as_retriever(search_kwargs={"k": 3}), now=NOW, min_retention=0.05
    )
    seen: list[str] = []

    def context(docs: list[Document]) -> str:
        seen.extend(d.page_content for d in docs)
        return "\n".join(d.page_content for d in docs)

    prompt = ChatPromptTemplate.from_template("Memories:\n{context}\n\nQ: {question}")
    chain = {"context": retriever | context, "question": RunnablePassthrough()} | prompt
    chain = chain | chat_model("Green tea.")
    assert chain.invoke("green tea").content == "Green tea."
    assert sorted(seen) == ["The user likes green tea, undated.", "The user likes green tea."]


def test_documents_carry_retention_and_reweighted_score() -> None:
    retriever = ForgettingCurveRetriever(base_retriever=_store().as_retriever(), now=NOW)
    docs = retriever.invoke("green tea")
    dated = [d for d in docs if "retention" in d.metadata]
    assert dated[0].metadata["retention"] == pytest.approx(math.exp(-1))
    assert all("score" in d.metadata for d in docs)


async def test_async_matches_sync() -> None:
    retriever = ForgettingCurveRetriever(base_retriever=_store().as_retriever(), now=NOW)
    sync = [d.page_content for d in retriever.invoke("green tea")]
    assert [d.page_content for d in await retriever.ainvoke("green tea")] == sync


def test_reinforcement_is_written_back_for_documents_of_our_store() -> None:
    clock = FixedClock(NOW - timedelta(days=1))
    memory = MemoryBankMemory(
        llm=ScriptedLLM(default=memorybank_reply),
        embedder=HashingEmbedder(),
        clock=clock,
        reinforce=False,
    )
    memory.save([Turn("user", "I like green tea", timestamp=clock.now())], Scope("ann"))
    clock.set(NOW)
    retriever = ForgettingCurveRetriever(
        base_retriever=MemoryRetriever(memory=memory, user_id="ann"), memory=memory
    )
    (doc,) = retriever.invoke("green tea")
    assert doc.metadata["retention"] == pytest.approx(math.exp(-1))
    (record,) = memory.engine.get("ann", [doc.metadata["record_id"]])
    assert record.state.strength == 2 and record.state.recall_count == 1


def test_memorybank_retriever_carries_portrait_and_global_summary_in_a_chain() -> None:
    from langchain_memories import MemoryBankRetriever

    clock = FixedClock(NOW - timedelta(days=2))
    memory = MemoryBankMemory(
        llm=ScriptedLLM(default=memorybank_reply), embedder=HashingEmbedder(), clock=clock
    )
    memory.save(
        [Turn("user", "Work stress is high; a walk helps me", timestamp=clock.now())], Scope("gary")
    )
    clock.set(NOW)
    memory.save([Turn("user", "New day, new plans", timestamp=clock.now())], Scope("gary"))
    retriever = MemoryBankRetriever(memory=memory, user_id="gary", k=2)
    seen: list[str] = []
    prompt = ChatPromptTemplate.from_template("{context}\n\nQ: {question}")
    chain = (
        {
            "context": retriever | MemoryBankRetriever.render,
            "question": RunnablePassthrough(),
        }
        | prompt
        | (lambda value: seen.append(value.to_string()) or "ok")
    )
    chain.invoke("how do I relieve stress?")
    docs = retriever.invoke("how do I relieve stress?")
    assert len(docs) == 2  # k memories; the global records are not extra documents
    assert all(d.metadata["global_portrait"] == memory.portrait("gary") for d in docs)
    assert all(d.metadata["global_summary"] == memory.global_summary("gary") for d in docs)
    assert any("walk" in d.page_content for d in docs)
    assert memory.portrait("gary") in seen[0]
    assert str(memory.global_summary("gary")) in seen[0]
    # The same order as the core memory's context: the memories, then the portrait.
    assert seen[0].index(docs[-1].page_content) < seen[0].index(str(memory.portrait("gary")))


def _sister_and_museum(memory: MemoryBankMemory, clock: FixedClock) -> str:
    """Day 0: where the sister lives; day 60: something else. Returns the day-0 turn's id."""
    start = clock.now()
    memory.save([Turn("user", "My sister Ann lives in Lisbon.", timestamp=start)], Scope("gary"))
    clock.set(start + timedelta(days=60))
    memory.save([Turn("user", "I visited a museum.", timestamp=clock.now())], Scope("gary"))
    turns = memory.engine.records("gary", where={"kind": "turn"})
    (turn,) = [r for r in turns if "Lisbon" in r.text]
    return turn.id


def test_memorybank_chain_default_recalls_old_memories_and_scheduled_forgetting_restores() -> None:
    from langchain_memories import MemoryBankRetriever

    def chain_for(memory: MemoryBankMemory, seen: list[list[Document]]) -> Any:
        retriever = MemoryBankRetriever(memory=memory, user_id="gary", k=1)
        prompt = ChatPromptTemplate.from_template("{context}\n\nQ: {question}")

        def keep(docs: list[Document]) -> str:
            seen.append(docs)
            return "\n".join(d.page_content for d in docs)

        context = retriever | keep
        return {"context": context, "question": RunnablePassthrough()} | prompt | chat_model("ok")

    question = "Where does my sister Ann live?"
    # The default (no query-time decay): sixty days on, the best match is still recalled.
    clock = FixedClock(NOW)
    kept = MemoryBankMemory(
        llm=ScriptedLLM(default=memorybank_reply), embedder=HashingEmbedder(), clock=clock
    )
    sister = _sister_and_museum(kept, clock)
    seen: list[list[Document]] = []
    assert chain_for(kept, seen).invoke(question).content == "ok"
    assert [d.metadata.get("record_id") for d in seen[-1]] == [sister]
    # Scheduled forgetting: the day-60 save's consolidation archives the faded memory ...
    clock = FixedClock(NOW)
    bank = MemoryBankMemory(
        llm=ScriptedLLM(default=memorybank_reply),
        embedder=HashingEmbedder(),
        clock=clock,
        archive_below=0.05,
    )
    sister = _sister_and_museum(bank, clock)
    assert sister in {r.id for r in bank.forgotten("gary")}
    chain = chain_for(bank, seen)
    chain.invoke(question)
    assert sister not in {d.metadata.get("record_id") for d in seen[-1]}
    # ... and restoring it brings it back into the chain's context.
    assert bank.restore("gary", [sister]) == 1
    chain.invoke(question)
    assert [d.metadata.get("record_id") for d in seen[-1]] == [sister]
