"""Pending jobs whose model calls are batched: the same memory as one job at a time.

A model that decodes several sequences per step (``batch_capacity`` > 1) lets the engine hand
several due jobs of a mechanism to its ``prepare`` hook; DPeM then asks each of its three steps
for all those rounds in one ``generate_batch``. What is remembered must not change.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from memories_core import ConditionalMemory, DualProcessMemory, FixedClock, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.errors import LLMError, LLMTimeoutError, ParseError
from memories_core.llms import ScriptedLLM
from memories_core.prompts.batch import batch_capacity, drive_batch, run_spec_batch
from memories_core.prompts.conditional import DECISION, DecisionInput
from memories_core.prompts.dpem import dpem_reply
from memories_core.prompts.rule_following import rule_following_reply
from memories_core.types import ChatMessage

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=timezone.utc)

FACTS = [
    "I have type 2 diabetes.",
    "My daughter Mia plays the cello.",
    "I have type 2 diabetes.",
    "I moved to Lisbon last spring.",
    "My daughter Mia plays the cello.",
    "I have type 2 diabetes.",
    "I am allergic to peanuts.",
]


def _exchanges(texts: Sequence[str]) -> list[Turn]:
    turns = []
    for i, text in enumerate(texts):
        at = T0 + timedelta(minutes=i)
        turns += [Turn("user", text, timestamp=at), Turn("assistant", "Noted.", timestamp=at)]
    return turns


def _memory(llm: ScriptedLLM) -> DualProcessMemory:
    return DualProcessMemory(
        llm=llm,
        embedder=HashingEmbedder(dimension=128),
        clock=FixedClock(T0),
        theta=2,
        stm_refresh_rounds=4,
    )


def _snapshot(memory: DualProcessMemory, user: str) -> dict[str, Any]:
    return {
        "working": sorted(i.text for i in memory.working(user)),
        "stm": sorted((i.text, i.count, i.type) for i in memory.stm(user)),
        "ltm": sorted((i.text, i.count, i.type) for i in memory.ltm(user)),
        "flags": memory.flag_table(user),
        "stats": memory.stats(user),
    }


# ---------------------------------------------------------------------------- the prompt runner
def test_run_spec_batch_answers_in_order_and_repairs_one_reply_in_the_next_round() -> None:
    llm = ScriptedLLM(
        ["<Decision>: yes", "not a decision", "<Decision>: no", "<Decision>: yes"],
        batch_capacity=4,
    )
    inputs = [DecisionInput("I am vegan"), DecisionInput("I hate rain"), DecisionInput("hi")]
    assert run_spec_batch(llm, DECISION, inputs) == [True, True, False]
    # One batch of three, then the repair of the second reply alone.
    assert llm.batches == [3]
    assert len(llm.calls) == 4
    assert "not a decision" in str(llm.calls[3])


def test_a_reply_that_never_parses_fails_only_its_own_input() -> None:
    llm = ScriptedLLM(["<Decision>: yes", "???", "<Decision>: no", "still ???"], batch_capacity=4)
    inputs = [DecisionInput("a"), DecisionInput("b"), DecisionInput("c")]
    first, second, third = run_spec_batch(llm, DECISION, inputs)
    assert (first, third) == (True, False)
    assert isinstance(second, ParseError)


def test_requests_with_other_options_go_in_separate_batches() -> None:
    llm = ScriptedLLM(default="<Decision>: yes", batch_capacity=8)
    short = run_spec_batch(llm, DECISION, [DecisionInput("a")] * 2, max_tokens=5)
    long = run_spec_batch(llm, DECISION, [DecisionInput("b")] * 3, max_tokens=50)
    assert short == [True, True] and long == [True, True, True]
    assert llm.batches == [2, 3]


def test_drive_batch_without_generate_batch_calls_one_request_at_a_time() -> None:
    class Plain:
        def __init__(self) -> None:
            self.seen: list[str] = []

        def generate(self, messages: Sequence[ChatMessage], **options: Any) -> str:
            self.seen.append(messages[-1].content)
            return "<Decision>: yes"

    from memories_core.prompts.spec import spec_steps

    plain = Plain()
    loops = [spec_steps(plain, DECISION, DecisionInput(t)) for t in ("x", "y")]
    assert drive_batch(plain, loops) == [True, True]  # type: ignore[arg-type]
    assert len(plain.seen) == 2
    assert batch_capacity(plain) == 1


def test_a_model_error_in_a_batch_is_raised() -> None:
    llm = ScriptedLLM(default=TimeoutError("down"), batch_capacity=4)
    with pytest.raises(LLMError):
        run_spec_batch(llm, DECISION, [DecisionInput("a"), DecisionInput("b")])


# ---------------------------------------------------------------------------- DPeM's jobs
def test_batched_rounds_remember_exactly_what_one_round_at_a_time_does() -> None:
    one = ScriptedLLM(default=dpem_reply)
    batched = ScriptedLLM(default=dpem_reply, batch_capacity=4)
    by_one, by_batch = _memory(one), _memory(batched)
    by_one.save(_exchanges(FACTS), Scope("ann"))
    by_batch.save(_exchanges(FACTS), Scope("ann"))
    assert by_batch.rounds("ann") == by_one.rounds("ann") == len(FACTS)
    assert by_batch.pending("ann") == by_one.pending("ann") == []
    assert _snapshot(by_batch, "ann") == _snapshot(by_one, "ann")
    assert by_batch.ltm("ann"), "a fact said twice reached long-term memory"
    # Seven rounds in batches of four and three, each step asked once per batch.
    assert batched.batches == [4, 4, 4, 3, 3, 3]
    assert len(batched.calls) == len(one.calls)
    assert one.batches == []
    assert by_batch.usage.summary()["llm_calls"] == by_one.usage.summary()["llm_calls"]


def test_a_round_whose_notes_never_parse_fails_alone_and_is_retried() -> None:
    def reply(messages: Sequence[ChatMessage]) -> str:
        if any("BROKEN" in m.content for m in messages):
            return "no notes here"
        return dpem_reply(messages)

    llm = ScriptedLLM(default=reply, batch_capacity=4)
    memory = _memory(llm)
    texts = ["I have type 2 diabetes.", "BROKEN line", "I am allergic to peanuts."]
    memory.save(_exchanges(texts), Scope("ann"))
    pending = memory.pending("ann")
    assert [(j.payload["round"], j.attempts) for j in pending] == [(2, 1)]
    assert memory.usage.failures.get("notes") == 1
    assert memory.stats("ann").processed == 2
    assert len(memory.engine.get("ann", [str(t) for t in pending[0].payload["turn_ids"]])) == 2
    # The model is fixed: the round is learned on the next run.
    llm.__init__(default=dpem_reply, batch_capacity=4)  # type: ignore[misc]
    assert memory.retry_pending("ann") == 0
    assert memory.stats("ann").processed == 3


def test_a_model_down_during_a_batch_fails_one_job_and_keeps_every_turn() -> None:
    llm = ScriptedLLM(default=TimeoutError("down"), batch_capacity=4)
    memory = _memory(llm)
    memory.save(_exchanges(FACTS[:3]), Scope("ann"))
    jobs = memory.pending("ann")
    assert sorted(j.attempts for j in jobs) == [0, 0, 1]
    assert len(memory.turns(Scope("ann"))) == 6
    assert llm.batches == [3]


class _SlowBatches(ScriptedLLM):
    """Answers each conversation alone in time, but every batch misses its timeout."""

    def generate_batch(self, conversations: Any, **options: Any) -> Any:
        self.batches.append(len(conversations))
        raise LLMTimeoutError("the batch gave no answer in time", timeout=1.0)


def test_a_batch_that_times_out_runs_its_jobs_one_by_one_and_the_model_stays_up() -> None:
    llm = _SlowBatches(default=dpem_reply, batch_capacity=4)
    memory = _memory(llm)
    memory.save(_exchanges(FACTS[:3]), Scope("ann"))
    assert llm.batches == [3]
    assert memory.pending("ann") == []
    assert memory.stats("ann").processed == 3
    assert memory.usage.failures == {"batch_timeout": 1}
    # The same memory as a model that never batches.
    one = _memory(ScriptedLLM(default=dpem_reply))
    one.save(_exchanges(FACTS[:3]), Scope("ann"))
    assert _snapshot(memory, "ann")["ltm"] == _snapshot(one, "ann")["ltm"]
    assert _snapshot(memory, "ann")["stm"] == _snapshot(one, "ann")["stm"]


def test_a_single_call_that_times_out_after_a_batch_timeout_still_stops_the_run() -> None:
    llm = _SlowBatches(default=TimeoutError("down"), batch_capacity=4)
    memory = _memory(llm)
    memory.save(_exchanges(FACTS[:3]), Scope("ann"))
    assert sorted(j.attempts for j in memory.pending("ann")) == [0, 0, 1]
    assert len(memory.turns(Scope("ann"))) == 6
    assert len(llm.calls) == 1  # one single call, not one per job


def test_one_batch_over_two_users_keeps_each_users_memory_apart() -> None:
    llm = ScriptedLLM(default=TimeoutError("down"), batch_capacity=8)
    memory = _memory(llm)
    memory.save(_exchanges(["I have type 2 diabetes."] * 2), Scope("ann"))
    memory.save(_exchanges(["My dog is named Rex."] * 2), Scope("bob"))
    assert len(memory.pending("ann")) == len(memory.pending("bob")) == 2
    llm.__init__(default=dpem_reply, batch_capacity=8)  # type: ignore[misc]
    assert memory.retry_pending() == 0
    assert llm.batches == [4, 4, 4]  # both users' rounds in each step's batch
    ann = [i.text for i in memory.stm("ann") + memory.ltm("ann")]
    bob = [i.text for i in memory.stm("bob") + memory.ltm("bob")]
    assert ann and all("diabetes" in t for t in ann)
    assert bob and all("Rex" in t for t in bob)
    assert memory.stats("ann").processed == memory.stats("bob").processed == 2


# ---------------------------------------------------------------------------- conditional memory
def _conditional(llm: ScriptedLLM) -> ConditionalMemory:
    return ConditionalMemory(llm=llm, embedder=HashingEmbedder(dimension=128), clock=FixedClock(T0))


def _records(memory: ConditionalMemory, user: str) -> list[tuple[str, int]]:
    """Each record's text and the position of the turn it was written for."""
    turns = [t.id for t in memory.records(Scope(user), kind="turn")]
    found = memory.records(Scope(user), kind="conditional")
    return sorted((r.text, turns.index(str(r.metadata["turn_id"]))) for r in found)


def test_batched_decisions_and_records_write_what_one_turn_at_a_time_does() -> None:
    one = ScriptedLLM(default=rule_following_reply)
    batched = ScriptedLLM(default=rule_following_reply, batch_capacity=8)
    by_one, by_batch = _conditional(one), _conditional(batched)
    by_one.save(_exchanges(FACTS), Scope("ann"))
    by_batch.save(_exchanges(FACTS), Scope("ann"))
    assert by_batch.pending("ann") == by_one.pending("ann") == []
    assert _records(by_batch, "ann") == _records(by_one, "ann")
    written = len(_records(by_one, "ann"))
    assert written > 0
    # Seven decisions in one batch, then the records of the turns worth remembering.
    assert batched.batches == [7, written]
    assert len(batched.calls) == len(one.calls) == 7 + written


def test_a_turn_whose_record_never_parses_fails_alone_with_its_decision_kept() -> None:
    def reply(messages: Sequence[ChatMessage]) -> str:
        text = rule_following_reply(messages)
        if any("peanuts" in m.content for m in messages) and "Decision" not in text:
            return "no record here"
        return text

    llm = ScriptedLLM(default=reply, batch_capacity=8)
    memory = _conditional(llm)
    memory.save(_exchanges(FACTS), Scope("ann"))
    pending = memory.pending("ann")
    assert len(pending) == 1 and pending[0].attempts == 1
    assert pending[0].payload["decision"] is True and "note" not in pending[0].payload
    assert memory.usage.failures.get("record") == 1
    assert all("peanuts" not in text for text, _ in _records(memory, "ann"))


# ---------------------------------------------------------------------------- EMG-RAG
def test_batched_extractions_edit_the_graph_as_one_turn_at_a_time_does() -> None:
    from test_emg import EXPECTED_AFTER_EDITS, STORY, USER, make, scripted_reply
    from test_emg import T0 as STORY_START

    def roles(text: str) -> str:
        return "notification" if text.startswith(("Airline", "Your")) else "user"

    turns = [
        Turn(roles(t), t, timestamp=STORY_START + timedelta(hours=i)) for i, t in enumerate(STORY)
    ]
    batched = ScriptedLLM(default=scripted_reply, batch_capacity=8)
    one = ScriptedLLM(default=scripted_reply)
    by_batch, by_one = make(llm=batched), make(llm=one)
    by_batch.save(turns, Scope(USER))  # one save of six turns: six extractions waiting
    by_one.save(turns, Scope(USER))
    now = STORY_START + timedelta(days=2)
    assert by_batch.triples(USER, now=now) == by_one.triples(USER, now=now)
    assert by_batch.triples(USER, now=now) == EXPECTED_AFTER_EDITS
    reasons = [c.reason for c in by_batch.edits(USER)]
    assert reasons == [c.reason for c in by_one.edits(USER)]
    assert batched.batches[0] == len(STORY) and one.batches == []


def test_an_unparsable_extraction_in_a_batch_is_stored_by_the_fallback() -> None:
    from test_emg import T0 as STORY_START
    from test_emg import USER, make

    llm = ScriptedLLM(default="not json at all", batch_capacity=4)
    memory = make(llm=llm)
    texts = ["I love green tea.", "My sister Ana lives in Porto."]
    memory.save([Turn("user", t, timestamp=STORY_START) for t in texts], Scope(USER))
    assert llm.batches == [2, 2]  # the batch, then both repairs together
    assert memory.pending(USER) == []
    stored = sorted(r.text for r in memory.memories(USER))
    assert stored == sorted(texts)


def test_extracted_memories_survive_the_payload_and_malformed_ones_fall_back() -> None:
    from memories_core.mechanisms.emg.batching import (
        extracted_from_payload,
        extracted_to_payload,
    )
    from memories_core.prompts.emg import ExtractedMemory

    item = ExtractedMemory(
        "Ana flies on 2024-05-12.", "Event", "Travel", "Ana", "flies_on", "2024-05-12", when=T0
    )
    payload = json.loads(json.dumps(extracted_to_payload([item])))
    assert extracted_from_payload(payload) == [item]
    assert extracted_to_payload(None) is None and extracted_from_payload(None) is None
    assert extracted_from_payload([{"text": "no other field"}]) is None
    assert extracted_from_payload([{**payload[0], "when": "not a time"}]) is None
