"""Chat models: the BaseLLM template, the scripted fake, and the OpenAI-compatible client."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

import httpx2
import openai
import pytest

import memories_core.llms as llms
from memories_core.errors import ConfigurationError, InvalidInputError, LLMError
from memories_core.interfaces import LLM
from memories_core.llms import BaseLLM, LLMResult, OpenAIChatLLM, ScriptedLLM
from memories_core.llms.base import DEFAULT_MAX_TOKENS, truncate_at_stop
from memories_core.types import ChatMessage

HELLO = [ChatMessage("system", "Be brief."), ChatMessage("user", "hello")]


def test_public_api_is_pinned() -> None:
    assert sorted(llms.__all__) == [
        "BaseLLM",
        "LLMResult",
        "LocalLLM",
        "OpenAIChatLLM",
        "ScriptedLLM",
    ]


def test_importing_package_is_light() -> None:
    code = (
        "import sys, memories_core.llms as m; m.ScriptedLLM;"
        "print(any(k in sys.modules for k in ('openai', 'torch', 'transformers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    with pytest.raises(AttributeError):
        _ = llms.Nope  # type: ignore[attr-defined]


# -- BaseLLM template -------------------------------------------------------------------------


class Echo(BaseLLM):
    def __init__(self, result: Any = None, exc: BaseException | None = None) -> None:
        super().__init__()
        self.result = result
        self.exc = exc
        self.kwargs: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return "echo"

    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        self.kwargs = {"max_tokens": max_tokens, "temperature": temperature, "stop": stop}
        if self.exc is not None:
            raise self.exc
        if self.result is not None:
            return self.result  # type: ignore[no-any-return]
        return LLMResult(messages[-1].content)


def test_base_counts_estimated_tokens_when_backend_reports_none() -> None:
    llm = Echo()
    assert llm.generate(HELLO) == "hello"
    usage = llm.usage
    assert usage.calls == 1 and usage.failures == 0
    assert usage.prompt_tokens > 0 and usage.completion_tokens == 2


def test_base_uses_reported_tokens() -> None:
    llm = Echo(result=LLMResult("x", prompt_tokens=11, completion_tokens=3))
    llm.generate(HELLO)
    assert (llm.usage.prompt_tokens, llm.usage.completion_tokens) == (11, 3)
    llm.reset_usage()
    assert llm.usage.calls == 0


def test_base_passes_options_and_normalises_stop() -> None:
    llm = Echo()
    llm.generate(HELLO, max_tokens=5, temperature=0.7, stop=["\n"])
    assert llm.kwargs == {"max_tokens": 5, "temperature": 0.7, "stop": ("\n",)}
    llm.generate(HELLO, stop="END")
    assert llm.kwargs["stop"] == ("END",)


@pytest.mark.parametrize(
    "messages",
    [
        [],
        "hello",
        ChatMessage("user", "x"),
        [{"role": "user", "content": "x"}],
        None,
        [ChatMessage("user", 3)],
    ],  # type: ignore[arg-type]
)
def test_base_rejects_bad_messages(messages: Any) -> None:
    llm = Echo()
    with pytest.raises(InvalidInputError):
        llm.generate(messages)
    assert llm.usage.failures == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_tokens": 0},
        {"max_tokens": True},
        {"temperature": -1},
        {"temperature": "hot"},
        {"stop": [1]},
    ],
)
def test_base_rejects_bad_options(kwargs: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        Echo().generate(HELLO, **kwargs)


def test_base_wraps_backend_errors_and_counts_failures() -> None:
    cause = ConnectionError("refused")
    llm = Echo(exc=cause)
    with pytest.raises(LLMError, match="refused") as info:
        llm.generate(HELLO)
    assert info.value.__cause__ is cause
    assert llm.usage.failures == 1 and llm.usage.calls == 0


def test_base_keeps_llm_errors_and_interrupts_unwrapped() -> None:
    original = LLMError("quota")
    llm = Echo(exc=original)
    with pytest.raises(LLMError) as info:
        llm.generate(HELLO)
    assert info.value is original and info.value.__cause__ is None
    interrupted = Echo(exc=KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        interrupted.generate(HELLO)
    assert interrupted.usage.failures == 1


def test_base_rejects_non_result() -> None:
    llm = Echo(result="plain str")
    with pytest.raises(LLMError, match="LLMResult"):
        llm.generate(HELLO)
    assert llm.usage.failures == 1


async def test_base_async_defaults_to_thread() -> None:
    llm = Echo()
    assert await llm.agenerate(HELLO) == "hello"
    assert llm.usage.calls == 1
    failing = Echo(exc=ValueError("boom"))
    with pytest.raises(LLMError):
        await failing.agenerate(HELLO)
    assert failing.usage.failures == 1


def test_truncate_at_stop() -> None:
    assert truncate_at_stop("a\nb END c", ["END", "\n"]) == "a"
    assert truncate_at_stop("abc", None) == "abc"
    assert truncate_at_stop("abc", ["", "x"]) == "abc"


# -- ScriptedLLM ------------------------------------------------------------------------------


def test_scripted_sequence_default_and_calls() -> None:
    llm = ScriptedLLM(["one", lambda msgs: msgs[-1].content.upper()], default="dflt")
    assert isinstance(llm, LLM)
    assert llm.remaining == 2
    assert llm.generate(HELLO) == "one"
    assert llm.generate(HELLO) == "HELLO"
    assert llm.generate(HELLO) == "dflt"
    assert llm.remaining == 0
    assert llm.calls == [tuple(HELLO)] * 3
    assert llm.usage.calls == 3
    assert llm.name == "scripted"


def test_scripted_exhausted_raises() -> None:
    llm = ScriptedLLM(["only"])
    llm.generate(HELLO)
    with pytest.raises(LLMError, match="script exhausted"):
        llm.generate(HELLO)
    assert llm.usage.failures == 1


def test_scripted_exception_is_a_counted_failure() -> None:
    llm = ScriptedLLM([TimeoutError("slow"), "ok"])
    with pytest.raises(LLMError) as info:
        llm.generate(HELLO)
    assert isinstance(info.value.__cause__, TimeoutError)
    assert llm.generate(HELLO) == "ok"
    assert (llm.usage.calls, llm.usage.failures) == (1, 1)


def test_scripted_exception_class_is_raised() -> None:
    llm = ScriptedLLM([TimeoutError])
    with pytest.raises(LLMError) as info:
        llm.generate(HELLO)
    assert isinstance(info.value.__cause__, TimeoutError)


def test_scripted_callable_default_and_bad_callable() -> None:
    llm = ScriptedLLM(default=lambda msgs: f"{len(msgs)} messages")
    assert llm.generate(HELLO) == "2 messages"
    bad = ScriptedLLM([lambda msgs: 42])  # type: ignore[list-item,return-value]
    with pytest.raises(LLMError, match="expected str"):
        bad.generate(HELLO)


def test_scripted_honours_stop() -> None:
    llm = ScriptedLLM(["answer\nUser: more"])
    assert llm.generate(HELLO, stop=["\nUser:"]) == "answer"


def test_scripted_rejects_string_script() -> None:
    with pytest.raises(ConfigurationError):
        ScriptedLLM("abc")


def test_scripted_rules() -> None:
    llm = ScriptedLLM.from_rules(
        [
            (r"summari[sz]e", "a summary"),
            (lambda msgs: msgs[0].role == "system" and "JSON" in msgs[0].content, '{"a": 1}'),
            ("explode", RuntimeError("bad rule")),
        ],
        default="fallback",
    )
    assert llm.generate([ChatMessage("user", "Please SUMMARIZE this")]) == "a summary"
    assert (
        llm.generate([ChatMessage("system", "Reply in JSON"), ChatMessage("user", "x")])
        == '{"a": 1}'
    )
    assert llm.generate([ChatMessage("user", "something else")]) == "fallback"
    with pytest.raises(LLMError):
        llm.generate([ChatMessage("user", "explode now")])
    # Rules read the LAST user message, not earlier ones.
    convo = [
        ChatMessage("user", "summarize"),
        ChatMessage("assistant", "ok"),
        ChatMessage("user", "thanks"),
    ]
    assert llm.generate(convo) == "fallback"


def test_scripted_rules_without_default_and_bad_rule() -> None:
    llm = ScriptedLLM.from_rules([("yes", "y")])
    with pytest.raises(LLMError, match="no rule matched"):
        llm.generate(HELLO)
    with pytest.raises(ConfigurationError):
        ScriptedLLM.from_rules([(42, "x")])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError):
        ScriptedLLM.from_rules(["not a pair"])  # type: ignore[list-item]


def test_scripted_is_thread_safe() -> None:
    n = 200
    llm = ScriptedLLM([str(i) for i in range(n)])
    answers: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(n // 4):
            out = llm.generate(HELLO)
            with lock:
                answers.append(out)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers, key=int) == [str(i) for i in range(n)]
    assert len(llm.calls) == n and llm.usage.calls == n


async def test_scripted_async() -> None:
    llm = ScriptedLLM(["a", "b"])
    results = await asyncio.gather(llm.agenerate(HELLO), llm.agenerate(HELLO))
    assert sorted(results) == ["a", "b"]


# -- OpenAIChatLLM ----------------------------------------------------------------------------


def _completion(content: str | None, usage: dict[str, int] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": content},
            }
        ],
    }
    if usage is not None:
        body["usage"] = {**usage, "total_tokens": sum(usage.values())}
    return body


class Recorder:
    """An httpx2 handler that records requests and answers with a canned completion."""

    def __init__(self, body: dict[str, Any], status: int = 200) -> None:
        self.body = body
        self.status = status
        self.requests: list[dict[str, Any]] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append({"url": str(request.url), "json": json.loads(request.content)})
        return httpx2.Response(self.status, json=self.body)


def _mock_client(handler: Recorder) -> openai.OpenAI:
    transport = httpx2.MockTransport(handler)
    return openai.OpenAI(
        api_key="test",
        base_url="http://mock/v1",
        http_client=httpx2.Client(transport=transport),
        max_retries=0,
    )


def test_openai_request_and_reported_usage() -> None:
    handler = Recorder(_completion("Hi!", {"prompt_tokens": 12, "completion_tokens": 3}))
    llm = OpenAIChatLLM("test-model", client=_mock_client(handler), extra_body={"num_ctx": 4096})
    assert llm.name == "openai:test-model"
    assert llm.generate(HELLO, max_tokens=20, stop=["\n\n"]) == "Hi!"
    sent = handler.requests[0]
    assert sent["url"] == "http://mock/v1/chat/completions"
    assert sent["json"]["model"] == "test-model"
    assert sent["json"]["messages"] == [m.to_dict() for m in HELLO]
    assert sent["json"]["max_tokens"] == 20
    assert sent["json"]["stop"] == ["\n\n"]
    assert sent["json"]["temperature"] == 0.0
    assert sent["json"]["num_ctx"] == 4096
    assert (llm.usage.prompt_tokens, llm.usage.completion_tokens) == (12, 3)


def test_openai_without_usage_estimates_and_truncates_stop() -> None:
    handler = Recorder(_completion("answer STOP ignored"))
    llm = OpenAIChatLLM("m", client=_mock_client(handler))
    assert llm.generate(HELLO, stop=["STOP"]) == "answer "
    # A call without max_tokens still has an output cap: the model's default.
    assert handler.requests[0]["json"]["max_tokens"] == DEFAULT_MAX_TOKENS == llm.max_tokens
    assert llm.usage.prompt_tokens > 0 and llm.usage.completion_tokens > 0


def test_openai_null_content_is_empty_string() -> None:
    llm = OpenAIChatLLM("m", client=_mock_client(Recorder(_completion(None))))
    assert llm.generate(HELLO) == ""


def test_openai_server_error_becomes_llm_error() -> None:
    handler = Recorder(
        {"error": {"message": "model overloaded", "type": "server_error"}}, status=500
    )
    llm = OpenAIChatLLM("m", client=_mock_client(handler))
    with pytest.raises(LLMError) as info:
        llm.generate(HELLO)
    assert isinstance(info.value.__cause__, openai.APIError)
    assert llm.usage.failures == 1


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_openai_unreachable_server_becomes_llm_error() -> None:
    # The network is blocked in unit tests, so this fails fast without touching a socket.
    llm = OpenAIChatLLM("m", base_url="http://127.0.0.1:9/v1", max_retries=0, timeout=2)
    with pytest.raises(LLMError):
        llm.generate(HELLO)


def test_openai_fake_client_duck_typed() -> None:
    class Completions:
        def __init__(self) -> None:
            self.kwargs: dict[str, Any] = {}

        def create(self, **kwargs: Any) -> Any:
            self.kwargs = kwargs
            return openai.types.chat.ChatCompletion.model_validate(_completion("fake"))

    class Chat:
        completions = Completions()

    class FakeClient:
        chat = Chat()

    client = FakeClient()
    llm = OpenAIChatLLM("m", client=client)  # type: ignore[arg-type]
    assert llm.generate(HELLO, temperature=0.3) == "fake"
    assert client.chat.completions.kwargs["temperature"] == 0.3


async def test_openai_async_native_client() -> None:
    async def handler(request: httpx2.Request) -> httpx2.Response:
        assert json.loads(request.content)["model"] == "m"
        return httpx2.Response(
            200, json=_completion("async hi", {"prompt_tokens": 5, "completion_tokens": 2})
        )

    async_client = openai.AsyncOpenAI(
        api_key="k",
        base_url="http://mock/v1",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )
    llm = OpenAIChatLLM("m", api_key="k", async_client=async_client)
    assert await llm.agenerate(HELLO) == "async hi"
    assert llm.usage.prompt_tokens == 5


async def test_openai_async_with_injected_sync_client_uses_thread() -> None:
    handler = Recorder(_completion("via thread"))
    llm = OpenAIChatLLM("m", client=_mock_client(handler))
    assert await llm.agenerate(HELLO) == "via thread"
    assert len(handler.requests) == 1


async def test_openai_async_client_built_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    built: list[dict[str, Any]] = []

    class FakeAsync:
        def __init__(self, **kwargs: Any) -> None:
            built.append(kwargs)

            async def create(**_: Any) -> Any:
                return openai.types.chat.ChatCompletion.model_validate(_completion("lazy"))

            self.chat = type(
                "Chat", (), {"completions": type("C", (), {"create": staticmethod(create)})()}
            )()

    llm = OpenAIChatLLM("m", base_url="http://local:11434/v1")
    monkeypatch.setattr(openai, "AsyncOpenAI", FakeAsync)
    assert built == []
    assert await llm.agenerate(HELLO) == "lazy"
    assert await llm.agenerate(HELLO) == "lazy"
    assert len(built) == 1
    assert built[0]["base_url"] == "http://local:11434/v1"
    assert built[0]["api_key"] == "not-needed"


def test_openai_rejects_contradictory_arguments() -> None:
    client = _mock_client(Recorder(_completion("x")))
    with pytest.raises(ConfigurationError, match="not both"):
        OpenAIChatLLM("m", client=client, base_url="http://x/v1")
    with pytest.raises(ConfigurationError, match="not both"):
        OpenAIChatLLM("m", client=client, api_key="k")


@pytest.mark.parametrize("kwargs", [{"timeout": 0}, {"max_retries": -1}, {"model": ""}])
def test_openai_rejects_bad_options(kwargs: dict[str, Any]) -> None:
    args: dict[str, Any] = {"api_key": "k", **kwargs}
    with pytest.raises(ConfigurationError):
        OpenAIChatLLM(**args)


def test_openai_reads_env_at_construction_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="API key"):
        OpenAIChatLLM()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://env-server/v1")
    llm = OpenAIChatLLM()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-later")
    client = llm._client
    assert client.api_key == "sk-env"
    assert str(client.base_url).startswith("http://env-server/v1")
    assert "sk-env" not in repr(llm)


def test_llm_classes_satisfy_protocol() -> None:
    llm = OpenAIChatLLM("m", api_key="k")
    assert isinstance(llm, LLM)
    assert isinstance(ScriptedLLM(), LLM)


def _names(msgs: Sequence[ChatMessage]) -> str:
    return ",".join(m.role for m in msgs)


def test_messages_are_copied_not_mutated() -> None:
    msgs = list(HELLO)
    llm = ScriptedLLM([_names])
    assert llm.generate(msgs) == "system,user"
    msgs.append(ChatMessage("user", "later"))
    assert llm.calls[0] == tuple(HELLO)


# ------------------------------------------------------------------ batches
def test_generate_batch_answers_each_conversation_in_order_and_counts_each() -> None:
    llm = ScriptedLLM([], default=lambda messages: "re: " + messages[-1].content)
    replies = llm.generate_batch(
        [[ChatMessage("user", "one")], [ChatMessage("user", "two.\nUser: more")]],
        stop=["\nUser:"],
    )
    assert [r.text for r in replies] == ["re: one", "re: two."]
    assert all(r.prompt_tokens and r.completion_tokens for r in replies)
    assert llm.usage.calls == 2 and llm.usage.failures == 0
    assert llm.generate_batch([]) == [] and llm.usage.calls == 2


@pytest.mark.parametrize(
    "conversations",
    ["not a list", [[]], [[ChatMessage("user", "ok")], "text"]],
)
def test_generate_batch_refuses_a_malformed_batch_before_running_any(
    conversations: Any,
) -> None:
    llm = ScriptedLLM([], default="x")
    with pytest.raises(InvalidInputError):
        llm.generate_batch(conversations)
    assert llm.usage.calls == 0 and llm.usage.failures == 0


def test_generate_batch_refuses_a_backend_that_drops_replies() -> None:
    class Short(ScriptedLLM):
        def _generate_batch(self, conversations: Any, **options: Any) -> list[LLMResult]:
            return super()._generate_batch(conversations, **options)[:-1]

    llm = Short([], default="x")
    with pytest.raises(LLMError, match="1 replies for 2 conversations"):
        llm.generate_batch([[ChatMessage("user", "a")], [ChatMessage("user", "b")]])
    assert llm.usage.failures == 1 and llm.usage.calls == 0


def test_a_batch_may_take_one_calls_timeout_per_conversation_unless_told() -> None:
    # A batch does the work of n calls and lasts as long as its longest reply; with one
    # call's timeout, a writer's batch of eight timed out on a loaded CPU.
    seen: list[float | None] = []

    class Timed(ScriptedLLM):
        enforces_timeout = True  # reads its limit itself, like the local model

        def _generate_batch(self, conversations: Any, **options: Any) -> list[LLMResult]:
            seen.append(self.call_timeout())
            return super()._generate_batch(conversations, **options)

    llm = Timed([], default="x")
    llm.timeout = 30.0
    three = [[ChatMessage("user", t)] for t in "abc"]
    llm.generate_batch(three)
    llm.generate_batch(three, timeout=5.0)  # a given timeout is the whole batch's
    llm.generate_batch(three[:1])
    assert seen == [90.0, 5.0, 30.0]
    unlimited = Timed([], default="x")
    unlimited.timeout = None
    unlimited.generate_batch(three)
    assert seen[-1] is None


def test_replies_that_reach_their_output_cap_are_counted() -> None:
    # A model looping on a list until max_tokens stops it writes a cut reply; usage says how
    # often, where the backend reports its token counts.
    llm = Echo(result=LLMResult("a b c", prompt_tokens=3, completion_tokens=16))
    llm.generate(HELLO, max_tokens=16)
    llm.generate(HELLO, max_tokens=64)
    assert (llm.usage.calls, llm.usage.capped) == (2, 1)
    unreported = Echo(result=LLMResult("word " * 40))  # counts estimated: never "capped"
    unreported.generate(HELLO, max_tokens=4)
    assert unreported.usage.capped == 0

    class Lengths(ScriptedLLM):
        def _generate_batch(self, conversations: Any, **options: Any) -> list[LLMResult]:
            return [LLMResult("x", 1, n) for n in (8, 3, 8)]

    batch = Lengths([], default="x")
    batch.generate_batch([[ChatMessage("user", t)] for t in "abc"], max_tokens=8)
    assert (batch.usage.calls, batch.usage.capped) == (3, 2)
    assert (batch.usage - batch.usage).capped == 0
