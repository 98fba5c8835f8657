"""Prompts are overridable without subclassing: ``prompts={name: instruction}``.

An override reaches the model in place of the default system instruction; it is checked
when the mechanism is built (a known prompt, overridable, keeping the output format its
parser reads), and a bad one raises a typed error before anything is opened.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from memochat_scenario import CHAT
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
from memories_core.types import ChatMessage

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


def obeying(
    overrides: Mapping[str, str],
    defaults: Mapping[str, str],
    reply: Callable[[Sequence[ChatMessage]], str],
    **kwargs: object,
) -> ScriptedLLM:
    """A scripted model that answers an overridden prompt as it answers the default one.

    It records every call (``llm.calls``), so a test sees which instruction reached it.
    """
    back = {overrides[name]: defaults[name] for name in overrides}

    def answer(messages: Sequence[ChatMessage]) -> str:
        system = messages[0].content
        return reply([ChatMessage("system", back.get(system, system)), *messages[1:]])

    return ScriptedLLM(default=answer, **kwargs)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ MemoChat
MEMO_CHAT_TURNS = CHAT[:10]
MEMO_OVERRIDES = {
    "memochat.writing": "You keep a tutor's lesson notes: split the lines into topics.",
    "memochat.retrieval": "You pick the lesson topics a student's question is about.",
    "memochat.chat": "You are a patient tutor who remembers earlier lessons.",
}


def memochat_run(prompts: Mapping[str, str] | None) -> tuple[ScriptedLLM, list[str], str]:
    """Fill a MemoChat memory, retrieve and respond; the model, memo topics and reply."""
    from memories_core import MemoChatMemory
    from memories_core.prompts import memochat

    defaults = {spec.name: spec.system or "" for spec in memochat.PROMPTS}
    llm = obeying(
        prompts or {}, defaults, lambda messages: memochat.rule_following_reply(messages) or ""
    )
    memory = MemoChatMemory(llm=llm, embedder=HashingEmbedder(dimension=64), prompts=prompts)
    scope = Scope("ann")
    memory.save([Turn(role, text) for role, text in MEMO_CHAT_TURNS], scope)
    topics = [m.topic for m in memory.memos(scope)]
    reply = memory.respond("Which business etiquette did we talk about?", scope, save=False)
    memory.close()
    return llm, topics, reply


def test_memochat_overrides_reach_the_model_for_each_of_its_prompts() -> None:
    from memories_core.prompts.memochat import CHAT_SYSTEM, RETRIEVE_SYSTEM, WRITE_SYSTEM

    llm, topics, reply = memochat_run(MEMO_OVERRIDES)
    systems = [call[0].content for call in llm.calls]
    # Memo writing, memo choice (inside respond) and the reply, each with its override.
    assert systems == list(MEMO_OVERRIDES.values())
    assert not {WRITE_SYSTEM, RETRIEVE_SYSTEM, CHAT_SYSTEM} & set(systems)
    # The task text with the output format stays in the request: the memos are the same.
    assert "Answer with JSON only" in llm.calls[0][-1].content
    assert "answer N#M" in llm.calls[1][-1].content
    assert (topics, reply) == memochat_run(None)[1:]
    assert topics == ["quantum", "business", "factor"]
    assert reply.startswith("From our memo on business")


def test_memochat_without_overrides_sends_the_default_prompts() -> None:
    from memories_core.prompts.memochat import CHAT_SYSTEM, RETRIEVE_SYSTEM, WRITE_SYSTEM

    llm, _, _ = memochat_run(None)
    assert [call[0].content for call in llm.calls] == [WRITE_SYSTEM, RETRIEVE_SYSTEM, CHAT_SYSTEM]


def test_memochat_json_twin_override_reaches_a_structured_model() -> None:
    from memories_core.mechanisms.memochat import LLMOptionSource, choose_memos
    from memories_core.prompts.memochat import MEMO_RETRIEVAL, RETRIEVE_SYSTEM

    text = "You pick the lesson topics a student's question is about, as JSON."
    source = LLMOptionSource(
        llm=ScriptedLLM(default='{"options": [1]}'), prompts={"memochat.retrieval.json": text}
    )
    spec = PromptOverrides.of(source.prompts).apply(MEMO_RETRIEVAL)
    llm = ScriptedLLM(default='{"options": [1]}', structured_output=frozenset({"json_schema"}))
    assert choose_memos(llm, "japan bowing", ["business. Bowing in Japan."], spec=spec) == [0]
    assert [call[0].content for call in llm.calls] == [text]
    # The tagged prompt keeps its default instruction.
    plain = ScriptedLLM(default="1")
    assert choose_memos(plain, "japan bowing", ["business. Bowing in Japan."], spec=spec) == [0]
    assert plain.calls[0][0].content == RETRIEVE_SYSTEM


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ({"memochat.chatt": "Be a tutor."}, "no prompt named 'memochat.chatt'"),
        ({"memochat.writing": "Summarise the lesson for the tutor."}, "'topics'"),
        ({"dpem.notes": "Take notes <Note>."}, "no prompt named"),
    ],
)
def test_a_bad_memochat_override_is_refused_at_construction(
    tmp_path: Path, prompts: dict[str, str], message: str
) -> None:
    from memories_core import MemoChatMemory
    from memories_core.mechanisms.memochat import LLMOptionSource

    folder = tmp_path / "memo"
    with pytest.raises(PromptOverrideError, match=message):
        MemoChatMemory(
            llm=ScriptedLLM(default="1"),
            path=folder,
            embedder=HashingEmbedder(dimension=64),
            prompts=prompts,
        )
    assert not folder.exists()
    with pytest.raises(PromptOverrideError, match=r"no prompt named 'memochat\.chat'"):
        LLMOptionSource(llm=ScriptedLLM(default="1"), prompts={"memochat.chat": "Be a tutor."})


# ------------------------------------------------------------------- self-reflective retrieval
JUDGE = (
    "You are a health coach's assistant. If the candidate memories answer the question, "
    'start with "<Memory>:" and copy them; else start with "<Query>:" and give keywords.'
)


def reflective_run(
    prompts: Mapping[str, str] | None, question: str, **llm_kwargs: object
) -> tuple[ScriptedLLM, str, list[str]]:
    """Save two facts, recall ``question`` through the reflection: model, context, queries."""
    from memories_core import HistoryMemory, SelfReflectiveMemory
    from memories_core.prompts import reflection
    from memories_core.prompts.rule_following import rule_following_reply

    defaults = {"reflection": reflection.SYSTEM, "reflection.json": reflection.JSON_SYSTEM}
    llm = obeying(prompts or {}, defaults, rule_following_reply, **llm_kwargs)
    base = HistoryMemory(embedder=HashingEmbedder(dimension=64), clock=FixedClock(T0))
    memory = SelfReflectiveMemory(base, llm, prompts=prompts)
    scope = Scope("ann")
    memory.save(
        [Turn("user", "I am allergic to peanuts."), Turn("user", "My sister lives in Lisbon.")],
        scope,
    )
    result = memory.reflect(question, scope, k=1)
    base.close()
    return llm, result.memory or "", result.queries


def test_reflection_override_reaches_the_model_for_the_judgement_and_the_expansion() -> None:
    from memories_core.prompts import reflection

    # Enough: the judgement copies the memory.
    llm, memory, queries = reflective_run({"reflection": JUDGE}, "Which peanuts allergy?")
    assert [call[0].content for call in llm.calls] == [JUDGE]
    assert "allergic to peanuts" in memory and len(queries) == 1
    # Not enough: the same prompt's other outcome extends the query.
    llm, memory, queries = reflective_run({"reflection": JUDGE}, "Where is the cinema?")
    assert [call[0].content for call in llm.calls] == [JUDGE]
    assert memory == "" and len(queries) == 2 and queries[1].startswith("Where is the cinema?")
    # Without overrides the default instruction is sent, with the same outcome.
    default_llm, _, default_queries = reflective_run(None, "Where is the cinema?")
    assert [call[0].content for call in default_llm.calls] == [reflection.SYSTEM]
    assert default_queries == queries


def test_reflection_json_override_reaches_a_structured_model() -> None:
    from memories_core.prompts import reflection

    text = (
        'Judge the memories for a health coach. Answer "enough", "memory" and "keywords".\\n'
        + reflection.JSON_SYSTEM.split("\\n")[-1]
    )
    llm, memory, _ = reflective_run(
        {"reflection.json": text},
        "Which peanuts allergy?",
        structured_output=frozenset({"json_schema"}),
    )
    assert [call[0].content for call in llm.calls] == [text]
    assert "allergic to peanuts" in memory


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ({"reflection": "Say whether the memories are enough."}, "'<Memory>', '<Query>'"),
        ({"reflection.json": "Reply with JSON."}, "'enough', 'keywords', 'memory'"),
        ({"reflexion": JUDGE}, "no prompt named"),
    ],
)
def test_a_bad_reflection_override_is_refused_at_construction(
    prompts: dict[str, str], message: str
) -> None:
    from memories_core import HistoryMemory, SelfReflectiveMemory
    from memories_core.mechanisms.reflection import SelfReflectiveRetrieval

    with pytest.raises(PromptOverrideError, match=message):
        SelfReflectiveRetrieval(ScriptedLLM(default="x"), prompts=prompts)
    base = HistoryMemory(embedder=HashingEmbedder(dimension=64))
    with pytest.raises(PromptOverrideError, match=message):
        SelfReflectiveMemory(base, ScriptedLLM(default="x"), prompts=prompts)
    base.close()


# ---------------------------------------------------------------- EMG answer, autofill, questions
EMG_OVERRIDES = {
    "emg.answer": "You answer a nurse's questions from the patient's memories. One sentence.",
    "emg.autofill": 'You fill in a clinic form from the memories. Reply {"value": ...}.',
    "emg.questions": 'You write quiz questions from the memories, as JSON "pairs".',
}


def emg_run(prompts: Mapping[str, str] | None) -> tuple[ScriptedLLM, list[object]]:
    """Save three facts, then answer, autofill and generate questions: model, results."""
    from memories_core.prompts import emg

    defaults = {
        "emg.extract": emg.EXTRACT_SYSTEM,
        "emg.answer": emg.ANSWER_SYSTEM,
        "emg.autofill": emg.AUTOFILL_SYSTEM,
        "emg.questions": emg.QUESTIONS_SYSTEM,
    }
    llm = obeying(prompts or {}, defaults, emg_reply)
    memory = EMGMemory(
        llm=llm,
        embedder=HashingEmbedder(dimension=64),
        clock=FixedClock(T0),
        derive="inline",
        train_after=None,
        prompts=prompts,
    )
    scope = Scope("ann")
    memory.save(
        [
            Turn("user", "I booked the EK349 flight to Dubai.", timestamp=T0),
            Turn("user", "My passport number is X1234567.", timestamp=T0),
            Turn("user", "My sister Maria lives in Dubai.", timestamp=T0),
        ],
        scope,
    )
    llm.calls.clear()
    results: list[object] = [
        memory.answer("Which flight did I book?", scope).text,
        memory.autofill(["passport number"], scope),
        [(e.question, e.answer) for e in memory.generate_questions("ann")[0]],
    ]
    memory.close()
    return llm, results


def test_emg_answer_autofill_and_question_overrides_reach_the_model() -> None:
    from memories_core.prompts import emg

    llm, results = emg_run(EMG_OVERRIDES)
    systems = {call[0].content for call in llm.calls}
    assert systems == set(EMG_OVERRIDES.values())
    assert not {emg.ANSWER_SYSTEM, emg.AUTOFILL_SYSTEM, emg.QUESTIONS_SYSTEM} & systems
    # The requests are the package's; the obedient model answers them as before.
    default_llm, default_results = emg_run(None)
    assert results == default_results
    assert {call[0].content for call in default_llm.calls} == {
        emg.ANSWER_SYSTEM,
        emg.AUTOFILL_SYSTEM,
        emg.QUESTIONS_SYSTEM,
    }
    assert "EK349" in str(results[0]) and results[2]


@pytest.mark.parametrize(
    ("name", "text", "kept"),
    [
        ("emg.autofill", "Fill in the form field from the memories.", "value"),
        ("emg.questions", "Write quiz questions from the memories.", "pairs"),
        ("emg.reminders", "Remind the user.", None),
    ],
)
def test_a_bad_emg_override_is_refused_at_construction(
    tmp_path: Path, name: str, text: str, kept: str | None
) -> None:
    folder = tmp_path / "emg"
    with pytest.raises(PromptOverrideError) as caught:
        EMGMemory(
            llm=ScriptedLLM(default=emg_reply),
            path=folder,
            embedder=HashingEmbedder(dimension=64),
            train_after=None,
            prompts={name: text},
        )
    assert (repr(kept) if kept else "no prompt named") in str(caught.value)
    assert not folder.exists()


def test_the_configuration_page_lists_every_overridable_prompt_and_what_it_must_keep() -> None:
    from memories_core import ConditionalMemory, MemoChatMemory, SummaryMemory
    from memories_core.mechanisms.reflection import SelfReflectiveRetrieval

    page = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text(encoding="utf-8")
    section = page.split("## Prompt overrides", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    owners = (
        MemoryBankMemory,
        DualProcessMemory,
        ConditionalMemory,
        SummaryMemory,
        MemoChatMemory,
        EMGMemory,
        SelfReflectiveRetrieval,
    )
    for owner in owners:
        for spec in owner.prompt_specs:
            for variant in (spec, spec.structured):
                if variant is None:
                    continue
                [row] = [r for r in rows if f"`{variant.name}`" in r]
                for marker in format_markers(variant):
                    assert f"`{marker}`" in row, (variant.name, marker)
