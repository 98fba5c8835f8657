"""PersonalizedChatModel inside real LCEL chains (tiny model, real LoRA adapter, real DPeM)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import ConfigurableField
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests
from pydantic import ValidationError

from langchain_memories import PersonalizedChatModel, dpem_retriever
from memories_core.personalize import Personalizer
from memories_core.types import Scope
from personalize_setup import trained_personalizer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None, reason="extra 'personalize' not installed"
)

QUESTION = "I got red spots on my skin recently"


@pytest.fixture(scope="module")
def personalizer(tmp_path_factory: pytest.TempPathFactory) -> Personalizer:
    return trained_personalizer(tmp_path_factory.mktemp("lc") / "m")


def test_lcel_chain_answers_with_the_users_adapter_and_memory(personalizer: Personalizer) -> None:
    chat = PersonalizedChatModel(personalizer=personalizer, user_id="ann")
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are a careful doctor."), ("human", "{question}")]
    )
    chain = prompt | chat | StrOutputParser()
    answer = chain.invoke({"question": QUESTION})
    assert isinstance(answer, str)
    sent = chat.core_llm.last_prompt
    memory = personalizer.memory
    assert memory is not None
    recalled = memory.recall(QUESTION, Scope("ann"), k=personalizer.config.memory_k).context
    assert sent[0].role == "system"
    assert sent[0].content.startswith("You are a careful doctor.")
    assert recalled and recalled in sent[0].content
    assert sent[-1].content == QUESTION
    # The chain's answer is exactly the adapter's greedy answer to that prompt.
    assert answer == personalizer.generate("ann", sent, max_new_tokens=8).text
    reply = chat.invoke([HumanMessage(QUESTION)])
    assert isinstance(reply, AIMessage) and reply.response_metadata["adapter"] is True
    assert reply.usage_metadata is not None and reply.usage_metadata["input_tokens"] > 0


def test_user_is_chosen_per_run_and_never_sees_another_users_memory(
    personalizer: Personalizer,
) -> None:
    chat = PersonalizedChatModel(personalizer=personalizer, user_id="ann").configurable_fields(
        user_id=ConfigurableField(id="user_id")
    )
    chain = ChatPromptTemplate.from_template("{question}") | chat
    reply = chain.invoke(
        {"question": "My ankle hurts"}, config={"configurable": {"user_id": "bob"}}
    )
    meta = reply.response_metadata
    assert (meta["adapter"], meta["user_id"]) == (False, "bob")
    assert meta["model_provider"] == "llm-memories"
    sent = personalizer.llm("bob").last_prompt[0].content
    assert "ankle" in sent and "sugar" not in sent and "diabetes" not in sent


def test_memory_and_adapter_can_be_switched_off(personalizer: Personalizer) -> None:
    plain = PersonalizedChatModel(
        personalizer=personalizer, user_id="ann", use_memory=False, use_adapter=False
    )
    reply = plain.invoke(QUESTION)
    assert reply.response_metadata["adapter"] is False
    assert [m.role for m in plain.core_llm.last_prompt] == ["user"]
    base = personalizer.generate(None, plain.core_llm.last_prompt, max_new_tokens=8).text
    assert reply.content == base


def test_async_chain_and_retriever_chain(personalizer: Personalizer) -> None:
    chat = PersonalizedChatModel(personalizer=personalizer, user_id="ann")
    memory = personalizer.memory
    assert memory is not None
    retriever = dpem_retriever(memory, "ann", k=3)
    chain = (
        {
            "context": retriever | (lambda docs: "\n".join(d.page_content for d in docs)),
            "question": lambda q: q,
        }
        | ChatPromptTemplate.from_template("Notes:\n{context}\n\n{question}")
        | chat
        | StrOutputParser()
    )
    answer = asyncio.run(chain.ainvoke(QUESTION))
    assert isinstance(answer, str)
    sent = chat.core_llm.last_prompt[-1].content
    documents = retriever.invoke(QUESTION)
    assert documents and all(d.page_content in sent for d in documents)
    assert {d.metadata["type"] for d in documents} <= {"user-specific", "common-sense"}
    assert {d.metadata["kind"] for d in documents} == {"dpem_knowledge"}
    assert sent.endswith(QUESTION)


def test_bad_user_id_fails_at_construction(personalizer: Personalizer, tmp_path: Path) -> None:
    with pytest.raises((ValidationError, ValueError)):
        PersonalizedChatModel(personalizer=personalizer, user_id="")


class _PersonalizedSuite:
    """LangChain's chat-model suites over ann's adapter and memory (the tiny model)."""

    @pytest.fixture(autouse=True)
    def _given(self, personalizer: Personalizer) -> None:
        self._personalizer = personalizer

    @property
    def chat_model_class(self) -> type[PersonalizedChatModel]:
        return PersonalizedChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"personalizer": self._personalizer, "user_id": "ann"}


class TestPersonalizedChatModelUnit(_PersonalizedSuite, ChatModelUnitTests):
    pass


class TestPersonalizedChatModelIntegration(_PersonalizedSuite, ChatModelIntegrationTests):
    pass
