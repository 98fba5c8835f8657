"""Bridges: LlamaIndex LLM/embeddings as core models, a core embedder as LlamaIndex embeddings."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from li_fakes import RecordingLLM
from llama_index.core.base.llms.types import ChatResponse
from llama_index.core.llms import MockLLM

from llamaindex_memories import CoreEmbedding, LlamaIndexEmbedder, LlamaIndexLLM
from memories_core import (
    ChatMessage,
    ConfigurationError,
    HistoryMemory,
    LLMError,
    Scope,
    SummaryMemory,
    Turn,
)
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import LLM, Embedder

# ---------------------------------------------------------------- LlamaIndexLLM


class TokenReportingLLM(MockLLM):
    """MockLLM that reports token counts the way llama-index-llms-openai does."""

    def chat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        response = super().chat(messages, **kwargs)
        response.additional_kwargs.update(prompt_tokens=11, completion_tokens=7)
        return response


class FailingLLM(MockLLM):
    def chat(self, messages: Any, **kwargs: Any) -> ChatResponse:
        raise ConnectionError("server down")


def test_llm_meets_the_protocol_and_counts_calls() -> None:
    llm = LlamaIndexLLM(MockLLM())
    assert isinstance(llm, LLM)
    reply = llm.generate([ChatMessage("system", "be brief"), ChatMessage("user", "hello there")])
    assert "hello there" in reply  # MockLLM echoes the prompt
    llm.generate([ChatMessage("user", "again")])
    assert llm.usage.calls == 2
    assert llm.usage.prompt_tokens > 0
    assert llm.name == "llamaindex:unknown"


def test_llm_passes_roles_and_does_not_mutate_messages(recording_llm: RecordingLLM) -> None:
    recording_llm.replies = ["fine"]
    messages = [ChatMessage("system", "be brief"), ChatMessage("user", "how are you?")]
    before = list(messages)
    assert LlamaIndexLLM(recording_llm).generate(messages) == "fine"
    assert messages == before
    assert "system: be brief" in recording_llm.prompts[0]
    assert "user: how are you?" in recording_llm.prompts[0]


def test_llm_applies_stop_and_reported_tokens() -> None:
    llm = LlamaIndexLLM(TokenReportingLLM(max_tokens=None))
    reply = llm.generate([ChatMessage("user", "hello STOP world")], stop=["STOP"])
    assert "STOP" not in reply
    assert (llm.usage.prompt_tokens, llm.usage.completion_tokens) == (11, 7)


def test_llm_wraps_backend_errors() -> None:
    llm = LlamaIndexLLM(FailingLLM(max_tokens=None))
    with pytest.raises(LLMError, match="server down"):
        llm.generate([ChatMessage("user", "hi")])
    assert llm.usage.failures == 1


async def test_llm_async_uses_achat(recording_llm: RecordingLLM) -> None:
    recording_llm.replies = ["async reply"]
    llm = LlamaIndexLLM(recording_llm)
    assert await llm.agenerate([ChatMessage("user", "hi")]) == "async reply"
    assert llm.usage.calls == 1


def test_summary_memory_runs_on_a_llamaindex_llm(recording_llm: RecordingLLM) -> None:
    recording_llm.replies = ["Alice loves spicy Thai food."]
    memory = SummaryMemory(llm=LlamaIndexLLM(recording_llm), embedder=HashingEmbedder())
    memory.save([Turn("user", "I love spicy Thai food")], Scope("alice", "s1"))
    memory.end_session(Scope("alice", "s1"))
    assert "Thai" in memory.recall("food?", Scope("alice")).context
    assert "I love spicy Thai food" in recording_llm.prompts[0]
    memory.close()


# ---------------------------------------------------------------- embeddings


def test_core_embedding_matches_the_core_embedder() -> None:
    core = HashingEmbedder()
    embed_model = CoreEmbedding(core)
    assert embed_model.model_name == "hashing-256"
    assert CoreEmbedding.class_name() == "CoreEmbedding"
    texts = ["I love Thai food", "The train leaves at nine"]
    np.testing.assert_allclose(
        embed_model.get_text_embedding_batch(texts), core.embed_documents(texts), atol=1e-6
    )
    np.testing.assert_allclose(
        embed_model.get_query_embedding("food"), core.embed_query("food"), atol=1e-6
    )
    assert "embedder" not in embed_model.model_dump()


async def test_core_embedding_async() -> None:
    core = HashingEmbedder(dimension=32)
    embed_model = CoreEmbedding(core, embed_batch_size=2)
    vectors = await embed_model.aget_text_embedding_batch(["a b", "c d", "e f"])
    assert np.asarray(vectors).shape == (3, 32)
    query = await embed_model.aget_query_embedding("a b")
    np.testing.assert_allclose(query, vectors[0], atol=1e-6)


def test_llamaindex_embedder_round_trip() -> None:
    core = HashingEmbedder(dimension=64)
    bridged = LlamaIndexEmbedder(CoreEmbedding(core))
    assert isinstance(bridged, Embedder)
    assert bridged.name == "llamaindex:hashing-64"
    assert bridged.dimension == 64  # measured with one probe
    texts = ["I love Thai food", "nothing in common"]
    np.testing.assert_allclose(
        bridged.embed_documents(texts), core.embed_documents(texts), atol=1e-6
    )
    np.testing.assert_allclose(bridged.embed_query("food"), core.embed_query("food"), atol=1e-6)
    assert bridged.usage.items == 3


def test_llamaindex_embedder_given_dimension_skips_the_probe() -> None:
    core = HashingEmbedder(dimension=16)
    bridged = LlamaIndexEmbedder(CoreEmbedding(core), dimension=16)
    assert bridged.dimension == 16
    assert core.usage.calls == 0
    for bad in (0, "16", True, 2.0):  # a string used to fail with a TypeError
        with pytest.raises(ConfigurationError, match="dimension must be a positive int"):
            LlamaIndexEmbedder(CoreEmbedding(core), dimension=bad)  # type: ignore[arg-type]


def test_history_memory_runs_on_a_llamaindex_embedder() -> None:
    memory = HistoryMemory(embedder=LlamaIndexEmbedder(CoreEmbedding(HashingEmbedder())))
    memory.save([Turn("user", "I love Thai food"), Turn("user", "I own a red bike")], Scope("a"))
    recall = memory.recall("what food do I love?", Scope("a"), k=1)
    assert recall.context.endswith("] user: I love Thai food")
    assert recall.context.count("\n") == 0
    memory.close()
