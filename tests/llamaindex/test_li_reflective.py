"""Self-reflective retrieval around plain LlamaIndex retrievers, MemoryRetriever and engines."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from li_fakes import RecordingLLM, SpyRetriever
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle

from llamaindex_memories import (
    CoreEmbedding,
    MemoryRetriever,
    SelfReflectiveFilter,
    SelfReflectiveRetriever,
)
from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM

OFFICE = "The office opens at 9am on weekdays."
PARKING = "Parking is on level two of the garage."
DOCS = [
    OFFICE,
    PARKING,
    "The cafeteria serves Thai curry on Fridays.",
    "Visitors sign in at the front desk.",
]
QUESTION = "When does the office open?"
CAR = "Where should I leave my car?"


@pytest.fixture
def index() -> VectorStoreIndex:
    return VectorStoreIndex.from_documents(
        [Document(text=t) for t in DOCS], embed_model=CoreEmbedding(HashingEmbedder())
    )


@pytest.fixture
def spy(index: VectorStoreIndex) -> SpyRetriever:
    return SpyRetriever(index.as_retriever(similarity_top_k=2))


def texts(nodes: list[NodeWithScore]) -> list[str]:
    return [n.node.get_content() for n in nodes]


# ---------------------------------------------------------------- SelfReflectiveRetriever


def test_memory_selects_nodes_with_one_call(spy: SpyRetriever) -> None:
    llm = ScriptedLLM([f"<Memory>: {OFFICE}"])
    candidates = texts(spy.base.retrieve(QUESTION))
    assert OFFICE in candidates and len(candidates) == 2
    nodes = SelfReflectiveRetriever(spy, llm=llm).retrieve(QUESTION)
    assert texts(nodes) == [OFFICE]
    assert llm.usage.calls == 1
    assert spy.queries == [QUESTION]  # one base retrieval
    meta = nodes[0].node.metadata
    assert meta["reflection_queries"] == [QUESTION]
    assert meta["reflection_memory"] == OFFICE
    for mode in (MetadataMode.LLM, MetadataMode.EMBED):
        assert "reflection" not in nodes[0].node.get_content(metadata_mode=mode)
    # Copies: the index's own nodes are untouched.
    assert all("reflection_queries" not in n.node.metadata for n in spy.base.retrieve(QUESTION))


def test_query_triggers_a_second_retrieval_with_the_extended_query(spy: SpyRetriever) -> None:
    llm = ScriptedLLM(["<Query>: parking, garage"])
    nodes = SelfReflectiveRetriever(spy, llm=llm).retrieve(CAR)
    extended = f"{CAR} parking garage"
    assert spy.queries == [CAR, extended]
    assert llm.usage.calls == 1  # max_rounds=1: the second candidates are used as they are
    assert PARKING in texts(nodes)
    assert nodes[0].node.metadata["reflection_queries"] == [CAR, extended]
    assert nodes[0].node.metadata["reflection_memory"] is None


def test_a_llamaindex_llm_judges_through_the_bridge(
    spy: SpyRetriever, recording_llm: RecordingLLM
) -> None:
    recording_llm.replies = [f"<Memory>: {OFFICE}"]
    nodes = SelfReflectiveRetriever(spy, llm=recording_llm).retrieve(QUESTION)
    assert texts(nodes) == [OFFICE]
    assert OFFICE in recording_llm.prompts[0] and QUESTION in recording_llm.prompts[0]


def test_garbled_reflection_falls_back_to_the_candidates(spy: SpyRetriever) -> None:
    llm = ScriptedLLM(["I am not sure.", "Still not sure."])  # one repair retry, then give up
    retriever = SelfReflectiveRetriever(spy, llm=llm)
    nodes = retriever.retrieve(QUESTION)
    assert texts(nodes) == texts(spy.base.retrieve(QUESTION))
    assert spy.queries == [QUESTION]
    assert nodes[0].node.metadata["reflection_memory"] is None
    assert llm.usage.calls == 2


def test_zero_rounds_makes_no_call(spy: SpyRetriever) -> None:
    llm = ScriptedLLM()
    nodes = SelfReflectiveRetriever(spy, llm=llm, max_rounds=0).retrieve(QUESTION)
    assert len(nodes) == 2
    assert llm.usage.calls == 0


def test_keeps_the_callers_query_bundle_for_the_first_round() -> None:
    seen: list[QueryBundle] = []

    class Recorder(BaseRetriever):
        def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
            seen.append(query_bundle)
            return []

    bundle = QueryBundle(QUESTION, embedding=[0.5, 0.5])
    SelfReflectiveRetriever(Recorder(), llm=ScriptedLLM(["<Query>: hours"])).retrieve(bundle)
    assert seen[0] is bundle
    assert seen[1].query_str == f"{QUESTION} hours"


async def test_aretrieve(spy: SpyRetriever) -> None:
    llm = ScriptedLLM(["<Query>: parking, garage"])
    nodes = await SelfReflectiveRetriever(spy, llm=llm).aretrieve(CAR)
    assert spy.queries == [CAR, f"{CAR} parking garage"]
    assert PARKING in texts(nodes)


def test_inside_a_retriever_query_engine(
    index: VectorStoreIndex, recording_llm: RecordingLLM
) -> None:
    retriever = SelfReflectiveRetriever(
        index.as_retriever(similarity_top_k=2), llm=ScriptedLLM([f"<Memory>: {OFFICE}"])
    )
    recording_llm.replies = ["At 9am."]
    response = RetrieverQueryEngine.from_args(retriever, llm=recording_llm).query(QUESTION)
    assert str(response) == "At 9am."
    prompt = recording_llm.prompts[-1]
    assert OFFICE in prompt
    assert len(response.source_nodes) == 1
    assert "reflection_memory" not in prompt  # hidden from the LLM view


async def test_inside_a_query_engine_async(
    index: VectorStoreIndex, recording_llm: RecordingLLM
) -> None:
    retriever = SelfReflectiveRetriever(
        index.as_retriever(similarity_top_k=2), llm=ScriptedLLM([f"<Memory>: {OFFICE}"])
    )
    response = await RetrieverQueryEngine.from_args(retriever, llm=recording_llm).aquery(QUESTION)
    assert [n.node.get_content() for n in response.source_nodes] == [OFFICE]


def test_around_memory_retriever_keeps_the_user_scope(history: HistoryMemory) -> None:
    history.save(
        [Turn("user", "I love spicy Thai food"), Turn("user", "My sister lives in Lisbon")],
        Scope("alice"),
    )
    history.save([Turn("user", "I love greasy pepperoni pizza")], Scope("bob"))
    spy = SpyRetriever(MemoryRetriever(history, "alice", similarity_top_k=2))
    llm = ScriptedLLM(["<Query>: pizza, pepperoni"])
    nodes = SelfReflectiveRetriever(spy, llm=llm).retrieve("what food do I love?")
    assert spy.queries == ["what food do I love?", "what food do I love? pizza pepperoni"]
    assert nodes and all(n.node.metadata["user_id"] == "alice" for n in nodes)
    assert not any("pizza" in t for t in texts(nodes))


def test_retriever_class_name_and_base(spy: SpyRetriever) -> None:
    retriever = SelfReflectiveRetriever(spy, llm=ScriptedLLM())
    assert SelfReflectiveRetriever.class_name() == "SelfReflectiveRetriever"
    assert retriever.base_retriever is spy


# ---------------------------------------------------------------- SelfReflectiveFilter


def test_filter_in_a_query_engine(index: VectorStoreIndex, recording_llm: RecordingLLM) -> None:
    reflect = SelfReflectiveFilter(llm=ScriptedLLM([f"<Memory>: {PARKING}"]))
    engine = RetrieverQueryEngine.from_args(
        index.as_retriever(similarity_top_k=3), llm=recording_llm, node_postprocessors=[reflect]
    )
    response = engine.query(CAR + " Is there parking in the garage?")
    assert [n.node.get_content() for n in response.source_nodes] == [PARKING]
    prompt = recording_llm.prompts[-1]
    assert PARKING in prompt
    assert not any(doc in prompt for doc in DOCS if doc != PARKING)


async def test_filter_in_a_query_engine_async(
    index: VectorStoreIndex, recording_llm: RecordingLLM
) -> None:
    reflect = SelfReflectiveFilter(llm=ScriptedLLM([f"<Memory>: {OFFICE}"]))
    engine = index.as_query_engine(
        llm=recording_llm, similarity_top_k=3, node_postprocessors=[reflect]
    )
    response = await engine.aquery(QUESTION)
    assert [n.node.get_content() for n in response.source_nodes] == [OFFICE]


def test_filter_on_query_keeps_the_nodes_and_records_the_keywords(
    index: VectorStoreIndex,
) -> None:
    nodes = index.as_retriever(similarity_top_k=3).retrieve(CAR)
    snapshot = [n.node.model_dump() for n in nodes]
    llm = ScriptedLLM(["<Query>: parking, garage"])
    kept = SelfReflectiveFilter(llm=llm).postprocess_nodes(nodes, query_str=CAR)
    assert texts(kept) == texts(nodes)
    assert kept[0].node.metadata["reflection_queries"] == [CAR, f"{CAR} parking garage"]
    assert [n.score for n in kept] == [n.score for n in nodes]
    assert [n.node.model_dump() for n in nodes] == snapshot  # inputs untouched
    assert llm.usage.calls == 1


def test_filter_falls_back_on_garbage(index: VectorStoreIndex) -> None:
    nodes = index.as_retriever(similarity_top_k=3).retrieve(QUESTION)
    reflect = SelfReflectiveFilter(llm=ScriptedLLM(default="???"))
    assert texts(reflect.postprocess_nodes(nodes, query_str=QUESTION)) == texts(nodes)


def test_filter_needs_a_query_and_an_llm(recording_llm: RecordingLLM) -> None:
    reflect = SelfReflectiveFilter(llm=recording_llm)  # a LlamaIndex LLM is bridged
    with pytest.raises(ValueError, match="query"):
        reflect.postprocess_nodes([])
    with pytest.raises(ValueError, match="llm"):
        SelfReflectiveFilter(llm=object())  # type: ignore[arg-type]
    assert SelfReflectiveFilter.class_name() == "SelfReflectiveFilter"
    assert "llm" not in reflect.model_dump()


#: An override of the reflection prompt (Table 19's instruction in a receptionist's words).
DESK_JUDGE = (
    "You help an office receptionist. If the candidate memories answer the question, start "
    'with "<Memory>:" and copy them; else start with "<Query>:" and give keywords.'
)


def test_a_prompt_override_reaches_the_model_in_a_query_engine(
    spy: SpyRetriever, recording_llm: RecordingLLM
) -> None:
    judge = ScriptedLLM([f"<Memory>: {OFFICE}"])
    retriever = SelfReflectiveRetriever(spy, llm=judge, prompts={"reflection": DESK_JUDGE})
    response = RetrieverQueryEngine.from_args(retriever, llm=recording_llm).query(QUESTION)
    assert judge.calls[0][0].content == DESK_JUDGE
    assert texts(response.source_nodes) == [OFFICE]


def test_filter_takes_a_prompt_override(index: VectorStoreIndex) -> None:
    from memories_core.prompts.overrides import PromptOverrideError

    judge = ScriptedLLM([f"<Memory>: {OFFICE}"])
    keep = SelfReflectiveFilter(llm=judge, prompts={"reflection": DESK_JUDGE})
    nodes = keep.postprocess_nodes(
        index.as_retriever(similarity_top_k=2).retrieve(QUESTION), query_str=QUESTION
    )
    assert texts(nodes) == [OFFICE]
    assert judge.calls[0][0].content == DESK_JUDGE
    for bad in ({"reflection": "Are these enough?"}, {"reflexion": DESK_JUDGE}):
        with pytest.raises(PromptOverrideError):
            SelfReflectiveFilter(llm=judge, prompts=bad)
        with pytest.raises(PromptOverrideError):
            SelfReflectiveRetriever(index.as_retriever(), llm=judge, prompts=bad)


# ---------------------------------------------------------------- dates shown to the model


def dated_history(history: HistoryMemory) -> MemoryRetriever:
    said = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
    history.save(
        [
            Turn("user", "I adopted a puppy", timestamp=said),
            Turn("user", "My sister lives in Lisbon", timestamp=said + timedelta(days=30)),
        ],
        Scope("alice"),
    )
    return MemoryRetriever(history, "alice", similarity_top_k=2)


def test_the_retriever_shows_the_model_each_memorys_date(history: HistoryMemory) -> None:
    llm = ScriptedLLM(["<Memory>: I adopted a puppy"])
    nodes = SelfReflectiveRetriever(dated_history(history), llm=llm).retrieve(
        "when did I adopt a puppy?"
    )
    assert texts(nodes) == ["user: I adopted a puppy"]
    shown = llm.calls[0][-1].content
    assert "- [8 May 2023, 13:56] user: I adopted a puppy" in shown
    assert "- [7 June 2023, 13:56] user: My sister lives in Lisbon" in shown
    # The reader's view of the node is unchanged: the date stays in hidden metadata.
    assert nodes[0].node.get_content(metadata_mode=MetadataMode.LLM) == "user: I adopted a puppy"


def test_dates_can_be_left_out(history: HistoryMemory) -> None:
    llm = ScriptedLLM(["<Memory>: I adopted a puppy"])
    SelfReflectiveRetriever(dated_history(history), llm=llm, show_dates=False).retrieve(
        "when did I adopt a puppy?"
    )
    assert "2023" not in llm.calls[0][-1].content


async def test_the_filter_shows_the_model_each_memorys_date(history: HistoryMemory) -> None:
    retriever = dated_history(history)
    llm = ScriptedLLM(["<Memory>: My sister lives in Lisbon"] * 2)
    reflect = SelfReflectiveFilter(llm=llm)
    for result in (
        reflect.postprocess_nodes(retriever.retrieve("sister"), query_str="where is my sister?"),
        await reflect.apostprocess_nodes(
            await retriever.aretrieve("sister"), query_bundle=QueryBundle("where is my sister?")
        ),
    ):
        assert texts(result) == ["user: My sister lives in Lisbon"]
    assert all("- [7 June 2023, 13:56] user: My sister" in c[-1].content for c in llm.calls)
