"""Test doubles of the language model: scripted, failing, garbage-answering, taught, gated.

:func:`rule_following_reply` (the offline stand-in that answers the package's own prompts)
and :class:`ScriptedLLM` are re-exported here, so a test finds every model double in one place.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from memories_core.errors import LLMError
from memories_core.interfaces import LLM
from memories_core.llms.base import BaseLLM, LLMResult
from memories_core.llms.scripted import ScriptedLLM
from memories_core.prompts.rule_following import UNKNOWN_PROMPT_REPLY, rule_following_reply
from memories_core.testing.cases import GARBAGE_REPLIES
from memories_core.types import ChatMessage

__all__ = [
    "UNKNOWN_PROMPT_REPLY",
    "FlakyLLM",
    "GatedLLM",
    "ScriptedLLM",
    "TaughtLLM",
    "healthy_llm",
    "rule_following_reply",
]


class FlakyLLM(ScriptedLLM):
    """A scripted model whose health the test switches: ``"ok"``, ``"fail"`` or ``"garbage"``.

    ``"ok"`` answers like :func:`~memories_core.prompts.rule_following.rule_following_reply`,
    ``"fail"`` raises :class:`~memories_core.errors.LLMError` on every call (an outage), and
    ``"garbage"`` cycles through ``garbage`` (default: every reply of :data:`GARBAGE_REPLIES`).

    Args:
        mode: The initial mode.
        garbage: The replies of ``"garbage"`` mode.

    Example:
        >>> llm = FlakyLLM("fail")
        >>> llm.mode = "ok"  # the outage is over
    """

    def __init__(self, mode: str = "ok", *, garbage: Sequence[str] | None = None) -> None:
        super().__init__(default=self._reply)
        self.mode = mode
        self._garbage = tuple(GARBAGE_REPLIES.values() if garbage is None else garbage)
        self._served = 0

    def _reply(self, messages: Sequence[ChatMessage]) -> str:
        if self.mode == "fail":
            raise LLMError("scripted outage")
        if self.mode == "garbage":
            reply = self._garbage[self._served % len(self._garbage)]
            self._served += 1
            return reply
        return rule_following_reply(messages)


class TaughtLLM(BaseLLM):
    """The suite's model taught a mechanism's own prompts.

    :func:`~memories_core.prompts.rule_following.rule_following_reply` answers only the prompts
    it knows; where it says so (:data:`~memories_core.prompts.rule_following.UNKNOWN_PROMPT_REPLY`),
    this wrapper answers with ``reply`` instead, as the model would if it knew them. Outages
    and garbage replies of ``inner`` (e.g. :class:`FlakyLLM`) pass through unchanged, so a
    new mechanism runs the whole contract suite with only its own offline stand-in.

    Args:
        inner: The suite's model.
        reply: The mechanism's stand-in: messages -> reply text.
        name: The model's name in usage records.

    Example:
        >>> from memories_core.prompts.memorybank import memorybank_reply
        >>> llm = TaughtLLM(FlakyLLM(), memorybank_reply, name="memorybank-aware")
    """

    def __init__(
        self,
        inner: LLM,
        reply: Callable[[Sequence[ChatMessage]], str],
        *,
        name: str = "taught",
    ) -> None:
        super().__init__()
        self.inner = inner
        self._reply = reply
        self._name = name

    @property
    def name(self) -> str:
        """The name given at construction (``"taught"`` by default)."""
        return self._name

    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        answer = self.inner.generate(messages, max_tokens=max_tokens, stop=stop)
        return LLMResult(self._reply(messages) if answer == UNKNOWN_PROMPT_REPLY else answer)


class GatedLLM(BaseLLM):
    """A model that answers only once its gate is opened: tests of work off the caller's path.

    Each call sets :attr:`entered` and then waits for :attr:`gate` (an ``Event``); when the
    gate is open it answers with ``reply(messages)``. A call still waiting when its timeout
    ends raises ``LLMTimeoutError`` (the base class stops waiting for it), so a test can
    show that a save returns before the model answers, that ``flush`` waits for it, and
    that a timed-out derivation stays pending, with events instead of sleeps.

    Args:
        reply: The answer to a call (default: :func:`rule_following_reply`).
        timeout: Default seconds per call (``None``: wait for the gate forever).
        open: Start with the gate open.

    Example:
        >>> from memories_core.types import ChatMessage
        >>> llm = GatedLLM(lambda messages: "hi", open=True)
        >>> llm.generate([ChatMessage("user", "hello")])
        'hi'
    """

    def __init__(
        self,
        reply: Callable[[Sequence[ChatMessage]], str] = rule_following_reply,
        *,
        timeout: float | None = 60.0,
        open: bool = False,
    ) -> None:
        super().__init__(timeout=timeout)
        self._reply = reply
        self.entered = threading.Event()
        self.gate = threading.Event()
        if open:
            self.gate.set()

    @property
    def name(self) -> str:
        """``"gated"``."""
        return "gated"

    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        self.entered.set()
        self.gate.wait()
        return LLMResult(self._reply(messages))


def healthy_llm() -> ScriptedLLM:
    """A scripted model that answers every prompt of the package by :func:`rule_following_reply`."""
    return ScriptedLLM(default=rule_following_reply)
