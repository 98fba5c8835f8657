"""A scripted fake chat model for tests, reused by the core and both adapter suites."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import TypeAlias

from memories_core.errors import ConfigurationError, LLMError
from memories_core.llms.base import BaseLLM, LLMResult, ResponseFormat, truncate_at_stop
from memories_core.types import ChatMessage

__all__ = ["Response", "Rule", "ScriptedLLM"]

#: What one scripted call answers: a fixed text, an exception to raise, or a function of the
#: messages that returns the text.
Response: TypeAlias = str | BaseException | Callable[[Sequence[ChatMessage]], str]

#: When a rule applies: a regex (string or compiled) searched in the last user message, or a
#: predicate over all messages.
Predicate: TypeAlias = str | re.Pattern[str] | Callable[[Sequence[ChatMessage]], bool]

#: One rule of :meth:`ScriptedLLM.from_rules`.
Rule: TypeAlias = tuple[Predicate, Response]


def _last_user_content(messages: Sequence[ChatMessage]) -> str:
    """Content of the last ``user`` message (or of the last message if none is from a user)."""
    for message in reversed(messages):
        if message.role == "user":
            return message.content
    return messages[-1].content if messages else ""


def _compile_rule(rule: Rule) -> tuple[Callable[[Sequence[ChatMessage]], bool], Response]:
    """Turn a rule's predicate into a function of the messages."""
    try:
        predicate, response = rule
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"a rule must be a (predicate, response) pair, got {rule!r}"
        ) from exc
    if isinstance(predicate, str):
        predicate = re.compile(predicate, re.IGNORECASE | re.DOTALL)
    if isinstance(predicate, re.Pattern):
        pattern = predicate

        def matches(messages: Sequence[ChatMessage]) -> bool:
            return pattern.search(_last_user_content(messages)) is not None

        return matches, response
    if callable(predicate):
        return predicate, response
    raise ConfigurationError(f"a rule predicate must be a regex or a callable, got {predicate!r}")


class ScriptedLLM(BaseLLM):
    """A fake chat model that answers from a script; public so any test suite can reuse it.

    Two modes:

    * **Sequence** (constructor): each call consumes the next response in order.
    * **Rules** (:meth:`from_rules`): each call answers with the first rule that matches.

    A response is a string (returned), a ``BaseException`` instance (raised, so it counts
    as a failure and surfaces as :class:`~memories_core.errors.LLMError`) or a callable that
    receives the messages and returns the string. When the script is exhausted (or no rule
    matches), ``default`` answers; without a default the call raises ``LLMError``.

    Like real backends it honours ``stop`` (the reply is cut at the first stop string).
    Every call's messages are kept in :attr:`calls` for assertions. Thread-safe.

    Args:
        responses: The answers, in call order.
        default: The answer once ``responses`` are used up (string, exception or callable);
            ``None`` makes further calls fail.
        structured_output: Structured-output modes to claim (``"json_schema"``,
            ``"json_object"``); a structured call answers from the same script and its
            ``response_format`` is kept in :attr:`response_formats`. None by default.
        batch_capacity: How many conversations to claim a batch pass decodes (1 by
            default). A batch is still answered in order, one response per conversation;
            the size of every :meth:`generate_batch` is kept in :attr:`batches`.

    Example:
        >>> from memories_core.types import ChatMessage
        >>> llm = ScriptedLLM(["<Decision>: yes"], default="ok")
        >>> llm.generate([ChatMessage("user", "hi")])
        '<Decision>: yes'
        >>> llm.generate([ChatMessage("user", "again")])
        'ok'
        >>> len(llm.calls)
        2
        >>> rules = ScriptedLLM.from_rules([(r"summari[sz]e", "a summary")], default="?")
        >>> rules.generate([ChatMessage("user", "Summarize this")])
        'a summary'
    """

    def __init__(
        self,
        responses: Sequence[Response] = (),
        *,
        default: Response | None = None,
        structured_output: frozenset[str] = frozenset(),
        batch_capacity: int = 1,
    ) -> None:
        super().__init__()
        if isinstance(batch_capacity, bool) or not isinstance(batch_capacity, int):
            raise ConfigurationError(f"batch_capacity must be an int, got {batch_capacity!r}")
        if batch_capacity < 1:
            raise ConfigurationError(f"batch_capacity must be at least 1, got {batch_capacity}")
        self._batch_capacity = batch_capacity
        #: The number of conversations of every :meth:`generate_batch`, in call order.
        self.batches: list[int] = []
        unknown = set(structured_output) - {"json_schema", "json_object"}
        if unknown:
            raise ConfigurationError(f"unknown structured output modes: {sorted(unknown)}")
        self._modes = frozenset(structured_output)
        #: The ``response_format`` of every structured call, in call order.
        self.response_formats: list[ResponseFormat] = []
        if isinstance(responses, str):
            # A lone string would otherwise be consumed one character per call.
            raise ConfigurationError("responses must be a sequence of responses, not a string")
        self._responses: list[Response] = list(responses)
        self._position = 0
        self._default = default
        self._rules: list[tuple[Callable[[Sequence[ChatMessage]], bool], Response]] = []
        self._lock = threading.Lock()
        #: The messages of every call, in call order (failed calls included).
        self.calls: list[tuple[ChatMessage, ...]] = []

    @classmethod
    def from_rules(cls, rules: Sequence[Rule], *, default: Response | None = None) -> ScriptedLLM:
        """Build a fake that answers with the first matching rule.

        Args:
            rules: ``(predicate, response)`` pairs tried in order. A string predicate is a
                regular expression searched (case-insensitively, ``.`` matching newlines) in
                the last user message; pass a compiled pattern for other flags, or a callable
                ``messages -> bool`` to look at the whole conversation.
            default: The answer when no rule matches; ``None`` makes such calls fail.

        Returns:
            The scripted model.

        Raises:
            ConfigurationError: if a rule is malformed.
        """
        llm = cls(default=default)
        llm._rules = [_compile_rule(rule) for rule in rules]
        return llm

    @property
    def structured_output(self) -> frozenset[str]:
        """The modes given at construction (none by default)."""
        return self._modes

    @property
    def batch_capacity(self) -> int:
        """The capacity given at construction (1 by default)."""
        return self._batch_capacity

    def _generate_batch(
        self,
        conversations: list[tuple[ChatMessage, ...]],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
        response_format: ResponseFormat | None = None,
    ) -> list[LLMResult]:
        with self._lock:
            self.batches.append(len(conversations))
        return super()._generate_batch(
            conversations,
            max_tokens=max_tokens,
            temperature=temperature,
            stop=stop,
            response_format=response_format,
        )

    @property
    def name(self) -> str:
        """Always ``"scripted"``."""
        return "scripted"

    @property
    def remaining(self) -> int:
        """How many sequence responses are still unused."""
        with self._lock:
            return len(self._responses) - self._position

    def _next_response(self, messages: tuple[ChatMessage, ...]) -> Response:
        """Record the call and pick its response (under the lock, so threads never share one)."""
        with self._lock:
            self.calls.append(messages)
            if self._rules:
                for matches, response in self._rules:
                    if matches(messages):
                        return response
            elif self._position < len(self._responses):
                response = self._responses[self._position]
                self._position += 1
                return response
            if self._default is None:
                raise LLMError("no rule matched" if self._rules else "script exhausted")
            return self._default

    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        response = self._next_response(messages)
        if isinstance(response, BaseException):
            raise response
        candidate: object = response
        if isinstance(candidate, type) and issubclass(candidate, BaseException):
            # An exception class is callable too; scripting `TimeoutError` means "raise it".
            raise candidate(f"scripted {candidate.__name__}")
        # Callables run outside the lock, so they may themselves call this model.
        text = response(messages) if callable(response) else response
        if not isinstance(text, str):
            raise LLMError(f"scripted response returned {type(text).__name__}, expected str")
        return LLMResult(truncate_at_stop(text, stop))

    def _generate_structured(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        response_format: ResponseFormat,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        with self._lock:
            self.response_formats.append(response_format)
        return self._generate(messages, max_tokens=max_tokens, temperature=temperature, stop=stop)
