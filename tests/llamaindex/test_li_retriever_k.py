"""Every mechanism behind the LlamaIndex retriever: at most k nodes, scores in [0, 1]."""

from __future__ import annotations

import pytest
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.schema import QueryBundle

from llamaindex_memories import MemoryRetriever
from memories_core import ConfigurationError, Scope
from retriever_scenarios import BUILDERS, FILTERING, QUERY, USER, filled


@pytest.mark.parametrize("mechanism", [*BUILDERS, *FILTERING])
def test_retriever_returns_at_most_k_and_fills_up_to_k(mechanism: str) -> None:
    memory = filled(mechanism)
    for k in (1, 3, 5):
        nodes = MemoryRetriever(memory, USER, similarity_top_k=k).retrieve(QUERY)
        assert len(nodes) <= k
        if mechanism in BUILDERS:
            assert len(nodes) == k, f"{mechanism} returned {len(nodes)} of {k} (5 facts stored)"
        scores = [n.score for n in nodes]
        assert all(s is not None and 0.0 <= s <= 1.0 for s in scores), scores
        # Nodes come in the mechanism's ranking; a score is the hit's similarity, which a
        # hybrid (dense + lexical) ranking need not order.
        fused = [n.node.metadata["fused_score"] for n in nodes]
        assert fused == sorted(fused, reverse=True) or mechanism == "multiview"


def test_relevance_keeps_the_order_and_works_with_a_similarity_cutoff() -> None:
    memory = filled("history")
    recall = memory.recall(QUERY, Scope(USER), k=5)
    nodes = MemoryRetriever(memory, USER, similarity_top_k=5).retrieve(QUERY)
    assert [n.node.node_id for n in nodes] == [h.record.id for h in recall.records]
    assert [n.node.metadata["score"] for n in nodes] == [h.score for h in recall.records]
    cutoff = (nodes[0].score + nodes[-1].score) / 2  # type: ignore[operator]
    kept = SimilarityPostprocessor(similarity_cutoff=cutoff).postprocess_nodes(
        nodes, QueryBundle(QUERY)
    )
    assert 0 < len(kept) < len(nodes)
    assert kept == nodes[: len(kept)]


@pytest.mark.parametrize("bad", [0, -2, True, 2.0, "3"])
def test_a_bad_similarity_top_k_is_a_configuration_error(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="similarity_top_k must be a positive int"):
        MemoryRetriever(filled("history"), USER, similarity_top_k=bad)  # type: ignore[arg-type]
