"""Cancelling a model call when its engine stops (``memories_core.llms.cancel``).

A local model writes a token or two a second on a CPU, so a derivation can outlive
``close()``'s timeout or the interpreter's exit wait. Past that wait the engine's worker
cancels the call in hand: the model stops (between layers, or at its next token), the job
is given back pending with no failure counted, and no thread is left inside native code.
"""

from __future__ import annotations

import importlib.machinery
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from memories_core import ConditionalMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.errors import LLMCancelledError, LLMError, LLMTimeoutError
from memories_core.llms import LocalLLM, ScriptedLLM, cancel
from memories_core.prompts.rule_following import rule_following_reply
from memories_core.testing import GatedLLM
from memories_core.types import ChatMessage

ANN = Scope("ann", session_id="s1")
FACT = "I am allergic to peanuts and I keep bees"
QUESTION = [ChatMessage("user", "Write a long story about a lighthouse keeper.")]


def in_thread(call: Any) -> tuple[threading.Thread, list[Any]]:
    """Run ``call`` in a thread; the list receives its result or its exception."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_only_a_set_event_of_the_callers_own_scope_cancels() -> None:
    cancel.check("m")  # outside any scope: nothing to cancel
    assert cancel.current() is None
    mine, other = threading.Event(), threading.Event()
    with cancel.cancellable(mine):
        assert cancel.current() is mine
        cancel.check("m")
        other.set()  # another scope's event
        cancel.check("m")
        mine.set()
        with pytest.raises(LLMCancelledError, match="m: generation stopped"):
            cancel.check("m")
        # Another thread does not share this thread's scope.
        thread, outcome = in_thread(cancel.current)
        thread.join(5)
        assert outcome == [None]
    assert cancel.current() is None
    cancel.check("m")
    assert issubclass(LLMCancelledError, LLMError)
    assert not issubclass(LLMCancelledError, LLMTimeoutError)


def test_wait_gives_up_at_its_timeout_or_at_a_cancel() -> None:
    never = threading.Event()
    started = time.monotonic()
    assert cancel.wait(never.wait, 0.1, name="m") is False  # no scope: one plain wait
    with cancel.cancellable(threading.Event()):
        assert cancel.wait(never.wait, 0.3, name="m") is False
    assert time.monotonic() - started < 5
    event = threading.Event()
    threading.Timer(0.3, event.set).start()
    started = time.monotonic()
    with cancel.cancellable(event), pytest.raises(LLMCancelledError):
        cancel.wait(never.wait, None, name="m")  # no timeout: only the cancel ends it
    assert time.monotonic() - started < 5


def test_a_call_in_a_helper_thread_stops_being_waited_for_when_cancelled() -> None:
    """A model that does not stop by itself (a served model's client) is abandoned at once."""
    llm = GatedLLM(timeout=60)  # never opened
    event = threading.Event()

    def call() -> str:
        with cancel.cancellable(event):
            return llm.generate(QUESTION)

    thread, outcome = in_thread(call)
    assert llm.entered.wait(10)
    started = time.monotonic()
    event.set()
    thread.join(10)
    assert time.monotonic() - started < 5
    assert isinstance(outcome[0], LLMCancelledError)
    assert llm.usage.failures == 0  # the model did not fail
    llm.gate.set()


class TokenByTokenLlama:
    """Stands in for ``llama_cpp.Llama``: writes up to 100,000 tokens, asking its stopping
    criteria after each one, as llama-cpp-python does."""

    instances: ClassVar[list[TokenByTokenLlama]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.tokens = 0
        self.started = threading.Event()
        TokenByTokenLlama.instances.append(self)

    def create_chat_completion(self, **kwargs: Any) -> dict[str, Any]:
        criteria = kwargs.get("stopping_criteria") or []
        self.started.set()
        for n in range(100_000):
            self.tokens = n + 1
            time.sleep(0.001)
            if any(criterion([1, 2, 3], None) for criterion in criteria):
                break
        content = "word " * self.tokens
        return {
            "choices": [{"message": {"role": "assistant", "content": content}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": self.tokens},
        }


@pytest.fixture
def token_by_token(monkeypatch: pytest.MonkeyPatch) -> type[TokenByTokenLlama]:
    fake = types.ModuleType("llama_cpp")
    fake.Llama = TokenByTokenLlama  # type: ignore[attr-defined]
    fake.StoppingCriteriaList = list  # type: ignore[attr-defined]
    fake.__spec__ = importlib.machinery.ModuleSpec("llama_cpp", None)
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    TokenByTokenLlama.instances.clear()
    return TokenByTokenLlama


@pytest.fixture
def token_llm(token_by_token: type[TokenByTokenLlama]) -> tuple[LocalLLM, TokenByTokenLlama]:
    """A loaded ``LocalLLM`` on the token-by-token fake, and the fake model."""
    llm = LocalLLM(backend="llama_cpp", timeout=None)
    llm.load()
    (model,) = token_by_token.instances
    return llm, model


def generate_in_scope(
    llm: LocalLLM, event: threading.Event, max_tokens: int
) -> tuple[threading.Thread, list[Any]]:
    """``llm.generate`` in a thread, inside a scope that ``event`` cancels."""

    def call() -> str:
        with cancel.cancellable(event):
            return llm.generate(QUESTION, max_tokens=max_tokens)

    return in_thread(call)


def test_a_local_model_stops_generating_at_its_next_token_when_cancelled(
    token_llm: tuple[LocalLLM, TokenByTokenLlama],
) -> None:
    llm, model = token_llm
    event = threading.Event()
    thread, outcome = generate_in_scope(llm, event, 100_000)
    assert model.started.wait(10)
    time.sleep(0.05)
    event.set()
    thread.join(10)
    assert isinstance(outcome[0], LLMCancelledError)
    assert model.tokens < 100_000
    assert llm.usage.failures == 0 and llm.usage.calls == 0
    # The lock was released: a call outside the scope runs (the fake runs on to its deadline).
    with pytest.raises(LLMTimeoutError, match="no complete answer"):
        llm.generate(QUESTION, max_tokens=10, timeout=0.2)


def test_a_call_waiting_for_a_busy_local_model_is_cancelled_while_it_waits(
    token_llm: tuple[LocalLLM, TokenByTokenLlama],
) -> None:
    llm, model = token_llm
    stop_first = threading.Event()
    busy, _ = generate_in_scope(llm, stop_first, 100_000)
    assert model.started.wait(10)
    event = threading.Event()
    waiting, outcome = generate_in_scope(llm, event, 10)
    time.sleep(0.3)
    assert outcome == []  # still waiting for the model
    event.set()
    waiting.join(5)
    assert isinstance(outcome[0], LLMCancelledError)
    stop_first.set()
    busy.join(10)


def conditional(llm: Any, path: Path) -> ConditionalMemory:
    return ConditionalMemory(llm=llm, embedder=HashingEmbedder(), path=path)


def pending_after_close(path: Path) -> tuple[GatedLLM, float]:
    """Save a turn and close past the timeout while its model call hangs.

    The derivation's job is then in the store at ``path``, pending (see the test below).
    Returns the model and the seconds ``close`` took.
    """
    llm = GatedLLM(timeout=600)  # would hold the worker for ten minutes
    memory = conditional(llm, path)
    memory.save([Turn("user", FACT)], ANN)
    assert llm.entered.wait(10)
    started = time.monotonic()
    memory.close(timeout=0.2)
    return llm, time.monotonic() - started


@pytest.mark.background
def test_close_past_its_timeout_cancels_the_model_call_and_keeps_the_job(tmp_path: Path) -> None:
    before = set(threading.enumerate())
    llm, took = pending_after_close(tmp_path)
    assert took < 10  # not the model's 600 s, nor the worker's grace
    workers = [t for t in set(threading.enumerate()) - before if t.name == "memories-derivations"]
    assert not workers  # no thread left waiting on the model
    assert llm.usage.failures == 0
    again = conditional(ScriptedLLM(default=rule_following_reply), tmp_path)
    try:
        (job,) = again.pending("ann")
        assert job.attempts == 0  # given back, not failed
        status = again.status("ann")
        assert status.failed == 0 and not status.last_errors
        assert again.flush("ann") == 0
        assert [r.kind for r in again.records(ANN)] == ["conditional"]
    finally:
        llm.gate.set()
        again.close()


@pytest.mark.background
def test_an_inline_flush_past_its_timeout_cancels_the_model_call_and_keeps_the_job(
    tmp_path: Path,
) -> None:
    """``derive="inline"`` runs the jobs in ``flush``: its timeout bounds them too."""
    first, _ = pending_after_close(tmp_path)
    slow = GatedLLM(timeout=600)
    inline = ConditionalMemory(llm=slow, embedder=HashingEmbedder(), path=tmp_path, derive="inline")
    try:
        started = time.monotonic()
        assert inline.flush("ann", timeout=0.3) == 1
        assert time.monotonic() - started < 5
        assert slow.entered.is_set() and slow.usage.failures == 0
        (job,) = inline.pending("ann")
        assert job.attempts == 0
        assert inline.status("ann").failed == 0
    finally:
        first.gate.set()
        slow.gate.set()
        inline.close()


@pytest.mark.slow
def test_a_real_local_model_is_cancelled_while_it_reads_a_long_prompt(
    one_torch_thread: int,
) -> None:
    """Reading a prompt is one forward pass: the cancel is checked between its layers."""
    llm = LocalLLM(backend="transformers", n_threads=one_torch_thread, timeout=None)
    llm.load()
    notes = " ".join(f"Note {i}: room {i} has locker code {i * 7 % 100}." for i in range(150))
    long_prompt = [ChatMessage("user", f"{notes}\nWhat is the code of room 3?")]
    started = time.monotonic()
    assert llm.generate(long_prompt, max_tokens=1)
    one_pass = time.monotonic() - started
    llm._runtime.cache = llm._runtime.cached_ids = None  # type: ignore[union-attr]
    event = threading.Event()

    def call() -> str:
        with cancel.cancellable(event):
            return llm.generate(long_prompt, max_tokens=200)

    thread, outcome = in_thread(call)
    time.sleep(min(0.3, one_pass / 4))
    cancelled_at = time.monotonic()
    event.set()
    thread.join(60)
    took = time.monotonic() - cancelled_at
    assert isinstance(outcome[0], LLMCancelledError)
    assert took < max(1.0, one_pass / 2), (took, one_pass)
    assert llm.usage.failures == 0
    # The cut pass left no cache behind: the next answer is the one a fresh model gives.
    answer = llm.generate(QUESTION, max_tokens=6)
    fresh = LocalLLM(backend="transformers", n_threads=one_torch_thread)
    assert answer == fresh.generate(QUESTION, max_tokens=6)
