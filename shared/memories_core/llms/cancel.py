"""Stopping a local model's generation from another thread.

A local model on a CPU writes one to two tokens a second, so a derivation can run for
minutes. When the engine stops its worker (``close()`` past its timeout, or the interpreter
exiting) it must not leave that thread inside torch or llama.cpp: a thread still in native
code when the interpreter finalizes aborts the process. The worker runs its jobs inside
:func:`cancellable` with an event of its own, and so does an inline ``flush(timeout=...)``
(``derive="inline"``), whose timer sets the event when its time is up. Once the event is
set, a model call in the scope ends and raises :class:`~memories_core.errors.LLMCancelledError`:
:class:`~memories_core.llms.LocalLLM` checks between its layers on transformers (reading a
long prompt is one forward pass of up to a minute) and at every decoded token on llama.cpp,
the OpenAI-compatible client at every streamed piece, and a call that runs in a helper thread
(:func:`~memories_core.llms.base.run_with_timeout`) stops being waited for. A backend of
one's own can call :func:`check` while it generates.

The scope is the calling thread's context (a :class:`contextvars.ContextVar`), so closing
one engine never stops another engine's generation, and a call made outside any scope (an
inline ``save``, a ``flush()`` without a timeout, a recall-time model step) is never
cancelled this way.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from memories_core.errors import LLMCancelledError

__all__ = ["POLL", "cancellable", "cancelled", "check", "current", "wait"]

#: Seconds between checks of a cancelled scope while :func:`wait` blocks.
POLL = 0.25

_EVENT: contextvars.ContextVar[threading.Event | None] = contextvars.ContextVar(
    "memories_cancel", default=None
)


@contextmanager
def cancellable(event: threading.Event) -> Iterator[None]:
    """Run the block's model calls so that setting ``event`` stops them at their next check."""
    token = _EVENT.set(event)
    try:
        yield
    finally:
        _EVENT.reset(token)


def current() -> threading.Event | None:
    """The event that cancels this thread's model calls (``None``: outside any scope)."""
    return _EVENT.get()


def cancelled(name: str) -> LLMCancelledError:
    """The error a cancelled call of the model ``name`` raises."""
    return LLMCancelledError(
        f"{name}: generation stopped by its caller (the engine stopping, or a flush's time up)"
    )


def check(name: str) -> None:
    """Raise :class:`~memories_core.errors.LLMCancelledError` if this scope was cancelled.

    Args:
        name: The model's name, for the message.
    """
    event = _EVENT.get()
    if event is not None and event.is_set():
        raise cancelled(name)


def wait(block: Callable[[float | None], bool], timeout: float | None, *, name: str) -> bool:
    """Block on ``block`` until it succeeds or ``timeout`` seconds pass, unless cancelled.

    Args:
        block: A blocking wait that takes a timeout in seconds (``None``: no limit) and says
            whether it succeeded, e.g. ``threading.Event.wait``.
        timeout: Seconds to wait in all (``None``: no limit).
        name: The model's name, for the cancellation's message.

    Returns:
        Whether ``block`` succeeded within ``timeout``.

    Raises:
        LLMCancelledError: once this thread's scope is cancelled (checked every
            :data:`POLL` seconds); outside a scope, ``block`` is called once.
    """
    if _EVENT.get() is None:
        return block(timeout)
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    while True:
        check(name)
        left = POLL if deadline is None else min(POLL, deadline - time.monotonic())
        if block(max(0.0, left)):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
