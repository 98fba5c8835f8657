"""PersonalizedLlamaLLM inside real LlamaIndex engines (tiny model, real adapter, real DPeM)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.base.response.schema import Response
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.query_engine import RetrieverQueryEngine

from llamaindex_memories import PersonalizedLlamaLLM, dpem_retriever
from memories_core.personalize import Personalizer
from memories_core.types import Scope
from personalize_setup import trained_personalizer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None, reason="extra 'personalize' not installed"
)

QUESTION = "I got red spots on my skin recently"


@pytest.fixture(scope="module")
def personalizer(tmp_path_factory: pytest.TempPathFactory) -> Personalizer:
    return trained_personalizer(tmp_path_factory.mktemp("li") / "m")


def test_chat_engine_answers_with_adapter_and_memory(personalizer: Personalizer) -> None:
    llm = PersonalizedLlamaLLM(personalizer=personalizer, user_id="ann")
    engine = SimpleChatEngine.from_defaults(llm=llm, system_prompt="You are a careful doctor.")
    response = engine.chat(QUESTION)
    sent = llm.core_llm.last_prompt
    memory = personalizer.memory
    assert memory is not None
    recalled = memory.recall(QUESTION, Scope("ann"), k=personalizer.config.memory_k).context
    assert sent[0].role == "system" and "You are a careful doctor." in sent[0].content
    assert recalled and recalled in sent[0].content
    assert sent[-1].content == QUESTION
    assert response.response == personalizer.generate("ann", sent, max_new_tokens=8).text
    assert llm.core_llm.trace.adapter is True
    # The engine keeps its chat history and sends it on the next turn.
    engine.chat("And my feet?")
    assert [m.content for m in llm.core_llm.last_prompt[1:]][-1] == "And my feet?"
    assert QUESTION in [m.content for m in llm.core_llm.last_prompt]


def test_query_engine_over_the_dpem_retriever(personalizer: Personalizer) -> None:
    memory = personalizer.memory
    assert memory is not None
    llm = PersonalizedLlamaLLM(personalizer=personalizer, user_id="ann")
    engine = RetrieverQueryEngine.from_args(dpem_retriever(memory, "ann", k=3), llm=llm)
    response = engine.query("What should I keep steady?")
    assert isinstance(response, Response) and isinstance(response.response, str)
    assert response.source_nodes
    sent = llm.core_llm.last_prompt[-1].content
    assert all(node.node.get_content() in sent for node in response.source_nodes)


def test_completion_streaming_and_async(personalizer: Personalizer) -> None:
    llm = PersonalizedLlamaLLM(personalizer=personalizer, user_id="bob")
    done = llm.complete("My ankle hurts")
    assert done.additional_kwargs == {"adapter": False, "user_id": "bob"}
    streamed = list(llm.stream_complete("My ankle hurts"))
    assert streamed[-1].text == done.text
    chat = asyncio.run(llm.achat([ChatMessage(role=MessageRole.USER, content="My ankle hurts")]))
    assert chat.message.content == done.text
    assert "sugar" not in llm.core_llm.last_prompt[0].content
    assert llm.metadata.is_chat_model and llm.metadata.model_name.startswith("malp:")
