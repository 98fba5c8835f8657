"""CoreChatModel: a core chat model inside real LCEL chains, and LangChain's standard tests."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_tests.unit_tests import ChatModelUnitTests
from pydantic import BaseModel

from langchain_memories import CoreChatModel
from memories_core.errors import InvalidInputError, LLMError
from memories_core.llms import ScriptedLLM
from memories_core.llms.base import JsonObject, JsonSchema
from memories_core.types import ChatMessage
from memories_core.usage import Usage

SCHEMA_MODES = frozenset({"json_schema", "json_object"})


def echo(messages: Any) -> str:
    """Reply with the roles and texts received, so a test sees what the model was sent."""
    return " | ".join(f"{m.role}={m.content}" for m in messages)


class TestCoreChatModelStandard(ChatModelUnitTests):
    """LangChain's standard unit tests for chat models."""

    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return CoreChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"llm": ScriptedLLM(default="ok", structured_output=SCHEMA_MODES)}


def test_lcel_chain_sends_the_prompt_and_returns_the_reply() -> None:
    llm = ScriptedLLM(default=echo)
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are terse."), ("human", "Name a {thing}.")]
    )
    chain = prompt | CoreChatModel(llm=llm) | StrOutputParser()
    assert chain.invoke({"thing": "fruit"}) == "system=You are terse. | user=Name a fruit."
    assert llm.calls[-1] == (
        ChatMessage("system", "You are terse."),
        ChatMessage("user", "Name a fruit."),
    )


def test_conversation_roles_reach_the_core_model() -> None:
    llm = ScriptedLLM(default=echo)
    CoreChatModel(llm=llm).invoke(
        [SystemMessage("s"), HumanMessage("q1"), AIMessage("a1"), HumanMessage("q2")]
    )
    assert [m.role for m in llm.calls[-1]] == ["system", "user", "assistant", "user"]


def test_usage_metadata_is_the_core_models_count_per_call() -> None:
    llm = ScriptedLLM(["a short answer", "a much longer answer than the first one was"])
    model = CoreChatModel(llm=llm)
    first = model.invoke("question one")
    between = llm.usage
    second = model.invoke("question two")
    assert first.usage_metadata is not None and second.usage_metadata is not None
    assert first.usage_metadata["input_tokens"] == between.prompt_tokens
    assert first.usage_metadata["output_tokens"] == between.completion_tokens
    assert (
        second.usage_metadata["output_tokens"]
        == llm.usage.completion_tokens - between.completion_tokens
    )
    assert second.usage_metadata["output_tokens"] > first.usage_metadata["output_tokens"]
    assert first.usage_metadata["total_tokens"] == (
        first.usage_metadata["input_tokens"] + first.usage_metadata["output_tokens"]
    )


def test_batch_gives_each_input_its_own_reply_and_usage() -> None:
    llm = ScriptedLLM.from_rules([("alpha", "A"), ("beta", "B B B B B B B B B B B B")])
    replies = CoreChatModel(llm=llm).batch(["alpha", "beta", "alpha"])
    assert [r.text for r in replies] == ["A", "B B B B B B B B B B B B", "A"]
    usages = [r.usage_metadata for r in replies if isinstance(r, AIMessage)]
    assert [u["output_tokens"] for u in usages if u] == [1, 6, 1]
    assert llm.usage.calls == 3


def test_stream_yields_the_reply_in_one_chunk_with_usage() -> None:
    model = CoreChatModel(llm=ScriptedLLM(default="streamed reply"))
    chunks = list(model.stream("hi"))
    assert len(chunks) == 1
    assert chunks[0].text == "streamed reply"
    assert chunks[0].usage_metadata is not None
    assert chunks[0].usage_metadata["output_tokens"] > 0

    async def collect() -> list[str]:
        return [c.text async for c in model.astream("hi")]

    assert asyncio.run(collect()) == ["streamed reply"]


async def test_async_invoke_and_chain() -> None:
    chain = (
        ChatPromptTemplate.from_template("{q}")
        | CoreChatModel(llm=ScriptedLLM(default=echo))
        | StrOutputParser()
    )
    assert await chain.ainvoke({"q": "hello"}) == "user=hello"


def test_stop_max_tokens_and_temperature_reach_the_core_model() -> None:
    seen: list[dict[str, Any]] = []

    class Recording(ScriptedLLM):
        def _generate(self, messages: Any, **options: Any) -> Any:
            seen.append(options)
            return super()._generate(messages, **options)

    model = CoreChatModel(
        llm=Recording(default="one. two. three"), max_tokens=7, temperature=0.3, stop=["three"]
    )
    assert model.invoke("x").text == "one. two. "
    assert seen[-1] == {"max_tokens": 7, "temperature": 0.3, "stop": ("three",)}
    assert model.invoke("x", stop=["."], max_tokens=2, temperature=0).text == "one"
    assert seen[-1] == {"max_tokens": 2, "temperature": 0.0, "stop": (".",)}
    assert model.bind(max_tokens=3).invoke("x").text == "one. two. "
    assert seen[-1]["max_tokens"] == 3


class Person(BaseModel):
    name: str
    age: int


def test_with_structured_output_decodes_under_the_schema() -> None:
    llm = ScriptedLLM(default='{"name": "Ann", "age": 31}', structured_output=SCHEMA_MODES)
    structured = CoreChatModel(llm=llm).with_structured_output(Person)
    chain = ChatPromptTemplate.from_template("Who is {who}?") | structured
    assert chain.invoke({"who": "Ann"}) == Person(name="Ann", age=31)
    fmt = llm.response_formats[-1]
    assert isinstance(fmt, JsonSchema)
    assert fmt.name == "Person"
    assert set(fmt.schema["required"]) == {"name", "age"}

    as_dict = CoreChatModel(llm=llm).with_structured_output(Person.model_json_schema())
    assert as_dict.invoke("Ann?") == {"name": "Ann", "age": 31}
    CoreChatModel(llm=llm).with_structured_output(Person, method="json_mode").invoke("Ann?")
    assert isinstance(llm.response_formats[-1], JsonObject)


def test_with_structured_output_include_raw_keeps_a_parsing_error() -> None:
    llm = ScriptedLLM(default="not json at all", structured_output=SCHEMA_MODES)
    out = CoreChatModel(llm=llm).with_structured_output(Person, include_raw=True).invoke("x")
    assert isinstance(out, dict)
    assert out["parsed"] is None
    assert out["parsing_error"] is not None
    assert out["raw"].text == "not json at all"


def test_with_structured_output_needs_a_model_that_offers_it() -> None:
    with pytest.raises(ValueError, match="json_schema"):
        CoreChatModel(llm=ScriptedLLM(default="{}")).with_structured_output(Person)
    with pytest.raises(ValueError, match="method"):
        CoreChatModel(llm=ScriptedLLM(structured_output=SCHEMA_MODES)).with_structured_output(
            Person, method="tools"
        )  # type: ignore[arg-type]


def test_bad_input_and_failures_are_typed_errors() -> None:
    with pytest.raises(ValueError, match="instance of LLM"):
        CoreChatModel(llm="not a model")
    model = CoreChatModel(llm=ScriptedLLM([TimeoutError("slow")]))
    with pytest.raises(LLMError, match="slow"):
        model.invoke("x")
    with pytest.raises(InvalidInputError, match="tools"):
        CoreChatModel(llm=ScriptedLLM(default="x")).invoke("x", tools=[])
    with pytest.raises(InvalidInputError, match="max_tokens"):
        CoreChatModel(llm=ScriptedLLM(default="x")).invoke("x", max_tokens=0)


def test_any_implementation_of_the_llm_protocol_works() -> None:
    class Minimal:
        """An LLM that is not a BaseLLM: token counts are estimated from the text."""

        usage = Usage()

        def generate(self, messages: Any, **options: Any) -> str:
            return "twelve chars STOP tail"

        async def agenerate(self, messages: Any, **options: Any) -> str:
            return self.generate(messages)

    reply = CoreChatModel(llm=Minimal(), stop=["STOP"]).invoke("hello there")
    assert reply.text == "twelve chars "
    assert reply.usage_metadata is not None
    assert reply.usage_metadata["output_tokens"] > 0


def test_the_default_is_the_offline_model_not_yet_loaded() -> None:
    from memories_core.llms.local import LocalLLM

    model = CoreChatModel()
    assert isinstance(model.llm, LocalLLM)
    assert not model.llm.loaded
    assert model.model_name.startswith("local:")
