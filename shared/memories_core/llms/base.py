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
import contextvars
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, TypeVar

from memories_core.errors import (
    ConfigurationError,
    InvalidInputError,
    LLMCancelledError,
    LLMError,
    LLMTimeoutError,
)
from memories_core.llms import cancel
from memories_core.types import ChatMessage
from memories_core.usage import Usage, UsageCounter, estimate_tokens

if TYPE_CHECKING:
    from memories_core.interfaces import LLM, LLMRouter
    from memories_core.types import Scope

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_TIMEOUT",
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
    "run_with_timeout",
    "structured_modes",
    "truncate_at_stop",
]

#: Output cap of a call that gives no ``max_tokens`` (every prompt of the package asks for far
#: less; an answer that runs on is cut, never waited for).
DEFAULT_MAX_TOKENS = 512
#: Seconds a call may take when neither the call nor the model says otherwise.
DEFAULT_TIMEOUT = 120.0

# The limit of the call in progress, for backends that enforce it themselves.
_CALL_TIMEOUT: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "llm_call_timeout", default=None
)


_T = TypeVar("_T")


def run_with_timeout(call: Callable[[], _T], timeout: float | None, *, label: str = "call") -> _T:
    """Return ``call()``, or raise ``LLMTimeoutError`` if it takes more than ``timeout`` s.

    The call runs in a daemon helper thread (with the caller's context variables) that the
    caller stops waiting for at the timeout, or as soon as the caller's scope is cancelled
    (:mod:`memories_core.llms.cancel`: ``LLMCancelledError``); its late result is dropped.
    ``None`` outside a cancellable scope: the call runs here, unbounded by this function.
    Exceptions of ``call`` are raised in the caller.
    """
    if timeout is None and cancel.current() is None:
        return call()
    if timeout is not None and timeout <= 0:
        raise LLMTimeoutError(f"{label}: no time left", timeout=0.0)
    outcome: list[Any] = []
    done = threading.Event()
    context = contextvars.copy_context()

    def run() -> None:
        try:
            outcome.append(context.run(call))
        except BaseException as exc:  # handed to the caller below
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=run, name=f"timed:{label}", daemon=True).start()
    if not cancel.wait(done.wait, timeout, name=label):
        assert timeout is not None
        raise LLMTimeoutError(f"{label} gave no answer within {timeout:g} s", timeout=timeout)
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    result: _T = outcome[0]
    return result


def _check_limit(name: str, value: Any, kind: type) -> None:
    bad = isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int)
    if value is not None and (bad or value <= 0):
        raise ConfigurationError(f"{name} must be a positive number or None, got {value!r}")


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
        looped: Generation was stopped because the reply had started to repeat itself
            (``text`` ends after the repeated span's second writing); counted as
            ``capped``, a reply the model did not end.
    """

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    looped: bool = False


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
    * Every call has an output cap and a timeout: ``max_tokens`` and ``timeout`` of the call,
      else the model's (:attr:`max_tokens`, :attr:`timeout`; defaults
      :data:`DEFAULT_MAX_TOKENS` and :data:`DEFAULT_TIMEOUT`). A call past its timeout raises
      :class:`~memories_core.errors.LLMTimeoutError`. A backend that stops its own
      generation at the limit (local models, HTTP clients) sets :attr:`enforces_timeout` and
      reads the limit with :meth:`call_timeout`; for any other the call runs in a helper
      thread that the caller stops waiting for.

    Args:
        timeout: Default seconds per call (``None``: no limit).
        max_tokens: Default output cap per call (``None``: the backend's own).

    Example:
        >>> from memories_core.llms import ScriptedLLM
        >>> from memories_core.types import ChatMessage
        >>> llm = ScriptedLLM(["hi"])
        >>> llm.generate([ChatMessage("user", "hello")])
        'hi'
        >>> llm.usage.calls
        1
    """

    #: Whether :meth:`_generate` stops by itself at :meth:`call_timeout` (raising
    #: ``LLMTimeoutError``); otherwise the base class waits for it in a helper thread.
    enforces_timeout: bool = False

    def __init__(
        self,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        max_tokens: int | None = DEFAULT_MAX_TOKENS,
    ) -> None:
        _check_limit("timeout", timeout, float)
        _check_limit("max_tokens", max_tokens, int)
        self._usage = UsageCounter()
        self.timeout: float | None = None if timeout is None else float(timeout)
        self.max_tokens: int | None = max_tokens

    @staticmethod
    def call_timeout() -> float | None:
        """The timeout of the call in progress (for backends that enforce it themselves)."""
        return _CALL_TIMEOUT.get()

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
        timeout: float | None = None,
    ) -> str:
        """Return the model's reply to ``messages``.

        Args:
            messages: The conversation, oldest first.
            max_tokens: Upper bound on generated tokens (``None``: the backend's default).
            temperature: Sampling temperature; 0 asks for greedy, deterministic decoding.
            stop: Strings at which generation stops; the stop string is not returned.
            response_format: Constrain the reply (:class:`JsonSchema` or
                :data:`JSON_OBJECT`); only modes in :attr:`structured_output` are accepted.
            timeout: Seconds this call may take (``None``: the model's :attr:`timeout`).

        Returns:
            The reply text.

        Raises:
            InvalidInputError: if the messages or options are malformed (not counted).
            LLMTimeoutError: if no answer came within the timeout (counted as a failure).
            LLMError: if the backend fails (counted as a failure).
        """
        return self.generate_result(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
            response_format=response_format,
            timeout=timeout,
        ).text

    def generate_result(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
        response_format: ResponseFormat | None = None,
        timeout: float | None = None,
    ) -> LLMResult:
        """:meth:`generate`, returning the reply with this call's counted token figures.

        The token counts are those added to :attr:`usage` by this call (reported by the
        backend, else estimated), so a caller serving several threads at once gets each call's
        own figures rather than a difference of shared counters.

        Returns:
            The reply; ``prompt_tokens`` and ``completion_tokens`` are always set.
        """
        msgs, options = self._prepare(messages, max_tokens, temperature, stop, response_format)
        limit = self._limit(timeout)

        def call() -> LLMResult:
            if response_format is None:
                return self._generate(msgs, **options)
            return self._generate_structured(msgs, response_format=response_format, **options)

        with self._counted():
            result = self._within(call, limit)
        return self._success(msgs, result, cap=options["max_tokens"])

    def generate_batch(
        self,
        conversations: Sequence[Sequence[ChatMessage]],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
        response_format: ResponseFormat | None = None,
        timeout: float | None = None,
    ) -> list[LLMResult]:
        """Replies to several independent conversations, in their order.

        A backend that can decode several sequences in one pass overrides
        :meth:`_generate_batch` (:class:`~memories_core.llms.LocalLLM` on transformers: a CPU
        reads every weight once per decoding step whatever the number of sequences, so
        writing costs about the same for eight replies as for one); the others answer one
        conversation after another. The rules of :meth:`generate_result` apply to each
        conversation, and each reply counts as one call in :attr:`usage`.

        Args:
            conversations: The conversations, each as :meth:`generate` takes ``messages``.
            max_tokens: Cap on each reply.
            temperature: As in :meth:`generate`.
            stop: As in :meth:`generate`, for every reply.
            response_format: As in :meth:`generate`, for every reply (one schema per batch).
            timeout: Seconds the whole batch may take (``None``: the model's
                :attr:`timeout` for each conversation, so a batch of n may take n times
                it, as n calls one after another could); a backend that splits a batch
                into passes may apply it per pass, and says so. A batch lasts as long as
                its longest reply: with one call's timeout, eight writers' extractions
                timed out on a loaded CPU and their jobs waited for a retry.

        Returns:
            One result per conversation, in order, with its counted token figures.

        Raises:
            InvalidInputError: if a conversation or an option is malformed (nothing is run).
            LLMTimeoutError: if the batch did not finish within the timeout (one failure).
            LLMError: if the backend fails (one failure); no reply of the batch is returned.
        """
        if isinstance(conversations, (str, bytes)) or not isinstance(conversations, Sequence):
            raise InvalidInputError(
                f"conversations must be a sequence of message lists, got "
                f"{type(conversations).__name__}"
            )
        prepared = [
            self._prepare(messages, max_tokens, temperature, stop, response_format)
            for messages in conversations
        ]
        if not prepared:
            return []
        batch = [msgs for msgs, _ in prepared]
        options = {**prepared[0][1], "response_format": response_format}
        limit = self._limit(timeout)
        if timeout is None and limit is not None:
            limit *= len(batch)
        with self._counted():
            results = self._within(lambda: self._generate_batch(batch, **options), limit)
            if not isinstance(results, list) or len(results) != len(batch):
                raise LLMError(
                    f"{self.name} returned {len(results) if isinstance(results, list) else 0} "
                    f"replies for {len(batch)} conversations"
                )
        cap = options["max_tokens"]
        return [
            self._success(msgs, result, cap=cap)
            for msgs, result in zip(batch, results, strict=True)
        ]

    def _generate_batch(
        self,
        conversations: list[tuple[ChatMessage, ...]],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
        response_format: ResponseFormat | None = None,
    ) -> list[LLMResult]:
        """Batch hook: one call per conversation, in order (the default)."""
        options: dict[str, Any] = {"max_tokens": max_tokens, "temperature": temperature}
        if response_format is None:
            return [self._generate(m, stop=stop, **options) for m in conversations]
        return [
            self._generate_structured(m, response_format=response_format, stop=stop, **options)
            for m in conversations
        ]

    @property
    def batch_capacity(self) -> int:
        """How many conversations one :meth:`generate_batch` pass decodes together.

        1 (the default): the backend answers a batch one conversation after another, so a
        caller gains nothing by gathering work into batches. A backend that decodes several
        sequences per step says how many.
        """
        return 1

    def _limit(self, timeout: float | None) -> float | None:
        if timeout is None:
            return self.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise InvalidInputError(f"timeout must be a positive number or None, got {timeout!r}")
        return float(timeout)

    def _timed_out(self, limit: float) -> LLMTimeoutError:
        return LLMTimeoutError(f"{self.name} gave no answer within {limit:g} s", timeout=limit)

    def _within(self, call: Callable[[], _T], limit: float | None) -> _T:
        """Run the hook ``call`` under ``limit`` seconds (see the class docstring)."""
        token = _CALL_TIMEOUT.set(limit)
        try:
            if self.enforces_timeout:
                return call()
            return run_with_timeout(call, limit, label=self.name)
        finally:
            _CALL_TIMEOUT.reset(token)

    async def agenerate(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        stop: Sequence[str] | None = None,
        response_format: ResponseFormat | None = None,
        timeout: float | None = None,
    ) -> str:
        """Async twin of :meth:`generate` (same arguments, rules and errors)."""
        result = await self.agenerate_result(
            messages,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
            response_format=response_format,
            timeout=timeout,
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
        timeout: float | None = None,
    ) -> LLMResult:
        """Async twin of :meth:`generate_result`."""
        msgs, options = self._prepare(messages, max_tokens, temperature, stop, response_format)
        limit = self._limit(timeout)
        token = _CALL_TIMEOUT.set(limit)
        try:
            with self._counted():
                if response_format is None:
                    pending = self._agenerate(msgs, **options)
                else:
                    pending = self._agenerate_structured(
                        msgs, response_format=response_format, **options
                    )
                task = asyncio.ensure_future(pending)
                done, _ = await asyncio.wait({task}, timeout=limit)
                if not done:
                    task.cancel()
                    assert limit is not None
                    raise self._timed_out(limit)
                result = task.result()
        finally:
            _CALL_TIMEOUT.reset(token)
        return self._success(msgs, result, cap=options["max_tokens"])

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
        cap = self.max_tokens if max_tokens is None else max_tokens
        return msgs, {"max_tokens": cap, "temperature": float(temperature), "stop": stops}

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
        """Count a failed call and return the exception to raise.

        A call its caller cancelled (:class:`~memories_core.errors.LLMCancelledError`) is not
        counted: the model did not fail.
        """
        if not isinstance(exc, LLMCancelledError):
            self._usage.record(failures=1)
        if isinstance(exc, LLMError) or not isinstance(exc, Exception):
            # LLMError is already the public type; KeyboardInterrupt, SystemExit and
            # cancellation must propagate untouched.
            return exc
        return LLMError(f"{self.name} failed: {type(exc).__name__}: {exc}")

    def _success(
        self, messages: tuple[ChatMessage, ...], result: LLMResult, *, cap: int | None = None
    ) -> LLMResult:
        """Check the hook's result, count the call and return it with its token counts.

        A reply whose reported token count reached ``cap``, or that was stopped in a loop,
        is also counted as ``capped``.
        """
        if not isinstance(result, LLMResult) or not isinstance(result.text, str):
            self._usage.record(failures=1)
            raise LLMError(f"{self.name} returned {type(result).__name__}, expected LLMResult")
        prompt = result.prompt_tokens
        if prompt is None:
            # Count role labels too: chat templates send them to the model.
            prompt = sum(estimate_tokens(f"{m.role}: {m.content}") for m in messages)
        completion = result.completion_tokens
        capped = int(
            result.looped or (cap is not None and completion is not None and completion >= cap)
        )
        if completion is None:
            completion = estimate_tokens(result.text)
        self._usage.record(
            calls=1, prompt_tokens=prompt, completion_tokens=completion, capped=capped
        )
        return LLMResult(
            result.text, prompt_tokens=prompt, completion_tokens=completion, looped=result.looped
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
