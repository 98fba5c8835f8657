from __future__ import annotations

import numpy as np
import pytest
from langchain_core.embeddings import DeterministicFakeEmbedding, Embeddings
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage
from langchain_core.vectorstores import InMemoryVectorStore
from lc_fakes import chat_model

from langchain_memories import CoreEmbeddings, LangChainEmbedder, LangChainLLM
from memories_core import ChatMessage, HistoryMemory, LLMError, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import LLM, Embedder

PROMPT = [
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "Hi"),
    ChatMessage("assistant", "Hello"),
    ChatMessage("narrator", "Later..."),
]


def test_llm_bridge_converts_roles_and_counts_calls() -> None:
    model = chat_model("first", "second")
    llm = LangChainLLM(model)
    assert isinstance(llm, LLM)
    assert llm.name == "langchain:RecordingChatModel"
    assert llm.generate(PROMPT) == "first"
    assert [m.type for m in model.prompts[0]] == ["system", "human", "ai", "chat"]
    assert model.prompts[0][3].role == "narrator"  # type: ignore[attr-defined]
    assert llm.generate([ChatMessage("user", "again")], stop=["ond"]) == "sec"
    assert llm.usage.calls == 2
    assert llm.usage.completion_tokens > 0  # estimated: the fake reports no usage


def test_llm_bridge_uses_usage_metadata() -> None:
    reply = AIMessage(
        "hi", usage_metadata={"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}
    )
    llm = LangChainLLM(chat_model(reply))
    llm.generate([ChatMessage("user", "hello")])
    assert (llm.usage.prompt_tokens, llm.usage.completion_tokens) == (11, 7)


async def test_llm_bridge_async_and_fake_list_model() -> None:
    llm = LangChainLLM(FakeListChatModel(responses=["a", "b"]))
    assert await llm.agenerate([ChatMessage("user", "x")]) == "a"
    assert llm.generate([ChatMessage("user", "y")]) == "b"
    assert llm.usage.calls == 2


def test_llm_bridge_wraps_failures() -> None:
    llm = LangChainLLM(chat_model())  # the script is endless, so break the model instead
    llm.chat_model = FakeListChatModel(responses=[])  # next() on an empty list raises
    with pytest.raises(LLMError):
        llm.generate([ChatMessage("user", "x")])
    assert llm.usage.failures == 1


class AsymmetricEmbeddings(Embeddings):
    """Documents and queries land on different axes, to show which method is used."""

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [[3.0, 0.0, 0.0] for _ in texts]

    def embed_query(self, text: str) -> list[float]:
        return [0.0, 4.0, 0.0]


def test_embedder_bridge_routes_queries_and_normalises() -> None:
    embedder = LangChainEmbedder(AsymmetricEmbeddings())
    assert isinstance(embedder, Embedder)
    assert embedder.name == "langchain:AsymmetricEmbeddings"
    assert embedder.dimension == 3  # probed once
    docs = embedder.embed_documents(["a", "b"])
    assert docs.dtype == np.float32
    np.testing.assert_allclose(docs, [[1, 0, 0], [1, 0, 0]])
    np.testing.assert_allclose(embedder.embed_query("q"), [0, 1, 0])
    assert (embedder.usage.calls, embedder.usage.items) == (2, 3)


def test_embedder_bridge_runs_a_memory() -> None:
    embedder = LangChainEmbedder(DeterministicFakeEmbedding(size=32), name="fake-32")
    assert embedder.dimension == 32
    memory = HistoryMemory(embedder=embedder, path=None)
    memory.save([Turn("user", "I love Thai food")], Scope("alice"))
    recall = memory.recall("I love Thai food", Scope("alice"), k=1)
    assert recall.records[0].record.text == "user: I love Thai food"


def test_core_embeddings_in_langchain_vector_store() -> None:
    embeddings = CoreEmbeddings(HashingEmbedder())
    store = InMemoryVectorStore(embeddings)
    store.add_texts(["I love spicy Thai food", "The train leaves at nine"])
    hits = store.similarity_search("which food do I love?", k=1)
    assert hits[0].page_content == "I love spicy Thai food"
    vector = embeddings.embed_query("hello")
    assert len(vector) == 256 and all(isinstance(x, float) for x in vector)


def test_embedder_bridge_rejects_a_wrong_query_length() -> None:
    embedder = LangChainEmbedder(AsymmetricEmbeddings(), dimension=4)
    with pytest.raises(RuntimeError, match="shape"):
        embedder.embed_query("q")
    assert embedder.usage.failures == 1
