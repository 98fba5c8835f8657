from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

import pytest

from memories_core import ChatMessage, FixedClock, Scope, SummaryMemory, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.summary import build_session_summary_messages, parse_session_summary

START = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)


def summarize_first_line(messages: Sequence[ChatMessage]) -> str:
    """A scripted summarizer: names what the first user line of the session was about."""
    body = messages[-1].content.split("<dialogue>\n", 1)[1].split("\n</dialogue>", 1)[0]
    first = body.splitlines()[0].split(": ", 1)[1]
    return f"The user talked about this: {first}"


def make(llm: ScriptedLLM, **kwargs: object) -> SummaryMemory:
    return SummaryMemory(llm=llm, embedder=HashingEmbedder(), clock=FixedClock(START), **kwargs)  # type: ignore[arg-type]


def test_prompt_snapshot() -> None:
    messages = build_session_summary_messages(["user: I adopted a cat", "assistant: Lovely!"])
    assert [m.role for m in messages] == ["system", "user"]
    assert "summary of the events and the key information" in messages[0].content
    assert messages[1].content == (
        "<dialogue>\nuser: I adopted a cat\nassistant: Lovely!\n</dialogue>\n\n"
        "Summarize the events and key information above."
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("The user adopted a cat.", "The user adopted a cat."),
        ("Summary: The user adopted a cat.", "The user adopted a cat."),
        ('**Summary**: "The user adopted a cat."', "The user adopted a cat."),
    ],
)
def test_summary_parser_cleans(raw: str, expected: str) -> None:
    assert parse_session_summary(raw, ["user: I adopted a cat"]) == expected


@pytest.mark.parametrize("raw", ["", "   ", "!!! ...", "Lorem ipsum dolor sit amet"])
def test_summary_parser_rejects_garbage(raw: str) -> None:
    from memories_core import ParseError

    with pytest.raises(ParseError):
        parse_session_summary(raw, ["user: I adopted a cat"])


def test_new_session_id_closes_and_summarizes_previous_session() -> None:
    llm = ScriptedLLM(default=summarize_first_line)
    memory = make(llm)
    memory.save(
        [
            Turn("user", "I am training for a marathon in April"),
            Turn("assistant", "Great, let's plan your long runs."),
        ],
        Scope("ann", "s1"),
    )
    assert llm.usage.calls == 0
    assert not memory.recall("marathon", Scope("ann"))
    memory.save([Turn("user", "hello again")], Scope("ann", "s2"))
    assert llm.usage.calls == 1
    recall = memory.recall("what race is ann training for", Scope("ann"))
    assert len(recall.records) == 1  # k=1 by default (paper §5)
    record = recall.records[0].record
    assert record.kind == "summary"
    assert record.session_id == "s1"
    assert record.text == "The user talked about this: I am training for a marathon in April"
    assert len(record.source_ids) == 2
    assert recall.context.startswith("[5 January 2026] ")


def test_explicit_end_session_and_idle_gap() -> None:
    llm = ScriptedLLM(default=summarize_first_line)
    clock = FixedClock(START)
    memory = SummaryMemory(
        llm=llm, embedder=HashingEmbedder(), clock=clock, idle_gap=timedelta(minutes=30)
    )
    memory.save([Turn("user", "my sister Jo visits next week")], Scope("ann"))
    clock.advance(timedelta(minutes=10))
    memory.save([Turn("user", "she likes sushi")], Scope("ann"))
    assert llm.usage.calls == 0
    clock.advance(timedelta(hours=2))
    memory.save([Turn("user", "new topic: my bike has a flat tyre")], Scope("ann"))
    assert llm.usage.calls == 1
    assert "sister Jo" in memory.recall("sister", Scope("ann")).context
    memory.end_session(Scope("ann"))
    assert llm.usage.calls == 2
    assert "flat tyre" in memory.recall("bike repair", Scope("ann")).context


def test_failed_or_garbage_summary_keeps_turns_and_is_retried() -> None:
    llm = ScriptedLLM([RuntimeError("server down"), "", "@@@"], default=summarize_first_line)
    memory = make(llm)
    scope = Scope("cy", "s1")
    memory.save([Turn("user", "I moved to Lisbon last month")], scope)
    memory.end_session(scope)  # call 1 raises
    assert memory.usage.failures["summary"] == 1
    assert memory.pending_sessions("cy") == ["s1"]
    assert [t.content for t in memory.turns(scope)] == ["I moved to Lisbon last month"]
    assert memory.retry_pending("cy") == 1  # "" then repair retry "@@@": still garbage
    assert memory.usage.failures["summary"] == 2
    assert memory.retry_pending() == 0  # the default summarizer answers properly now
    assert memory.pending_sessions("cy") == []
    assert "Lisbon" in memory.recall("where does cy live", Scope("cy")).context


def test_resummarizing_a_session_replaces_its_summary() -> None:
    llm = ScriptedLLM(default=summarize_first_line)
    memory = make(llm, idle_gap=None)
    memory.save([Turn("user", "I paint watercolours")], Scope("di", "s1"))
    memory.end_session(Scope("di", "s1"))
    memory.save([Turn("user", "and I sell them online")], Scope("di", "s1"))
    memory.end_session(Scope("di", "s1"))
    hits = memory.recall("painting", Scope("di"), k=5).records
    assert len(hits) == 1


def test_users_are_isolated() -> None:
    memory = make(ScriptedLLM(default=summarize_first_line))
    memory.save([Turn("user", "I keep bees in my garden")], Scope("ed", "s1"))
    memory.end_session(Scope("ed"))
    memory.save([Turn("user", "I grow tomatoes in my garden")], Scope("fi", "s1"))
    memory.end_session(Scope("fi"))
    assert [h.record.user_id for h in memory.recall("garden", Scope("fi"), k=5).records] == ["fi"]


def test_a_failed_jobs_unparsable_reply_is_logged_at_debug_level_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reply = "<<not a summary>> " + "x" * 3000
    memory = make(ScriptedLLM([reply, reply]))
    scope = Scope("gu", "s1")
    memory.save([Turn("user", "I moved to Lisbon last month")], scope)
    with caplog.at_level("DEBUG", logger="memories_core.engine"):
        memory.end_session(scope)
    assert memory.usage.failures["summary"] == 1
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    debug = [r.getMessage() for r in caplog.records if r.levelname == "DEBUG"]
    assert warned and not any("not a summary" in m for m in warned)
    shown = [m for m in debug if "<<not a summary>>" in m]
    assert len(shown) == 1 and len(shown[0]) < 2200


def test_a_reply_with_a_lone_surrogate_is_stored_with_the_replacement_character() -> None:
    """A JSON "\\ud800" escape in a model's reply used to fail the write (UnicodeEncodeError)
    and leave the job claimed; the summary is now stored as turns are (U+FFFD)."""
    llm = ScriptedLLM(default=lambda messages: "The user likes jasmine tea \ud800 a lot.")
    memory = SummaryMemory(llm=llm, embedder=HashingEmbedder())
    scope = Scope("una", "s1")
    memory.save([Turn("user", "I like jasmine tea"), Turn("assistant", "Noted.")], scope)
    memory.end_session(scope)
    memory.flush("una")
    status = memory.status("una")
    assert (status.pending, status.running, status.failed) == (0, 0, 0)
    texts = [hit.record.text for hit in memory.recall("jasmine tea", Scope("una")).records]
    assert "The user likes jasmine tea \ufffd a lot." in texts
    memory.close()
