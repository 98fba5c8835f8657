"""CoreLLM: a core chat model inside real LlamaIndex chat and query engines."""

from __future__ import annotations

from typing import Any

import pytest
from llama_index.core import Document, VectorStoreIndex
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW

from llamaindex_memories import CoreLLM, LlamaIndexLLM
from memories_core.errors import LLMError
from memories_core.llms import ScriptedLLM
from memories_core.llms.local import LocalLLM
from memories_core.types import ChatMessage as CoreMessage


def echo(messages: Any) -> str:
    """Reply with the roles and texts received, so a test sees what the model was sent."""
    return " | ".join(f"{m.role}={m.content}" for m in messages)


def test_simple_chat_engine_holds_the_conversation() -> None:
    llm = ScriptedLLM(["Hi Ann.", "Your name is Ann."])
    engine = SimpleChatEngine.from_defaults(llm=CoreLLM(llm=llm), system_prompt="Be brief.")
    assert str(engine.chat("My name is Ann")) == "Hi Ann."
    assert str(engine.chat("What is my name?")) == "Your name is Ann."
    assert llm.calls[-1] == (
        CoreMessage("system", "Be brief."),
        CoreMessage("user", "My name is Ann"),
        CoreMessage("assistant", "Hi Ann."),
        CoreMessage("user", "What is my name?"),
    )


async def test_simple_chat_engine_streams_and_runs_async() -> None:
    engine = SimpleChatEngine.from_defaults(llm=CoreLLM(llm=ScriptedLLM(default="streamed")))
    streaming = engine.stream_chat("hi")
    assert "".join(streaming.response_gen) == "streamed"
    assert str(await engine.achat("again")) == "streamed"


def test_query_engine_answers_from_the_retrieved_context() -> None:
    llm = ScriptedLLM(default=echo)
    index = VectorStoreIndex.from_documents(
        [Document(text="The bakery opens at seven."), Document(text="Cats sleep a lot.")]
    )
    engine = index.as_query_engine(llm=CoreLLM(llm=llm), similarity_top_k=1)
    answer = str(engine.query("When does the bakery open?"))
    assert "The bakery opens at seven." in answer
    assert "When does the bakery open?" in answer
    assert llm.usage.calls == 1


def test_complete_and_stream_complete_report_token_counts() -> None:
    llm = ScriptedLLM(default="a completion of some length")
    model = CoreLLM(llm=llm)
    response = model.complete("prompt")
    assert response.text == "a completion of some length"
    assert response.additional_kwargs["completion_tokens"] == llm.usage.completion_tokens
    assert response.additional_kwargs["prompt_tokens"] == llm.usage.prompt_tokens
    chunks = list(model.stream_complete("prompt"))
    assert [c.delta for c in chunks] == ["a completion of some length"]
    assert llm.calls[-1] == (CoreMessage("user", "prompt"),)


def test_usage_round_trips_through_the_reverse_bridge() -> None:
    core = ScriptedLLM(default="four token reply here")
    bridged = LlamaIndexLLM(CoreLLM(llm=core))
    assert bridged.generate([CoreMessage("user", "hi")]) == "four token reply here"
    assert bridged.usage.completion_tokens == core.usage.completion_tokens
    assert bridged.usage.prompt_tokens == core.usage.prompt_tokens


def test_options_reach_the_core_model() -> None:
    seen: list[dict[str, Any]] = []

    class Recording(ScriptedLLM):
        def _generate(self, messages: Any, **options: Any) -> Any:
            seen.append(options)
            return super()._generate(messages, **options)

    model = CoreLLM(llm=Recording(default="yes. no"), max_tokens=9, temperature=0.5, stop=["."])
    reply = model.chat([ChatMessage(role=MessageRole.USER, content="q")])
    assert reply.message.content == "yes"
    assert seen[-1] == {"max_tokens": 9, "temperature": 0.5, "stop": (".",)}
    model.complete("q", max_tokens=2)
    assert seen[-1]["max_tokens"] == 2


def test_metadata() -> None:
    model = CoreLLM(llm=ScriptedLLM(), max_tokens=40)
    assert model.metadata.is_chat_model
    assert model.metadata.model_name == "scripted"
    assert model.metadata.num_output == 40
    assert model.metadata.context_window == DEFAULT_CONTEXT_WINDOW
    assert CoreLLM(llm=ScriptedLLM(), context_window=1000).metadata.context_window == 1000
    offline = CoreLLM()
    assert isinstance(offline.llm, LocalLLM) and not offline.llm.loaded
    assert offline.metadata.context_window == offline.llm.context_tokens
    assert offline.metadata.model_name.startswith("local:")


def test_bad_input_and_failures_are_typed_errors() -> None:
    with pytest.raises(ValueError, match="instance of LLM"):
        CoreLLM(llm=object())
    with pytest.raises(LLMError, match="down"):
        CoreLLM(llm=ScriptedLLM([ConnectionError("down")])).complete("x")
