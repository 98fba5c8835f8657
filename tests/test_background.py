"""Model work off the caller's path: background derivations, flush, status, timeouts, budgets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from memories_core import ConditionalMemory, HistoryMemory, Scope, SelfReflectiveMemory, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.errors import ConfigurationError, LLMError, LLMTimeoutError
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.memochat import choose_memos
from memories_core.prompts.rule_following import UNKNOWN_PROMPT_REPLY, rule_following_reply
from memories_core.testing import GatedLLM
from memories_core.types import ChatMessage

pytestmark = pytest.mark.background

ANN = Scope("ann", session_id="s1")
FACT = "I am allergic to peanuts and I keep bees"


def conditional(llm: GatedLLM | ScriptedLLM, **kwargs: object) -> ConditionalMemory:
    return ConditionalMemory(llm=llm, embedder=HashingEmbedder(), **kwargs)  # type: ignore[arg-type]


def test_save_returns_before_the_model_answers_and_flush_waits() -> None:
    llm = GatedLLM()
    memory = conditional(llm)
    try:
        memory.save([Turn("user", FACT)], ANN)  # returns although the model cannot answer
        assert llm.entered.wait(10), "the background worker never called the model"
        # The turn is stored and searchable at once; nothing is derived yet.
        assert [t.content for t in memory.turns(ANN)] == [FACT]
        assert memory.engine.search("peanuts", "ann", k=1)[0].record.kind == "turn"
        assert memory.records(ANN) == []
        status = memory.status("ann")
        assert status.running == 1 and status.derive == "background" and status.worker_alive
        assert memory.flush("ann", timeout=0.05) == 1  # a bounded wait leaves it running
        llm.gate.set()
        assert memory.flush("ann") == 0
        assert [r.kind for r in memory.records(ANN)] == ["conditional"]
        assert memory.status("ann").idle
    finally:
        llm.gate.set()
        memory.close()


def test_a_timed_out_model_leaves_the_turn_stored_and_the_job_pending() -> None:
    llm = GatedLLM(timeout=0.2)  # never opened in time: every call times out
    memory = conditional(llm)
    try:
        memory.save([Turn("user", FACT)], ANN)
        assert memory.flush("ann") == 1  # failed into backoff: flush does not wait for it
        assert [t.content for t in memory.turns(ANN)] == [FACT]
        status = memory.status("ann")
        assert status.failed == 1 and status.pending == status.running == 0
        assert "no answer within 0.2 s" in next(iter(status.last_errors.values()))
        assert "failed" in str(status)
        assert llm.usage.failures >= 1
        # The model comes back: an explicit retry derives the record.
        llm.gate.set()
        assert memory.retry_pending("ann") == 0
        assert [r.kind for r in memory.records(ANN)] == ["conditional"]
    finally:
        llm.gate.set()
        memory.close()


def test_a_failing_model_never_stops_the_worker() -> None:
    llm = ScriptedLLM([ConnectionError("down")], default="<Decision>: no")
    memory = conditional(llm)
    try:
        memory.save([Turn("user", FACT)], ANN)
        assert memory.flush("ann") == 1
        memory.save([Turn("user", "I also grow tomatoes")], Scope("bob"))
        assert memory.flush("bob") == 0  # the worker lives on after a failed job
        assert [t.content for t in memory.turns(ANN)] == [FACT]
    finally:
        memory.close()


def test_close_with_pending_work_then_reopen_runs_it(tmp_path: Path) -> None:
    llm = GatedLLM()
    memory = conditional(llm, path=tmp_path)
    memory.save([Turn("user", FACT)], ANN)
    assert llm.entered.wait(10)
    memory.save([Turn("user", "My sister Mia lives in Lyon")], ANN)
    # The job in hand outlives the close timeout: it is released, the other stays pending.
    memory.close(timeout=0.2)
    llm.gate.set()
    again = conditional(ScriptedLLM(default=rule_following_reply), path=tmp_path)
    try:
        assert len(again.pending("ann")) == 2
        assert again.status("ann").pending == 2
        assert again.flush("ann", progress=True) == 0
        texts = " ".join(r.text for r in again.records(ANN))
        assert "peanuts" in texts and "Lyon" in texts
        assert len(again.turns(ANN)) == 2
    finally:
        again.close()


def test_end_session_does_not_wait_for_the_model() -> None:
    from memories_core import SummaryMemory

    llm = GatedLLM(lambda messages: "The user keeps bees.")
    memory = SummaryMemory(llm=llm, embedder=HashingEmbedder())
    try:
        memory.save([Turn("user", FACT)], ANN)
        memory.end_session(ANN)  # returns with the gate closed
        assert llm.entered.wait(10)
        assert memory.records(ANN) == []
        llm.gate.set()
        assert memory.flush() == 0
        assert [r.text for r in memory.records(ANN)] == ["The user keeps bees."]
    finally:
        llm.gate.set()
        memory.close()


def test_inline_mode_derives_inside_save() -> None:
    llm = GatedLLM(open=True)
    memory = conditional(llm, derive="inline")
    try:
        memory.save([Turn("user", FACT)], ANN)
        assert [r.kind for r in memory.records(ANN)] == ["conditional"]
        assert memory.status("ann").derive == "inline"
        assert not memory.status("ann").worker_alive
    finally:
        memory.close()


def test_derive_is_validated_and_belongs_to_the_engine() -> None:
    with pytest.raises(ConfigurationError):
        MemoryEngine(embedder=HashingEmbedder(), derive="later")  # type: ignore[arg-type]
    engine = MemoryEngine(embedder=HashingEmbedder())
    with pytest.raises(ConfigurationError, match="derive"):
        HistoryMemory(engine=engine, derive="inline")
    engine.close()


# --------------------------------------------------------------------- model timeouts
def test_generate_raises_a_typed_timeout_and_counts_it() -> None:
    llm = GatedLLM(timeout=0.1)
    with pytest.raises(LLMTimeoutError) as info:
        llm.generate([ChatMessage("user", "hello")])
    assert isinstance(info.value, LLMError) and info.value.timeout == pytest.approx(0.1)
    with pytest.raises(LLMTimeoutError):
        llm.generate([ChatMessage("user", "hello")], timeout=0.05)  # per call
    assert llm.usage.failures == 2
    llm.gate.set()
    assert llm.generate([ChatMessage("user", "hello")], timeout=5) == UNKNOWN_PROMPT_REPLY


async def test_agenerate_times_out_too() -> None:
    llm = GatedLLM(timeout=0.1)
    try:
        with pytest.raises(LLMTimeoutError):
            await llm.agenerate([ChatMessage("user", "hello")])
    finally:
        llm.gate.set()


def test_every_call_has_an_output_cap() -> None:
    llm = ScriptedLLM(["ok"])
    assert llm.max_tokens is not None and llm.timeout is not None
    with pytest.raises(ConfigurationError):
        GatedLLM(timeout=0)


# --------------------------------------------------------------------- recall budgets
def _history_with_facts() -> HistoryMemory:
    memory = HistoryMemory(embedder=HashingEmbedder())
    memory.save([Turn("user", FACT), Turn("user", "My sister Mia lives in Lyon")], ANN)
    return memory


def test_reflection_past_its_budget_returns_the_first_search(
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = _history_with_facts()
    llm = GatedLLM()  # never answers in time
    memory = SelfReflectiveMemory(base, llm, budget=0.2)
    try:
        plain = base.recall("peanuts allergy", ANN, k=2)
        result = memory.reflect("peanuts allergy", ANN, k=2)
        assert result.timed_out and result.failed and result.memory is None
        assert [h.record.id for h in result.items] == [h.record.id for h in plain.records]
        recall = memory.recall("peanuts allergy", ANN, k=2)
        assert [h.record.id for h in recall.records] == [h.record.id for h in plain.records]
        assert memory.usage.failures["reflection_timeout"] == 2
        # The warning names the budget and the way to wait for a slow model.
        assert "0.2 s time budget" in caplog.text and "budget=None" in caplog.text
    finally:
        llm.gate.set()
        base.close()


async def test_async_reflection_keeps_its_budget() -> None:
    base = _history_with_facts()
    llm = GatedLLM()
    memory = SelfReflectiveMemory(base, llm, budget=0.2)
    try:
        result = await memory.areflect("peanuts allergy", ANN, k=2)
        assert result.timed_out
        assert "peanuts" in result.items[0].record.text
    finally:
        llm.gate.set()
        base.close()


def test_reflection_within_its_budget_is_used() -> None:
    base = _history_with_facts()
    memory = SelfReflectiveMemory(base, GatedLLM(open=True), budget=5)
    result = memory.reflect("peanuts allergy", ANN, k=2)
    assert result.llm_calls == 1 and not result.timed_out and not result.failed
    assert "reflection_timeout" not in memory.usage.failures
    base.close()


def test_memo_choice_past_its_budget_fails_softly(caplog: pytest.LogCaptureFixture) -> None:
    llm = GatedLLM()
    try:
        assert choose_memos(llm, "bees?", ["bees and honey", "a trip to Lyon"], budget=0.1) is None
        assert "0.1 s budget" in caplog.text and "budget=None" in caplog.text
    finally:
        llm.gate.set()


def test_flush_passthrough_on_the_reflective_wrapper() -> None:
    llm = GatedLLM(open=True)
    base = conditional(llm)
    memory = SelfReflectiveMemory(base, llm, budget=5)
    try:
        memory.save([Turn("user", FACT)], ANN)
        assert memory.flush("ann") == 0
        assert [r.kind for r in base.records(ANN)] == ["conditional"]
    finally:
        base.close()


def test_asave_then_aflush() -> None:
    async def run() -> None:
        llm = GatedLLM(open=True)
        memory = conditional(llm)
        try:
            await memory.asave([Turn("user", FACT)], ANN)
            assert await memory.aflush("ann") == 0
            assert [r.kind for r in memory.records(ANN)] == ["conditional"]
        finally:
            memory.close()

    asyncio.run(run())


def test_a_write_the_store_refuses_fails_the_job_instead_of_leaving_it_claimed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A derivation whose write raises a ValueError is counted as a failure and retried."""
    from memories_core import SummaryMemory

    memory = SummaryMemory(
        llm=ScriptedLLM(default=lambda messages: "The user drinks mint tea."),
        embedder=HashingEmbedder(),
    )
    store = memory.engine.store
    real_add = store.add
    refused: list[int] = []

    def add_once(records, *args, **kwargs):  # type: ignore[no-untyped-def]
        if any(r.kind == "summary" for r in records) and not refused:
            refused.append(1)
            raise ValueError("the store cannot encode this value")
        return real_add(records, *args, **kwargs)

    monkeypatch.setattr(store, "add", add_once)
    scope = Scope("mia", "s1")
    memory.save([Turn("user", "I drink mint tea"), Turn("assistant", "Noted.")], scope)
    memory.end_session(scope)
    memory.flush("mia")
    status = memory.status("mia")
    assert refused and status.running == 0 and status.failed == 1  # not stuck as running
    memory.retry_pending("mia")
    memory.flush("mia")
    assert memory.status("mia").failed == 0
    kinds = [hit.record.kind for hit in memory.recall("mint tea", Scope("mia")).records]
    assert "summary" in kinds
    memory.close()
