"""``turns_from_texts``: the adapters' fallbacks for what a framework's run produced."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import memories_core.types
from memories_core.errors import InvalidInputError
from memories_core.types import MAX_TURN_CHARS, Turn, texts_from_turns, turns_from_texts


def test_short_texts_become_one_turn_each_and_empty_ones_are_skipped() -> None:
    turns = turns_from_texts([("user", "hello"), ("assistant", "  \n"), ("assistant", "hi")])
    assert turns == [Turn("user", "hello"), Turn("assistant", "hi")]
    assert turns_from_texts([]) == []


def test_a_text_at_the_limit_is_one_turn() -> None:
    text = "a" * MAX_TURN_CHARS
    (turn,) = turns_from_texts([("user", text)])
    assert turn.content == text and dict(turn.metadata) == {}


@pytest.mark.parametrize(
    "text",
    [
        "x" * 2_500,  # no whitespace: hard cuts
        " ".join(["word"] * 600),  # cut after a space
        "line\n" * 500,  # cut after a newline
        "y" * 950 + " " * 1_200 + "z" * 300,  # a part of only whitespace is dropped
    ],
)
def test_a_long_text_is_kept_whole_in_parts(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setattr(memories_core.types, "MAX_TURN_CHARS", 1_000)
    turns = turns_from_texts([("user", text), ("assistant", "ok")])
    *parts, answer = turns
    assert answer == Turn("assistant", "ok")
    assert len(parts) >= 2
    assert all(t.role == "user" and len(t.content) <= 1_000 for t in parts)
    # Every character is kept, but for a part of only whitespace.
    assert "".join(t.content for t in parts).split() == text.split()
    assert [t.metadata["part"] for t in parts] == list(range(1, len(parts) + 1))
    assert {t.metadata["parts"] for t in parts} == {len(parts)}


def test_a_cut_falls_after_whitespace_near_the_end_of_a_part(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memories_core.types, "MAX_TURN_CHARS", 1_000)
    text = " ".join(f"w{n:03d}" for n in range(400))
    parts = turns_from_texts([("user", text)])
    assert all(p.content.endswith(" ") for p in parts[:-1])  # no word is split
    assert all(len(p.content) > 900 for p in parts[:-1])


def test_a_text_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(InvalidInputError, match="must be a str"):
        turns_from_texts([("user", None)])  # type: ignore[list-item]


@settings(max_examples=200, deadline=None)
@given(
    text=st.text(alphabet=st.sampled_from("ab \n\t\u00e9\U0001f600"), min_size=0, max_size=400),
    limit=st.integers(min_value=10, max_value=60),
)
def test_parts_never_exceed_the_limit_and_keep_every_non_blank_character(
    text: str, limit: int
) -> None:
    import memories_core.types as types_module

    before = types_module.MAX_TURN_CHARS
    types_module.MAX_TURN_CHARS = limit
    try:
        turns = turns_from_texts([("user", text)])
    finally:
        types_module.MAX_TURN_CHARS = before
    assert all(0 < len(t.content) <= limit and t.content.strip() for t in turns)
    assert "".join(t.content for t in turns).split() == text.split()
    if len(text) <= limit:
        assert len(turns) == (1 if text.strip() else 0)


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(
        st.tuples(
            st.sampled_from(["user", "assistant"]),
            st.text(alphabet=st.sampled_from("ab \n\u00e9"), min_size=0, max_size=200),
        ),
        max_size=4,
    ),
    limit=st.integers(min_value=10, max_value=60),
)
def test_texts_from_turns_reads_back_what_turns_from_texts_kept(
    texts: list[tuple[str, str]], limit: int
) -> None:
    """Every non-blank text comes back as one pair, its parts joined (blank parts dropped)."""
    import memories_core.types as types_module

    before = types_module.MAX_TURN_CHARS
    types_module.MAX_TURN_CHARS = limit
    try:
        turns = turns_from_texts(texts)
    finally:
        types_module.MAX_TURN_CHARS = before
    back = texts_from_turns(turns)
    kept = [(role, text) for role, text in texts if text.strip()]
    assert [role for role, _ in back] == [role for role, _ in kept]
    assert [text.split() for _, text in back] == [text.split() for _, text in kept]
