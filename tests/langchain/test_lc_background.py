"""LangChain adapters over a memory that derives in the background (the default)."""

from __future__ import annotations

import pytest
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from lc_fakes import chat_model

from langchain_memories import LegacyChainMemory, MemoryRetriever
from memories_core import Scope, SummaryMemory, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.testing import GatedLLM

pytestmark = pytest.mark.background

SUMMARY = "The user said they love spicy Thai food"


def format_docs(docs: list) -> str:  # type: ignore[type-arg]
    return "\n".join(d.page_content for d in docs)


def test_retriever_in_an_lcel_chain_sees_derived_memory_after_flush() -> None:
    llm = GatedLLM(lambda messages: SUMMARY)
    memory = SummaryMemory(llm=llm, embedder=HashingEmbedder())
    try:
        memory.save([Turn("user", "I love spicy Thai food")], Scope("alice", "s1"))
        memory.save([Turn("user", "hello again")], Scope("alice", "s2"))  # ends session s1
        retriever = MemoryRetriever(memory=memory, user_id="alice", k=3)
        assert llm.entered.wait(10)  # the summary is being written, off the caller's path
        status = retriever.status()
        assert status is not None and status.running == 1
        assert "summary" not in [d.metadata["kind"] for d in retriever.invoke("what food?")]
        llm.gate.set()
        assert retriever.flush() == 0
        prompt = ChatPromptTemplate.from_template("Memories:\n{context}\n\nQuestion: {question}")
        model = chat_model("answer")
        chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt
        assert (chain | model).invoke("What food do I love?").text == "answer"
        assert SUMMARY in model.prompts[-1][0].text
    finally:
        llm.gate.set()
        memory.close()


def test_legacy_memory_flush_and_status() -> None:
    llm = GatedLLM(lambda messages: SUMMARY, open=True)
    memory = SummaryMemory(llm=llm, embedder=HashingEmbedder())
    try:
        legacy = LegacyChainMemory(memory=memory, user_id="bob")
        legacy.save_context({"input": "I love spicy Thai food"}, {"output": "Noted!"})
        memory.end_session(Scope("bob"))
        assert legacy.flush() == 0
        status = legacy.status()
        assert status is not None and status.idle
        variables = legacy.load_memory_variables({"input": "what food do I love?"})
        assert SUMMARY in str(variables)
    finally:
        memory.close()
