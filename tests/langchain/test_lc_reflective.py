"""SelfReflectiveRetriever around a plain LangChain retriever and around MemoryRetriever."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any
from uuid import UUID

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore, VectorStoreRetriever
from lc_fakes import RecordingRetriever, chat_model, history_memory, rule_following_chat_model
from pydantic import ValidationError

from langchain_memories import CoreEmbeddings, MemoryRetriever, SelfReflectiveRetriever
from memories_core import Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.rule_following import rule_following_reply

FACTS = [
    "I am allergic to peanuts",
    "My sister lives in Lisbon",
    "I play the cello on weekends",
    "My favourite hiking trail is in Norway",
]


class QueryLog(BaseCallbackHandler):
    """Every retriever run: (query, run id, parent run id)."""

    def __init__(self) -> None:
        self.runs: list[tuple[str, UUID, UUID | None]] = []

    def on_retriever_start(
        self,
        serialized: dict[str, Any],
        query: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        **kwargs: Any,
    ) -> None:
        self.runs.append((query, run_id, parent_run_id))


def vector_retriever(k: int = 2) -> VectorStoreRetriever:
    store = InMemoryVectorStore(CoreEmbeddings(HashingEmbedder()))
    store.add_texts(FACTS)
    return store.as_retriever(search_kwargs={"k": k})


def texts(docs: list[Document]) -> list[str]:
    return [d.page_content for d in docs]


def test_memory_verdict_returns_the_selected_documents_with_one_call() -> None:
    llm = chat_model("<Memory>: I am allergic to peanuts")
    retriever = SelfReflectiveRetriever(base_retriever=vector_retriever(), llm=llm)
    query = "what am I allergic to?"

    docs = retriever.invoke(query)
    assert texts(docs) == ["I am allergic to peanuts"]
    assert len(llm.prompts) == 1
    assert "- I am allergic to peanuts" in llm.prompts[0][-1].text  # the candidates were shown
    assert docs[0].metadata == {
        "reflection_queries": [query],
        "reflection_memory": "I am allergic to peanuts",
        "reflection_failed": False,
    }
    assert retriever.reflection.llm.usage.calls == 1


def test_query_verdict_searches_the_base_retriever_again() -> None:
    llm = chat_model("<Query>: cello, weekends")
    retriever = SelfReflectiveRetriever(base_retriever=vector_retriever(k=1), llm=llm)
    log = QueryLog()

    docs = retriever.invoke("what do I do on Saturdays?", config={"callbacks": [log]})
    extended = "what do I do on Saturdays? cello weekends"
    (outer, outer_id, _), *searches = log.runs
    assert outer == "what do I do on Saturdays?"
    # Both base searches ran as children of the reflective run, the second with the keywords.
    assert [(q, parent) for q, _, parent in searches] == [(outer, outer_id), (extended, outer_id)]
    assert len(llm.prompts) == 1  # max_rounds=1: the second candidates are used as they are
    assert texts(docs) == ["I play the cello on weekends"]
    assert docs[0].metadata["reflection_queries"] == [outer, extended]
    assert docs[0].metadata["reflection_memory"] is None


def test_garbled_reflection_falls_back_to_the_base_documents() -> None:
    llm = chat_model("Hmm, hard to say.", "Still not sure.")  # answer, then the repair retry
    base = vector_retriever()
    retriever = SelfReflectiveRetriever(base_retriever=base, llm=llm)

    docs = retriever.invoke("where does my sister live?")
    assert texts(docs) == texts(base.invoke("where does my sister live?"))
    assert all(d.metadata["reflection_failed"] for d in docs)
    assert len(llm.prompts) == 2
    assert retriever.reflection.failures.snapshot().failures == 1


def test_base_documents_are_copied_not_mutated() -> None:
    original = Document("I am allergic to peanuts", metadata={"source": "chat"}, id="d1")
    base = RecordingRetriever(documents=[original])
    retriever = SelfReflectiveRetriever(
        base_retriever=base, llm=chat_model("<Memory>: I am allergic to peanuts")
    )
    (doc,) = retriever.invoke("allergies?")
    assert doc is not original and doc.id == "d1"
    assert doc.metadata["source"] == "chat" and doc.metadata["reflection_failed"] is False
    assert original.metadata == {"source": "chat"}
    assert base.queries == ["allergies?"]


def test_max_rounds_zero_makes_no_call() -> None:
    llm = chat_model()
    retriever = SelfReflectiveRetriever(base_retriever=vector_retriever(), llm=llm, max_rounds=0)
    assert len(retriever.invoke("sister")) == 2
    assert llm.prompts == []


def test_invalid_construction() -> None:
    with pytest.raises(ValidationError):
        SelfReflectiveRetriever(base_retriever=vector_retriever(), llm=chat_model(), max_rounds=-1)
    with pytest.raises(ValidationError):
        SelfReflectiveRetriever(base_retriever=vector_retriever(), llm="gpt-4o")


async def test_async_query_then_memory() -> None:
    llm = chat_model("<Query>: cello", "<Memory>: I play the cello on weekends")
    retriever = SelfReflectiveRetriever(base_retriever=vector_retriever(k=1), llm=llm, max_rounds=2)
    log = QueryLog()
    docs = await retriever.ainvoke("my hobbies?", config={"callbacks": [log]})
    assert [q for q, _, _ in log.runs] == ["my hobbies?", "my hobbies?", "my hobbies? cello"]
    assert texts(docs) == ["I play the cello on weekends"]
    assert docs[0].metadata["reflection_queries"] == ["my hobbies?", "my hobbies? cello"]
    assert docs[0].metadata["reflection_memory"] == "I play the cello on weekends"
    assert len(llm.prompts) == 2


def test_around_memory_retriever_the_user_scope_passes_through() -> None:
    memory = history_memory()
    memory.save([Turn("user", fact) for fact in FACTS], Scope("alice"))
    memory.save([Turn("user", "I am allergic to shellfish and cats")], Scope("bob"))
    # A core LLM is accepted as well; this one follows the reflection prompt's rules.
    llm = ScriptedLLM(["<Query>: allergic, shellfish, cats"], default=rule_following_reply)
    base = MemoryRetriever(memory=memory, user_id="alice", k=2)
    retriever = SelfReflectiveRetriever(base_retriever=base, llm=llm)

    docs = retriever.invoke("am I allergic to shellfish?")
    assert docs and {d.metadata["user_id"] for d in docs} == {"alice"}
    assert all("shellfish" not in d.page_content for d in docs)
    assert docs[0].metadata["reflection_queries"][-1] == "am I allergic to shellfish? cats"
    assert docs[0].metadata["kind"] == "turn"  # MemoryRetriever's metadata is kept

    # Extra invoke kwargs reach the base retriever (here MemoryRetriever's k).
    assert len(retriever.invoke("cello", k=1)) == 1


def answer_chain(reflective: SelfReflectiveRetriever, answerer: Any) -> Any:
    """An LCEL chain: the reflective retriever's documents as context, then the answerer."""
    prompt = ChatPromptTemplate.from_template("Memories:\n{context}\n\nQuestion: {question}")

    def format_docs(docs: list[Document]) -> str:
        return "\n".join(d.page_content for d in docs)

    return (
        {"context": reflective | format_docs, "question": RunnablePassthrough()} | prompt | answerer
    )


def test_in_an_lcel_chain() -> None:
    model = rule_following_chat_model()
    memory = history_memory()
    memory.save([Turn("user", fact) for fact in FACTS], Scope("alice"))
    reflective = SelfReflectiveRetriever(
        base_retriever=MemoryRetriever(memory=memory, user_id="alice", k=3), llm=model
    )
    answerer = chat_model("You are allergic to peanuts.")
    chain = answer_chain(reflective, answerer)
    assert chain.invoke("which food allergy do I have? peanuts?").text.startswith("You are")
    sent = answerer.prompts[-1][0].text
    assert "user: I am allergic to peanuts" in sent
    assert "Lisbon" not in sent  # the reflection dropped the irrelevant candidates


#: An override of the reflection prompt (Table 19's instruction in a coach's words).
COACH_JUDGE = (
    "You help a health coach. If the candidate memories answer the question, start with "
    '"<Memory>:" and copy them; else start with "<Query>:" and give keywords.'
)


def test_a_prompt_override_reaches_the_model_inside_an_lcel_chain() -> None:
    judge = chat_model("<Memory>: I am allergic to peanuts")
    reflective = SelfReflectiveRetriever(
        base_retriever=vector_retriever(), llm=judge, prompts={"reflection": COACH_JUDGE}
    )
    answerer = chat_model("You are allergic to peanuts.")
    chain = answer_chain(reflective, answerer)
    chain.invoke("what am I allergic to?")
    assert judge.prompts[0][0].text == COACH_JUDGE  # the override is the system message
    assert "I am allergic to peanuts" in answerer.prompts[-1][0].text
    assert "Lisbon" not in answerer.prompts[-1][0].text  # the judge's choice reached the chain


def test_a_bad_prompt_override_is_refused_at_construction() -> None:
    # A pydantic component: the refusal comes as ValidationError, naming what is missing.
    with pytest.raises(ValidationError, match="<Memory>"):
        SelfReflectiveRetriever(
            base_retriever=vector_retriever(),
            llm=chat_model(),
            prompts={"reflection": "Say whether the memories are enough."},
        )
    with pytest.raises(ValidationError, match="no prompt named"):
        SelfReflectiveRetriever(
            base_retriever=vector_retriever(), llm=chat_model(), prompts={"reflexion": COACH_JUDGE}
        )


def test_the_model_judges_memory_documents_after_their_dates() -> None:
    """Around MemoryRetriever the model sees each memory's date (as the core wrapper shows it)."""
    memory = history_memory()
    said = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
    memory.save([Turn("user", "I adopted a puppy", timestamp=said)], Scope("alice"))
    judge = chat_model("<Memory>: I adopted a puppy")
    reflective = SelfReflectiveRetriever(
        base_retriever=MemoryRetriever(memory=memory, user_id="alice", k=1), llm=judge
    )
    docs = reflective.invoke("when did I adopt a puppy?")
    assert texts(docs) == ["user: I adopted a puppy"]  # selected by the copied sentence
    assert "- [8 May 2023, 13:56] user: I adopted a puppy" in judge.prompts[0][-1].text

    bare = chat_model("<Memory>: I adopted a puppy")
    undated = SelfReflectiveRetriever(
        base_retriever=MemoryRetriever(memory=memory, user_id="alice", k=1),
        llm=bare,
        show_dates=False,
    )
    assert texts(undated.invoke("when did I adopt a puppy?")) == ["user: I adopted a puppy"]
    assert "2023" not in bare.prompts[0][-1].text


def test_a_documents_timestamp_metadata_dates_it_and_bad_values_are_ignored() -> None:
    store = InMemoryVectorStore(CoreEmbeddings(HashingEmbedder()))
    store.add_texts(
        ["Lunch with Ana", "Dentist appointment", "Gym session"],
        metadatas=[{"timestamp": 1683554160}, {"timestamp": "not a date"}, {"created_at": True}],
    )
    judge = chat_model("<Memory>: Lunch with Ana")
    docs = SelfReflectiveRetriever(
        base_retriever=store.as_retriever(search_kwargs={"k": 3}), llm=judge
    ).invoke("when was lunch with Ana?")
    assert texts(docs) == ["Lunch with Ana"]
    shown = judge.prompts[0][-1].text
    assert "- [8 May 2023, 13:56] Lunch with Ana" in shown
    assert "- Dentist appointment" in shown and "- Gym session" in shown
