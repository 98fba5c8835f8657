"""DPeM and EMG-RAG write through the engine, so the engine's write rules apply to them.

``MemoryEngine.write_derivation`` is the route for writes a mechanism makes itself (under its
user lock, or from a public method) instead of returning a derivation from its job: records
only of the user written for, search keys checked and replaced with their targets, a pending
deletion finished before a direct write, and nothing written by a job whose user was deleted
while its model ran.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from memories_core import DualProcessMemory, EMGMemory, FixedClock, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.engine import Derivation, MemoryEngine
from memories_core.errors import InvalidInputError
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.dpem import NOTE_KIND
from memories_core.prompts.dpem import dpem_reply
from memories_core.prompts.emg import ExtractedMemory, emg_reply
from memories_core.retrieval.keys import SEARCH_KEY_KIND
from memories_core.types import ChatMessage, JobSpec, MemoryRecord, new_id

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=timezone.utc)
USER = "ann"


@pytest.fixture
def engine() -> Iterator[MemoryEngine]:
    built = MemoryEngine(
        embedder=HashingEmbedder(dimension=64), clock=FixedClock(T0), derive="inline"
    )
    yield built
    built.close()


def note(user: str, text: str = "a note") -> MemoryRecord:
    return MemoryRecord(new_id(), user, "note", text, T0)


# ----------------------------------------------------------------------------- the engine route
def test_write_derivation_refuses_another_users_records(engine: MemoryEngine) -> None:
    with pytest.raises(InvalidInputError):
        engine.write_derivation(USER, Derivation(add=[note(USER), note("bob")]))
    assert engine.records(USER) == [] and engine.records("bob") == []


def test_write_derivation_replaces_records_with_their_search_keys(engine: MemoryEngine) -> None:
    old = note(USER, "old")
    engine.add_records([old])
    key = MemoryRecord(new_id(), USER, SEARCH_KEY_KIND, "old key", T0, metadata={"key_for": old.id})
    engine.add_records([key])
    assert engine.write_derivation(USER, Derivation(add=[note(USER, "new")], replace=[old.id]))
    assert [r.text for r in engine.records(USER)] == ["new"]


def test_a_job_whose_user_was_deleted_writes_nothing(engine: MemoryEngine) -> None:
    engine.enqueue(USER, [JobSpec("m", "k", "key:1", {})])
    [job] = engine.pending(USER)
    engine.add_records([note(USER)])
    engine.delete_user(USER)
    assert not engine.write_derivation(USER, Derivation(add=[note(USER)]), job=job)
    assert engine.records(USER) == [] and USER not in engine.users()


def test_a_direct_write_finishes_a_pending_deletion_first(engine: MemoryEngine) -> None:
    engine.add_records([note(USER, "before the crash")])
    engine.store.mark_deleting(USER, at=T0)  # a deletion the process died in
    engine.write_derivation(USER, Derivation(add=[note(USER, "after")]))
    assert not engine.store.is_deleting(USER)
    assert [r.text for r in engine.records(USER)] == ["after"]


# ----------------------------------------------------------------------------- EMG-RAG
def emg() -> EMGMemory:
    return EMGMemory(
        llm=ScriptedLLM(default=emg_reply),
        embedder=HashingEmbedder(dimension=64),
        clock=FixedClock(T0),
        train_after=None,
    )


def hotel(city: str) -> ExtractedMemory:
    return ExtractedMemory(
        f"The boss stays in {city}.", "Event", "Arrangement", "boss", "stays_in", city
    )


@pytest.mark.parametrize("route", ["add_memories", "add_text"])
def test_emg_direct_writes_survive_a_pending_deletion(route: str) -> None:
    """``add_memories``/``add_text`` finish a crashed deletion, then write (not the reverse).

    Written past the engine, the new memory sat next to the deleted user's old ones until
    the next search finished the deletion and purged it too: an acknowledged write lost.
    """
    memory = emg()
    memory.add_memories(USER, [hotel("Amsterdam")])
    memory.engine.store.mark_deleting(USER, at=T0)
    if route == "add_memories":
        memory.add_memories(USER, [hotel("Utrecht")])
    else:
        memory.add_text(USER, "The boss stays in Utrecht.")
    assert [r.text for r in memory.memories(USER)] == ["The boss stays in Utrecht."]
    recalled = memory.recall("Where does the boss stay?", Scope(USER))
    assert [h.record.text for h in recalled.records] == ["The boss stays in Utrecht."]
    # The replacement was planned against what stays: nothing to replace, an insertion.
    assert [c.reason.split(":")[0] for c in memory.edits(USER) if c.reason] in (
        ["emg insert"],
        ["emg fallback"],
    )
    memory.close()


# ----------------------------------------------------------------------------- DPeM
def dpem(llm: ScriptedLLM | None = None) -> DualProcessMemory:
    return DualProcessMemory(
        llm=llm or ScriptedLLM(default=dpem_reply),
        embedder=HashingEmbedder(dimension=64),
        clock=FixedClock(T0),
        theta=2,
    )


def say(memory: DualProcessMemory, text: str, i: int) -> None:
    at = T0 + timedelta(minutes=i)
    memory.save(
        [Turn("user", text, timestamp=at), Turn("assistant", "Okay.", timestamp=at)], Scope(USER)
    )


def test_dpem_working_notes_are_replaced_with_their_search_keys() -> None:
    memory = dpem()
    say(memory, "I have type 2 diabetes.", 0)
    [first] = memory.engine.records(USER, where={"kind": NOTE_KIND})
    key = MemoryRecord(
        new_id(), USER, SEARCH_KEY_KIND, "diabetes note", T0, metadata={"key_for": first.id}
    )
    memory.engine.add_records([key])
    say(memory, "My feet tingle at night.", 1)
    notes = memory.engine.records(USER, where={"kind": NOTE_KIND})
    assert notes and first.id not in {r.id for r in notes}
    assert memory.engine.records(USER, where={"kind": SEARCH_KEY_KIND}) == []
    memory.close()


def test_a_dpem_job_whose_user_is_deleted_meanwhile_writes_nothing() -> None:
    """The user is deleted while the coordinator (the model) works on their round."""
    holder: dict[str, DualProcessMemory] = {}

    def reply(messages: Sequence[ChatMessage]) -> Any:
        memory = holder["memory"]
        if USER in memory.engine.users():
            memory.delete_user(USER)
        return dpem_reply(messages)

    memory = holder["memory"] = dpem(ScriptedLLM(default=reply))
    say(memory, "I have type 2 diabetes.", 0)
    assert USER not in memory.engine.users()
    assert memory.engine.records(USER) == []
    assert memory.working(USER) == [] and memory.stm(USER) == []
    memory.close()


def test_emg_questions_of_a_user_deleted_meanwhile_are_not_kept() -> None:
    """The user is deleted while the model writes their training questions (A.1 step 3)."""
    from memories_core.mechanisms.emg import TRAINING_GENERATED
    from memories_core.prompts.emg import QUESTIONS_SYSTEM

    holder: dict[str, EMGMemory] = {}

    def reply(messages: Sequence[ChatMessage]) -> Any:
        memory = holder["memory"]
        if messages[0].content == QUESTIONS_SYSTEM and USER in memory.engine.users():
            memory.delete_user(USER)
        return emg_reply(messages)

    memory = holder["memory"] = EMGMemory(
        llm=ScriptedLLM(default=reply),
        embedder=HashingEmbedder(dimension=64),
        clock=FixedClock(T0),
        train_after=1,
        questions_every=1,
    )
    memory.add_memories(USER, [hotel("Amsterdam")])
    assert memory.schedule_training(USER) == 1
    run = memory.run_training(USER)
    assert run.sessions == 1 and run.questions == 0 and run.failed == 0
    assert memory.engine.artifacts.get(USER, TRAINING_GENERATED) is None
    assert memory.engine.pending(USER) == []
    memory.close()


# ----------------------------------------------------------------------------- state and artifacts
@pytest.mark.parametrize(
    ("key", "value"),
    [("", 1), ("k", float("nan")), ("k", {"a": object()}), ("k", [float("inf")])],
)
def test_user_state_is_checked_before_it_is_written(
    engine: MemoryEngine, key: str, value: Any
) -> None:
    with pytest.raises(InvalidInputError):
        engine.set_user_state(USER, key, value)
    assert engine.store.get_state(key, user_id=USER) is None


def test_user_state_finishes_a_pending_deletion_first(engine: MemoryEngine) -> None:
    engine.add_records([note(USER, "before the crash")])
    engine.set_user_state(USER, "dpem.rounds", 3)
    engine.store.mark_deleting(USER, at=T0)
    engine.set_user_state(USER, "dpem.log", {"last_round": 1})
    assert not engine.store.is_deleting(USER) and engine.records(USER) == []
    assert engine.store.get_state("dpem.rounds", user_id=USER) is None
    assert engine.store.get_state("dpem.log", user_id=USER) == {"last_round": 1}


def test_an_artifact_of_a_user_being_deleted_is_not_written(engine: MemoryEngine) -> None:
    engine.add_records([note(USER)])
    assert engine.put_artifact(USER, "kept", {"a.json": b"1"}) is not None
    engine.store.mark_deleting(USER, at=T0)
    assert engine.put_artifact(USER, "late", {"a.json": b"2"}) is None
    assert not engine.store.is_deleting(USER)
    assert engine.artifacts.get(USER, "late") is None and engine.artifacts.get(USER, "kept") is None


def test_dpem_round_counter_goes_through_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """DPeM's round counter and log are user state written by the engine, checked there."""
    memory = dpem()
    written: list[str] = []
    real = memory.engine.set_user_state

    def spy(user_id: str, key: str, value: Any) -> None:
        written.append(key)
        real(user_id, key, value)

    monkeypatch.setattr(memory.engine, "set_user_state", spy)
    say(memory, "I have type 2 diabetes.", 0)
    assert memory.rounds(USER) == 1
    assert len(set(written)) == 2  # the round counter (at save) and the log (after the round)
    memory.close()


def test_emg_examples_of_a_user_being_deleted_are_not_kept() -> None:
    """The archive's writes go through the engine: a pending deletion wins over them."""
    from memories_core.mechanisms.emg import TRAINING_GENERATED

    memory = emg()
    memory.add_memories(USER, [hotel("Amsterdam")])
    memory.engine.store.mark_deleting(USER, at=T0)
    assert memory.archive.keep_generated(USER, [], seen=["m1"], at=T0) == 0
    assert memory.engine.artifacts.get(USER, TRAINING_GENERATED) is None
    assert not memory.engine.store.is_deleting(USER) and memory.memories(USER) == []
    memory.close()
