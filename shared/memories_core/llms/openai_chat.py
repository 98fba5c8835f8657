"""Chat model over any OpenAI-compatible server: OpenAI, Ollama, vLLM, llama.cpp server, ..."""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from memories_core.errors import ConfigurationError, LLMError, LLMTimeoutError, MissingExtraError
from memories_core.llms import cancel
from memories_core.llms.base import (
    DEFAULT_MAX_TOKENS,
    BaseLLM,
    JsonSchema,
    LLMResult,
    ResponseFormat,
    truncate_at_stop,
)
from memories_core.llms.loops import loop_end
from memories_core.types import ChatMessage

if TYPE_CHECKING:
    import openai

__all__ = ["OpenAIChatLLM"]

# Schema keywords OpenAI's strict mode refuses; the bounds are a local-model safeguard only.
_STRICT_UNSUPPORTED = frozenset({"minLength", "maxLength"})


def _strict_schema(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strict_schema(v) for k, v in node.items() if k not in _STRICT_UNSUPPORTED}
    if isinstance(node, list):
        return [_strict_schema(v) for v in node]
    return node


def _rejected(exc: Exception) -> bool:
    """Whether the server refused the request itself (400/422), not failed to serve it."""
    return getattr(exc, "status_code", None) in (400, 422)


# Local OpenAI-compatible servers (Ollama, vLLM, llama.cpp) accept any key, but the openai
# client refuses to start without one.
_PLACEHOLDER_KEY = "not-needed"


def _raise_typed(exc: Exception, limit: float | None) -> None:
    """Raise the client's timeout as ``LLMTimeoutError``; return for any other error."""
    if type(exc).__name__ == "APITimeoutError" and limit is not None:
        raise LLMTimeoutError(f"the request took longer than {limit:g} s", timeout=limit) from exc


class _StreamedReply:
    """The pieces of one streamed reply, and where it fell into a cycle (``stop_loops``).

    Servers stream about one token per piece, so the pieces are the tokens of
    :func:`~memories_core.llms.loops.loop_end` (equal pieces, equal ids).
    """

    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.refusal = ""
        self.usage: Any = None
        self.end: int | None = None
        self._ids: list[int] = []
        self._codes: dict[str, int] = {}

    def take(self, chunk: Any) -> bool:
        """Read one chunk; ``True`` once the reply repeats itself (stop reading)."""
        self.usage = getattr(chunk, "usage", None) or self.usage
        choices = getattr(chunk, "choices", None)
        if not choices:
            return False
        delta = getattr(choices[0], "delta", None)
        self.refusal += getattr(delta, "refusal", None) or ""
        piece = getattr(delta, "content", None)
        if not piece:
            return False
        self.pieces.append(piece)
        self._ids.append(self._codes.setdefault(piece, len(self._codes)))
        self.end = loop_end(self._ids)
        return self.end is not None

    def result(self, name: str, stop: tuple[str, ...] | None) -> LLMResult:
        """The reply (its cycle's first two writings, if it looped) and its token counts."""
        text = "".join(self.pieces[: self.end])
        if not text and self.refusal:
            raise LLMError(f"{name} refused: {self.refusal}")
        prompt = getattr(self.usage, "prompt_tokens", None)
        completion = getattr(self.usage, "completion_tokens", None)
        return LLMResult(
            truncate_at_stop(text, stop),
            prompt_tokens=prompt if isinstance(prompt, int) else None,
            # A reply cut in a loop has no usage report: the pieces read were generated.
            completion_tokens=completion if isinstance(completion, int) else len(self.pieces),
            looped=self.end is not None,
        )


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        error = MissingExtraError("openai", "default")
        message = "openai is not installed; it is a dependency of llm-memories: pip install openai"
        # ImportError renders `msg`, BaseException renders `args`: set both.
        error.msg = message
        error.args = (message,)
        raise error from exc
    return openai


class OpenAIChatLLM(BaseLLM):
    """Chat completions from OpenAI or any OpenAI-compatible server.

    Setup:
        For OpenAI, set ``OPENAI_API_KEY``. For a local server give its ``base_url`` (or set
        ``OPENAI_BASE_URL``); no key is needed then. The environment is read when the object
        is built, never at import.

    Key init args:
        model: Model name as the server knows it (``"gpt-4o-mini"``, ``"llama3.2"``, ...).
        base_url: Server URL ending in ``/v1``; ``None`` uses ``OPENAI_BASE_URL`` or OpenAI.
        api_key: ``None`` uses ``OPENAI_API_KEY``.
        client: A ready ``openai.OpenAI`` client instead of ``base_url``/``api_key``.
        async_client: A ready ``openai.AsyncOpenAI`` for native async calls. Without it, async
            calls build one from ``base_url``/``api_key``, or, when ``client`` was injected,
            run the sync client in a worker thread (so an injected client's transport is used
            for both).
        timeout: Seconds a call may take, retries included (a call's own ``timeout``
            overrides it); past it the call raises ``LLMTimeoutError``.
        max_tokens: Output cap of a call that gives no ``max_tokens``.
        max_retries: Retries of the openai client on connection errors, 429 and 5xx.
        extra_body: Extra JSON fields sent with every request (e.g. ``{"num_ctx": 8192}``
            for Ollama, ``{"top_k": 20}`` for vLLM).
        structured_output: Offer structured output (``response_format``): a JSON schema
            (strict) first; when the server rejects it (HTTP 400/422), JSON mode; when that
            is rejected too, no ``response_format`` (the parser and its repair retry then do
            the work). A rejected mode is remembered for the object's lifetime. ``False``
            keeps every prompt in the paper's tagged text format.
        stop_loops: Stream each reply and stop reading it once it repeats itself (the rule
            of ``LocalLLM(stop_loops=True)``, over the streamed pieces): the reply keeps the
            cycle's first two writings and is counted as ``capped``. Closing the stream
            ends generation on servers that stop on a disconnect (vLLM, llama.cpp's server,
            Ollama). For small local models, whose greedy replies can loop until the cap;
            off by default (large hosted models rarely loop). Usage comes from the
            stream's usage report (``stream_options``; a server that refuses it is asked
            without it, and its prompt tokens are then estimated).

    Instantiate:
        .. code-block:: python

            llm = OpenAIChatLLM("gpt-4o-mini")
            ollama = OpenAIChatLLM("llama3.2", base_url="http://localhost:11434/v1")

    Invoke:
        .. code-block:: python

            from memories_core.types import ChatMessage

            text = llm.generate([ChatMessage("user", "Say hi")], max_tokens=20)
            print(llm.usage.total_tokens)   # from the server's usage report

    Async:
        .. code-block:: python

            text = await llm.agenerate([ChatMessage("user", "Say hi")])

    Raises:
        ConfigurationError: if ``client`` is given together with ``base_url`` or ``api_key``,
            if no API key can be found for OpenAI itself, or if an option is out of range.
    """

    def __init__(
        self,
        model: str = "gpt-4o-mini",
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: openai.OpenAI | None = None,
        async_client: openai.AsyncOpenAI | None = None,
        timeout: float = 60,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
        max_retries: int = 2,
        extra_body: Mapping[str, Any] | None = None,
        structured_output: bool = True,
        stop_loops: bool = False,
    ) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigurationError(f"timeout must be a positive number, got {timeout!r}")
        super().__init__(timeout=timeout, max_tokens=max_tokens)
        if not isinstance(model, str) or not model.strip():
            raise ConfigurationError("model must be a non-empty string")
        if client is not None and (base_url is not None or api_key is not None):
            raise ConfigurationError(
                "pass either client= or base_url=/api_key=, not both: the client already "
                "holds its URL and key"
            )
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise ConfigurationError(f"timeout must be a positive number, got {timeout!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise ConfigurationError(f"max_retries must be an int >= 0, got {max_retries!r}")
        self._model = model
        self._timeout = float(timeout)
        self._max_retries = max_retries
        # Copied so a caller mutating its dict later cannot change our requests.
        self._extra_body = dict(extra_body) if extra_body else None
        self._async_client = async_client
        self._async_lock = threading.Lock()
        self._injected = client is not None
        self._offers_structured = bool(structured_output)
        self._stop_loops = bool(stop_loops)
        # Cleared when the server refused a streamed request with stream_options only.
        self._stream_usage = True
        # Modes the server refused with HTTP 400/422; never sent again.
        self._refused: set[str] = set()
        if client is not None:
            self._client = client
            self._base_url: str | None = None
            self._api_key: str | None = None
            return
        self._base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = api_key or os.environ.get("OPENAI_API_KEY") or None
        if key is None:
            if self._base_url is None:
                raise ConfigurationError(
                    "no API key: pass api_key=, set OPENAI_API_KEY, or give the base_url of "
                    "a local OpenAI-compatible server"
                )
            key = _PLACEHOLDER_KEY
        self._api_key = key
        openai_module = _import_openai()
        # Building the client opens no connection; requests start on the first call.
        self._client = openai_module.OpenAI(
            api_key=key, base_url=self._base_url, timeout=self._timeout, max_retries=max_retries
        )

    @property
    def name(self) -> str:
        """``openai:<model>``."""
        return f"openai:{self._model}"

    @property
    def model(self) -> str:
        """Model name sent to the server."""
        return self._model

    @property
    def structured_output(self) -> frozenset[str]:
        """``json_schema`` and ``json_object`` unless disabled (a refusing server falls back)."""
        if not self._offers_structured:
            return frozenset()
        return frozenset({"json_schema", "json_object"})

    def _formats(self, fmt: ResponseFormat) -> list[tuple[str, dict[str, Any] | None]]:
        """The ``response_format`` values to try, strongest first, skipping refused ones."""
        tries: list[tuple[str, dict[str, Any] | None]] = []
        if isinstance(fmt, JsonSchema):
            schema = {"name": fmt.name, "schema": _strict_schema(dict(fmt.schema)), "strict": True}
            tries.append(("json_schema", {"type": "json_schema", "json_schema": schema}))
        tries.append(("json_object", {"type": "json_object"}))
        tries = [t for t in tries if t[0] not in self._refused]
        return [*tries, ("none", None)]

    def _structured_request(
        self, base: dict[str, Any], mode: str, response_format: dict[str, Any] | None
    ) -> dict[str, Any]:
        return base if response_format is None else {**base, "response_format": response_format}

    def _refuse(self, mode: str, exc: Exception) -> None:
        if mode == "none" or not _rejected(exc):
            _raise_typed(exc, self.call_timeout())
            raise exc
        self._refused.add(mode)

    def _generate_structured(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        response_format: ResponseFormat,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        base = self._request(messages, max_tokens, temperature, stop)
        for mode, rf in self._formats(response_format):
            try:
                return self._create(self._client, self._structured_request(base, mode, rf), stop)
            except LLMError:
                raise
            except Exception as exc:
                self._refuse(mode, exc)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _agenerate_structured(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        response_format: ResponseFormat,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        client = self._get_async_client()
        if client is None:
            return await super()._agenerate_structured(
                messages,
                response_format=response_format,
                max_tokens=max_tokens,
                temperature=temperature,
                stop=stop,
            )
        base = self._request(messages, max_tokens, temperature, stop)
        for mode, rf in self._formats(response_format):
            try:
                return await self._acreate(client, self._structured_request(base, mode, rf), stop)
            except LLMError:
                raise
            except Exception as exc:
                self._refuse(mode, exc)
        raise AssertionError("unreachable")  # pragma: no cover

    def _request(
        self,
        messages: tuple[ChatMessage, ...],
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "model": self._model,
            "messages": [m.to_dict() for m in messages],
            "temperature": temperature,
        }
        if max_tokens is not None:
            # max_tokens, not max_completion_tokens: every compatible server understands it.
            kwargs["max_tokens"] = max_tokens
        limit = self.call_timeout()
        if limit is not None:
            # The client's own request timeout, so that a call the caller stopped waiting
            # for does not keep its connection open.
            kwargs["timeout"] = limit
        if stop:
            kwargs["stop"] = list(stop)
        if self._extra_body:
            kwargs["extra_body"] = dict(self._extra_body)
        return kwargs

    def _result(self, response: Any, stop: tuple[str, ...] | None) -> LLMResult:
        choices = getattr(response, "choices", None)
        if not choices:
            raise LLMError(f"{self.name} returned no choices")
        message = choices[0].message
        content = message.content
        if content is None:
            refusal = getattr(message, "refusal", None)
            if refusal:
                raise LLMError(f"{self.name} refused: {refusal}")
            content = ""
        usage = getattr(response, "usage", None)
        prompt = getattr(usage, "prompt_tokens", None) if usage is not None else None
        completion = getattr(usage, "completion_tokens", None) if usage is not None else None
        # Some servers ignore `stop`; cutting again locally keeps the contract everywhere.
        return LLMResult(
            truncate_at_stop(content, stop),
            prompt_tokens=prompt if isinstance(prompt, int) else None,
            completion_tokens=completion if isinstance(completion, int) else None,
        )

    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        kwargs = self._request(messages, max_tokens, temperature, stop)
        try:
            return self._create(self._client, kwargs, stop)
        except LLMError:
            raise
        except Exception as exc:
            _raise_typed(exc, kwargs.get("timeout"))
            raise

    def _streamed(self, kwargs: dict[str, Any], usage: bool) -> dict[str, Any]:
        """``kwargs`` as a streamed request (with the usage report when ``usage``)."""
        extra = {"stream_options": {"include_usage": True}} if usage else {}
        return {**kwargs, "stream": True, **extra}

    def _create(
        self, client: openai.OpenAI, kwargs: dict[str, Any], stop: tuple[str, ...] | None
    ) -> LLMResult:
        """One request: a whole reply, or with ``stop_loops`` a stream read until it loops."""
        if not self._stop_loops:
            return self._result(client.chat.completions.create(**kwargs), stop)
        usage = self._stream_usage
        try:
            stream = client.chat.completions.create(**self._streamed(kwargs, usage))
        except Exception as exc:
            if not (usage and _rejected(exc)):
                raise
            # Asked again without the usage report; remembered only if that is accepted.
            stream = client.chat.completions.create(**self._streamed(kwargs, False))
            self._stream_usage = False
        reply = _StreamedReply()
        try:
            for chunk in stream:
                cancel.check(self.name)  # the engine is stopping: close the stream
                if reply.take(chunk):
                    break
        except Exception as exc:
            _raise_typed(exc, kwargs.get("timeout"))
            raise
        finally:
            stream.close()  # a looping reply: the server stops generating
        return reply.result(self.name, stop)

    async def _acreate(
        self, client: openai.AsyncOpenAI, kwargs: dict[str, Any], stop: tuple[str, ...] | None
    ) -> LLMResult:
        """Async twin of :meth:`_create`."""
        if not self._stop_loops:
            return self._result(await client.chat.completions.create(**kwargs), stop)
        usage = self._stream_usage
        try:
            stream = await client.chat.completions.create(**self._streamed(kwargs, usage))
        except Exception as exc:
            if not (usage and _rejected(exc)):
                raise
            stream = await client.chat.completions.create(**self._streamed(kwargs, False))
            self._stream_usage = False
        reply = _StreamedReply()
        try:
            async for chunk in stream:
                if reply.take(chunk):
                    break
        except Exception as exc:
            _raise_typed(exc, kwargs.get("timeout"))
            raise
        finally:
            await stream.close()
        return reply.result(self.name, stop)

    def _get_async_client(self) -> openai.AsyncOpenAI | None:
        """The async client, built on first use; ``None`` when only a sync client was given."""
        if self._async_client is not None or self._injected:
            return self._async_client
        with self._async_lock:
            if self._async_client is None:
                openai_module = _import_openai()
                self._async_client = openai_module.AsyncOpenAI(
                    api_key=self._api_key,
                    base_url=self._base_url,
                    timeout=self._timeout,
                    max_retries=self._max_retries,
                )
            return self._async_client

    async def _agenerate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        client = self._get_async_client()
        if client is None:
            return await super()._agenerate(
                messages, max_tokens=max_tokens, temperature=temperature, stop=stop
            )
        kwargs = self._request(messages, max_tokens, temperature, stop)
        try:
            return await self._acreate(client, kwargs, stop)
        except LLMError:
            raise
        except Exception as exc:
            _raise_typed(exc, kwargs.get("timeout"))
            raise
