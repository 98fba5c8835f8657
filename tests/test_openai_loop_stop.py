"""``OpenAIChatLLM(stop_loops=True)``: a streamed reply that repeats itself is cut and closed.

A small model behind an OpenAI-compatible server (llama.cpp's server, Ollama, vLLM) loops as
it does in-process. The server here is an httpx mock that streams server-sent events; a
looping reply streams for ever, so a client that kept reading would never return.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import openai
import pytest

from memories_core.errors import LLMError
from memories_core.llms import OpenAIChatLLM
from memories_core.types import ChatMessage

HELLO = [ChatMessage("user", "Take notes of the dialogue.")]
PREAMBLE = ["{", '"notes"', ":", " [", '"Ann', " adopted", " a", " cat", '",']
#: One note of 14 pieces, written again and again.
CYCLE = [
    ' "',
    "Mel",
    "anie",
    " suggests",
    " painting",
    " as",
    " a",
    " way",
    " to",
    " relax",
    " after",
    " work",
    '"',
    ",",
]


def _event(body: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(body)}\n\n".encode()


def _chunk(piece: str | None = None, usage: dict[str, int] | None = None) -> bytes:
    choices = [] if piece is None else [{"index": 0, "delta": {"content": piece}}]
    body: dict[str, Any] = {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = {**usage, "total_tokens": sum(usage.values())}
    return _event(body)


class Server:
    """Streams ``pieces`` (then for ever ``CYCLE`` when ``loops``); counts what was pulled."""

    def __init__(self, pieces: list[str], *, loops: bool, refuse_usage: bool = False) -> None:
        self.pieces = pieces
        self.loops = loops
        self.refuse_usage = refuse_usage
        self.pulled = 0
        self.requests: list[dict[str, Any]] = []

    def events(self) -> Iterator[bytes]:
        for piece in self.pieces:
            self.pulled += 1
            yield _chunk(piece)
        while self.loops:
            for piece in CYCLE:
                self.pulled += 1
                yield _chunk(piece)
        yield _chunk(usage={"prompt_tokens": 21, "completion_tokens": len(self.pieces)})
        yield b"data: [DONE]\n\n"

    def respond(self, request: httpx2.Request) -> httpx2.Response | None:
        sent = json.loads(request.content)
        self.requests.append(sent)
        if self.refuse_usage and "stream_options" in sent:
            return httpx2.Response(400, json={"error": {"message": "unknown field"}})
        if not sent.get("stream"):
            return httpx2.Response(500, json={"error": {"message": "expected a stream"}})
        return None

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        refused = self.respond(request)
        if refused is not None:
            return refused
        headers = {"content-type": "text/event-stream"}
        return httpx2.Response(200, headers=headers, content=self.events())


def _client(handler: Any) -> openai.OpenAI:
    return openai.OpenAI(
        api_key="k",
        base_url="http://mock/v1",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )


def _llm(server: Server) -> OpenAIChatLLM:
    return OpenAIChatLLM("m", client=_client(server), stop_loops=True)


def test_a_looping_stream_is_cut_after_two_writings_and_closed() -> None:
    server = Server(PREAMBLE, loops=True)
    llm = _llm(server)
    text = llm.generate(HELLO, max_tokens=4000)
    note = "".join(CYCLE)
    assert text.startswith("".join(PREAMBLE))
    assert note in text and text.count("Melanie suggests") == 2
    # Reading stopped at the third writing, not at the 4,000-token cap.
    assert server.pulled < len(PREAMBLE) + 4 * len(CYCLE)
    usage = llm.usage
    assert usage.capped == 1 and usage.calls == 1
    assert usage.completion_tokens == server.pulled  # the pieces read were generated
    assert server.requests[0]["stream"] is True
    assert server.requests[0]["stream_options"] == {"include_usage": True}


def test_a_reply_that_ends_keeps_every_piece_and_the_servers_usage() -> None:
    labels = ['"fact"', ", "] * 30  # a run of short labels is not a loop
    server = Server(["[", *labels, "]"], loops=False)
    llm = _llm(server)
    text = llm.generate(HELLO, stop=["STOP"])
    assert text == "[" + '"fact", ' * 30 + "]"
    assert (llm.usage.prompt_tokens, llm.usage.completion_tokens) == (21, 62)
    assert llm.usage.capped == 0


def test_a_server_that_refuses_the_usage_report_is_asked_without_it() -> None:
    server = Server(["Hello", " there"], loops=False, refuse_usage=True)
    llm = _llm(server)
    assert llm.generate(HELLO) == "Hello there"
    assert llm.generate(HELLO) == "Hello there"
    # The refusal is learnt: the second call sends no stream_options at all.
    assert ["stream_options" in r for r in server.requests] == [True, False, False]
    assert llm.usage.completion_tokens > 0


def test_a_stream_that_fails_midway_is_an_llm_error() -> None:
    def broken() -> Iterator[bytes]:
        yield _chunk("Hel")
        raise httpx2.ReadError("connection reset")

    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=broken())

    llm = OpenAIChatLLM("m", client=_client(handler), stop_loops=True)
    with pytest.raises(LLMError):
        llm.generate(HELLO)
    assert llm.usage.failures == 1


def test_structured_requests_stream_too_and_keep_their_response_format() -> None:
    server = Server(PREAMBLE, loops=True)
    llm = _llm(server)
    from memories_core.llms.base import JsonSchema

    schema = JsonSchema("notes", {"type": "object", "properties": {"notes": {"type": "array"}}})
    text = llm.generate(HELLO, response_format=schema)
    assert text.count("Melanie suggests") == 2
    assert server.requests[0]["response_format"]["type"] == "json_schema"


async def test_the_async_client_cuts_a_looping_stream_too() -> None:
    server = Server(PREAMBLE, loops=True)

    async def events() -> AsyncIterator[bytes]:
        for event in server.events():
            yield event

    async def handler(request: httpx2.Request) -> httpx2.Response:
        server.requests.append(json.loads(request.content))
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=events())

    async_client = openai.AsyncOpenAI(
        api_key="k",
        base_url="http://mock/v1",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
        max_retries=0,
    )
    llm = OpenAIChatLLM("m", api_key="k", async_client=async_client, stop_loops=True)
    text = await llm.agenerate(HELLO, max_tokens=4000)
    assert text.count("Melanie suggests") == 2
    assert server.pulled < len(PREAMBLE) + 4 * len(CYCLE)
    assert llm.usage.capped == 1


def test_without_stop_loops_nothing_is_streamed() -> None:
    requests: list[dict[str, Any]] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        requests.append(json.loads(request.content))
        body = {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "ok"},
                }
            ],
        }
        return httpx2.Response(200, json=body)

    assert OpenAIChatLLM("m", client=_client(handler)).generate(HELLO) == "ok"
    assert "stream" not in requests[0]
