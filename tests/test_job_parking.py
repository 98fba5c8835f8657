"""Jobs whose replies never parse are parked after ``JobPolicy.max_attempts``, not retried for
ever; a model that is down never parks a job; an explicit retry runs a parked job again."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from memories_core import ChatMessage, FixedClock, Scope, SummaryMemory, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.engine import JobPolicy, MemoryEngine
from memories_core.errors import ConfigurationError
from memories_core.llms import ScriptedLLM

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)


def summarize(messages: Sequence[ChatMessage]) -> str:
    return "The user said they moved to Lisbon last month."


def make(
    llm: ScriptedLLM, clock: FixedClock, path: Path | None = None, **policy: object
) -> SummaryMemory:
    engine = MemoryEngine(
        path=path,
        embedder=HashingEmbedder(),
        clock=clock,
        jobs=JobPolicy(**policy),  # type: ignore[arg-type]
    )
    return SummaryMemory(engine=engine, llm=llm)


def end_sessions(memory: SummaryMemory, clock: FixedClock, count: int) -> None:
    """Days of further sessions: each save and session end retries what is due."""
    for _ in range(count):
        clock.advance(timedelta(days=1))
        day = f"{clock.now():%B %d}"
        scope = Scope("ann", day)
        memory.save([Turn("user", f"small talk on {day}")], scope)
        memory.end_session(scope)


def test_a_job_whose_reply_never_parses_is_parked_and_an_explicit_retry_runs_it() -> None:
    clock = FixedClock(T0)
    garbage = ScriptedLLM(default="@@@ not a summary")
    memory = make(garbage, clock, max_attempts=3)
    scope = Scope("ann", "s1")
    memory.save([Turn("user", "I moved to Lisbon last month")], scope)
    memory.end_session(scope)
    # Every later session is garbage too; the first session's job is tried three times in all.
    end_sessions(memory, clock, 6)
    jobs = {j.key: j for j in memory.pending("ann")}
    first = next(j for key, j in jobs.items() if key.endswith("s1"))
    assert first.attempts == 3
    status = memory.status("ann")
    assert status.parked == sum(j.attempts == 3 for j in jobs.values()) >= 4
    assert status.failed == len(jobs) - status.parked  # the newest sessions' are in backoff
    assert "parked" in str(status)
    calls = len(garbage.calls)
    end_sessions(memory, clock, 1)  # parked jobs cost no calls
    asked = " ".join(m.content for call in garbage.calls[calls:] for m in call)
    assert asked and "Lisbon" not in asked and "March 03" not in asked
    assert len(garbage.calls) - calls == 2 * (status.failed + 1)  # each try and its repair
    # The turns were stored before anything derived from them, and are still there.
    assert [t.content for t in memory.turns(scope)] == ["I moved to Lisbon last month"]
    memory.summarizer = ScriptedLLM(default=summarize)
    assert memory.retry_pending("ann") == 0
    assert memory.status("ann").idle
    assert "Lisbon" in memory.recall("where does ann live", Scope("ann")).context


def test_a_model_that_is_down_never_parks_a_job() -> None:
    clock = FixedClock(T0)
    down = ScriptedLLM(default=ConnectionError("server down"))
    memory = make(down, clock, max_attempts=2)
    scope = Scope("ann", "s1")
    memory.save([Turn("user", "I moved to Lisbon last month")], scope)
    memory.end_session(scope)
    end_sessions(memory, clock, 4)
    first = next(j for j in memory.pending("ann") if j.key.endswith("s1"))
    assert first.attempts > 2
    assert memory.status("ann").parked == 0
    memory.summarizer = ScriptedLLM(default=summarize)
    end_sessions(memory, clock, 1)  # the model is back: the backlog runs by itself
    assert memory.pending("ann") == []


def test_without_a_limit_a_failing_job_is_retried_for_ever() -> None:
    clock = FixedClock(T0)
    memory = make(ScriptedLLM(default="@@@"), clock, max_attempts=None)
    memory.save([Turn("user", "I moved to Lisbon last month")], Scope("ann", "s1"))
    memory.end_session(Scope("ann", "s1"))
    end_sessions(memory, clock, 5)
    first = next(j for j in memory.pending("ann") if j.key.endswith("s1"))
    assert first.attempts >= 5
    assert memory.status("ann").parked == 0


def test_a_parked_job_stays_parked_after_a_reopen(tmp_path: Path) -> None:
    clock = FixedClock(T0)
    memory = make(ScriptedLLM(default="@@@"), clock, tmp_path, max_attempts=1)
    memory.save([Turn("user", "I moved to Lisbon last month")], Scope("ann", "s1"))
    memory.end_session(Scope("ann", "s1"))
    assert memory.status("ann").parked == 1
    memory.close()
    clock.advance(timedelta(days=30))
    reopened = make(ScriptedLLM(default=summarize), clock, tmp_path, max_attempts=1)
    reopened.save([Turn("user", "hello again")], Scope("ann", "s2"))
    assert reopened.status("ann").parked == 1
    assert reopened.retry_pending("ann") == 0


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "3"])
def test_max_attempts_must_be_a_positive_int_or_none(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="max_attempts"):
        JobPolicy(max_attempts=bad)  # type: ignore[arg-type]


def test_the_background_worker_stops_retrying_a_parked_job_and_flush_returns() -> None:
    garbage = ScriptedLLM(default="@@@ not a summary")
    engine = MemoryEngine(
        embedder=HashingEmbedder(),
        clock=FixedClock(T0),
        derive="background",
        jobs=JobPolicy(base_backoff=timedelta(0), max_attempts=3),
    )
    memory = SummaryMemory(engine=engine, llm=garbage)
    try:
        memory.save([Turn("user", "I moved to Lisbon last month")], Scope("ann", "s1"))
        memory.end_session(Scope("ann", "s1"))
        # Due again at once after each failure, so only the limit ends the retries.
        assert memory.flush("ann", timeout=30) == 1
        assert memory.status("ann").parked == 1
        assert len(garbage.calls) == 3 * 2  # three tries, each with its repair call
    finally:
        memory.close()


def test_usage_counts_finished_jobs_by_the_run_that_succeeded() -> None:
    clock = FixedClock(T0)
    # The first session's summary and its repair are garbage; every later reply is good.
    llm = ScriptedLLM(["@@@ not a summary", "@@@ still not"], default=summarize)
    memory = make(llm, clock)
    scope = Scope("ann", "s1")
    memory.save([Turn("user", "I moved to Lisbon last month")], scope)
    memory.end_session(scope)
    assert memory.usage.finished_after == {}
    assert memory.usage.failures == {"summary": 1}
    end_sessions(memory, clock, 2)  # the failed job is retried with the next session's
    assert memory.usage.finished_after == {1: 2, 2: 1}
    assert memory.status("ann").idle
