"""Question-answer context spreading.

A turn right after a question inherits ``after_question_weight`` of the question's score, and
a turn that only asks keeps ``question_weight`` of its own. Checked by hand on
``spread_context`` and through the public API (``HistoryMemory.recall``) with the
deterministic HashingEmbedder.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from memories_core import ConfigurationError, FixedClock, HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.retrieval import ContextSpreading, FusionConfig, spread_context
from memories_core.retrieval.context import (
    DEFAULT_AFTER_QUESTION_WEIGHT,
    DEFAULT_QUESTION_WEIGHT,
    asks,
    only_asks,
)

START = datetime(2024, 3, 1, 18, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize(
    ("text", "ends", "only"),
    [
        ("Caroline: What pet do you have?", True, True),
        ("Caroline: That's so nice! What pet do you have?", True, False),
        ("Mel: Is that your third one? [shares a photo of a notebook]", True, True),
        ("Mel: How was it? I hope it went well.", False, False),
        ("Mel: A cat named Bailey.", False, False),
        ("Mel: Really? Where? When?", True, True),
        ("", False, False),
    ],
)
def test_asks_and_only_asks(text: str, ends: bool, only: bool) -> None:
    assert asks(text) is ends
    assert only_asks(text) is only


def test_spread_context_question_rule_by_hand() -> None:
    ranking = [("q", 3.0), ("other", 2.0), ("low", 1.0)]
    neighbours = {"q": (None, "answer"), "other": (None, "after-other")}
    plain = dict(spread_context(ranking, neighbours, previous_weight=0.4, next_weight=0.0))
    assert plain == pytest.approx(
        {"q": 2.0, "other": 1.0, "low": 0.0, "answer": 0.8, "after-other": 0.4}
    )
    rule = dict(
        spread_context(
            ranking,
            neighbours,
            previous_weight=0.4,
            next_weight=0.0,
            questions=frozenset({"q"}),
            after_question_weight=0.8,
            question_only=frozenset({"q"}),
            question_weight=0.5,
        )
    )
    # The answer inherits 0.8 of the question (shifted score 2), the question keeps half of
    # its own; a record after a non-question still inherits the ordinary 0.4.
    assert rule == pytest.approx(
        {"q": 1.0, "other": 1.0, "low": 0.0, "answer": 1.6, "after-other": 0.4}
    )


def conversation() -> list[Turn]:
    lines = [
        ("Caroline", "How have you been lately?"),
        ("Melanie", "Busy with the kids and work, but good."),
        ("Caroline", "What pet do you have?"),
        ("Melanie", "A cat named Bailey, she sleeps all day."),
        ("Caroline", "Aww, so cute. I went hiking on Sunday."),
        ("Melanie", "Sounds lovely, the weather was great."),
    ]
    return [
        Turn("user", text, speaker=who, timestamp=START + timedelta(seconds=30 * n))
        for n, (who, text) in enumerate(lines)
    ]


def ranked_texts(fusion: FusionConfig | None, query: str, k: int = 6) -> list[str]:
    memory = HistoryMemory(
        embedder=HashingEmbedder(), clock=FixedClock(START + timedelta(days=1)), fusion=fusion
    )
    try:
        for turn in conversation():
            memory.save([turn], Scope("u1"))
        return [hit.record.text for hit in memory.recall(query, Scope("u1"), k=k).records]
    finally:
        memory.close()


def test_the_answer_after_a_question_ranks_first_by_default() -> None:
    query = "Which pet does she have?"
    question = "Caroline: What pet do you have?"
    answer = "Melanie: A cat named Bailey, she sleeps all day."
    off = ranked_texts(FusionConfig(after_question_weight=None, question_weight=1.0), query)
    on = ranked_texts(None, query)
    # Without the rule the question, which shares the words, comes first; with it (the
    # default), the answer does.
    assert off.index(question) < off.index(answer)
    assert on[0] == answer
    assert on.index(answer) < on.index(question)


def test_defaults_are_the_cross_validated_values_and_prefixes_hold() -> None:
    config = FusionConfig()
    assert config.after_question_weight == DEFAULT_AFTER_QUESTION_WEIGHT == 0.8
    assert config.question_weight == DEFAULT_QUESTION_WEIGHT == 0.5
    stage = config.pipeline().rerankers[0]
    assert isinstance(stage, ContextSpreading)
    assert (stage.after_question_weight, stage.question_weight) == (0.8, 0.5)
    query = "Which pet does she have?"
    assert ranked_texts(None, query, k=2) == ranked_texts(None, query, k=6)[:2]
    # Deterministic for a fixed store.
    assert ranked_texts(None, query) == ranked_texts(None, query)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"after_question_weight": -0.1},
        {"after_question_weight": float("inf")},
        {"question_weight": 1.5},
        {"question_weight": -1.0},
    ],
)
def test_bad_question_weights_are_rejected(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigurationError):
        FusionConfig(**kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        ContextSpreading(**kwargs)  # type: ignore[arg-type]


def chat_texts(question_weight: float, query: str) -> list[tuple[str, float]]:
    memory = HistoryMemory(
        embedder=HashingEmbedder(),
        clock=FixedClock(START + timedelta(days=1)),
        fusion=FusionConfig(question_weight=question_weight),
    )
    lines = [
        ("user", "Can you recommend Italian restaurants in Boston?"),
        ("assistant", "Giacomo's in the North End is a classic, and Carmelina's too."),
        ("user", "Thanks, I will book a table for Friday."),
        ("assistant", "Enjoy the dinner and the cannoli afterwards."),
        ("user", "I also started running in the mornings."),
        ("assistant", "Great habit, start slowly and keep it regular."),
    ]
    try:
        memory.save(
            [
                Turn(role, text, timestamp=START + timedelta(seconds=30 * n))
                for n, (role, text) in enumerate(lines)
            ],
            Scope("u2"),
        )
        hits = memory.recall(query, Scope("u2"), k=6).records
        return [(hit.record.text, round(hit.score, 9)) for hit in hits]
    finally:
        memory.close()


def test_a_user_question_answered_by_the_assistant_keeps_its_score() -> None:
    # The assistant's reply keeps its own score (it inherits nothing), so the user's
    # question is not demoted: the default gives the same ranking and scores as no demotion.
    query = "Which Italian restaurants in Boston did I ask about?"
    default = chat_texts(DEFAULT_QUESTION_WEIGHT, query)
    assert default == chat_texts(1.0, query)
    assert default[0][0] == "user: Can you recommend Italian restaurants in Boston?"
