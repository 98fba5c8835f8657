"""Late interaction as ``HistoryMemory``'s default, and its rule for long queries.

The rest of the suite runs with ``LLM_MEMORIES_LATE_INTERACTION=off`` (conftest.py); these
tests set the variable themselves.
"""

from __future__ import annotations

import numpy as np
import pytest

from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.errors import ConfigurationError
from memories_core.retrieval import Pipeline, RecallRequest
from memories_core.retrieval import late_interaction as late
from memories_core.retrieval.cross_encoder import CrossEncoderModelMissing
from memories_core.retrieval.late_interaction import (
    DEFAULT_LATE_DEPTH,
    LATE_DEFAULT_ENV,
    LateInteractionReranker,
    OnnxLateInteractionEncoder,
    default_turn_pipeline,
    late_interaction_pipeline,
    shared_late_reranker,
)
from reranker_scenarios import CAT_QUESTION, CAT_TURNS, FakeEncoder, needs_bundled

DIALOGUE = (
    "Ana: we spent the whole weekend at the lake with the kids and the dog. "
    "Bo: that sounds lovely, was the water warm enough to swim? "
    "Ana: only on Sunday. Bo: what did the kids like best?"
)


class Windowed(FakeEncoder):
    """A fake encoder whose query window holds eight words."""

    def query_fits(self, text: str) -> bool:
        return len(text.split()) <= 8


@pytest.fixture
def fake_default(monkeypatch: pytest.MonkeyPatch) -> Windowed:
    """The default reranker of this process, built over a fake encoder."""
    encoder = Windowed()
    monkeypatch.setenv(LATE_DEFAULT_ENV, "auto")
    monkeypatch.setattr(late, "late_interaction_installed", lambda: True)
    shared = LateInteractionReranker(encoder, pool=50, depth=DEFAULT_LATE_DEPTH)
    monkeypatch.setattr(late, "_SHARED", shared)
    return encoder


def cat_memory() -> HistoryMemory:
    memory = HistoryMemory(embedder=HashingEmbedder())
    for text in CAT_TURNS:
        memory.save([Turn("user", text)], Scope("ana"))
    memory.flush()
    return memory


def test_history_memory_without_a_pipeline_gets_late_interaction(fake_default: Windowed) -> None:
    memory = cat_memory()
    pipeline = memory.pipeline
    assert pipeline is not None and pipeline.rerankers[-1] is shared_late_reranker()
    request = RecallRequest(CAT_QUESTION, user_id="ana", k=3)
    assert pipeline.candidate_depth(3, request) == DEFAULT_LATE_DEPTH  # deep enough for the pool
    assert len(fake_default.documents) == len(CAT_TURNS)  # encoded by the save jobs
    hits = memory.recall(CAT_QUESTION, Scope("ana"), k=2).records
    assert fake_default.queries == [CAT_QUESTION] and len(hits) == 2  # reranked by it
    other = HistoryMemory(embedder=HashingEmbedder())  # one reranker for the process
    assert other.pipeline is not None and other.pipeline.rerankers[-1] is pipeline.rerankers[-1]
    # An explicit pipeline is kept as given.
    plain = HistoryMemory(embedder=HashingEmbedder(), pipeline=Pipeline())
    assert plain.pipeline == Pipeline()
    for m in (memory, other, plain):
        m.close()


def test_the_switch_turns_it_off_and_a_missing_extra_falls_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(LATE_DEFAULT_ENV, "off")
    assert default_turn_pipeline() is None
    assert HistoryMemory(embedder=HashingEmbedder()).pipeline is None
    monkeypatch.setenv(LATE_DEFAULT_ENV, "sometimes")
    with pytest.raises(ConfigurationError, match=LATE_DEFAULT_ENV):
        HistoryMemory(embedder=HashingEmbedder())
    # Without the model: "auto" keeps the first stage alone, "on" names the extra.
    monkeypatch.setattr("memories_core.retrieval.cross_encoder.BUNDLED_PACKAGE", "no_such_wheel")
    monkeypatch.setattr(late, "_SHARED", None)
    assert not late.late_interaction_installed()
    monkeypatch.setenv(LATE_DEFAULT_ENV, "auto")
    memory = HistoryMemory(embedder=HashingEmbedder())
    assert memory.pipeline is None
    memory.save([Turn("user", "I like tea")], Scope("ana"))
    assert memory.recall("tea", Scope("ana")).records[0].record.text == "user: I like tea"
    monkeypatch.setenv(LATE_DEFAULT_ENV, "on")
    with pytest.raises(CrossEncoderModelMissing, match="rerank"):
        HistoryMemory(embedder=HashingEmbedder())


def test_a_query_longer_than_the_window_keeps_the_first_stage_order() -> None:
    encoder = Windowed()
    first_stage = Pipeline()
    skipping = late_interaction_pipeline(reranker=LateInteractionReranker(encoder, pool=50))
    reranking = late_interaction_pipeline(
        reranker=LateInteractionReranker(Windowed(), pool=50, weight=1.0, skip_long_queries=False)
    )
    memory = HistoryMemory(embedder=HashingEmbedder(), pipeline=first_stage)
    for text in (
        "Bo: the kids liked the rope swing best",
        "Ana: the dog chased ducks all afternoon",
        "Bo: the lake water was warm enough to swim on Sunday",
        "Ana: we spent the weekend at the lake",
    ):
        memory.save([Turn("user", text)], Scope("ana"))

    def order(pipeline: Pipeline, query: str) -> list[str]:
        hits = memory.engine.search(query, user_id="ana", k=4, pipeline=pipeline)
        return [h.record.text for h in hits]

    # Exactly the first stage (fetched at its own depth, not the pool's), never encoded.
    assert (
        skipping.candidate_depth(4, RecallRequest(DIALOGUE, user_id="ana", k=4))
        == first_stage.depth
    )
    assert order(skipping, DIALOGUE) == order(first_stage, DIALOGUE)
    assert encoder.queries == []
    assert order(reranking, DIALOGUE) != order(first_stage, DIALOGUE)
    short = "what did the kids like best?"
    order(skipping, short)
    assert encoder.queries == [short]  # a question that fits is reranked
    memory.close()


@needs_bundled
def test_the_bundled_encoder_says_which_queries_fit() -> None:
    encoder = OnnxLateInteractionEncoder()
    assert encoder.query_fits("What is the name of Ana's cat?")
    assert not encoder.query_fits(DIALOGUE)
    assert not encoder.query_fits("x" * 10_000)  # no piece is that long: not tokenised
    assert not encoder.query_fits(" ".join(["word"] * 40))
    assert np.asarray(encoder.encode_query(DIALOGUE)).shape[0] <= encoder.query_length


def test_a_langchain_chain_and_a_llamaindex_engine_rerank_with_the_default(
    fake_default: Windowed,
) -> None:
    from langchain_core.language_models.fake_chat_models import FakeListChatModel
    from langchain_core.output_parsers import StrOutputParser
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnablePassthrough
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import RetrieverQueryEngine

    from langchain_memories import MemoryRetriever as LCRetriever
    from llamaindex_memories import MemoryRetriever as LIRetriever

    memory = cat_memory()
    expected = [h.record.text for h in memory.recall(CAT_QUESTION, Scope("ana"), k=3).records]
    fake_default.queries.clear()
    seen: list[list[str]] = []

    def context(docs: list[object]) -> str:
        texts = [d.page_content for d in docs]  # type: ignore[attr-defined]
        seen.append(texts)
        return "\n".join(texts)

    prompt = ChatPromptTemplate.from_messages(
        [("system", "Memories:\n{context}"), ("human", "{question}")]
    )
    chain = (
        {
            "context": LCRetriever(memory=memory, user_id="ana", k=3) | context,
            "question": RunnablePassthrough(),
        }
        | prompt
        | FakeListChatModel(responses=["Pixel."])
        | StrOutputParser()
    )
    assert chain.invoke(CAT_QUESTION) == "Pixel."
    assert seen == [expected]  # the reranked order, k at most
    engine = RetrieverQueryEngine.from_args(
        LIRetriever(memory, "ana", similarity_top_k=3), llm=MockLLM()
    )
    nodes = engine.query(CAT_QUESTION).source_nodes
    assert [n.node.get_content() for n in nodes] == expected
    assert all(0.0 <= (n.score or 0.0) <= 1.0 for n in nodes)
    assert fake_default.queries == [CAT_QUESTION, CAT_QUESTION]  # both went through it
    memory.close()


@pytest.mark.slow
@needs_bundled
def test_the_real_default_encodes_at_save_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LATE_DEFAULT_ENV, "auto")
    memory = cat_memory()
    assert memory.pipeline is not None
    reranker = memory.pipeline.rerankers[-1]
    assert isinstance(reranker, LateInteractionReranker)
    assert isinstance(reranker.encoder, OnnxLateInteractionEncoder)
    assert memory.prefetch("ana", progress=False) == 0  # the save jobs stored them all
    hits = memory.recall(CAT_QUESTION, Scope("ana"), k=2).records
    assert len(hits) == 2 and any("Pixel" in h.record.text for h in hits)
    # A lone surrogate reaches the encoder's tokenizer as U+FFFD (it raised a TypeError).
    odd = memory.recall(CAT_QUESTION + " \udc80", Scope("ana"), k=2).records
    assert [h.record.id for h in odd] == [h.record.id for h in hits]
    memory.close()
