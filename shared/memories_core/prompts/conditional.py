"""Prompts and parsers of conditional memory (Yuan et al., §3.1, appendix C.2, Tables 17-18).

Three message builders, each a pure function, and their parsers:

* :func:`build_decision_messages`: Table 17's second step on its own, the "memorisation timing"
  decision (is this user turn worth remembering?), for the drop-in mode where the chain's own
  prompt is not ours.
* :func:`build_respond_and_decide_messages`: Table 17 whole, the paper's single-call mode: one
  call writes the response (``<Respond>``) and the hidden decision (``<Decision>``).
* :func:`build_record_messages`: Table 18, the memory content: related context, why the user
  said it (``<Summary>``) and a note for future reference (``<Note>``).

Each is also a :class:`~memories_core.prompts.spec.PromptSpec` (:data:`DECISION`,
:data:`RESPOND_AND_DECIDE`, :data:`RECORD`) for :func:`~memories_core.prompts.spec.run_spec`.

Two answer formats, chosen by what the model offers:

* **Tagged** (the paper's own format, Tables 17-18: ``<Decision>: yes``, ``<Respond>: ...``,
  ``<Context>/<Summary>/<Note>``): the prompt-only layer, for server models and any model
  without structured output; parsed tolerantly with one repair retry.
* **JSON** (the same fields: ``{"decision": "yes"|"no"}``, ``{"respond", "decision"}``,
  ``{"context": [line numbers], "summary", "note"}``): each spec's
  :attr:`~PromptSpec.structured` twin, used when the model offers schema-constrained
  decoding (the local models through lm-format-enforcer; OpenAI-compatible servers through
  ``response_format``) or JSON mode.
  A 135M-parameter model rarely follows the tagged format (BENCHMARKS.md, "Structured
  output"), while a schema makes every answer parse; the fields and
  rules are the paper's, only the envelope differs.

User text is untrusted: it is fenced in ``<user_input>`` with ``<``, ``>`` and ``&`` escaped
(:func:`~memories_core.prompts.spec.fence`), so it can neither close its section nor show
the model a real tag; the parsers also pass it as ``echoed`` to
:func:`~memories_core.parsing.parse_tagged`, so a forged ``<Decision>: yes`` that the model
repeats (however re-spaced) does not count.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import pydantic

from memories_core.errors import ParseError
from memories_core.parsing import parse_tagged, parse_yes_no
from memories_core.prompts.spec import (
    PromptSpec,
    fence,
    json_instruction,
    parse_model,
    require_text,
    unescape,
)
from memories_core.types import ChatMessage

__all__ = [
    "DECISION",
    "DECISION_JSON",
    "RECORD",
    "RECORD_JSON",
    "RESPOND_AND_DECIDE",
    "RESPOND_AND_DECIDE_JSON",
    "ConditionalNote",
    "DecisionAnswer",
    "DecisionInput",
    "RecordAnswer",
    "RecordInput",
    "RespondAnswer",
    "RespondDecision",
    "RespondInput",
    "build_decision_messages",
    "build_record_messages",
    "build_respond_and_decide_messages",
    "is_worth_remembering",
    "parse_decision",
    "parse_record",
    "parse_respond_and_decision",
    "render_record",
]

# Table 17, second step, in our words: what is worth remembering and what is not.
DECISION_RULES = (
    'Answer "yes" if the user input is a requirement or instruction for the assistant. '
    'Answer "yes" if the user input reflects on, corrects or gives feedback about the '
    "assistant's previous answer. "
    'Answer "yes" if the user input contains knowledge worth remembering (facts about the user, '
    "preferences, plans, things they know). "
    'Answer "no" if the user input is a simple question the assistant just has to answer. '
    'Answer "no" if the user input is phatic talk such as greetings or thanks.'
)

DECIDE_SYSTEM = (
    "You decide what a personal assistant should remember. Imagine you are the assistant and "
    "judge whether the user input below should be remembered for future conversations. "
    f'{DECISION_RULES} Reply only with one line that starts with "<Decision>:" followed by '
    '"yes" or "no", with no reason.'
)

RESPOND_SYSTEM = (
    "You are a helpful personal assistant. Work in two steps.\n"
    "Step 1: write your response to the user input, using the memory when it helps. Start it "
    'with "<Respond>:".\n'
    "Step 2: imagine you are the assistant and judge whether the user input should be "
    f"remembered. {DECISION_RULES} Only answer yes or no, with no reason. Start it with "
    '"<Decision>:".\n'
    'Output format: "<Respond>: your response <Decision>: yes or no"'
)

RECORD_SYSTEM = (
    "You write the long-term memory of a personal assistant. Work in three steps.\n"
    "Step 1: from the dialogue context, copy the turns that relate to the user input. If none "
    'relate, write "NaN". Start it with "<Context>:".\n'
    "Step 2: summarise why the user said the user input, based on the input itself and the "
    "context from step 1: the situation, reasons or background behind it. If the context is "
    '"NaN", do not ask for it. Start it with "<Summary>:".\n'
    "Step 3: imagine you are the assistant and want to serve this user better in the future: "
    "rewrite the user input as a note for future reference that keeps the new information or "
    'knowledge it contains. Start it with "<Note>:".\n'
    'Output format: "<Context>: related turns <Summary>: why the user said it <Note>: the note"'
)

_NAN = {"nan", "none", "n/a", "na", "null", ""}

#: Related dialogue lines a JSON record may name (step 1 of Table 18): a bound on the answer's
#: size, above the 6 lines ``ConditionalMemory`` shows by default (``context_turns``).
MAX_RELATED = 12


@dataclass(frozen=True)
class RespondDecision:
    """Parsed single-call output (Table 17).

    Attributes:
        respond: The response shown to the user.
        decision: Whether to remember the user input; ``None`` if the model gave no readable
            decision (the caller then decides with a separate call).
    """

    respond: str
    decision: bool | None


@dataclass(frozen=True)
class ConditionalNote:
    """Parsed memory-record output (Table 18).

    Attributes:
        related_context: The copied related turns (an intermediate product, not stored as text).
        summary: Why the user said it: the record's ``context`` part.
        note: The note for future reference: the record's ``knowledge`` part.
    """

    related_context: str
    summary: str
    note: str


def _fence(user_input: str) -> str:
    return fence("user_input", user_input)


def build_decision_messages(
    user_input: str, *, previous_reply: str | None = None
) -> list[ChatMessage]:
    """Messages asking whether ``user_input`` is worth remembering (Table 17, step 2).

    Args:
        user_input: The user's turn.
        previous_reply: The assistant's turn before it, so that feedback on it can be judged.
    """
    return _decision_messages(
        DECIDE_SYSTEM,
        "Should this user input be remembered? Answer with <Decision>: yes or no.",
        user_input,
        previous_reply,
    )


def _decision_messages(
    system: str, question: str, user_input: str, previous_reply: str | None
) -> list[ChatMessage]:
    parts = []
    if previous_reply:
        parts.append(fence("previous_assistant_reply", previous_reply))
    parts.append(_fence(user_input))
    parts.append(question)
    return [ChatMessage("system", system), ChatMessage("user", "\n\n".join(parts))]


def build_respond_and_decide_messages(
    user_input: str,
    *,
    memory: str = "",
    history: Sequence[str] = (),
    instructions: str | None = None,
) -> list[ChatMessage]:
    """Messages for the single-call mode: response plus hidden decision (Table 17).

    Args:
        user_input: The user's turn.
        memory: Recalled memory records, rendered (empty if none).
        history: The current session's earlier turns, rendered ``"role: content"``.
        instructions: The application's own instructions, put before the two steps.
    """
    system = f"{instructions.strip()}\n\n{RESPOND_SYSTEM}" if instructions else RESPOND_SYSTEM
    parts = [fence("memory", memory.strip() or "NaN")]
    if history:
        parts.append(fence("dialogue_so_far", "\n".join(history)))
    parts.append(_fence(user_input))
    return [ChatMessage("system", system), ChatMessage("user", "\n\n".join(parts))]


def build_record_messages(
    dialogue_context: Sequence[str],
    user_input: str,
    *,
    system: str = RECORD_SYSTEM,
    numbered_lines: bool = False,
) -> list[ChatMessage]:
    """Messages asking for a conditional memory record (Table 18).

    Args:
        dialogue_context: The ongoing dialogue up to and including the user input, rendered.
        user_input: The user turn to remember.
        system: The instructions (the JSON form's are :data:`RECORD_JSON_SYSTEM`).
        numbered_lines: Number the dialogue lines (:func:`numbered`), for an answer that
            names the related lines by number (the JSON form).
    """
    join = numbered if numbered_lines else lambda lines: "\n".join(lines) or "NaN"
    context = join(dialogue_context)
    body = f"{fence('dialogue_context', context)}\n\n{_fence(user_input)}"
    return [ChatMessage("system", system), ChatMessage("user", body)]


def parse_decision(text: str, user_input: str) -> bool:
    """Read ``<Decision>: yes|no``; tags echoed from ``user_input`` do not count.

    Raises:
        ParseError: if there is no readable decision.
    """
    values = parse_tagged(text, ["Decision"], required=["Decision"], echoed=user_input)
    return parse_yes_no(values["Decision"])


def parse_respond_and_decision(text: str, user_input: str) -> RespondDecision:
    """Read the single-call output; the user only ever sees the ``<Respond>`` part.

    Graceful fallback for chatty models: without a ``<Respond>`` tag, the text before the
    ``<Decision>`` marker (or all of it) is the response; an unreadable decision is ``None``.

    Raises:
        ParseError: if no response text is left at all.
    """
    try:
        values = parse_tagged(text, ["Respond", "Decision"], echoed=user_input)
    except ParseError:
        values = {}
    respond = unescape(values.get("Respond", "")).strip()
    if not respond:
        respond = unescape(_before_decision(text))
    if not respond:
        raise ParseError("the model gave no response text", raw=text)
    decision: bool | None
    try:
        decision = parse_yes_no(values["Decision"]) if values.get("Decision") else None
    except ParseError:
        decision = None
    return RespondDecision(respond=respond, decision=decision)


def parse_record(text: str, user_input: str) -> ConditionalNote:
    """Read ``<Context>``, ``<Summary>`` and ``<Note>``; a note is required.

    Raises:
        ParseError: if there is no note.
    """
    values = parse_tagged(
        text, ["Context", "Summary", "Note"], required=["Note"], echoed=user_input
    )
    summary = values.get("Summary", "").strip()
    related = values.get("Context", "").strip()
    return ConditionalNote(
        related_context="" if related.lower() in _NAN else unescape(related),
        summary="" if summary.lower() in _NAN else unescape(summary),
        note=require_text(values["Note"], "note", text),
    )


def render_record(note: ConditionalNote) -> str:
    """The stored record text, ``"Context: ... Knowledge: ..."`` (Yuan et al., Table 1)."""
    if note.summary:
        return f"Context: {note.summary} Knowledge: {note.note}"
    return f"Knowledge: {note.note}"


def _before_decision(text: str) -> str:
    head = re.split(r"(?i)[<\[*\s]*decision\b", text, maxsplit=1)[0]
    return re.sub(r"(?i)^[\s*]*(?:<respond>|\[respond\]|respond)\s*:?", "", head).strip()


# ---------------------------------------------------------------------------------------------
# Specs: typed inputs, JSON answers, stand-ins
# ---------------------------------------------------------------------------------------------

_PHATIC = re.compile(
    r"^\W*(hi|hello|hey|good (morning|evening|night)|thanks|thank you|ok|okay|bye|cool|great)\b",
    re.I,
)
_QUESTION_START = re.compile(
    r"^\W*(what|when|where|who|whom|which|why|how|can|could|would|will|do|does|did|is|are|"
    r"should|may)\b",
    re.I,
)
_FEEDBACK = re.compile(
    r"(^\W*no\b|\bnot what\b|\binstead\b|\bactually\b|\bi meant\b|\bi prefer\b|\balways\b|"
    r"\bnever\b|\bfrom now on\b|\bwrong\b|\bremember\b)",
    re.I,
)
# A one-off task ("Capitalize these words: ...") is answered, not remembered.
_TASK_START = re.compile(
    r"^\W*(please\b|capitalize|translate|write|tell|give|show|list|summari[sz]e|explain|help|"
    r"make|find|suggest|recommend|plan|convert|book|draft|fix)\b",
    re.I,
)


def is_worth_remembering(text: str) -> bool:
    """Yuan et al.'s Table 17 rule, as heuristics (the offline stand-ins' judgement).

    Yes for standing requirements, feedback on earlier answers and knowledge; no for simple
    questions, one-off tasks and phatic talk. Feedback and requirement words ("no, ...",
    "always", "I prefer", "from now on") win over the question or task shape.
    """
    stripped = text.strip()
    if _FEEDBACK.search(stripped):
        return True
    if _PHATIC.match(stripped) and len(stripped.split()) <= 6:
        return False
    return not (
        stripped.endswith("?") or _QUESTION_START.match(stripped) or _TASK_START.match(stripped)
    )


@dataclass(frozen=True)
class DecisionInput:
    """Input of the decision prompt (Table 17, step 2).

    Attributes:
        user_input: The user's turn (untrusted).
        previous_reply: The assistant's turn before it, if any (untrusted).
    """

    user_input: str
    previous_reply: str | None = None


@dataclass(frozen=True)
class RespondInput:
    """Input of the single-call respond-and-decide prompt (Table 17).

    Attributes:
        user_input: The user's turn.
        memory: Recalled memory records, rendered.
        history: The session's earlier turns, rendered ``"role: content"``.
        instructions: The application's own instructions (trusted).
    """

    user_input: str
    memory: str = ""
    history: tuple[str, ...] = field(default=())
    instructions: str | None = None


@dataclass(frozen=True)
class RecordInput:
    """Input of the record prompt (Table 18).

    Attributes:
        dialogue_context: The ongoing dialogue up to and including the user input, rendered.
        user_input: The user turn to remember.
    """

    dialogue_context: tuple[str, ...]
    user_input: str


class DecisionAnswer(pydantic.BaseModel):
    """JSON form of Table 17's ``<Decision>``."""

    model_config = pydantic.ConfigDict(extra="forbid")
    decision: Literal["yes", "no"] = pydantic.Field(description="Remember the user input?")


class RespondAnswer(pydantic.BaseModel):
    """JSON form of Table 17's ``<Respond>`` and ``<Decision>`` (response first, as there)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    respond: str = pydantic.Field(min_length=1, max_length=2000, description="The response")
    decision: Literal["yes", "no"] = pydantic.Field(description="Remember the user input?")


class RecordAnswer(pydantic.BaseModel):
    """JSON form of Table 18's ``<Context>``, ``<Summary>`` and ``<Note>``.

    Step 1 (find the related context) names the related dialogue lines by number instead of
    copying them: the copy is an intermediate product (not stored), and the local default model
    copied the whole dialogue, looped, and ran out of its token budget before the note, so
    every record of a LoCoMo session failed to parse (BENCHMARKS.md, "Conditional memory:
    the record call with the local model"). The numbers are mapped back to the exact lines.
    """

    model_config = pydantic.ConfigDict(extra="forbid")
    context: list[int] = pydantic.Field(
        max_length=MAX_RELATED,
        description="Numbers of the dialogue lines related to the user input ([] if none)",
    )
    summary: str = pydantic.Field(max_length=300, description="Why the user said it")
    note: str = pydantic.Field(
        min_length=1, max_length=300, description="The note for future reference"
    )

    @pydantic.field_validator("context", mode="before")
    @classmethod
    def _numbers(cls, value: object) -> object:
        """Read the numbers another model may give in another shape.

        ``"1, 3"`` is two numbers; "NaN", ``None`` or a copied text (its own digits are no
        line numbers) is none; a longer list is cut, not refused.
        """
        if value is None:
            return []
        if isinstance(value, str):
            if not re.fullmatch(r"[\s\d,;#\[\]]*", value):
                return []
            return [int(n) for n in re.findall(r"\d+", value)][:MAX_RELATED]
        if isinstance(value, list):
            return value[:MAX_RELATED]
        return value


DECIDE_JSON_SYSTEM = (
    "You decide what a personal assistant should remember. Imagine you are the assistant and "
    "judge whether the user input below should be remembered for future conversations. "
    f"{DECISION_RULES} " + json_instruction(DecisionAnswer)
)

RESPOND_JSON_SYSTEM = (
    "You are a helpful personal assistant. Work in two steps.\n"
    'Step 1: write your response to the user input, using the memory when it helps ("respond").\n'
    "Step 2: imagine you are the assistant and judge whether the user input should be "
    f'remembered ("decision", yes or no). {DECISION_RULES}\n' + json_instruction(RespondAnswer)
)

RECORD_JSON_SYSTEM = (
    "You write the long-term memory of a personal assistant. Work in three steps.\n"
    '"context": the numbers of the dialogue context lines that relate to the user input, or '
    "[] if none relate.\n"
    '"summary": in one sentence, why the user said the user input: the situation, reasons or '
    "background.\n"
    '"note": in one sentence, rewrite the user input as a note for future reference that '
    "keeps the new information or knowledge it contains.\n" + json_instruction(RecordAnswer)
)


def _with_system(messages: list[ChatMessage], system: str) -> list[ChatMessage]:
    return [ChatMessage("system", system), *messages[1:]]


def _decision_stand_in(inputs: DecisionInput) -> str:
    return f"<Decision>: {'yes' if is_worth_remembering(inputs.user_input) else 'no'}"


def _respond_text(inputs: RespondInput) -> str:
    memory = inputs.memory.strip()
    return f"Answering {inputs.user_input!r}" + (
        f" with what I remember: {memory}" if memory and memory != "NaN" else "."
    )


def _related_indices(inputs: RecordInput) -> range:
    """The stand-ins' related lines (0-based): the two before the user input."""
    count = len(inputs.dialogue_context)
    return range(max(0, count - 3), count - 1) if count > 1 else range(0)


def _record_parts(inputs: RecordInput) -> tuple[str, str, str]:
    related = [inputs.dialogue_context[i] for i in _related_indices(inputs)]
    asked = [line.split(": ", 1)[-1] for line in related if line.startswith("user: ")]
    why = (
        f"The user reacted to the assistant's answer to '{asked[-1]}'."
        if asked
        else "The user said this without earlier context."
    )
    return " | ".join(related) or "NaN", why, f"The user said: {inputs.user_input}"


def _record_stand_in(inputs: RecordInput) -> str:
    related, why, note = _record_parts(inputs)
    return f"<Context>: {related}\n<Summary>: {why}\n<Note>: {note}"


def _parse_decision_json(text: str, inputs: DecisionInput) -> bool:
    return parse_model(text, DecisionAnswer, [inputs.user_input]).decision == "yes"


def _parse_respond_json(text: str, inputs: RespondInput) -> RespondDecision:
    answer = parse_model(text, RespondAnswer, [inputs.user_input])
    respond = require_text(answer.respond, "response", text)
    return RespondDecision(respond=respond, decision=answer.decision == "yes")


def numbered(lines: Sequence[str]) -> str:
    """The dialogue context with line numbers from 1 (``"[2] user: ..."``), or ``"NaN"``."""
    return "\n".join(f"[{n}] {line}" for n, line in enumerate(lines, 1)) or "NaN"


def unnumbered(line: str) -> str:
    """A line of :func:`numbered` without its number."""
    return re.sub(r"^\[\d+\] ", "", line)


def _parse_record_json(text: str, inputs: RecordInput) -> ConditionalNote:
    answer = parse_model(text, RecordAnswer, [inputs.user_input])
    lines = inputs.dialogue_context
    chosen = sorted({n for n in answer.context if 1 <= n <= len(lines)})
    related = "\n".join(lines[n - 1] for n in chosen)
    summary = answer.summary.strip()
    return ConditionalNote(
        related_context=related,
        summary="" if summary.lower() in _NAN else unescape(summary),
        note=require_text(answer.note, "note", text),
    )


#: Table 17, step 2, as JSON: ``{"decision": "yes"|"no"}``.
DECISION_JSON: PromptSpec[DecisionInput, bool] = PromptSpec(
    name="conditional.decision.json",
    system=DECIDE_JSON_SYSTEM,
    build=lambda i: _decision_messages(
        DECIDE_JSON_SYSTEM,
        'Should this user input be remembered? Answer {"decision": "yes"} or {"decision": "no"}.',
        i.user_input,
        i.previous_reply,
    ),
    parse=_parse_decision_json,
    stand_in=lambda i: DecisionAnswer(
        decision="yes" if is_worth_remembering(i.user_input) else "no"
    ).model_dump_json(),
    response_model=DecisionAnswer,
    max_tokens=16,
)

#: Table 17, step 2: is this user turn worth remembering? (``<Decision>: yes|no``)
DECISION: PromptSpec[DecisionInput, bool] = PromptSpec(
    name="conditional.decision",
    system=DECIDE_SYSTEM,
    build=lambda i: build_decision_messages(i.user_input, previous_reply=i.previous_reply),
    parse=lambda text, i: parse_decision(text, i.user_input),
    stand_in=_decision_stand_in,
    # Room for a chatty preamble before the tag; the JSON twin needs only 16.
    max_tokens=48,
    structured=DECISION_JSON,
)


def _respond_messages(i: RespondInput) -> list[ChatMessage]:
    return build_respond_and_decide_messages(
        i.user_input, memory=i.memory, history=i.history, instructions=i.instructions
    )


def _respond_json_messages(i: RespondInput) -> list[ChatMessage]:
    system = RESPOND_JSON_SYSTEM
    if i.instructions:
        system = f"{i.instructions.strip()}\n\n{system}"
    return _with_system(_respond_messages(i), system)


#: Table 17 as JSON: ``{"respond": ..., "decision": "yes"|"no"}``.
RESPOND_AND_DECIDE_JSON: PromptSpec[RespondInput, RespondDecision] = PromptSpec(
    name="conditional.respond_and_decide.json",
    system=RESPOND_JSON_SYSTEM,
    build=_respond_json_messages,
    parse=_parse_respond_json,
    stand_in=lambda i: RespondAnswer(
        respond=_respond_text(i),
        decision="yes" if is_worth_remembering(i.user_input) else "no",
    ).model_dump_json(),
    response_model=RespondAnswer,
)

#: Table 17 whole: the response and the hidden decision in one call.
RESPOND_AND_DECIDE: PromptSpec[RespondInput, RespondDecision] = PromptSpec(
    name="conditional.respond_and_decide",
    system=RESPOND_SYSTEM,
    build=_respond_messages,
    parse=lambda text, i: parse_respond_and_decision(text, i.user_input),
    stand_in=lambda i: (
        f"<Respond>: {_respond_text(i)}\n"
        f"<Decision>: {'yes' if is_worth_remembering(i.user_input) else 'no'}"
    ),
    structured=RESPOND_AND_DECIDE_JSON,
)

#: Table 18 as JSON: ``{"context", "summary", "note"}``.
RECORD_JSON: PromptSpec[RecordInput, ConditionalNote] = PromptSpec(
    name="conditional.record.json",
    system=RECORD_JSON_SYSTEM,
    build=lambda i: build_record_messages(
        i.dialogue_context, i.user_input, system=RECORD_JSON_SYSTEM, numbered_lines=True
    ),
    parse=_parse_record_json,
    stand_in=lambda i: RecordAnswer(
        context=[n + 1 for n in _related_indices(i)],
        summary=_record_parts(i)[1],
        note=_record_parts(i)[2],
    ).model_dump_json(),
    response_model=RecordAnswer,
    # Two one-sentence fields of at most 300 characters each, the numbers and the braces.
    max_tokens=200,
)

#: Table 18: the memory record (``<Context>``, ``<Summary>``, ``<Note>``).
RECORD: PromptSpec[RecordInput, ConditionalNote] = PromptSpec(
    name="conditional.record",
    system=RECORD_SYSTEM,
    build=lambda i: build_record_messages(i.dialogue_context, i.user_input),
    parse=lambda text, i: parse_record(text, i.user_input),
    stand_in=_record_stand_in,
    max_tokens=200,
    structured=RECORD_JSON,
)
