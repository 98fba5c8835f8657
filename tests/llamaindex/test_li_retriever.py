"""MemoryRetriever: scored nodes, user isolation, and use inside a RetrieverQueryEngine."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from li_fakes import RecordingLLM
from llama_index.core.postprocessor import SimilarityPostprocessor
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import MetadataMode, NodeWithScore

from llamaindex_memories import MemoryRetriever
from memories_core import HistoryMemory, MissingUserError, Scope, Turn

WHEN = datetime(2024, 5, 1, 12, 0, tzinfo=timezone.utc)


@pytest.fixture
def filled(history: HistoryMemory) -> HistoryMemory:
    history.save(
        [
            Turn("user", "I love spicy Thai food", timestamp=WHEN, metadata={"mood": "happy"}),
            Turn("user", "My sister lives in Lisbon", timestamp=WHEN),
            Turn("user", "I play the cello on Sundays", timestamp=WHEN),
            Turn("user", "My dog is called Pixel", timestamp=WHEN),
        ],
        Scope("alice", "s1"),
    )
    history.save([Turn("user", "I love greasy pepperoni pizza food")], Scope("bob"))
    return history


def test_retrieve_returns_scored_nodes_best_first(filled: HistoryMemory) -> None:
    nodes = MemoryRetriever(filled, "alice").retrieve("what food do I love?")
    assert len(nodes) == filled.default_k
    assert all(isinstance(n, NodeWithScore) for n in nodes)
    assert nodes[0].node.get_content() == "user: I love spicy Thai food"
    scores = [n.score or 0.0 for n in nodes]
    assert scores == sorted(scores, reverse=True)


def test_node_carries_the_record(filled: HistoryMemory) -> None:
    recall = filled.recall("what food do I love?", Scope("alice"), k=1)
    record = recall.records[0].record
    (hit,) = MemoryRetriever(filled, "alice", similarity_top_k=1).retrieve("what food do I love?")
    assert hit.node.node_id == record.id
    assert hit.score == pytest.approx(recall.records[0].relevance)
    meta = hit.node.metadata
    assert meta["score"] == pytest.approx(recall.records[0].score)
    assert meta["record_id"] == record.id
    assert meta["kind"] == "turn"
    assert meta["user_id"] == "alice"
    assert meta["session_id"] == "s1"
    assert meta["created_at"] == WHEN.isoformat()
    assert meta["mood"] == "happy"
    llm_view = hit.node.get_content(metadata_mode=MetadataMode.LLM)
    # The LLM reads the text and the application's own metadata, no bookkeeping.
    assert llm_view == "mood: happy\n\nuser: I love spicy Thai food"
    hidden = ("record_id", "batch_id", "role", "kind", "created_at", "score", "turn")
    for internal in (*hidden, "fused_score", "relevance"):
        assert internal not in llm_view
    assert hit.node.get_content(metadata_mode=MetadataMode.EMBED) == llm_view


def test_similarity_top_k(filled: HistoryMemory) -> None:
    retriever = MemoryRetriever(filled, "alice", similarity_top_k=2)
    assert retriever.similarity_top_k == 2
    assert len(retriever.retrieve("anything about me")) == 2
    assert len(MemoryRetriever(filled, "alice", similarity_top_k=10).retrieve("me")) == 4


def test_users_are_isolated(filled: HistoryMemory) -> None:
    texts = [n.node.get_content() for n in MemoryRetriever(filled, "bob").retrieve("food")]
    assert texts == ["user: I love greasy pepperoni pizza food"]
    assert MemoryRetriever(filled, "carol").retrieve("food") == []


async def test_aretrieve(filled: HistoryMemory) -> None:
    nodes = await MemoryRetriever(filled, "alice").aretrieve("where does my sister live?")
    assert nodes[0].node.get_content() == "user: My sister lives in Lisbon"


@pytest.mark.parametrize("top_k", [0, -1, True, 2.5])
def test_rejects_bad_top_k(history: HistoryMemory, top_k: object) -> None:
    with pytest.raises(ValueError, match="similarity_top_k"):
        MemoryRetriever(history, "alice", similarity_top_k=top_k)  # type: ignore[arg-type]


def test_requires_a_user(history: HistoryMemory) -> None:
    with pytest.raises(MissingUserError):
        MemoryRetriever(history, "")


def test_query_engine_answers_from_the_users_memories(
    filled: HistoryMemory, recording_llm: RecordingLLM
) -> None:
    recording_llm.replies = ["You love spicy Thai food."]
    retriever = MemoryRetriever(filled, "alice", similarity_top_k=1)
    engine = RetrieverQueryEngine.from_args(retriever, llm=recording_llm)
    response = engine.query("What food do I love?")
    assert str(response) == "You love spicy Thai food."
    prompt = recording_llm.prompts[-1]
    assert "user: I love spicy Thai food" in prompt
    assert "pizza" not in prompt
    assert response.source_nodes[0].node.metadata["user_id"] == "alice"


async def test_query_engine_async(filled: HistoryMemory, recording_llm: RecordingLLM) -> None:
    engine = RetrieverQueryEngine.from_args(MemoryRetriever(filled, "bob"), llm=recording_llm)
    await engine.aquery("What food do I love?")
    prompt = recording_llm.prompts[-1]
    assert "pepperoni" in prompt
    assert "Thai" not in prompt


def test_node_score_is_the_cosine_of_an_exact_match(history: HistoryMemory) -> None:
    # One record: its fused score is 0.0 (a z-score of a single hit), but its node score is
    # the cosine of the query to its vector, 1.0 for the record's own text.
    history.save([Turn("user", "I play the cello on Sundays", timestamp=WHEN)], Scope("alice"))
    (hit,) = MemoryRetriever(history, "alice").retrieve("user: I play the cello on Sundays")
    assert hit.score == pytest.approx(1.0, abs=1e-4)
    assert hit.node.metadata["fused_score"] == hit.node.metadata["score"]
    assert hit.node.metadata["relevance"] == pytest.approx(hit.score)


def test_similarity_cutoff_keeps_the_best_exact_match(
    history: HistoryMemory, recording_llm: RecordingLLM
) -> None:
    # Alice's only memory: its fused score is 0.0 (one hit), which a logistic map puts at
    # 0.5, under the cutoff; its cosine is 1.0. Bob's memory is never a candidate.
    history.save([Turn("user", "I play the cello on Sundays", timestamp=WHEN)], Scope("alice"))
    history.save([Turn("user", "My sister lives in Lisbon", timestamp=WHEN)], Scope("bob"))
    recording_llm.replies = ["On Sundays."]
    engine = RetrieverQueryEngine.from_args(
        MemoryRetriever(history, "alice", similarity_top_k=4),
        llm=recording_llm,
        node_postprocessors=[SimilarityPostprocessor(similarity_cutoff=0.8)],
    )
    response = engine.query("user: I play the cello on Sundays")
    assert str(response) == "On Sundays."
    kept = [n.node.get_content() for n in response.source_nodes]
    # The exact match passes the cutoff; the other memories are dissimilar and are dropped.
    assert kept == ["user: I play the cello on Sundays"]
    assert "cello" in recording_llm.prompts[-1]
    assert "Lisbon" not in recording_llm.prompts[-1]
    for node in response.source_nodes:
        assert node.score is not None and 0.8 <= node.score <= 1.0
