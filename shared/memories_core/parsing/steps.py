"""Generate, parse, and repair once: the model-call loop written once for sync and async."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast

from memories_core.errors import InvalidInputError, ParseError
from memories_core.types import ChatMessage

if TYPE_CHECKING:
    from memories_core.interfaces import LLM
    from memories_core.llms.base import ResponseFormat

__all__ = [
    "LLMRequest",
    "ParseSteps",
    "adrive",
    "agenerate_parsed",
    "drive",
    "generate_parsed",
    "parse_steps",
    "repair_messages",
]

T = TypeVar("T")

# Upper bound on repair retries, whatever the caller asks: each retry costs a model call.
_MAX_RETRIES = 3


def repair_messages(
    messages: Sequence[ChatMessage], bad_output: str, error: ParseError
) -> tuple[ChatMessage, ...]:
    """Return a new conversation asking the model to fix an unparsable answer.

    The original messages are kept (never mutated); the bad answer is appended as the
    assistant's turn, followed by a user turn that quotes the parse error and asks for the
    same content in the requested format, or for what ``error.fix`` says when the content
    itself was the fault (a copied placeholder: asked for "the same content", the local
    model copied it again on every retry).
    """
    fix = error.fix or (
        "Reply again with the same content in exactly the format requested above, and nothing else."
    )
    request = f"Your previous answer could not be read by the program: {error}. {fix}"
    return (
        *messages,
        ChatMessage("assistant", bad_output),
        ChatMessage("user", request),
    )


def _check_retries(retries: int) -> int:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise InvalidInputError(f"retries must be an int >= 0, got {retries!r}")
    return min(retries, _MAX_RETRIES)


@dataclass(frozen=True)
class LLMRequest:
    """One model call, as data: what a step of a parse loop asks its driver to send.

    Attributes:
        messages: The conversation.
        max_tokens: Passed to the model.
        temperature: Passed to the model.
        stop: Passed to the model.
        response_format: Structured-output request, or ``None`` for plain text.
    """

    messages: tuple[ChatMessage, ...]
    max_tokens: int | None = None
    temperature: float = 0.0
    stop: Sequence[str] | None = None
    response_format: ResponseFormat | None = None

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``LLM.generate``.

        ``response_format`` is included only when set, so plain
        :class:`~memories_core.interfaces.LLM` implementations keep working.
        """
        options: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stop": self.stop,
        }
        if self.response_format is not None:
            options["response_format"] = self.response_format
        return options


#: A parse loop: yields the calls to make, receives each reply, returns the parsed value.
ParseSteps: TypeAlias = Generator[LLMRequest, str, T]


def parse_steps(
    request: LLMRequest, parse: Callable[[str], T], *, retries: int = 1
) -> ParseSteps[T]:
    """The generate-parse-repair loop as a generator, shared by the sync and async drivers.

    Yields the request, parses the reply it is sent, and on ``ParseError`` yields a repair
    request that shows the model its answer and the error (:func:`repair_messages`), at most
    ``retries`` times.

    Raises:
        ParseError: if the last reply still does not parse (chained to its cause).
    """
    attempts = _check_retries(retries)
    output = yield request
    for attempt in range(attempts + 1):
        try:
            return parse(output)
        except ParseError as exc:
            if attempt == attempts:
                raise ParseError(
                    f"model output still unparsable after {attempts} repair attempt(s): {exc}",
                    output,
                ) from exc
            request = replace(request, messages=repair_messages(request.messages, output, exc))
        output = yield request
    raise AssertionError("unreachable")  # pragma: no cover


def drive(llm: LLM, steps: ParseSteps[T]) -> T:
    """Run a parse loop against ``llm`` with blocking calls."""
    request = next(steps)
    while True:
        output = llm.generate(request.messages, **request.kwargs())
        try:
            request = steps.send(output)
        except StopIteration as done:
            return cast("T", done.value)


async def adrive(llm: LLM, steps: ParseSteps[T]) -> T:
    """Run a parse loop against ``llm`` with async calls (the same loop as :func:`drive`)."""
    request = next(steps)
    while True:
        output = await llm.agenerate(request.messages, **request.kwargs())
        try:
            request = steps.send(output)
        except StopIteration as done:
            return cast("T", done.value)


def generate_parsed(
    llm: LLM,
    messages: Sequence[ChatMessage],
    parse: Callable[[str], T],
    *,
    retries: int = 1,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    stop: Sequence[str] | None = None,
) -> T:
    """Call ``llm``, parse its answer, and on failure ask again with the error fed back.

    Prefer :func:`memories_core.prompts.spec.run_spec` for this package's prompts: it also
    uses the model's structured-output modes.

    Args:
        llm: Any :class:`~memories_core.interfaces.LLM`.
        messages: The prompt (not mutated).
        parse: A parser that raises ``ParseError`` on bad output, e.g.
            ``lambda t: parse_tagged(t, ["Decision"], required=["Decision"])``.
        retries: Repair attempts after the first answer (default one; capped at 3).
        max_tokens: Passed to the model.
        temperature: Passed to the model.
        stop: Passed to the model.

    Returns:
        What ``parse`` returns.

    Raises:
        ParseError: if the last attempt still does not parse (chained to its cause).
        LLMError: if the model call fails (not retried here: that is the backend's job).
    """
    request = LLMRequest(tuple(messages), max_tokens, temperature, stop)
    return drive(llm, parse_steps(request, parse, retries=retries))


async def agenerate_parsed(
    llm: LLM,
    messages: Sequence[ChatMessage],
    parse: Callable[[str], T],
    *,
    retries: int = 1,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    stop: Sequence[str] | None = None,
) -> T:
    """Async twin of :func:`generate_parsed` (same arguments and errors)."""
    request = LLMRequest(tuple(messages), max_tokens, temperature, stop)
    return await adrive(llm, parse_steps(request, parse, retries=retries))
