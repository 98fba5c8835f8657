"""The EMG answer and autofill prompts: a reply from selected memory lines."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import pydantic

from memories_core.errors import ParseError
from memories_core.prompts.emg.extract import _MARKUP, _WORD
from memories_core.prompts.spec import (
    PromptSpec,
    fence,
    json_instruction,
    parse_model,
    unescape,
)
from memories_core.types import ChatMessage, ensure_utc

__all__ = [
    "ANSWER",
    "ANSWER_SYSTEM",
    "AUTOFILL",
    "AUTOFILL_SYSTEM",
    "AnswerInput",
    "AutofillAnswer",
    "AutofillInput",
    "MemoryLine",
    "build_answer_messages",
    "build_autofill_messages",
    "parse_answer",
    "parse_autofill",
]


# ----------------------------------------------------------------------------- answering
@dataclass(frozen=True)
class MemoryLine:
    """A selected memory as the answer and autofill prompts show it."""

    text: str
    subject: str = ""
    relation: str = ""
    object: str = ""

    def render(self) -> str:
        """``text [subject | relation | object]`` (one line)."""
        if not self.relation:
            return self.text
        return f"{self.text} [{self.subject} | {self.relation} | {self.object}]"


@dataclass(frozen=True)
class AnswerInput:
    """Input of the answer prompt (§4.3: ``LLM(Q ⊕ M)``)."""

    question: str
    memories: tuple[MemoryLine, ...]
    now: datetime


ANSWER_SYSTEM = (
    "You are a personal assistant on the user's phone. Answer the user's question using only "
    "their memories listed below; they are the user's own notes, so 'I' and 'my' in them mean "
    "the user. Give the exact names, times and numbers the memories hold. If the memories do "
    "not contain the answer, say that you do not know. Answer in one or two sentences."
)


def _memories_block(lines: Sequence[MemoryLine]) -> str:
    return fence("memories", "\n".join(f"- {m.render()}" for m in lines) or "(none)")


def build_answer_messages(inputs: AnswerInput) -> list[ChatMessage]:
    """Messages asking for the answer to a question from the selected memories (§4.4)."""
    user = (
        f"Now: {ensure_utc(inputs.now):%Y-%m-%d %H:%M} UTC\n{_memories_block(inputs.memories)}\n"
        f"{fence('question', inputs.question)}\n\nAnswer the question."
    )
    return [ChatMessage("system", ANSWER_SYSTEM), ChatMessage("user", user)]


def parse_answer(text: str, inputs: AnswerInput) -> str:
    """Return the answer stripped; an empty answer or prompt markup raises ``ParseError``."""
    cleaned = unescape((text or "").strip()).strip().strip('"').strip()
    cleaned = re.sub(r"^\s*answer\s*:\s*", "", cleaned, flags=re.I)
    if not re.search(r"\w", cleaned):
        raise ParseError("the answer is empty", text)
    if _MARKUP.search(cleaned):
        raise ParseError("the answer holds prompt markup", text)
    return cleaned


def _overlap(a: str, b: str) -> int:
    return len({w.lower() for w in _WORD.findall(a)} & {w.lower() for w in _WORD.findall(b)})


def _answer_stand_in(inputs: AnswerInput) -> str:
    if not inputs.memories:
        return "I do not know."
    timely = re.match(r"\s*(when|what time|what date)\b", inputs.question, re.I) is not None

    def score(line: MemoryLine) -> int:
        bonus = 2 if timely and re.search(r"\d{1,2}:\d{2}|\d{4}-\d{2}-\d{2}", line.text) else 0
        return _overlap(line.render(), inputs.question) + bonus

    return max(inputs.memories, key=score).text


#: Question + selected memories -> answer (§4.3, §4.4 question answering).
ANSWER: PromptSpec[AnswerInput, str] = PromptSpec(
    name="emg.answer",
    system=ANSWER_SYSTEM,
    build=build_answer_messages,
    parse=parse_answer,
    stand_in=_answer_stand_in,
    max_tokens=200,
)


@dataclass(frozen=True)
class AutofillInput:
    """Input of the autofill prompt: one form field and the memories selected for it."""

    field: str
    memories: tuple[MemoryLine, ...]


class AutofillAnswer(pydantic.BaseModel):
    """JSON form of one autofilled field."""

    model_config = pydantic.ConfigDict(extra="forbid")
    value: str | None = pydantic.Field(description="The field's value, or null if unknown")


AUTOFILL_SYSTEM = (
    "You fill in online forms for the user of a smartphone assistant. You will get one form "
    "field and the user's memories that may hold it. Give the field's value exactly as the "
    "memories state it (a name, a number, an address), with nothing around it. If no memory "
    "holds it, give null.\n" + json_instruction(AutofillAnswer)
)


def build_autofill_messages(inputs: AutofillInput) -> list[ChatMessage]:
    """Messages asking for one form field's value from the memories (§4.4 autofill)."""
    user = (
        f"{_memories_block(inputs.memories)}\n{fence('field', inputs.field)}\n\n"
        "Give the field's value as JSON."
    )
    return [ChatMessage("system", AUTOFILL_SYSTEM), ChatMessage("user", user)]


def parse_autofill(text: str, inputs: AutofillInput) -> str | None:
    """The value, or ``None``; a value found in no memory raises ``ParseError`` (made up)."""
    answer = parse_model(text, AutofillAnswer)
    if answer.value is None or not answer.value.strip():
        return None
    value = unescape(answer.value).strip()
    haystack = " ".join(m.render() for m in inputs.memories).lower()
    if value.lower() not in haystack:
        raise ParseError(f"the value {value!r} is in none of the memories", text)
    return value


def _autofill_stand_in(inputs: AutofillInput) -> str:
    wanted = {w.lower() for w in _WORD.findall(inputs.field)}
    scored = [
        (_overlap(f"{m.relation.replace('_', ' ')} {m.text}", inputs.field), m)
        for m in inputs.memories
        if wanted <= {w.lower() for w in _WORD.findall(f"{m.relation.replace('_', ' ')} {m.text}")}
    ]
    scored = [pair for pair in scored if pair[0] > 0 and pair[1].object]
    if not scored:
        return AutofillAnswer(value=None).model_dump_json()
    best = max(scored, key=lambda pair: pair[0])[1]
    return AutofillAnswer(value=best.object).model_dump_json()


#: Form field + selected memories -> value or null (§4.4 autofill forms).
AUTOFILL: PromptSpec[AutofillInput, str | None] = PromptSpec(
    name="emg.autofill",
    system=AUTOFILL_SYSTEM,
    build=build_autofill_messages,
    parse=parse_autofill,
    stand_in=_autofill_stand_in,
    response_model=AutofillAnswer,
    max_tokens=100,
)
