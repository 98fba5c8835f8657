"""EMG-RAG's parts, each through its own public functions and without an ``EMGMemory``.

The whole mechanism is tested in ``test_emg.py``; here every module of
``memories_core.mechanisms.emg`` runs on a bare engine (or on plain records), so a failure
names the part that broke.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

import memories_core.mechanisms.emg.applications as applications
import memories_core.mechanisms.emg.export as export
import memories_core.mechanisms.emg.questions as questions
import memories_core.mechanisms.emg.taxonomy as taxonomy
import memories_core.mechanisms.emg.training as training
from memories_core import FixedClock
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.errors import ConfigurationError, InvalidInputError
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.emg.archive import PolicyArchive, examples_from_json, examples_json
from memories_core.mechanisms.emg.edits import EditConfig, GraphEditor
from memories_core.mechanisms.emg.embeddings import EmbeddingCache
from memories_core.mechanisms.emg.policy import ALL_FEATURES, SelectionPolicy
from memories_core.mechanisms.emg.schema import (
    MEMORY_KIND,
    ROOT,
    STORE_OWNER,
    Selection,
    TrainingExample,
    entity_id,
)
from memories_core.mechanisms.emg.selection import (
    SelectionConfig,
    Selector,
    WalkEnvironment,
)
from memories_core.prompts.emg import ExtractedMemory, emg_reply
from memories_core.types import GraphEdge, MemoryRecord, RecordState, ScoredRecord

T0 = datetime(2024, 4, 10, 9, 0, tzinfo=timezone.utc)
USER = "ann"


class CountingEmbedder(HashingEmbedder):
    """A hashing embedder that counts the texts it embeds."""

    def __init__(self) -> None:
        super().__init__(dimension=64)
        self.embedded: list[str] = []

    def embed_documents(self, texts: Sequence[str]) -> list[list[float]]:
        self.embedded += list(texts)
        return super().embed_documents(texts)


@pytest.fixture
def engine() -> Iterator[MemoryEngine]:
    built = MemoryEngine(
        embedder=HashingEmbedder(dimension=64), clock=FixedClock(T0), derive="inline"
    )
    yield built
    built.close()


def editor_on(engine: MemoryEngine, **settings: float) -> GraphEditor:
    return GraphEditor(engine, EmbeddingCache(engine.embedder), EditConfig.build(**settings))


def hotel(city: str) -> ExtractedMemory:
    return ExtractedMemory(
        f"The boss stays in {city}.", "Event", "Arrangement", "boss", "stays_in", city
    )


# ----------------------------------------------------------------------------- embeddings
def test_embedding_cache_embeds_each_text_once_and_forgets_on_clear() -> None:
    embedder = CountingEmbedder()
    cache = EmbeddingCache(embedder, capacity=2)
    first = cache.vectors(["tea", "coffee", "tea"])
    assert embedder.embedded == ["tea", "coffee"]
    assert np.allclose(first[0], first[2])
    cache.vectors(["coffee"])
    assert embedder.embedded == ["tea", "coffee"]
    cache.vectors(["water"])  # over capacity: the oldest ("tea") goes
    assert len(cache) == 2
    cache.vectors(["tea"])
    assert embedder.embedded[-1] == "tea"
    cache.clear()
    assert len(cache) == 0


# ----------------------------------------------------------------------------- taxonomy
def test_taxonomy_adds_subclasses_once_and_rejects_unknown_types() -> None:
    built = taxonomy.build_taxonomy({"Preference": ["Tea preference", "Tea preference"]})
    assert built["Preference"].count("Tea preference") == 1
    assert "Preference/Tea preference" in taxonomy.labels_of(built)
    with pytest.raises(ConfigurationError):
        taxonomy.build_taxonomy({"Mood": ["Happy"]})
    with pytest.raises(ConfigurationError):
        taxonomy.build_taxonomy({"Event": [" "]})


def test_skeleton_links_root_types_and_subclasses() -> None:
    built = taxonomy.build_taxonomy()
    nodes, edges = taxonomy.skeleton(USER, built)
    ids = {n.id for n in nodes}
    assert ROOT in ids and {f"type:{t}" for t in built} <= ids
    assert {f"sub:{label}" for label in taxonomy.labels_of(built)} <= ids
    assert all(e.source in ids and e.target in ids for e in edges)


def test_a_subclass_name_is_nearest_to_itself() -> None:
    labels = taxonomy.labels_of(taxonomy.build_taxonomy())
    cache = EmbeddingCache(HashingEmbedder(dimension=256))
    for label in labels[:5]:
        assert taxonomy.nearest_subclass(cache, labels, taxonomy.subclass_text(label)) == label


# ----------------------------------------------------------------------------- edits
def test_editor_inserts_then_replaces_on_a_bare_engine(engine: MemoryEngine) -> None:
    editor = editor_on(engine)
    [first] = editor.add_memories(USER, [hotel("Amsterdam")])
    assert first.op == "insert"
    [again] = editor.add_memories(USER, [hotel("Amsterdam")])
    assert again.op == "duplicate" and again.replaced_id == first.record_id
    later = T0 + timedelta(days=1)
    [moved] = editor.add_memories(USER, [hotel("Utrecht")], at=later)
    assert moved.op == "replace" and moved.replaced_id == first.record_id
    old = engine.get(USER, [str(first.record_id)])[0]
    assert old.state.valid_until == later
    assert [c.reason.split(":")[0] for c in editor.history(USER) if c.reason] == [
        "emg insert",
        "emg replace",
        "emg replace",
    ]


def test_editor_plan_writes_nothing(engine: MemoryEngine) -> None:
    editor = editor_on(engine)
    plan = editor.plan(USER, [hotel("Amsterdam")], None, T0, ())
    assert [e.op for e in plan.edits] == ["insert"]
    assert engine.records(USER) == []
    empty = editor.plan(USER, [], None, T0, ())
    assert editor.derivation(USER, empty) is None


def test_editor_rejects_bad_memories_before_writing(engine: MemoryEngine) -> None:
    editor = editor_on(engine)
    with pytest.raises(InvalidInputError):
        editor.add_memories(USER, ["The boss stays in Amsterdam."])  # type: ignore[list-item]
    bad_type = ExtractedMemory("x", "Mood", "Happy", "boss", "is", "happy")
    with pytest.raises(InvalidInputError):
        editor.add_memories(USER, [bad_type])
    assert engine.records(USER) == []


def test_relation_match_one_keeps_near_relations_apart(engine: MemoryEngine) -> None:
    editor = editor_on(engine, relation_match=1.0)
    editor.add_memories(USER, [hotel("Amsterdam")])
    other = ExtractedMemory(
        "The boss sleeps in Utrecht.", "Event", "Arrangement", "boss", "sleeps_in", "Utrecht"
    )
    assert [e.op for e in editor.add_memories(USER, [other])] == ["insert"]


# ----------------------------------------------------------------------------- selection
def walk_env() -> WalkEnvironment:
    """Three memories on a path a - b - c (edges a->b, b->c, c->d); states by hand."""
    env = WalkEnvironment(question="q", activated=["m1"])
    ends = {"m1": ("a", "b"), "m2": ("b", "c"), "m3": ("c", "d")}
    for i, (rid, (source, target)) in enumerate(ends.items()):
        env.edges[rid] = GraphEdge(f"e:{rid}", source, target, "r", record_id=rid)
        env.adjacency.setdefault(source, []).append(rid)
        env.adjacency.setdefault(target, []).append(rid)
        cos = 0.9 - 0.3 * i
        env.states[rid] = np.array([cos, cos, cos, cos - 0.9, 1 / (1 + i), 1.0])
        env.scores[rid] = cos
    return env


def test_traverse_walks_on_while_included_and_stops_a_branch_otherwise() -> None:
    env = walk_env()
    everything = Selector.traverse(env, lambda s: (True, float(s[2])))
    assert [v.record_id for v in everything] == ["m1", "m2", "m3"]
    assert [round(float(v.state[-1]), 3) for v in everything] == [1.0, 0.5, 0.333]
    stop_low = Selector.traverse(env, lambda s: (bool(s[2] >= 0.5), float(s[2])))
    # m2 is included, so the walk goes on to m3 (0.3 < 0.5: visited, not included).
    assert [(v.record_id, v.include) for v in stop_low] == [
        ("m1", True),
        ("m2", True),
        ("m3", False),
    ]
    # m2 is excluded (0.6 < 0.7), so the walk never reaches m3 behind it.
    stop_mid = Selector.traverse(env, lambda s: (bool(s[2] >= 0.7), float(s[2])))
    assert [(v.record_id, v.include) for v in stop_mid] == [("m1", True), ("m2", False)]


def test_picked_ranks_included_and_fills_to_min_select(engine: MemoryEngine) -> None:
    env = walk_env()
    selector = Selector(
        engine, EmbeddingCache(engine.embedder), SelectionConfig(min_select=2, max_select=5)
    )
    walk = Selector.traverse(env, lambda s: (bool(s[2] >= 0.7), float(s[2])))
    assert selector.picked(walk) == [("m1", pytest.approx(0.9)), ("m2", pytest.approx(0.6))]


def test_untrained_selection_is_the_nearest_memory(engine: MemoryEngine) -> None:
    editor = editor_on(engine)
    editor.add_memories(
        USER,
        [
            hotel("Amsterdam"),
            ExtractedMemory(
                "The user likes green tea.",
                "Preference",
                "Diet preference",
                "user",
                "likes",
                "green tea",
            ),
        ],
    )
    selector = Selector(engine, EmbeddingCache(engine.embedder), SelectionConfig())
    chosen = selector.select("Where does the boss stay in Amsterdam?", USER, T0)
    assert chosen.policy == "top1" and chosen.decode == "top1"
    assert [h.record.text for h in chosen.memories] == ["The boss stays in Amsterdam."]
    assert selector.select("Where?", "nobody", T0).memories == ()


# ----------------------------------------------------------------------------- archive
def test_archive_saves_loads_and_marks_policies_stale(engine: MemoryEngine) -> None:
    archive = PolicyArchive(engine)
    assert archive.load(USER) is None
    policy = SelectionPolicy.initial(0, ALL_FEATURES)
    archive.save(policy, contributors=["bob", USER])
    assert archive.status().trained and archive.status().contributors == ("ann", "bob")
    loaded = archive.load(USER)  # no policy of their own: the store's
    assert loaded is not None and loaded.to_json() == policy.to_json()
    archive.drop_trained_by("bob")
    status = archive.status()
    assert status.owner == STORE_OWNER and status.stale and not status.trained
    assert status.contributors == ("ann",) and archive.load() is None


def test_examples_round_trip_through_json() -> None:
    examples = [TrainingExample(USER, "Where?", frozenset({"b", "a"}), "Amsterdam")]
    text = examples_json(examples, T0)
    assert json.loads(text)["examples"][0]["required"] == ["a", "b"]
    back, at = examples_from_json(USER, text)
    assert back == examples and at == T0


# ----------------------------------------------------------------------------- training
def test_train_on_fits_a_policy_on_prepared_environments(engine: MemoryEngine) -> None:
    editor_on(engine).add_memories(USER, [hotel("Amsterdam"), hotel("Utrecht")], edit=False)
    selector = Selector(engine, EmbeddingCache(engine.embedder), SelectionConfig())
    [target] = [r for r in engine.records(USER) if "Amsterdam" in r.text]
    example = TrainingExample(
        USER, "Where does the boss stay in Amsterdam?", frozenset({target.id})
    )
    env = selector.environment(example.question, USER, T0, 3)
    policy = SelectionPolicy.initial(0, ALL_FEATURES)
    report = training.train_on(
        selector,
        policy,
        [example],
        [env],
        warm_epochs=5,
        episodes=4,
        batch=2,
        lr=1e-3,
        warm_lr=1e-2,
        balance=False,
        reward_llm=None,
        when=T0,
        seed=0,
        progress=False,
    )
    assert policy.trained and report.states == 2 and report.positives == 1
    assert report.reward == "selection-f1" and report.episodes == 4
    with pytest.raises(InvalidInputError):
        training.train_on(
            selector,
            SelectionPolicy.initial(0),
            [example],
            [WalkEnvironment("q", [])],
            warm_epochs=1,
            episodes=0,
            batch=1,
            lr=1e-3,
            warm_lr=1e-2,
            balance=False,
            reward_llm=None,
            when=T0,
            seed=0,
            progress=False,
        )


def test_held_out_questions_are_one_in_five_by_hash() -> None:
    held = [
        training.is_held_out(TrainingExample(USER, f"Question {i}?", frozenset()))
        for i in range(400)
    ]
    assert 0.1 < sum(held) / len(held) < 0.3
    again = training.is_held_out(TrainingExample(USER, "Question 7?", frozenset()))
    assert again == held[7]


# ----------------------------------------------------------------------------- questions
def memory_record(text: str, user: str = USER, minutes: int = 0, **meta: str) -> MemoryRecord:
    return MemoryRecord(
        f"{user}-{minutes}",
        user,
        MEMORY_KIND,
        text,
        T0 + timedelta(minutes=minutes),
        metadata=dict(meta),
    )


def test_sessions_keep_the_users_memories_in_time_order() -> None:
    records = [
        memory_record("late", minutes=5),
        memory_record("other user", user="bob", minutes=1),
        memory_record("early", minutes=0),
        memory_record("middle", minutes=2),
    ]
    sessions = questions.sessions_of(records, USER, 2)
    assert [[r.text for r in s] for s in sessions] == [["early", "middle"], ["late"]]
    assert [[r.text for r in s] for s in questions.sessions_of(records, USER, 2, 1)] == [["late"]]


def test_generated_questions_cite_memories_of_their_session() -> None:
    records = [
        memory_record(
            "The boss flies on flight EK349.",
            minutes=0,
            subject="boss",
            relation="flight",
            object="EK349",
        ),
        memory_record(
            "The boss stays at the Crowne Plaza.",
            minutes=1,
            subject="boss",
            relation="hotel",
            object="Crowne Plaza",
        ),
    ]
    made, sent, rejected = questions.generate_questions(
        USER, records, ScriptedLLM(default=emg_reply), session_size=8, per_session=2
    )
    assert sent == 1 and rejected == 0 and made
    assert all(e.user_id == USER and e.required <= {r.id for r in records} for e in made)


# ----------------------------------------------------------------------------- applications
def test_reminders_list_events_and_expiries_inside_the_horizon() -> None:
    event = memory_record("Flight on Friday.", minutes=0, when=(T0 + timedelta(days=2)).isoformat())
    expiring = MemoryRecord(
        "v",
        USER,
        MEMORY_KIND,
        "Voucher.",
        T0,
        state=RecordState(valid_until=T0 + timedelta(days=1)),
    )
    far = memory_record("Trip in June.", minutes=1, when=(T0 + timedelta(days=60)).isoformat())
    out = applications.reminders([event, expiring, far], T0, timedelta(days=7))
    assert [(r.what, r.text) for r in out] == [
        ("expires", "Voucher."),
        ("event", "Flight on Friday."),
    ]
    with pytest.raises(InvalidInputError):
        applications.reminders([event], T0, timedelta(0))


def test_autofill_asks_one_question_per_field() -> None:
    record = memory_record(
        "The user's email is ann@example.com.",
        subject="user",
        relation="email",
        object="ann@example.com",
    )
    asked: list[str] = []

    def select(question: str) -> Selection:
        asked.append(question)
        return Selection(question, (ScoredRecord(record, 1.0),), (record.id,), 1, "top1")

    filled = applications.autofill(["email"], select, ScriptedLLM(default=emg_reply))
    assert asked == ["What is the user's email?"]
    assert filled["email"] == "ann@example.com"
    with pytest.raises(InvalidInputError):
        applications.check_fields("email")


def test_memory_lines_render_statement_and_triple() -> None:
    record = memory_record("Ann likes tea.", subject="Ann", relation="likes", object="tea")
    line = applications.memory_line(record)
    assert (line.subject, line.relation, line.object) == ("Ann", "likes", "tea")
    assert applications.render([ScoredRecord(record, 1.0)]) == line.render()


# ----------------------------------------------------------------------------- export
def test_export_reads_memories_as_of_a_time(engine: MemoryEngine) -> None:
    editor = editor_on(engine)
    editor.add_memories(USER, [hotel("Amsterdam")])
    editor.add_memories(USER, [hotel("Utrecht")], at=T0 + timedelta(days=1))
    before = [r.text for r in export.memories_of(engine, USER, now=T0)]
    after = [r.text for r in export.memories_of(engine, USER, now=T0 + timedelta(days=2))]
    assert before == ["The boss stays in Amsterdam."]
    assert after == ["The boss stays in Utrecht."]
    assert len(export.memories_of(engine, USER, include_expired=True)) == 2
    assert export.triples(engine, USER, now=T0 + timedelta(days=2)) == {
        ("boss", "stays_in", "Utrecht")
    }
    graph = json.loads(export.export_graph(engine, USER, now=T0 + timedelta(days=2)))
    live = {e["memory"]: e["live"] for e in graph["edges"] if e.get("memory")}
    assert live == {"The boss stays in Amsterdam.": False, "The boss stays in Utrecht.": True}
    assert entity_id("Utrecht") in {n["id"] for n in graph["nodes"]}
    with pytest.raises(InvalidInputError):
        export.export_graph(engine, USER, format="csv")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- import paths
def test_the_single_module_names_still_import_from_the_package() -> None:
    import memories_core.mechanisms.emg as emg

    old_all = {
        "HOLD_OUT", "LAST_TRAINING", "MEMORY_KIND", "POLICY_ARTIFACT", "POLICY_JOBS", "ROOT",
        "STALE_ARTIFACT", "STORE_OWNER", "TRAINING_GENERATED", "TRAINING_OWN", "TRAINING_STORE",
        "Answer", "EMGMemory", "EMGSource", "Edit", "PolicyStatus", "Reminder", "Selection",
        "TrainingExample", "TrainingReport", "TrainingRun", "is_held_out",
    }  # fmt: skip
    assert old_all <= set(emg.__all__)
    assert set(emg.__all__) - old_all == {
        "EmbeddingCache",
        "GraphEditor",
        "PolicyArchive",
        "Selector",
    }
    for name in ("ExtractedMemory", "SelectionPolicy", "entity_id", "ALL_FEATURES", "EXTRACT"):
        assert hasattr(emg, name), name


def test_emg_policy_is_a_deprecated_alias_of_the_policy_module() -> None:
    import importlib
    import sys

    from memories_core.mechanisms.emg import policy

    sys.modules.pop("memories_core.mechanisms.emg_policy", None)
    with pytest.warns(DeprecationWarning, match="emg.policy"):
        alias = importlib.import_module("memories_core.mechanisms.emg_policy")
    assert alias.SelectionPolicy is policy.SelectionPolicy
    assert set(alias.__all__) == set(policy.__all__)
