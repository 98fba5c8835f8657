"""The chat-model template: validation, error wrapping and usage counting live here once.

Subclasses implement the hook :meth:`BaseLLM._generate` (and may override
:meth:`BaseLLM._agenerate` when their backend is natively async). The public
:meth:`BaseLLM.generate` / :meth:`BaseLLM.agenerate` check the messages, call the hook,
count calls, failures and tokens, and turn any backend exception into
:class:`~memories_core.errors.LLMError`, so callers catch one error type whatever the backend.

Structured output is an optional capability. A backend that can constrain its answer lists
the modes it offers in :attr:`BaseLLM.structured_output` (``"json_schema"``: decoding
constrained to a JSON schema; ``"json_object"``: any JSON object) and implements
:meth:`BaseLLM._generate_structured`; callers then pass ``response_format=JsonSchema(...)``
or ``response_format=JSON_OBJECT``. :func:`memories_core.prompts.spec.run_spec` picks the
strongest mode a model offers.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from memories_core.errors import InvalidInputError, LLMError
from memories_core.types import ChatMessage
from memories_core.usage import Usage, UsageCounter, estimate_tokens

if TYPE_CHECKING:
    from memories_core.interfaces import LLM, LLMRouter
    from memories_core.types import Scope

__all__ = [
    "JSON_OBJECT",
    "BaseLLM",
    "JsonObject",
    "JsonSchema",
    "LLMResult",
    "ResponseFormat",
    "StructuredMode",
    "counted_agenerate",
    "counted_generate",
    "llm_for_scope",
    "structured_modes",
    "truncate_at_stop",
]

#: A structured-output mode: schema-constrained decoding, or "some JSON object".
StructuredMode: TypeAlias = Literal["json_schema", "json_object"]


@dataclass(frozen=True)
class JsonSchema:
    """Ask for an answer that is valid under a JSON schema (constrained decoding).

    Attributes:
        name: A short identifier (OpenAI requires ``^[a-zA-Z0-9_-]+$``).
        schema: The JSON schema (draft 2020-12 subset understood by OpenAI-compatible
            servers and by lm-format-enforcer: objects, strings with ``enum``/``maxLength``,
            arrays with ``minItems``/``maxItems``, booleans).
    """

    name: str
    schema: Mapping[str, Any] = field(hash=False)

    mode: StructuredMode = field(default="json_schema", init=False)


@dataclass(frozen=True)
class JsonObject:
    """Ask for any JSON object (OpenAI's JSON mode); the schema lives in the prompt."""

    mode: StructuredMode = field(default="json_object", init=False)


#: The single :class:`JsonObject` value.
JSON_OBJECT = JsonObject()

#: What ``generate(..., response_format=...)`` accepts.
ResponseFormat: TypeAlias = JsonSchema | JsonObject


def structured_modes(llm: object) -> frozenset[str]:
    """The structured-output modes ``llm`` offers (empty for plain-text models and fakes)."""
    modes: Any = getattr(llm, "structured_output", frozenset())
    try:
        return frozenset(m for m in modes if m in ("json_schema", "json_object"))
    except TypeError:
        return frozenset()


def llm_for_scope(default: LLM, router: LLMRouter | None, scope: Scope) -> LLM:
    """The model that serves ``scope``: the router's choice, else ``default``.

    Args:
        default: The memory's own model.
        router: An ``llm_for`` hook (``Scope -> LLM | None``), e.g. a per-user fine-tuned
            model; ``None`` means every scope uses ``default``.
        scope: Who is being served.
    """
    if router is None:
        return default
    chosen = router(scope)
    return default if chosen is None else chosen


@dataclass(frozen=True)
class LLMResult:
    """What a backend hook returns.

    Attributes:
        text: The generated reply.
        prompt_tokens: Tokens the backend counted in the prompt, or ``None`` if it reports
            none (the base class then estimates them).
        completion_tokens: Tokens generated, or ``None`` if unknown (estimated likewise).
    """

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


def truncate_at_stop(text: str, stop: Sequence[str] | None) -> str:
    """Cut ``text`` at the earliest occurrence of any stop string (the stop is not kept).

    Args:
        text: Generated text.
        stop: Stop strings; empty strings are ignored.

    Returns:
        The text before the first stop string, or ``text`` unchanged.
    """
    if not stop:
        return text
    cut = len(text)
    for s in stop:
        if s:
            i = text.find(s)
            if i != -1:
                cut = min(cut, i)
    return text[:cut]


def _estimated(messages: Sequence[ChatMessage], text: str) -> LLMResult:
    """``text`` with token counts estimated the way :class:`BaseLLM` estimates them."""
    prompt = sum(estimate_tokens(f"{m.role}: {m.content}") for m in messages)
    return LLMResult(text, prompt_tokens=prompt, completion_tokens=estimate_tokens(text))


def counted_generate(
    llm: LLM,
    messages: Sequence[ChatMessage],
    *,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    stop: Sequence[str] | None = None,
    response_format: ResponseFormat | None = None,
) -> LLMResult:
    """Call any core ``LLM`` and return its reply with this call's token counts.

    A :class:`BaseLLM` reports the figures it added to its own usage
    (:meth:`BaseLLM.generate_result`); any other implementation of the protocol has them
    estimated from the text. The reply is cut at the first stop string either way.

    Raises:
        InvalidInputError: if ``response_format`` is given to a model that is not a
            :class:`BaseLLM` (the protocol has no structured output), or the call is malformed.
        LLMError: if the model fails.
    """
    if isinstance(llm, BaseLLM):
        result = llm.generate_result(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
            response_format=response_format,
        )
    else:
        if response_format is not None:
            raise InvalidInputError(f"{type(llm).__name__} offers no structured output")
        text = llm.generate(messages, max_tokens=max_tokens, temperature=temperature, stop=stop)
        result = _estimated(messages, text)
    return _cut(result, stop)


async def counted_agenerate(
    llm: LLM,
    messages: Sequence[ChatMessage],
    *,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    stop: Sequence[str] | None = None,
    response_format: ResponseFormat | None = None,
) -> LLMResult:
    """Async twin of :func:`counted_generate`."""
    if isinstance(llm, BaseLLM):
        result = await llm.agenerate_result(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
            response_format=response_format,
        )
    else:
        if response_format is not None:
            raise InvalidInputError(f"{type(llm).__name__} offers no structured output")
        text = await llm.agenerate(
            messages, max_tokens=max_tokens, temperature=temperature, stop=stop
        )
        result = _estimated(messages, text)
    return _cut(result, stop)


def _cut(result: LLMResult, stop: Sequence[str] | None) -> LLMResult:
    # A lone string is one stop string, as in generate().
    stops = (stop,) if isinstance(stop, str) else stop
    text = truncate_at_stop(result.text, stops)
    if text == result.text:
        return result
    return LLMResult(text, result.prompt_tokens, result.completion_tokens)


def _check_messages(messages: Sequence[ChatMessage]) -> tuple[ChatMessage, ...]:
    """Return ``messages`` as a tuple (a private copy), or raise InvalidInputError."""
    if isinstance(messages, (str, bytes, ChatMessage)):
        raise InvalidInputError("messages must be a sequence of ChatMessage, not a single value")
    try:
        items = tuple(messages)
    except TypeError as exc:
        raise InvalidInputError(
            f"messages must be a sequence of ChatMessage, got {type(messages).__name__}"
        ) from exc
    if not items:
        raise InvalidInputError("messages must not be empty")
    for i, message in enumerate(items):
        if not isinstance(message, ChatMessage):
            raise InvalidInputError(
                f"messages[{i}] must be a ChatMessage, got {type(message).__name__}"
            )
        if not isinstance(message.role, str) or not isinstance(message.content, str):
            raise InvalidInputError(f"messages[{i}] must have str role and content")
    return items


def _check_options(
    max_tokens: int | None, temperature: float, stop: Sequence[str] | None
) -> tuple[str, ...] | None:
    """Validate the sampling options; return ``stop`` as a tuple (``None`` if not given)."""
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise InvalidInputError(f"max_tokens must be a positive int or None, got {max_tokens!r}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise InvalidInputError(f"temperature must be a number, got {temperature!r}")
    if temperature < 0:
        raise InvalidInputError(f"temperature must be >= 0, got {temperature!r}")
    if stop is None:
        return None
    # A lone string is accepted as one stop string: splitting it into characters would stop
    # at the first of any of its letters, which nobody means.
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    for s in stops:
        if not isinstance(s, str):
            raise InvalidInputError(f"stop strings must be str, got {type(s).__name__}")
    return stops


class BaseLLM(ABC):
    """Base class of every chat model: subclasses implement :meth:`_generate` only.

    Rules shared by every backend:

    * ``messages`` must be a non-empty sequence of :class:`~memories_core.types.ChatMessage`;
      it is copied, never mutated.
    * Every call is counted in :attr:`usage`: a success adds one call and its prompt and
      completion tokens (as reported by the backend, else estimated from the text); a
      failure adds one failure.
    * Any exception from the backend that is not already an
      :class:`~memories_core.errors.LLMError` is re-raised as one, chained with ``from``.
    * ``response_format`` is accepted only in a mode listed in :attr:`structured_output`;
      otherwise the call raises ``InvalidInputError`` (not counted).

    Example:
        >>> from memories_core.llms import ScriptedLLM
        >>> from memories_core.types import ChatMessage
        >>> llm = ScriptedLLM(["hi"])
        >>> llm.generate([ChatMessage("user", "hello")])
        'hi'
        >>> llm.usage.calls
        1
    """

    def __init__(self) -> None:
        self._usage = UsageCounter()

    @property
    def structured_output(self) -> frozenset[str]:
        """Structured-output modes implemented in :meth:`_generate_structured` (none here)."""
        return frozenset()

    @property
    @abstractmethod
    def name(self) -> str:
        """Identity of the model (e.g. ``"openai:gpt-4o-mini"``), for logs and reports."""

    @property
    def usage(self) -> Usage:
        """Calls, failures and tokens so far."""
        return self._usage.snapshot()

    def reset_usage(self) -> None:
        """Set the usage counters back to zero."""
        self._usage.reset()

    @abstractmethod
    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        """Backend hook: return the reply to validated ``messages``.

        Implementations should honour ``stop`` (drop the stop string and what follows) and may
        raise any exception; the caller wraps it in ``LLMError``.
        """

    async def _agenerate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        """Async backend hook; defaults to :meth:`_generate` in a worker thread."""
        return await asyncio.to_thread(
            self._generate, messages, max_tokens=max_tokens, temperature=temperature, stop=stop
        )

    def _generate_structured(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        response_format: ResponseFormat,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        """Structured-output hook, called only for a mode in :attr:`structured_output`."""
        raise NotImplementedError(f"{type(self).__name__} offers no structured output")

    async def _agenerate_structured(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        response_format: ResponseFormat,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        """Async structured hook; defaults to :meth:`_generate_structured` in a thread."""
        return await asyncio.to_thread(
            self._generate_structured,
            messages,
            response_format=response_format,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
        )

    def generate(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
        response_format: ResponseFormat | None = None,
    ) -> str:
        """Return the model's reply to ``messages``.

        Args:
            messages: The conversation, oldest first.
            max_tokens: Upper bound on generated tokens (``None``: the backend's default).
            temperature: Sampling temperature; 0 asks for greedy, deterministic decoding.
            stop: Strings at which generation stops; the stop string is not returned.
            response_format: Constrain the reply (:class:`JsonSchema` or
                :data:`JSON_OBJECT`); only modes in :attr:`structured_output` are accepted.

        Returns:
            The reply text.

        Raises:
            InvalidInputError: if the messages or options are malformed (not counted).
            LLMError: if the backend fails (counted as a failure).
        """
        return self.generate_result(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
            response_format=response_format,
        ).text

    def generate_result(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
        response_format: ResponseFormat | None = None,
    ) -> LLMResult:
        """:meth:`generate`, returning the reply with this call's counted token figures.

        The token counts are those added to :attr:`usage` by this call (reported by the
        backend, else estimated), so a caller serving several threads at once gets each call's
        own figures rather than a difference of shared counters.

        Returns:
            The reply; ``prompt_tokens`` and ``completion_tokens`` are always set.
        """
        msgs, options = self._prepare(messages, max_tokens, temperature, stop, response_format)
        with self._counted():
            if response_format is None:
                result = self._generate(msgs, **options)
            else:
                result = self._generate_structured(msgs, response_format=response_format, **options)
        return self._success(msgs, result)

    async def agenerate(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
        response_format: ResponseFormat | None = None,
    ) -> str:
        """Async twin of :meth:`generate` (same arguments, rules and errors)."""
        result = await self.agenerate_result(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
            response_format=response_format,
        )
        return result.text

    async def agenerate_result(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
        response_format: ResponseFormat | None = None,
    ) -> LLMResult:
        """Async twin of :meth:`generate_result`."""
        msgs, options = self._prepare(messages, max_tokens, temperature, stop, response_format)
        with self._counted():
            if response_format is None:
                result = await self._agenerate(msgs, **options)
            else:
                result = await self._agenerate_structured(
                    msgs, response_format=response_format, **options
                )
        return self._success(msgs, result)

    def _prepare(
        self,
        messages: Sequence[ChatMessage],
        max_tokens: int | None,
        temperature: float,
        stop: Sequence[str] | None,
        response_format: ResponseFormat | None,
    ) -> tuple[tuple[ChatMessage, ...], dict[str, Any]]:
        """Validate a call's arguments once for both twins; return the hook's arguments."""
        msgs = _check_messages(messages)
        stops = _check_options(max_tokens, temperature, stop)
        if response_format is not None:
            if not isinstance(response_format, (JsonSchema, JsonObject)):
                raise InvalidInputError(
                    "response_format must be a JsonSchema or JSON_OBJECT, got "
                    f"{type(response_format).__name__}"
                )
            if response_format.mode not in self.structured_output:
                raise InvalidInputError(
                    f"{self.name} does not offer structured output mode "
                    f"{response_format.mode!r} (it offers {sorted(self.structured_output)})"
                )
        return msgs, {"max_tokens": max_tokens, "temperature": float(temperature), "stop": stops}

    @contextmanager
    def _counted(self) -> Iterator[None]:
        """Count a failed hook call and re-raise it as ``LLMError`` (shared by both twins)."""
        try:
            yield
        except BaseException as exc:
            wrapped = self._failure(exc)
            if wrapped is exc:
                raise
            raise wrapped from exc

    def _failure(self, exc: BaseException) -> BaseException:
        """Count a failed call and return the exception to raise."""
        self._usage.record(failures=1)
        if isinstance(exc, LLMError) or not isinstance(exc, Exception):
            # LLMError is already the public type; KeyboardInterrupt, SystemExit and
            # cancellation must propagate untouched.
            return exc
        return LLMError(f"{self.name} failed: {type(exc).__name__}: {exc}")

    def _success(self, messages: tuple[ChatMessage, ...], result: LLMResult) -> LLMResult:
        """Check the hook's result, count the call and return it with its token counts."""
        if not isinstance(result, LLMResult) or not isinstance(result.text, str):
            self._usage.record(failures=1)
            raise LLMError(f"{self.name} returned {type(result).__name__}, expected LLMResult")
        prompt = result.prompt_tokens
        if prompt is None:
            # Count role labels too: chat templates send them to the model.
            prompt = sum(estimate_tokens(f"{m.role}: {m.content}") for m in messages)
        completion = result.completion_tokens
        if completion is None:
            completion = estimate_tokens(result.text)
        self._usage.record(calls=1, prompt_tokens=prompt, completion_tokens=completion)
        return LLMResult(result.text, prompt_tokens=prompt, completion_tokens=completion)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
