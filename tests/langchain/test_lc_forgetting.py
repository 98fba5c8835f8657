"""ForgettingCurveRetriever around a real LangChain vector store, inside a chain."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

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
