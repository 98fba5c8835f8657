from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from memories_core import (
    EmbedderMismatchError,
    HistoryMemory,
    InvalidInputError,
    MissingUserError,
    Scope,
    Turn,
)
from memories_core.embedders import HashingEmbedder

ALICE = Scope("alice", session_id="s1")
BOB = Scope("bob", session_id="s1")


@pytest.fixture
def memory() -> HistoryMemory:
    return HistoryMemory(embedder=HashingEmbedder())


def test_turns_are_rendered_and_recalled_best_first(memory: HistoryMemory) -> None:
    memory.save(
        [
            Turn("user", "I love spicy Thai food, especially green curry"),
            Turn("assistant", "Noted, green curry it is."),
            Turn("user", "My train leaves at nine from platform four"),
        ],
        ALICE,
    )
    recall = memory.recall("what food does alice like to eat", ALICE, k=1)
    assert len(recall.records) == 1
    assert recall.records[0].record.text == "user: I love spicy Thai food, especially green curry"
    said = recall.records[0].record.created_at
    assert recall.context == (
        f"[{said.day} {said:%B %Y, %H:%M}] user: I love spicy Thai food, especially green curry"
    )
    assert recall.records[0].record.kind == "turn"
    assert recall.records[0].record.metadata["role"] == "user"


def test_context_carries_when_each_turn_was_said_unless_dates_are_off() -> None:
    when = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
    dated = HistoryMemory(embedder=HashingEmbedder())
    bare = HistoryMemory(embedder=HashingEmbedder(), show_dates=False)
    for memory in (dated, bare):
        memory.save([Turn("user", "I went to the support group", timestamp=when)], ALICE)
        memory.save([Turn("user", "I painted a sunrise last week")], ALICE)
    query = "when did alice go to the support group"
    assert dated.recall(query, ALICE, k=1).context == (
        "[8 May 2023, 13:56] user: I went to the support group"
    )
    assert bare.recall(query, ALICE, k=1).context == "user: I went to the support group"


def test_default_k_is_three_and_k_overrides(memory: HistoryMemory) -> None:
    memory.save([Turn("user", f"fact number {i} about gardening") for i in range(6)], ALICE)
    assert len(memory.recall("gardening", ALICE).records) == 3
    assert len(memory.recall("gardening", ALICE, k=5).records) == 5
    with pytest.raises(InvalidInputError):
        memory.recall("gardening", ALICE, k=0)


def test_speaker_names_are_kept(memory: HistoryMemory) -> None:
    when = datetime(2023, 5, 8, 13, 56, tzinfo=timezone.utc)
    memory.save(
        [
            Turn(
                "user",
                "I went to a LGBTQ support group",
                speaker="Caroline",
                timestamp=when,
                metadata={"dia_id": "D1:3"},
            )
        ],
        ALICE,
    )
    hit = memory.recall("support group", ALICE).records[0].record
    assert hit.text == "Caroline: I went to a LGBTQ support group"
    assert hit.created_at == when
    assert hit.metadata["dia_id"] == "D1:3"
    (turn,) = memory.turns(ALICE)
    assert (turn.speaker, turn.content, turn.timestamp) == (
        "Caroline",
        "I went to a LGBTQ support group",
        when,
    )


def test_users_never_see_each_other(memory: HistoryMemory) -> None:
    memory.save([Turn("user", "My secret password hint is blue elephant")], ALICE)
    memory.save([Turn("user", "I like elephants at the zoo")], BOB)
    texts = [h.record.text for h in memory.recall("blue elephant password", BOB, k=10).records]
    assert texts == ["user: I like elephants at the zoo"]


def test_clear_one_session_or_the_whole_user(memory: HistoryMemory) -> None:
    memory.save([Turn("user", "session one about cats")], Scope("alice", "s1"))
    memory.save([Turn("user", "session two about cats")], Scope("alice", "s2"))
    memory.save([Turn("user", "bob talks about cats")], BOB)
    memory.clear(Scope("alice", "s1"))
    assert [t.content for t in memory.turns(Scope("alice"))] == ["session two about cats"]
    memory.clear(Scope("alice"))
    assert memory.turns(Scope("alice")) == []
    assert not memory.recall("cats", Scope("alice"))
    assert memory.recall("cats", BOB).records


def test_bad_input_is_rejected_and_nothing_is_lost(memory: HistoryMemory) -> None:
    memory.save([Turn("user", "keep me")], ALICE)
    with pytest.raises(InvalidInputError):
        Turn("user", "   \n\t")
    with pytest.raises(InvalidInputError):
        Turn("user", "")
    with pytest.raises(InvalidInputError):
        memory.save(["not a turn"], ALICE)  # type: ignore[list-item]
    with pytest.raises(InvalidInputError):
        memory.save("raw string", ALICE)  # type: ignore[arg-type]
    with pytest.raises(MissingUserError):
        Scope("")
    with pytest.raises(MissingUserError):
        Scope(None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        memory.recall("   ", ALICE)
    assert [t.content for t in memory.turns(ALICE)] == ["keep me"]


def test_large_and_odd_unicode_messages_round_trip(memory: HistoryMemory) -> None:
    big = "word " * 200_000 + "needle-at-the-end"
    odd = "emoji 🧠🎉, RTL שלום, combining e\u0301, NUL \x00 inside, zero-width\u200b"
    memory.save([Turn("user", big), Turn("user", odd)], ALICE)
    contents = [t.content for t in memory.turns(ALICE)]
    assert contents == [big, odd]
    assert memory.recall("שלום emoji", ALICE, k=1).records[0].record.text == f"user: {odd}"
    surrogate = Turn("user", "broken \ud800 surrogate")
    assert surrogate.content == "broken \ufffd surrogate"


def test_usage_counts_embedding_calls(memory: HistoryMemory) -> None:
    before = memory.usage.embedder
    memory.save([Turn("user", "one"), Turn("user", "two")], ALICE)
    memory.recall("one", ALICE)
    after = memory.usage.embedder
    assert after.items - before.items == 3
    assert memory.usage.llm is None


async def test_async_twins(memory: HistoryMemory) -> None:
    await memory.asave([Turn("user", "I play the cello on Sundays")], ALICE)
    recall = await memory.arecall("which instrument", ALICE)
    assert "cello" in recall.context
    await memory.aclear(ALICE)
    assert memory.turns(Scope("alice")) == []


def test_persistent_path_survives_reopen(tmp_path: Path) -> None:
    path = tmp_path / "mem"
    with HistoryMemory(path=path, embedder=HashingEmbedder()) as first:
        first.save([Turn("user", f"persistent fact {i} about sailing") for i in range(5)], ALICE)
    with HistoryMemory(path=path, embedder=HashingEmbedder()) as second:
        assert len(second.turns(ALICE)) == 5
        assert "sailing" in second.recall("sailing", ALICE).context


def test_in_memory_index_over_existing_store_is_rebuilt(tmp_path: Path) -> None:
    from memories_core.backends import NumpyIndex, SQLiteRecordStore

    db = tmp_path / "records.sqlite3"
    first = HistoryMemory(
        store=SQLiteRecordStore(db), index=NumpyIndex(), embedder=HashingEmbedder()
    )
    first.save([Turn("user", "the boat is called Wavedancer")], ALICE)
    first.close()
    second = HistoryMemory(
        store=SQLiteRecordStore(db), index=NumpyIndex(), embedder=HashingEmbedder()
    )
    assert "Wavedancer" in second.recall("what is the boat called", ALICE, k=1).context


def test_wrong_dimension_embedder_on_existing_store(tmp_path: Path) -> None:
    path = tmp_path / "mem"
    with HistoryMemory(path=path, embedder=HashingEmbedder(dimension=256)) as first:
        first.save([Turn("user", "I collect vintage stamps")], ALICE)
    with pytest.raises(EmbedderMismatchError):
        HistoryMemory(path=path, embedder=HashingEmbedder(dimension=128))
    with HistoryMemory(
        path=path, embedder=HashingEmbedder(dimension=128), allow_embedder_change=True
    ) as changed:
        assert "stamps" in changed.recall("stamps", ALICE).context
        assert [t.content for t in changed.turns(ALICE)] == ["I collect vintage stamps"]


async def test_answer_and_save_keeps_the_users_turn_whatever_the_model_does() -> None:
    """The chat loops' rule is every mechanism's: a failed or empty answer keeps the input."""
    memory = HistoryMemory(embedder=HashingEmbedder())
    scope = Scope("ann")

    def down() -> str:
        raise ConnectionError("the model is down")

    with pytest.raises(ConnectionError):
        memory.answer_and_save("first question", scope, down)
    assert memory.answer_and_save("second question", scope, lambda: "  ") == ""
    assert memory.answer_and_save("third question", scope, lambda: " An answer. ") == "An answer."

    async def empty() -> str:
        return ""

    assert await memory.aanswer_and_save("fourth question", scope, empty) == ""
    assert [t.content for t in memory.turns(scope)] == [
        "first question",
        "second question",
        "third question",
        "An answer.",
        "fourth question",
    ]
