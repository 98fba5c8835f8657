from __future__ import annotations

from datetime import datetime

import pytest
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from lc_fakes import chat_model, history_memory

from langchain_memories import MemoryRetriever
from memories_core import FixedClock, HistoryMemory, Scope, SummaryMemory, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM


@pytest.fixture
def memory() -> HistoryMemory:
    mem = history_memory()
    mem.save(
        [
            Turn("user", "I love spicy Thai food", metadata={"topic": "food"}),
            Turn("assistant", "Noted!"),
        ],
        Scope("alice", session_id="s1"),
    )
    mem.save([Turn("user", "I adopted a cat named Miso")], Scope("alice", session_id="s2"))
    mem.save([Turn("user", "My favourite food is Italian pizza")], Scope("bob"))
    return mem


def format_docs(docs: list[Document]) -> str:
    return "\n".join(doc.page_content for doc in docs)


def test_documents_carry_record_metadata(memory: HistoryMemory) -> None:
    docs = MemoryRetriever(memory=memory, user_id="alice", k=1).invoke("which food do I love?")
    assert len(docs) == 1
    doc = docs[0]
    assert "Thai food" in doc.page_content
    meta = doc.metadata
    assert meta["user_id"] == "alice"
    assert meta["kind"] == "turn"
    assert meta["session_id"] == "s1"
    assert meta["topic"] == "food"  # the turn's own metadata is kept
    assert meta["record_id"] == doc.id
    assert isinstance(meta["score"], float)
    assert isinstance(meta["source_ids"], list)
    assert datetime.fromisoformat(meta["created_at"]).tzinfo is not None


def test_k_default_constructor_and_per_call(memory: HistoryMemory) -> None:
    retriever = MemoryRetriever(memory=memory, user_id="alice")
    assert retriever.k is None
    assert len(retriever.invoke("food cat Thai")) == 3  # mechanism default k=3
    assert len(retriever.invoke("food cat Thai", k=2)) == 2
    assert len(MemoryRetriever(memory=memory, user_id="alice", k=1).invoke("food")) == 1


def test_users_are_isolated(memory: HistoryMemory) -> None:
    docs = MemoryRetriever(memory=memory, user_id="bob", k=5).invoke("which food do I love?")
    assert docs and all(doc.metadata["user_id"] == "bob" for doc in docs)
    assert "Thai" not in format_docs(docs)
    assert MemoryRetriever(memory=memory, user_id="carol").invoke("food") == []


def test_missing_user_is_rejected_at_construction(memory: HistoryMemory) -> None:
    with pytest.raises(ValueError, match="user_id"):
        MemoryRetriever(memory=memory, user_id="  ")


def test_invalid_k_is_rejected(memory: HistoryMemory) -> None:
    with pytest.raises(ValueError, match="k"):
        MemoryRetriever(memory=memory, user_id="alice", k=0)


async def test_ainvoke(memory: HistoryMemory) -> None:
    docs = await MemoryRetriever(memory=memory, user_id="alice").ainvoke("my cat", k=1)
    assert [d.page_content for d in docs] == ["user: I adopted a cat named Miso"]


def test_retriever_in_lcel_chain_sees_only_its_user(memory: HistoryMemory) -> None:
    prompt = ChatPromptTemplate.from_template("Memories:\n{context}\n\nQuestion: {question}")
    for user, own, other in [("alice", "Thai", "pizza"), ("bob", "pizza", "Thai")]:
        model = chat_model("answer")
        retriever = MemoryRetriever(memory=memory, user_id=user, k=2)
        chain = (
            {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | model
        )
        assert chain.invoke("What food do I love?").text == "answer"
        sent = model.prompts[-1][0].text
        assert own in sent
        assert other not in sent


def test_works_over_summary_memory() -> None:
    def summarize(messages: object) -> str:
        return "The user said they love spicy Thai food"

    llm = ScriptedLLM(default=summarize)
    memory = SummaryMemory(
        llm=llm, embedder=HashingEmbedder(), clock=FixedClock(datetime(2026, 1, 5, 9, 0))
    )
    memory.save([Turn("user", "I love spicy Thai food")], Scope("alice", "s1"))
    memory.save([Turn("user", "hello again")], Scope("alice", "s2"))  # closes session s1
    docs = MemoryRetriever(memory=memory, user_id="alice").invoke("what food?")
    assert [d.metadata["kind"] for d in docs] == ["summary"]
    assert docs[0].page_content == "The user said they love spicy Thai food"
    assert len(docs[0].metadata["source_ids"]) == 1
    assert llm.usage.calls == 1


def test_relevance_is_the_cosine_and_the_fused_score_is_kept() -> None:
    mem = history_memory()
    mem.save([Turn("user", "I adopted a cat named Miso")], Scope("carol"))
    (doc,) = MemoryRetriever(memory=mem, user_id="carol").invoke("user: I adopted a cat named Miso")
    meta = doc.metadata
    # A single hit's fused score is 0.0; its relevance is the cosine (1.0 for its own text).
    assert meta["relevance"] == pytest.approx(1.0, abs=1e-4)
    assert meta["fused_score"] == meta["score"]
