"""MemoryBank (Zhong et al.): the curve, consolidation, reinforcement, forgetting, recall."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memories_core import FixedClock, MemoryBankMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.errors import ConfigurationError, InvalidInputError, LLMError, ParseError
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.forgetting import ForgettingCurve, choose_forgotten, retention
from memories_core.prompts.memorybank import (
    DAILY_PORTRAIT_SYSTEM,
    GLOBAL_PORTRAIT_SYSTEM,
    build_daily_summary_messages,
    memorybank_reply,
    parse_portrait,
    parse_summary,
)
from memories_core.testing import GARBAGE_REPLIES
from memories_core.types import ChatMessage

DAY1 = datetime(2023, 5, 1, 20, 0, tzinfo=timezone.utc)
USER = "gary"

times = st.floats(min_value=0, max_value=1e4, allow_nan=False)
strengths = st.floats(min_value=0.01, max_value=1e3, allow_nan=False)


# ----------------------------------------------------------------------------- the curve
@given(strengths, st.floats(min_value=0.1, max_value=100))
def test_retention_is_one_at_zero(strength: float, scale: float) -> None:
    assert retention(0, strength, scale=scale) == 1.0


@given(times, times, strengths)
def test_retention_is_monotone_in_time(t1: float, t2: float, strength: float) -> None:
    low, high = sorted((t1, t2))
    assert 0 <= retention(high, strength) <= retention(low, strength) <= 1


@given(times, strengths, strengths)
def test_retention_increases_with_strength(t: float, s1: float, s2: float) -> None:
    weak, strong = sorted((s1, s2))
    assert retention(t, weak) <= retention(t, strong)


def test_retention_is_the_intended_curve_not_the_releases() -> None:
    # exp(-t / S), where the release's exp(-t / 5*S) would make S=2 fade faster than S=1.
    assert retention(3, 2) == pytest.approx(math.exp(-1.5))
    assert retention(3, 2) > retention(3, 1)
    assert retention(5, 1, scale=5) == pytest.approx(math.exp(-1))


def test_retention_rejects_bad_input() -> None:
    with pytest.raises(InvalidInputError):
        retention(math.nan, 1)
    with pytest.raises(InvalidInputError):
        retention(1, 1, scale=0)
    assert retention(-5, 1) == 1.0
    assert retention(1, 0) == 0.0
    with pytest.raises(ConfigurationError):
        ForgettingCurve(unit=timedelta(0))


def test_curve_reads_metadata_of_any_index() -> None:
    curve = ForgettingCurve()
    now = DAY1 + timedelta(days=2)
    assert curve.of_metadata({"created_at": DAY1.isoformat()}, now) == pytest.approx(math.exp(-2))
    assert curve.of_metadata({"timestamp": DAY1.timestamp(), "strength": 2}, now) == (
        pytest.approx(math.exp(-1))
    )
    recalled = {"created_at": "2020-01-01", "last_recalled_at": now.isoformat()}
    assert curve.of_metadata(recalled, now) == 1.0
    assert curve.of_metadata({"text": "no time"}, now) is None
    assert curve.of_metadata({"created_at": "not a date"}, now) is None


@given(st.lists(st.tuples(st.text(min_size=1), st.floats(0, 1)), unique_by=lambda x: x[0]))
def test_stochastic_forgetting_is_reproducible_and_order_free(items: list[Any]) -> None:
    first = choose_forgotten(items, seed=7)
    assert first == choose_forgotten(list(reversed(items)), seed=7)
    assert set(first) <= {item for item, _ in items}


def test_threshold_forgetting() -> None:
    items = [("a", 0.05), ("b", 0.5), ("c", 0.09)]
    assert choose_forgotten(items, policy="threshold", threshold=0.1) == ["a", "c"]
    assert choose_forgotten([("x", 1.0)], seed=1) == []  # R = 1 is never forgotten
    assert choose_forgotten([("x", 0.0)], seed=1) == ["x"]
    with pytest.raises(ConfigurationError):
        choose_forgotten(items, policy="random")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- prompts
@pytest.mark.parametrize("name", sorted(GARBAGE_REPLIES))
def test_parsers_reject_garbage(name: str) -> None:
    source = ["user: I always drink green tea in the morning", "assistant: Noted, green tea."]
    with pytest.raises(ParseError):
        parse_summary(GARBAGE_REPLIES[name], source)
    with pytest.raises(ParseError):
        parse_portrait(GARBAGE_REPLIES[name], source)


def test_parsers_keep_quotes_of_the_dialogue_and_strip_labels() -> None:
    source = ["user: I'm sorry I was late", "assistant: No worries."]
    text = '**Summary:** The user said "I\'m sorry I was late"; the companion reassured them.'
    assert parse_summary(text, source).startswith("The user said")
    assert parse_portrait("Portrait: A polite, anxious person.", source).startswith("A polite")


def test_stand_in_answers_the_prompts() -> None:
    lines = ["user: I enjoy chess and I feel stressed", "assistant: Try a walk."]
    summary = memorybank_reply(build_daily_summary_messages("2023-05-01", lines))
    assert parse_summary(summary, lines).startswith("On 2023-05-01 the user said")
    note = memorybank_reply(
        [ChatMessage("system", DAILY_PORTRAIT_SYSTEM), ChatMessage("user", "x")]
    )
    assert "calm" in note
    assert memorybank_reply([ChatMessage("system", "other"), ChatMessage("user", "x")])
    assert GLOBAL_PORTRAIT_SYSTEM


# ----------------------------------------------------------------------------- the mechanism
def _day(n: int, hour: int = 0) -> datetime:
    return DAY1 + timedelta(days=n, hours=hour)


def _exchange(user: str, reply: str, at: datetime) -> list[Turn]:
    return [
        Turn("user", user, timestamp=at),
        Turn("assistant", reply, timestamp=at + timedelta(seconds=30)),
    ]


DAYS = [
    ("I feel stressed at work and sleep badly.", "Try exercise, music and reading to relax."),
    ("I enjoy chess and painting on weekends.", "Chess and painting are great hobbies."),
    ("My cooking keeps burning, any tips?", "Use lower heat and watch the pan."),
]


def _memory(llm: Any = None, **kwargs: Any) -> tuple[MemoryBankMemory, FixedClock]:
    clock = FixedClock(DAY1)
    memory = MemoryBankMemory(
        llm=llm or ScriptedLLM(default=memorybank_reply),
        embedder=HashingEmbedder(dimension=256),
        clock=clock,
        **kwargs,
    )
    return memory, clock


def _replay(memory: MemoryBankMemory, clock: FixedClock, days: int = 3) -> None:
    for n, (said, reply) in enumerate(DAYS[:days]):
        clock.set(_day(n))
        memory.save(_exchange(said, reply, _day(n)), Scope(USER))


def _kinds(memory: MemoryBankMemory, kind: str) -> list[Any]:
    return memory.records(Scope(USER), kind=kind)


def test_day_rollover_consolidates_the_closed_day_only() -> None:
    memory, _ = _memory(consolidate_on_session_end=False)
    memory.save(_exchange(*DAYS[0], _day(0)), Scope(USER))
    assert not _kinds(memory, "daily_summary")
    assert memory.open_day(USER) == "2023-05-01"
    memory.save(_exchange(*DAYS[1], _day(1)), Scope(USER))
    daily = _kinds(memory, "daily_summary")
    assert [r.metadata["day"] for r in daily] == ["2023-05-01"]
    assert "stressed" in daily[0].text
    assert len(_kinds(memory, "daily_portrait")) == 1
    assert memory.global_summary(USER) and memory.portrait(USER)
    assert memory.consolidate(USER) == 0  # the open day, explicitly
    assert [r.metadata["day"] for r in _kinds(memory, "daily_summary")] == [
        "2023-05-01",
        "2023-05-02",
    ]


def test_consolidation_is_incremental() -> None:
    llm = ScriptedLLM(default=memorybank_reply)
    memory, clock = _memory(llm)
    _replay(memory, clock, days=2)
    first = {r.metadata["day"]: r.id for r in _kinds(memory, "daily_summary")}
    calls = len(llm.calls)
    _replay_day = DAYS[2]
    memory.save(_exchange(*_replay_day, _day(2)), Scope(USER))
    # Day 2 closes: its summary and note, then the global summary and portrait: 4 calls.
    assert len(llm.calls) - calls == 4
    dialogues = [c[-1].content for c in llm.calls[calls:]]
    assert not any("stressed at work" in d and "<dialogue>" in d for d in dialogues)
    after = {r.metadata["day"]: r.id for r in _kinds(memory, "daily_summary")}
    assert after["2023-05-01"] == first["2023-05-01"]  # day 1 is never re-summarised
    assert len(_kinds(memory, "global_summary")) == 1  # replaced, not duplicated
    assert len(_kinds(memory, "global_portrait")) == 1
    assert "Over 2 day(s)" in (memory.global_summary(USER) or "")


def test_a_day_closed_twice_is_summarised_once() -> None:
    """Session end closes a day, then the next day's first turn closes it again (§2.2)."""
    llm = ScriptedLLM(default=memorybank_reply)
    memory, clock = _memory(llm)
    per_day = []
    for n, (said, reply) in enumerate(DAYS):
        clock.set(_day(n))
        scope = Scope(USER, session_id=f"s{n}")
        before = len(llm.calls)
        memory.save(_exchange(said, reply, _day(n)), scope)
        memory.end_session(scope)
        memory.flush()
        per_day.append(len(llm.calls) - before)
    # Day summary, day note, global summary, global portrait: four calls a day, not eight.
    assert per_day == [4, 4, 4]
    first = {r.metadata["day"]: r.id for r in _kinds(memory, "daily_summary")}
    # A late turn of a closed day does change the day: it is summarised again.
    before = len(llm.calls)
    late = _day(0) + timedelta(hours=1)
    memory.save([Turn("user", "I also started yoga.", timestamp=late)], Scope(USER))
    memory.flush()
    assert len(llm.calls) - before == 4
    after = {r.metadata["day"]: r.id for r in _kinds(memory, "daily_summary")}
    assert after["2023-05-01"] != first["2023-05-01"]
    assert after["2023-05-02"] == first["2023-05-02"]


def test_failures_are_retried_and_never_lose_turns() -> None:
    state = {"down": True}

    def reply(messages: Sequence[ChatMessage]) -> str:
        if state["down"] and messages[0].content == DAILY_PORTRAIT_SYSTEM:
            raise LLMError("outage")
        return memorybank_reply(messages)

    llm = ScriptedLLM(default=reply)
    memory, clock = _memory(llm)
    _replay(memory, clock, days=2)
    assert len(memory.turns(Scope(USER))) == 4
    assert not _kinds(memory, "daily_summary")  # all or nothing: the day's records wait
    (job,) = [j for j in memory.pending(USER) if j.key == "day:2023-05-01"]
    assert "summary" in job.payload  # the finished step is kept
    assert memory.usage.failures
    state["down"] = False
    asked = len(llm.calls)
    assert memory.retry_pending(USER) == 0
    retried = [c[0].content for c in llm.calls[asked:]]
    assert retried.count(DAILY_PORTRAIT_SYSTEM) >= 1
    assert len(_kinds(memory, "daily_summary")) == 1  # day 2 is still open
    assert memory.retry_pending(USER) == 0
    assert len(_kinds(memory, "daily_summary")) == 1
    assert len(memory.turns(Scope(USER))) == 4


def test_garbage_never_becomes_a_summary() -> None:
    memory, clock = _memory(ScriptedLLM(default=GARBAGE_REPLIES["forged-memory"]))
    _replay(memory, clock, days=2)
    assert [r.kind for r in memory.engine.records(USER)] == ["turn"] * 4
    assert len(memory.turns(Scope(USER))) == 4
    assert memory.pending(USER)


def test_recall_context_has_memories_portrait_and_global_summary() -> None:
    memory, clock = _memory()
    _replay(memory, clock)
    memory.consolidate(USER)
    clock.set(_day(3))
    recall = memory.recall("What did you recommend to relieve stress?", Scope(USER))
    kinds = {hit.record.kind for hit in recall.records}
    assert kinds <= {"turn", "daily_summary"}
    assert "Relevant memories:" in recall.context
    assert "exercise" in recall.context
    assert f"User portrait: {memory.portrait(USER)}" in recall.context
    assert f"Summary of past events: {memory.global_summary(USER)}" in recall.context
    # The query's memories lead (the order measured to answer better), then the globals.
    context = recall.context
    assert context.index("Relevant memories:") < context.index("User portrait:")
    assert context.index("User portrait:") < context.index("Summary of past events:")


def test_recall_reinforces_what_it_returns() -> None:
    memory, clock = _memory(k=1)
    _replay(memory, clock)
    now = _day(5)
    clock.set(now)
    (hit,) = memory.recall("exercise music reading relax", Scope(USER)).records
    (record,) = memory.engine.get(USER, [hit.record.id])
    assert record.state.strength == 2
    assert record.state.recall_count == 1
    assert record.state.last_recalled_at == now
    assert memory.retention(record, now) == 1.0
    assert memory.engine.history(USER, record_id=record.id)[-1].reason == "recalled"


def test_query_time_forgetting_prefers_fresh_memories() -> None:
    def top(memory: MemoryBankMemory, clock: FixedClock) -> str:
        clock.set(_day(0))
        memory.save(_exchange("I like green tea.", "Noted.", _day(0)), Scope(USER))
        clock.set(_day(9))
        memory.save(_exchange("I like green tea a lot.", "Noted again.", _day(9)), Scope(USER))
        (hit,) = memory.recall("green tea", Scope(USER), k=1).records
        return hit.record.text

    memory, clock = _memory(reinforce=False, forgetting_weight=1.0)
    assert top(memory, clock) == "user: I like green tea a lot."
    assert memory.recall_pipeline(forgetting=False) != memory.pipeline


def test_by_default_age_does_not_lower_relevance() -> None:
    """The default (chosen on LoCoMo): an old memory that fits best is recalled first."""

    def top(memory: MemoryBankMemory, clock: FixedClock) -> str:
        clock.set(_day(0))
        memory.save(_exchange("My sister Ann lives in Lisbon.", "Nice.", _day(0)), Scope(USER))
        clock.set(_day(60))
        memory.save(_exchange("I visited a museum.", "Fun.", _day(60)), Scope(USER))
        hits = memory.recall("Where does my sister Ann live?", Scope(USER), k=1).records
        return hits[0].record.text

    memory, clock = _memory(reinforce=False)
    assert memory.forgetting_weight == 0
    assert memory.pipeline == memory.recall_pipeline(forgetting=False)
    assert top(memory, clock) == "user: My sister Ann lives in Lisbon."
    faded, clock = _memory(reinforce=False, forgetting_weight=1.0)
    assert top(faded, clock) != "user: My sister Ann lives in Lisbon."


def test_summaries_follow_the_curve_and_recall_reinforces_them() -> None:
    memory, clock = _memory(forgetting_weight=1.0, k=1)
    _replay(memory, clock, days=2)
    (summary,) = _kinds(memory, "daily_summary")
    later = _day(4)
    # Dated by the last turn of its day (day 0): four days old at S = 1.
    assert memory.retention(summary, later) == pytest.approx(math.exp(-4), rel=1e-3)
    # A fresh turn outranks the faded summary of the same words at weight 1.
    clock.set(later)
    memory.save(_exchange(DAYS[0][0], "Noted.", later), Scope(USER))
    (hit,) = memory.recall(DAYS[0][0], Scope(USER)).records
    assert hit.record.kind == "turn" and hit.record.created_at == later
    # Recalling the summary reinforces it, as it does a turn.
    hits = memory.recall(DAYS[0][0], Scope(USER), k=10).records
    assert summary.id in {h.record.id for h in hits}
    (record,) = memory.engine.get(USER, [summary.id])
    assert record.state.strength == 2 and record.state.last_recalled_at == later
    assert memory.retention(record, later) == 1.0
    # The global portrait and summary shown in the context are reinforced too ...
    gs = _kinds(memory, "global_summary")[0]
    assert gs.state.strength > 1 and gs.state.last_recalled_at == later
    # ... and a rewrite keeps the strength it earned (the next day closes day 5).
    clock.set(_day(5))
    memory.save(_exchange("Hello again.", "Hi.", _day(5)), Scope(USER))
    (rewritten,) = _kinds(memory, "global_summary")
    assert rewritten.id != gs.id and rewritten.state.strength == gs.state.strength


def test_summaries_can_be_kept_from_decaying() -> None:
    memory, clock = _memory(summaries_decay=False)
    _replay(memory, clock, days=2)
    (summary,) = _kinds(memory, "daily_summary")
    assert memory.curve(summary, _day(30)) == 1.0
    assert memory.forget(USER, _day(30), policy="threshold").forgotten  # turns only
    assert not _kinds(memory, "daily_summary")[0].state.archived


def test_scheduled_forgetting_archives_during_consolidation_and_restores() -> None:
    memory, clock = _memory(archive_below=0.01, consolidate_on_session_end=False)
    _replay(memory, clock, days=3)
    assert not memory.forgotten(USER)  # nothing is old enough yet
    clock.set(_day(2, hour=1))
    assert memory.recall("chess painting weekends", Scope(USER), k=1).records
    # Twenty days later, the first save closes day 3; its consolidation forgets what fell
    # below R = 0.01: everything not recalled on day 3.
    clock.set(_day(22))
    memory.save(_exchange("I started yoga.", "Good for you.", _day(22)), Scope(USER))
    forgotten = memory.forgotten(USER)
    assert forgotten and all(memory.retention(r) < 0.01 for r in forgotten)
    assert {r.kind for r in forgotten} >= {"turn", "daily_summary"}
    assert memory.engine.history(USER, record_id=forgotten[0].id)[-1].reason == (
        "forgotten (scheduled threshold)"
    )
    assert memory.portrait(USER) and memory.global_summary(USER)  # never archived
    live = memory.engine.records(USER, where={"archived": False})
    assert all(memory.retention(r) >= 0.01 for r in live if r.kind in ("turn", "daily_summary"))
    ids = {r.id for r in forgotten}
    hits = memory.recall("stressed at work exercise music", Scope(USER), k=20).records
    assert not ids & {h.record.id for h in hits}  # archived: never recalled
    assert memory.restore(USER) == len(ids)
    hits = memory.recall("stressed at work exercise music", Scope(USER), k=20).records
    assert ids & {h.record.id for h in hits}


def test_consolidation_forgets_nothing_by_default() -> None:
    memory, clock = _memory()
    assert memory.archive_below is None
    _replay(memory, clock, days=2)
    clock.set(_day(60))
    memory.save(_exchange("Back after two months.", "Welcome back.", _day(60)), Scope(USER))
    assert memory.consolidate(USER) == 0
    assert not memory.forgotten(USER)
    assert not [j for j in memory.pending(USER) if j.kind == "forget"]


def test_forget_archives_restores_and_hard_deletes_only_when_asked() -> None:
    memory, clock = _memory()
    _replay(memory, clock)
    turns = memory.engine.records(USER, where={"kind": "turn"})
    report = memory.forget(
        USER, _day(40), policy="threshold", threshold=0.5, include_summaries=False
    )
    assert report.considered == 6 and len(report.forgotten) == 6 and not report.hard_deleted
    assert len(memory.engine.records(USER, where={"kind": "turn"})) == 6  # kept, archived
    assert {r.id for r in memory.forgotten(USER)} == {r.id for r in turns}
    hits = memory.recall("stressed exercise chess cooking", Scope(USER), k=10).records
    assert all(hit.record.kind != "turn" for hit in hits)
    assert memory.restore(USER, [turns[0].id]) == 1
    assert memory.restore(USER) == 5
    assert not memory.forgotten(USER)
    gone = memory.forget(
        USER, _day(40), policy="threshold", threshold=0.5, hard_delete=True, include_summaries=False
    )
    assert gone.hard_deleted and len(gone.forgotten) == 6
    assert not memory.engine.records(USER, where={"kind": "turn"})
    assert memory.engine.history(USER)[-1].new == {"deleted": True}


def test_forget_takes_summaries_unless_told_not_to() -> None:
    memory, clock = _memory()
    _replay(memory, clock)
    report = memory.forget(
        USER, _day(60), policy="threshold", threshold=0.5, include_summaries=False
    )
    assert len(report.forgotten) == 6
    assert _kinds(memory, "daily_summary")[0].state.archived is False
    both = memory.forget(USER, _day(60), policy="threshold")
    assert len(both.forgotten) == 4  # two daily summaries and two notes
    assert memory.portrait(USER)  # global records are never forgotten


def test_forget_is_one_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    memory, clock = _memory()
    _replay(memory, clock)
    store = memory.engine.store
    original = store.update_state

    def crash(*args: Any, **kwargs: Any) -> Any:
        original(*args, **kwargs)
        raise RuntimeError("crash after writing")

    monkeypatch.setattr(store, "update_state", crash)
    with pytest.raises(RuntimeError):
        memory.forget(USER, _day(40), policy="threshold", threshold=0.5)
    monkeypatch.undo()
    assert not memory.forgotten(USER)


def test_stochastic_forget_is_deterministic_under_fixed_clock_and_seed() -> None:
    def run() -> tuple[list[str], list[str]]:
        memory, clock = _memory()
        _replay(memory, clock)
        clock.set(_day(4))
        recalled = [h.record.text for h in memory.recall("chess", Scope(USER)).records]
        report = memory.forget(USER, _day(5), seed=42)
        texts = sorted(r.text for r in memory.forgotten(USER))
        assert len(report.forgotten) == len(texts)
        return recalled, texts

    first = run()
    assert first == run()
    assert 0 < len(first[1]) < 10  # of 6 turns, 2 daily summaries and 2 notes


def test_async_twins_match_sync_without_reinforcement() -> None:
    memory, clock = _memory(reinforce=False)
    _replay(memory, clock)
    sync = memory.recall("chess painting", Scope(USER))
    assert asyncio.run(memory.arecall("chess painting", Scope(USER))) == sync
    assert asyncio.run(memory.aconsolidate(USER)) == 0
    report = asyncio.run(memory.aforget(USER, _day(30), policy="threshold"))
    assert report.forgotten


def test_bad_arguments() -> None:
    with pytest.raises(ConfigurationError):
        _memory(forgetting_weight=2)
    for bad in (0, 1.5, -0.1):
        with pytest.raises(ConfigurationError):
            _memory(archive_below=bad)
    memory, _ = _memory()
    with pytest.raises(InvalidInputError):
        memory.consolidate(USER, "yesterday")
    assert memory.consolidate(USER) == 0  # no open day yet: nothing to do
