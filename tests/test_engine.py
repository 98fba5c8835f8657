"""The memory engine through its public API: state, history, jobs, sessions, graph,
artifacts, deletion, verification, and the rule that model calls never block other users."""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from memories_core import (
    ConditionalMemory,
    FixedClock,
    HistoryMemory,
    InvalidInputError,
    Scope,
    SummaryMemory,
    Turn,
)
from memories_core.embedders import HashingEmbedder
from memories_core.engine import Derivation, JobPolicy, MechanismHooks, MemoryEngine
from memories_core.llms import ScriptedLLM
from memories_core.types import GraphEdge, GraphNode, Job, JobSpec, MemoryRecord, new_id

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)


def make_engine(path: Path | None = None, **kwargs: object) -> MemoryEngine:
    kwargs.setdefault("clock", FixedClock(T0))
    return MemoryEngine(path=path, embedder=HashingEmbedder(), **kwargs)  # type: ignore[arg-type]


def note(user: str, text: str, kind: str = "note") -> MemoryRecord:
    return MemoryRecord(id=new_id(), user_id=user, kind=kind, text=text, created_at=T0)


# ---------------------------------------------------------------- state and history


def test_updating_state_of_10k_records_never_calls_the_embedder() -> None:
    engine = make_engine()
    records = [note("u", f"fact number {i}") for i in range(10_000)]
    engine.add_records(records)
    embedded = engine.embedder.usage.items
    changes = {r.id: {"strength": 2.0, "last_recalled_at": T0} for r in records}
    written = engine.update_state("u", changes, reason="recalled")
    assert len(written) == 10_000
    assert engine.embedder.usage.items == embedded
    first = engine.get("u", [records[0].id])[0]
    assert first.state.strength == 2.0
    assert first.state.last_recalled_at == T0


def test_history_keeps_old_new_when_and_why() -> None:
    clock = FixedClock(T0)
    engine = make_engine(clock=clock)
    record = note("u", "flight EK349 departs 09:00")
    engine.add_records([record])
    clock.advance(timedelta(hours=1))
    engine.update_state("u", {record.id: {"tier": "ltm", "attrs": {"seen": 3}}}, reason="promoted")
    engine.edit_text("u", record.id, "flight EK349 departs 11:30", reason="time moved")
    history = engine.history("u", record_id=record.id)
    assert [h.reason for h in history] == ["promoted", "time moved"]
    assert history[0].old == {"tier": None, "attrs": {}}
    assert history[0].new == {"tier": "ltm", "attrs": {"seen": 3}}
    assert history[0].at == T0 + timedelta(hours=1)
    assert history[1].old == {"text": "flight EK349 departs 09:00"}
    assert engine.history("someone else") == []


def test_editing_text_re_embeds_only_that_record() -> None:
    engine = make_engine()
    records = [note("u", f"fact {i}") for i in range(50)]
    engine.add_records(records)
    before = engine.embedder.usage.items
    engine.edit_text("u", records[7].id, "the passport number is X1234567")
    assert engine.embedder.usage.items == before + 1
    hits = engine.search("passport number", "u", k=1)
    assert hits[0].record.id == records[7].id


def test_state_updates_reject_unknown_fields_and_bad_values() -> None:
    engine = make_engine()
    record = note("u", "x y z")
    engine.add_records([record])
    with pytest.raises(InvalidInputError):
        engine.update_state("u", {record.id: {"text": "no"}})
    with pytest.raises(InvalidInputError):
        engine.update_state("u", {record.id: {"strength": float("nan")}})
    with pytest.raises(InvalidInputError):
        engine.update_state("u", {record.id: {"valid_until": "tomorrow"}})
    assert engine.history("u") == []


def test_archived_and_expired_records_are_not_recalled() -> None:
    clock = FixedClock(T0)
    engine = make_engine(clock=clock)
    voucher = note("u", "hotel voucher code AMS-2291")
    kept = note("u", "hotel in Amsterdam booked")
    engine.add_records([voucher, kept])
    engine.update_state("u", {voucher.id: {"valid_until": T0 + timedelta(days=2)}})
    assert voucher.id in {h.record.id for h in engine.search("hotel voucher", "u", k=5)}
    later = T0 + timedelta(days=3)
    assert voucher.id not in {
        h.record.id for h in engine.search("hotel voucher", "u", k=5, now=later)
    }
    engine.update_state("u", {kept.id: {"archived": True}}, reason="forgotten")
    assert engine.search("hotel Amsterdam", "u", k=5, now=later) == []
    assert {h.record.id for h in engine.search("hotel", "u", k=5, include_archived=True)} == {
        voucher.id,
        kept.id,
    }


def test_transaction_is_all_or_nothing() -> None:
    engine = make_engine()
    record = note("u", "before")
    engine.add_records([record])
    with pytest.raises(RuntimeError), engine.transaction():
        engine.update_state("u", {record.id: {"tier": "stm"}})
        engine.graph.put("u", nodes=[GraphNode("n1", "entity", "Amsterdam")])
        raise RuntimeError("crash in the middle")
    assert engine.get("u", [record.id])[0].state.tier is None
    assert engine.graph.nodes("u") == []


def test_on_recalled_can_reinforce_what_was_recalled() -> None:
    engine = make_engine()
    record = note("u", "stress relief: a walk after lunch")
    engine.add_records([record])

    def reinforce(hits: list, now: datetime) -> None:
        engine.update_state(
            "u",
            {
                h.record.id: {"strength": h.record.state.strength + 1, "last_recalled_at": now}
                for h in hits
            },
            reason="recalled",
        )

    engine.search("stress relief", "u", k=1, on_recalled=reinforce)
    engine.search("stress relief", "u", k=1, on_recalled=reinforce)
    assert engine.get("u", [record.id])[0].state.strength == 3.0


# ---------------------------------------------------------------- pending work


class CountingMechanism:
    """A minimal mechanism: one job per user turn, writing one derived record."""

    def __init__(self, engine: MemoryEngine, llm: ScriptedLLM, name: str = "counting") -> None:
        self.engine = engine
        self.llm = llm
        self.name = name
        engine.attach(
            MechanismHooks(
                name=name,
                on_turns=lambda records: [
                    JobSpec(name, "derive", f"turn:{r.id}", {"turn_id": r.id})
                    for r in records
                    if r.metadata.get("role") == "user"
                ],
                run_job=self.run,
            )
        )

    def run(self, job: Job) -> Derivation:
        from memories_core.types import ChatMessage

        text = self.llm.generate([ChatMessage("user", "derive")])
        return Derivation(
            add=[note(job.user_id, f"derived {text} {job.payload['turn_id']}", kind="derived")]
        )


def test_a_down_model_costs_one_call_per_save_not_one_per_pending_item() -> None:
    clock = FixedClock(T0)
    engine = make_engine(clock=clock)
    down = ScriptedLLM(default=ConnectionError("down"))
    CountingMechanism(engine, down)
    for i in range(30):
        engine.save([Turn("user", f"message {i}")], Scope("u"))
        clock.advance(timedelta(seconds=1))
    # Before the engine: 930 calls (every save retried every pending item).
    assert len(down.calls) <= 40
    assert len(engine.pending("u")) == 30
    assert engine.failures["derive"] == len(down.calls)


def test_retries_back_off_and_an_explicit_retry_ignores_backoff() -> None:
    clock = FixedClock(T0)
    engine = make_engine(clock=clock, jobs=JobPolicy(base_backoff=timedelta(minutes=1)))
    llm = ScriptedLLM([ConnectionError("down")], default="ok")
    mechanism = CountingMechanism(engine, llm)
    engine.save([Turn("user", "first")], Scope("u"))
    assert len(engine.pending("u")) == 1
    job = engine.pending("u")[0]
    assert job.attempts == 1 and "down" in (job.last_error or "")
    clock.advance(timedelta(seconds=10))  # still in backoff: a save does not retry it
    engine.save([Turn("assistant", "noted")], Scope("u"))
    assert len(llm.calls) == 1
    assert engine.run_pending("u", force=True) == 0
    assert len(engine.records("u", where={"kind": "derived"})) == 1
    assert mechanism.llm is llm


def test_a_job_finished_elsewhere_is_not_derived_twice(tmp_path: Path) -> None:
    # Worker one claims the job and stalls in the model call past its lease; worker two (an
    # hour later on its clock) takes the lapsed job over and commits. Worker one's result
    # must then be dropped, not stored a second time.
    policy = JobPolicy(lease=timedelta(seconds=1))
    first = make_engine(tmp_path, jobs=policy)
    second = make_engine(tmp_path, clock=FixedClock(T0 + timedelta(hours=1)), jobs=policy)
    CountingMechanism(second, ScriptedLLM(default="by-two"))

    def stall(messages: object) -> str:
        assert second.run_pending("u", force=True) == 0
        return "by-one"

    CountingMechanism(first, ScriptedLLM(default=stall))
    first.save([Turn("user", "hello")], Scope("u"))
    derived = first.records("u", where={"kind": "derived"})
    assert [r.text.split()[1] for r in derived] == ["by-two"]


def test_turns_and_jobs_survive_reopen(tmp_path: Path) -> None:
    engine = make_engine(tmp_path)
    CountingMechanism(engine, ScriptedLLM(default=ConnectionError("down")))
    engine.save([Turn("user", "remember the blue door")], Scope("u"))
    engine.close()
    reopened = make_engine(tmp_path)
    CountingMechanism(reopened, ScriptedLLM(default="fine"))
    assert len(reopened.pending("u")) == 1
    assert reopened.run_pending(force=True) == 0
    assert len(reopened.records("u", where={"kind": "derived"})) == 1
    assert [r.text for r in reopened.records("u", where={"kind": "turn"})] == [
        "user: remember the blue door"
    ]


class BlockingLLM(ScriptedLLM):
    """A model that blocks until released (a slow server), to prove nobody else waits."""

    def __init__(self) -> None:
        super().__init__(default="<Decision>: no")
        self.entered = threading.Event()
        self.release = threading.Event()

    def generate(self, messages, **kwargs):  # type: ignore[no-untyped-def,override]
        if any("sailing" in m.content for m in messages):  # only alice's calls are slow
            self.entered.set()
            assert self.release.wait(10)
        return super().generate(messages, **kwargs)


def test_a_slow_model_for_one_user_never_blocks_another_users_save_or_recall() -> None:
    slow = BlockingLLM()
    engine = make_engine()
    conditional = ConditionalMemory(engine=engine, llm=slow)
    history = HistoryMemory(engine=engine, name="history")
    worker = threading.Thread(
        target=conditional.save, args=([Turn("user", "I love sailing")], Scope("alice"))
    )
    worker.start()
    assert slow.entered.wait(5)
    # Alice's derivation is inside the model call now; Bob's save and recall must not wait.
    done = threading.Event()

    def bob() -> None:
        history.save([Turn("user", "my cat is called Miso")], Scope("bob"))
        assert "Miso" in history.recall("cat name", Scope("bob")).context
        done.set()

    other = threading.Thread(target=bob)
    other.start()
    finished = done.wait(5)
    slow.release.set()
    worker.join(5)
    other.join(5)
    assert finished, "bob waited for alice's model call"


# ---------------------------------------------------------------- sessions and sharing


def test_sessions_without_session_ids_come_from_idle_gaps() -> None:
    clock = FixedClock(T0)
    llm = ScriptedLLM(default="The user talked about their weekend plans in detail.")
    engine = make_engine(clock=clock, session_gap=timedelta(minutes=30))
    summary = SummaryMemory(engine=engine, llm=llm)
    summary.save([Turn("user", "this weekend I will hike")], Scope("u"))
    clock.advance(timedelta(minutes=5))
    summary.save([Turn("user", "probably near the lake")], Scope("u"))
    turns = engine.records("u", where={"kind": "turn"})
    assert turns[0].session_id == turns[1].session_id is not None
    clock.advance(timedelta(hours=2))
    summary.save([Turn("user", "new topic: taxes")], Scope("u"))
    summaries = engine.records("u", where={"kind": "summary"})
    assert len(summaries) == 1 and summaries[0].session_id == turns[0].session_id


def test_mechanisms_sharing_an_engine_share_one_copy_of_the_turns() -> None:
    llm = ScriptedLLM(default="A summary of the session about the user's allergy.")
    engine = make_engine(llm=llm)
    history = HistoryMemory(engine=engine)
    summary = SummaryMemory(engine=engine)
    history.save([Turn("user", "I am allergic to peanuts")], Scope("u", "s1"))
    summary.end_session(Scope("u", "s1"))
    assert len(engine.records("u", where={"kind": "turn"})) == 1
    assert "peanuts" in history.recall("allergy", Scope("u")).context
    assert "allergy" in summary.recall("allergy", Scope("u")).context


def test_engine_and_storage_options_are_exclusive() -> None:
    from memories_core import ConfigurationError

    engine = make_engine()
    with pytest.raises(ConfigurationError):
        HistoryMemory(engine=engine, path="somewhere")
    HistoryMemory(engine=engine)
    with pytest.raises(ConfigurationError):
        HistoryMemory(engine=engine)  # same name twice


def test_llm_for_serves_a_user_their_own_model() -> None:
    alice_model = ScriptedLLM(default="<Decision>: no")
    default = ScriptedLLM(default="<Decision>: no")
    engine = make_engine(llm_for=lambda scope: alice_model if scope.user_id == "alice" else None)
    memory = ConditionalMemory(engine=engine, llm=default)
    memory.save([Turn("user", "hi there")], Scope("alice"))
    memory.save([Turn("user", "hello")], Scope("bob"))
    assert len(alice_model.calls) == 1 and len(default.calls) == 1


# ---------------------------------------------------------------- graph and artifacts


def test_graph_is_per_user_and_never_links_users() -> None:
    engine = make_engine()
    engine.graph.put(
        "alice",
        nodes=[GraphNode("user", "user", "alice"), GraphNode("ams", "entity", "Amsterdam")],
        edges=[GraphEdge("e1", "user", "ams", "flies to")],
    )
    engine.graph.put("bob", nodes=[GraphNode("bob", "user", "bob")])
    with pytest.raises(InvalidInputError):
        engine.graph.put("bob", edges=[GraphEdge("x", "bob", "ams", "steals")])
    view = engine.graph.to_networkx("alice")
    assert view.has_edge("user", "ams") and view.nodes["ams"]["label"] == "Amsterdam"
    assert [n.id for n in engine.graph.nodes("bob")] == ["bob"]
    engine.graph.delete("alice", node_ids=["ams"])
    assert engine.graph.edges("alice") == []


def test_artifacts_are_atomic_listed_and_hashed_on_disk(tmp_path: Path) -> None:
    engine = make_engine(tmp_path)
    info = engine.artifacts.put("alice@example.com", "malp/lora", {"adapter.bin": b"v1"})
    assert engine.artifacts.read("alice@example.com", "malp/lora", "adapter.bin") == b"v1"
    engine.artifacts.put("alice@example.com", "malp/lora", {"adapter.bin": b"v2"})
    assert not info.path.exists()  # the old version is gone
    assert engine.artifacts.read("alice@example.com", "malp/lora", "adapter.bin") == b"v2"
    names = [p.name for p in (tmp_path / "artifacts").rglob("*")]
    assert not any("alice" in n or "lora" in n for n in names)
    assert [a.name for a in engine.artifacts.list("alice@example.com")] == ["malp/lora"]
    with pytest.raises(InvalidInputError):
        engine.artifacts.put("alice@example.com", "x", {"../escape": b""})


# ---------------------------------------------------------------- deletion and verify


def _grep(root: Path, needle: bytes) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def test_delete_user_erases_every_part(tmp_path: Path) -> None:
    engine = make_engine(tmp_path)
    secret = "zebracorn-7781"
    HistoryMemory(engine=engine).save(
        [Turn("user", f"my code word is {secret}", metadata={"tag": secret})],
        Scope(f"user-{secret}"),
    )
    user = f"user-{secret}"
    record = engine.records(user)[0]
    engine.update_state(user, {record.id: {"tier": secret}}, reason=secret)
    engine.graph.put(user, nodes=[GraphNode(secret, "entity", secret)])
    engine.artifacts.put(user, secret, {"f": secret.encode()})
    engine.enqueue(user, [JobSpec("nobody", "x", secret, {"s": secret})])
    engine.save([Turn("user", "other user keeps this")], Scope("keeper"))
    engine.delete_user(user)
    engine.close()
    assert _grep(tmp_path, secret.encode()) == []
    reopened = make_engine(tmp_path)
    assert reopened.users() == ["keeper"]


def test_an_interrupted_delete_is_finished_on_open(tmp_path: Path) -> None:
    engine = make_engine(tmp_path)
    HistoryMemory(engine=engine).save([Turn("user", "quasar-1189 secret")], Scope("gone"))
    engine.store.mark_deleting("gone", at=T0)  # the process dies right after the tombstone
    assert engine.search("quasar secret", "gone", k=3) == []  # nothing is served meanwhile
    engine.close()
    reopened = make_engine(tmp_path)
    assert reopened.users() == []
    reopened.close()
    assert _grep(tmp_path, b"quasar-1189") == []


def test_verify_finds_and_repairs_missing_and_orphan_vectors() -> None:
    engine = make_engine()
    HistoryMemory(engine=engine).save(
        [Turn("user", "alpha fact"), Turn("user", "beta fact")], Scope("u")
    )
    turns = engine.records("u")
    engine.index.delete([turns[0].id], user_id="u")  # a vector lost
    engine.index.add(
        ["ghost"], engine.embedder.embed_documents(["ghost"]), [{"user_id": "u", "kind": "turn"}]
    )
    report = engine.verify()
    assert report.missing == (turns[0].id,) and report.orphans == ("ghost",)
    assert not report.ok
    engine.verify(repair=True)
    assert engine.verify().ok


def test_bad_input_is_refused_with_typed_errors() -> None:
    engine = make_engine()
    for bad in (None, "text", [object()]):
        with pytest.raises(InvalidInputError):
            engine.save(bad, Scope("u"))  # type: ignore[arg-type]
    for k in (0, -1, 2**63, True):
        with pytest.raises(InvalidInputError):
            engine.search("q", "u", k=k)  # type: ignore[arg-type]
    for meta in ({"": 1}, {"$and": 1}, {"chroma:document": 1}, {"kind": 1}, {"x": float("nan")}):
        with pytest.raises(InvalidInputError):
            Turn("user", "hi", metadata=meta)
    with pytest.raises(InvalidInputError):
        Turn("user", "hi", timestamp="2024-01-01")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        Scope("bad\ud800user")
    assert engine.users() == []


def test_deleting_records_keeps_an_audit_trail_unless_erased() -> None:
    engine = make_engine()
    kept, erased = note("u", "old address: 12 Elm St"), note("u", "passport X99")
    engine.add_records([kept, erased])
    assert engine.delete_records("u", [kept.id], reason="moved") == 1
    assert engine.delete_records("u", [erased.id], reason="user asked", erase=True) == 1
    assert engine.delete_records("u", ["unknown"]) == 0
    entries = {h.record_id: h for h in engine.history("u")}
    assert entries[kept.id].old["text"] == "old address: 12 Elm St"
    assert "text" not in entries[erased.id].old and entries[erased.id].reason == "user asked"
    assert engine.records("u") == []


def test_records_and_their_state_are_written_in_one_transaction() -> None:
    engine = make_engine()
    voucher = note("u", "hotel voucher AMS-2291")
    until = T0 + timedelta(days=1)
    engine.add_records([voucher], state={voucher.id: {"valid_until": until}}, reason="expires")
    assert engine.get("u", [voucher.id])[0].state.valid_until == until
    assert [h.reason for h in engine.history("u")] == ["expires"]
    broken = note("u", "never stored")
    with pytest.raises(InvalidInputError):
        engine.add_records([broken], state={broken.id: {"valid_until": "tomorrow"}})
    assert engine.get("u", [broken.id]) == []
