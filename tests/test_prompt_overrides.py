"""Prompts are overridable without subclassing: ``prompts={name: instruction}``.

An override reaches the model in place of the default system instruction; it is checked
when the mechanism is built (a known prompt, overridable, keeping the output format its
parser reads), and a bad one raises a typed error before anything is opened.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from memories_core import DualProcessMemory, EMGMemory, FixedClock, MemoryBankMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.errors import ConfigurationError
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.memorybank import DAILY_SUMMARY
from memories_core.prompts import dpem
from memories_core.prompts.dpem import dpem_reply
from memories_core.prompts.emg import EXTRACT, emg_reply
from memories_core.prompts.memorybank import (
    DAILY_SUMMARY_PROMPT,
    DAILY_SUMMARY_SYSTEM,
    PROMPTS,
    DayInput,
    memorybank_reply,
)
from memories_core.prompts.overrides import PromptOverrideError, PromptOverrides, format_markers
from memories_core.prompts.spec import run_spec

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=timezone.utc)
NURSE = "You write the day's notes for a nurse. Plain prose, at most three sentences."


def bank(llm: ScriptedLLM, **kwargs: object) -> MemoryBankMemory:
    return MemoryBankMemory(
        llm=llm,
        embedder=HashingEmbedder(dimension=64),
        clock=FixedClock(T0),
        derive="inline",
        **kwargs,  # type: ignore[arg-type]
    )


def test_memorybank_prompts_are_specs_with_their_default_instructions() -> None:
    assert [s.name for s in PROMPTS] == [
        "memorybank.daily_summary",
        "memorybank.daily_portrait",
        "memorybank.global_summary",
        "memorybank.global_portrait",
    ]
    inputs = DayInput("2024-05-01", ("user: I adopted a cat named Bailey.", "assistant: Lovely!"))
    messages = DAILY_SUMMARY_PROMPT.build(inputs)
    assert messages[0].content == DAILY_SUMMARY_SYSTEM
    # The spec runs through the one runner, and its stand-in answers it offline.
    text = run_spec(ScriptedLLM(default=memorybank_reply), DAILY_SUMMARY_PROMPT, inputs)
    assert "Bailey" in text
    assert DAILY_SUMMARY_PROMPT.parse(DAILY_SUMMARY_PROMPT.stand_in(inputs), inputs) == text


def test_an_override_reaches_the_model_and_only_for_its_prompt() -> None:
    llm = ScriptedLLM.from_rules(
        [
            (
                lambda messages: messages[0].content == NURSE,
                "The user adopted a cat named Bailey and was happy about it.",
            )
        ],
        default=memorybank_reply,
    )
    memory = bank(llm, prompts={"memorybank.daily_summary": NURSE})
    scope = Scope("ann", "s1")
    memory.save([Turn("user", "I adopted a cat named Bailey!", timestamp=T0)], scope)
    assert memory.consolidate("ann", T0) == 0
    systems = [call[0].content for call in llm.calls]
    assert NURSE in systems and DAILY_SUMMARY_SYSTEM not in systems
    # The other three prompts keep their default instructions.
    assert {s.system for s in PROMPTS[1:]} <= set(systems)
    [summary] = memory.engine.records("ann", where={"kind": DAILY_SUMMARY})
    assert summary.text == "The user adopted a cat named Bailey and was happy about it."
    memory.close()


def test_an_override_keeps_the_spec_dynamic_parts_and_its_json_twin() -> None:
    """DPeM's notes prompt: the override replaces the instruction, not the request."""
    text = "Take short notes on the patient's health. Write each as a line `<Note>: ...`."
    llm = ScriptedLLM(default=dpem_reply)
    memory = DualProcessMemory(
        llm=llm,
        embedder=HashingEmbedder(dimension=64),
        clock=FixedClock(T0),
        theta=2,
        prompts={"dpem.notes": text},
    )
    at = T0 + timedelta(minutes=1)
    memory.save(
        [Turn("user", "I have type 2 diabetes.", timestamp=at), Turn("assistant", "Okay.")],
        Scope("ann"),
    )
    notes_calls = [c for c in llm.calls if c[0].content == text]
    assert notes_calls and "type 2 diabetes" in notes_calls[0][-1].content
    assert all(c[0].content != dpem.NOTES_SYSTEM for c in llm.calls)
    memory.close()
    twin = PromptOverrides({"dpem.notes.json": "Notes as JSON with a `notes` list."}).apply(
        dpem.NOTES
    )
    assert twin.structured is not None and twin.structured.system is not None
    assert twin.structured.system.startswith("Notes as JSON")
    assert twin.system == dpem.NOTES_SYSTEM  # the tagged prompt is untouched


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ({"memorybank.daily_sumary": NURSE}, "no prompt named"),
        ({"memorybank.daily_summary": "   "}, "non-empty text"),
        ({"memorybank.daily_summary": 3}, "non-empty text"),
        (["memorybank.daily_summary"], "mapping"),
    ],
)
def test_a_bad_override_is_refused_before_anything_is_opened(
    tmp_path: Path, prompts: object, message: str
) -> None:
    folder = tmp_path / "memory"
    with pytest.raises(PromptOverrideError, match=message) as caught:
        bank(ScriptedLLM(default=memorybank_reply), path=folder, prompts=prompts)
    assert isinstance(caught.value, ConfigurationError)
    assert not folder.exists()


@pytest.mark.parametrize(
    ("mechanism", "name", "text", "kept"),
    [
        ("dpem", "dpem.notes", "Take notes on the user.", "<Note>"),
        ("dpem", "dpem.typing", "Type each item: <Type 1>: habit.", "<Type 2>"),
        ("dpem", "dpem.notes.json", "Reply with JSON.", "notes"),
        ("emg", "emg.extract", "Extract what the user said as JSON.", "memories"),
    ],
)
def test_an_override_must_keep_the_output_format(
    mechanism: str, name: str, text: str, kept: str
) -> None:
    with pytest.raises(PromptOverrideError, match="drops the output format") as caught:
        if mechanism == "dpem":
            DualProcessMemory(
                llm=ScriptedLLM(default=dpem_reply),
                embedder=HashingEmbedder(dimension=64),
                prompts={name: text},
            )
        else:
            EMGMemory(
                llm=ScriptedLLM(default=emg_reply),
                embedder=HashingEmbedder(dimension=64),
                train_after=None,
                prompts={name: text},
            )
    assert repr(kept) in str(caught.value)


def test_format_markers_name_what_each_parser_reads() -> None:
    assert format_markers(dpem.NOTES) == {"<Note>"}
    assert format_markers(dpem.TYPING) == {"<Type 1>", "<Type 2>"}
    assert format_markers(EXTRACT) == {"memories"}
    assert format_markers(DAILY_SUMMARY_PROMPT) == frozenset()  # free prose


def test_a_mechanism_without_overridable_prompts_refuses_any_override() -> None:
    from memories_core import HistoryMemory

    with pytest.raises(PromptOverrideError, match="no prompt named"):
        HistoryMemory(embedder=HashingEmbedder(dimension=64), prompts={"summary": "x"})


def test_summary_override_reaches_the_model() -> None:
    from memories_core import SummaryMemory

    text = "Summarise the session for the user's coach. One sentence."
    llm = ScriptedLLM.from_rules(
        [(lambda messages: messages[0].content == text, "The user moved to Porto.")]
    )
    memory = SummaryMemory(
        llm=llm,
        embedder=HashingEmbedder(dimension=64),
        clock=FixedClock(T0),
        derive="inline",
        prompts={"summary.session": text},
    )
    scope = Scope("ann", "s1")
    memory.save([Turn("user", "I moved to Porto last week.", timestamp=T0)], scope)
    memory.end_session(scope)
    assert [r.text for r in memory.engine.records("ann", where={"kind": "summary"})] == [
        "The user moved to Porto."
    ]
    assert [call[0].content for call in llm.calls] == [text]
    memory.close()


def test_conditional_overrides_keep_the_tags_their_parsers_read() -> None:
    from memories_core import ConditionalMemory

    with pytest.raises(PromptOverrideError, match="'<Decision>'"):
        ConditionalMemory(
            llm=ScriptedLLM(default="<Decision>: no"),
            embedder=HashingEmbedder(dimension=64),
            prompts={"conditional.decision": "Decide whether the turn is worth keeping."},
        )
    kept = ConditionalMemory(
        llm=ScriptedLLM(default="<Decision>: no"),
        embedder=HashingEmbedder(dimension=64),
        prompts={"conditional.decision": "Keep it? Reply `<Decision>: yes` or `<Decision>: no`."},
    )
    kept.close()
