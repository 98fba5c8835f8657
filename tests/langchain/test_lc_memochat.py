"""MemoChat in LangChain: the chat-with-memo runnable inside a real LCEL chain, the retriever."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from lc_fakes import chat_model

from langchain_memories import create_memochat_chain, memochat_retriever
from memories_core import InvalidInputError, MemoChatMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.memochat import rule_following_reply

TOPICS = [
    ("user", "Next week I meet business partners in Japan. How should I bow?"),
    ("assistant", "In Japan a business bow is about fifteen degrees."),
    ("user", "Is a gift expected at a Japanese business meeting?"),
    ("assistant", "A modest wrapped gift is polite at Japanese business meetings."),
    ("user", "Can you factor the polynomial x squared minus five x plus six?"),
    ("assistant", "The polynomial factors as (x - 2)(x - 3)."),
]


def _memory() -> MemoChatMemory:
    llm = ScriptedLLM(default=lambda m: rule_following_reply(m) or "")
    memory = MemoChatMemory(llm=llm, embedder=HashingEmbedder(), max_lines=6)
    memory.save([Turn(r, t) for r, t in TOPICS], Scope("ann"))
    return memory


def test_chain_sends_the_table8_prompt_and_saves_the_exchange() -> None:
    memory = _memory()
    model = chat_model("It was Japan, not Korea.")
    chain = create_memochat_chain(memory, model) | RunnableLambda(str.upper)
    out = chain.invoke(
        {
            "input": "The business etiquette we talked about belongs to Korea, right?",
            "user_id": "ann",
        }
    )
    assert out == "IT WAS JAPAN, NOT KOREA."
    prompt = model.prompts[-1][-1].content
    assert "Related evidences:" in prompt and "fifteen degrees" in prompt
    assert "Recent dialogs:" in prompt and "User input:" in prompt
    assert memory.turns(Scope("ann"))[-1].content == "It was Japan, not Korea."


def test_chain_is_scoped_by_user() -> None:
    memory = _memory()
    model = chat_model("No idea.")
    create_memochat_chain(memory, model).invoke({"input": "business in Japan?", "user_id": "bo"})
    assert "fifteen degrees" not in model.prompts[-1][-1].content


def test_chain_needs_a_user() -> None:
    chain = create_memochat_chain(_memory(), chat_model("x"))
    with pytest.raises(InvalidInputError):
        chain.invoke({"input": "hi"})


async def test_chain_async() -> None:
    memory = _memory()
    chain = create_memochat_chain(memory, chat_model("Async."), save=False) | StrOutputParser()
    assert await chain.ainvoke({"input": "polynomial?", "user_id": "ann"}) == "Async."
    assert memory.turns(Scope("ann"))[-1].content != "Async."


def test_retriever_returns_memo_documents() -> None:
    docs = memochat_retriever(_memory(), "ann", k=5).invoke("business etiquette japan")
    assert any(d.metadata.get("kind") == "memo" for d in docs) or any(
        "business" in d.page_content for d in docs
    )


def _memoized() -> MemoChatMemory:
    """Every line written into a memo (the session ended), so only memos can be recalled."""
    memory = _memory()
    memory.end_session(Scope("ann"))
    assert memory.buffer(Scope("ann")) == []
    return memory


def _joined(found: list[Document]) -> str:
    return "\n".join(d.page_content for d in found) or "(nothing)"


def _retriever_chain(memory: MemoChatMemory, model: Any) -> Any:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "Memo:\n{context}"), ("human", "{question}")]
    )
    docs = memochat_retriever(memory, "ann", k=5) | RunnableLambda(_joined)
    return {"context": docs, "question": RunnablePassthrough()} | prompt | model


def test_retriever_in_an_lcel_chain_returns_only_the_memo_the_model_chose() -> None:
    memory = _memoized()
    chosen = memory.retrieve("the polynomial roots", Scope("ann"))
    model = chat_model("Two and three.")
    _retriever_chain(memory, model).invoke("the polynomial roots")
    system = model.prompts[-1][0].content
    assert len(chosen) == 1 and "polynomial" in chosen[0].summary
    assert "polynomial" in system and "Japan" not in system


def test_retriever_in_an_lcel_chain_recalls_nothing_when_the_model_says_noto() -> None:
    memory = _memoized()
    model = chat_model("No idea.")
    _retriever_chain(memory, model).invoke("zebras gallop across savannahs")
    assert model.prompts[-1][0].content == "Memo:\n(nothing)"
    assert memochat_retriever(memory, "ann", k=5).invoke("zebras gallop") == []


def test_chain_keeps_the_users_turn_when_the_model_answers_nothing() -> None:
    memory = _memory()
    before = len(memory.turns(Scope("ann")))
    out = create_memochat_chain(memory, chat_model(" ")).invoke(
        {"input": "Which country was it again?", "user_id": "ann"}
    )
    assert out == ""
    turns = memory.turns(Scope("ann"))
    assert len(turns) == before + 1 and turns[-1].content == "Which country was it again?"


class FailingChatModel(GenericFakeChatModel):
    """A chat model whose server is down."""

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("the server is down")

    async def _agenerate(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("the server is down")


async def test_chain_keeps_the_users_turn_when_the_model_fails() -> None:
    memory = _memory()
    before = len(memory.turns(Scope("ann")))
    chain = create_memochat_chain(memory, FailingChatModel(messages=iter([])))
    with pytest.raises(ConnectionError):
        chain.invoke({"input": "Which country was it?", "user_id": "ann"})
    with pytest.raises(ConnectionError):
        await chain.ainvoke({"input": "Was it Japan?", "user_id": "ann"})
    texts = [t.content for t in memory.turns(Scope("ann"))]
    assert texts[before:] == ["Which country was it?", "Was it Japan?"]
