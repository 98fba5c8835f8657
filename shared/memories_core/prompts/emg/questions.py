"""The EMG question-generation prompt (training pairs) and the offline stand-in reply."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

import pydantic

from memories_core.errors import ParseError
from memories_core.prompts.emg.answer import (
    ANSWER_SYSTEM,
    AUTOFILL_SYSTEM,
    AnswerInput,
    AutofillInput,
    MemoryLine,
    _answer_stand_in,
    _autofill_stand_in,
    _overlap,
)
from memories_core.prompts.emg.extract import (
    _MARKUP,
    _WORD,
    EXTRACT_SYSTEM,
    _extract_stand_in,
    _read_extract,
)
from memories_core.prompts.spec import (
    PromptSpec,
    fence,
    json_instruction,
    parse_model,
    read_section,
    unescape,
)
from memories_core.types import ChatMessage, ensure_utc

__all__ = [
    "QUESTIONS",
    "QUESTIONS_SYSTEM",
    "GeneratedPairModel",
    "GeneratedQuestion",
    "QuestionsAnswer",
    "QuestionsInput",
    "build_questions_messages",
    "emg_reply",
    "parse_questions",
]


# ----------------------------------------------------------------------- training questions
@dataclass(frozen=True)
class QuestionsInput:
    """Input of the question-generation prompt (appendix A.1, step 3).

    Attributes:
        memories: One session of the user's memories (consecutive in time), oldest first;
            the prompt numbers them from 1 and the answer cites those numbers.
        times: When each memory was made (same length as ``memories``), shown as its date.
        pairs: Most question-answer pairs asked for.
    """

    memories: tuple[MemoryLine, ...]
    times: tuple[datetime, ...] = ()
    pairs: int = 3


class GeneratedPairModel(pydantic.BaseModel):
    """JSON form of one generated question."""

    model_config = pydantic.ConfigDict(extra="forbid")
    question: str = pydantic.Field(min_length=3, max_length=400, description="The question")
    answer: str = pydantic.Field(min_length=1, max_length=400, description="Its short answer")
    memories: list[int] = pydantic.Field(
        min_length=1, max_length=10, description="Numbers of the memories the answer needs"
    )


class QuestionsAnswer(pydantic.BaseModel):
    """JSON form of the question-generation answer."""

    model_config = pydantic.ConfigDict(extra="forbid")
    pairs: list[GeneratedPairModel] = pydantic.Field(max_length=20)


@dataclass(frozen=True)
class GeneratedQuestion:
    """One validated question-answer pair and the memories it requires (Table 1, step 3).

    Attributes:
        question: The question, as the user might ask it.
        answer: The reference answer, grounded in the required memories.
        memories: Positions (0-based) of the required memories in the session.
    """

    question: str
    answer: str
    memories: tuple[int, ...]


QUESTIONS_SYSTEM = (
    "You write training questions for the personal assistant on a user's phone. You will get "
    "a numbered list of the user's memories from one period, oldest first. Write questions "
    "the user could ask their assistant that these memories answer. Prefer questions that "
    "need two or more of the memories together (linked by a shared person, place, thing or "
    "time), and also write some that one memory answers. Each question asks one thing: one "
    "sentence ending in one question mark, never several questions joined together. For "
    "each question give a short answer taken from the memories (names, dates, numbers as "
    "they are written there) and the numbers of every memory the answer needs. Do not ask "
    "about anything the memories do not say.\n" + json_instruction(QuestionsAnswer)
)


def _numbered(inputs: QuestionsInput) -> str:
    lines = []
    for i, line in enumerate(inputs.memories):
        when = f" ({ensure_utc(inputs.times[i]):%Y-%m-%d})" if i < len(inputs.times) else ""
        lines.append(f"[{i + 1}]{when} {line.render()}")
    return fence("memories", "\n".join(lines) or "(none)")


def build_questions_messages(inputs: QuestionsInput) -> list[ChatMessage]:
    """Messages asking for question-answer pairs over one session of memories (A.1 step 3)."""
    user = (
        f"{_numbered(inputs)}\n\nWrite at most {inputs.pairs} questions with their answers "
        "and the numbers of the memories each answer needs, as JSON."
    )
    return [ChatMessage("system", QUESTIONS_SYSTEM), ChatMessage("user", user)]


#: Short answers that need no grounding word ("yes", "no").
_YES_NO = frozenset({"yes", "no"})


def parse_questions(text: str, inputs: QuestionsInput) -> list[GeneratedQuestion]:
    """Validate generated pairs; keep those whose cited memories exist and hold the answer.

    A pair is dropped when it cites a number outside the list (a made-up memory), when its
    answer shares no word with the cited memories (not grounded in them; "yes"/"no" answers
    pass if the question shares a word with them), when it holds prompt markup, when it is
    several questions run together (more than one question mark: "What ...? And what ...?",
    which a small model writes and no user asks; its joint answer and memories cannot be
    split), or when it repeats an earlier question. Numbers are 1-based in the reply,
    0-based in the result.

    Raises:
        ParseError: if the reply is not the JSON answer, or the model gave pairs and every one
            was dropped.
    """
    answer = parse_model(text, QuestionsAnswer, cut_ok=True)
    out: list[GeneratedQuestion] = []
    seen: set[str] = set()
    count = len(inputs.memories)
    for pair in answer.pairs:
        question = unescape(pair.question).strip()
        reply = unescape(pair.answer).strip()
        cited = tuple(dict.fromkeys(pair.memories))
        if not cited or any(not 1 <= n <= count for n in cited):
            continue
        if _MARKUP.search(question) or _MARKUP.search(reply) or not re.search(r"\w", reply):
            continue
        if question.count("?") > 1:  # several questions run together
            continue
        source = " ".join(inputs.memories[n - 1].render() for n in cited)
        if reply.lower().strip(" .!") in _YES_NO:
            grounded = _overlap(question, source) > 0
        else:
            grounded = _overlap(reply, source) > 0
        key = " ".join(re.findall(r"\w+", question.lower()))
        if not grounded or not key or key in seen:
            continue
        seen.add(key)
        out.append(GeneratedQuestion(question, reply, tuple(n - 1 for n in cited)))
    if answer.pairs and not out:
        raise ParseError("no generated question cites existing memories that hold its answer", text)
    return out


def _topic(line: MemoryLine) -> str:
    return line.relation.replace("_", " ") if line.relation else "memory"


def _questions_stand_in(inputs: QuestionsInput) -> str:
    """Rule-based pairs: half (at least one) about two memories sharing an entity, else one.

    Not a model: it asks about a memory's subject and relation and answers with its object
    (or its statement when it has no edge), so it is only as good as the extracted triples.
    """
    multi = max(1, inputs.pairs // 2)
    lines = inputs.memories
    pairs: list[dict[str, object]] = []
    used: set[int] = set()
    for i, a in enumerate(lines):
        for j in range(i + 1, len(lines)):
            b = lines[j]
            shared = {_norm_entity(a.subject), _norm_entity(a.object)} & {
                _norm_entity(b.subject),
                _norm_entity(b.object),
            } - {""}
            if a.relation and b.relation and shared and len(pairs) < multi:
                entity = sorted(shared)[0]
                pairs.append(
                    {
                        "question": f"What {_topic(a)} and what {_topic(b)} involve {entity}?",
                        "answer": f"{a.object}; {b.object}",
                        "memories": [i + 1, j + 1],
                    }
                )
                used |= {i, j}
                break
    for i, line in enumerate(lines):
        if len(pairs) >= inputs.pairs:
            break
        if i in used:
            continue
        subject = line.subject if line.relation else ""
        question = (
            f"What {_topic(line)} does {subject} have?"
            if subject
            else f"What do you remember about {' '.join(_WORD.findall(line.text)[:4])}?"
        )
        answer = line.object if line.relation and line.object else line.text
        pairs.append({"question": question, "answer": answer, "memories": [i + 1]})
    return json.dumps({"pairs": pairs})


def _norm_entity(value: str) -> str:
    return " ".join(re.findall(r"[^\W_]+", value.lower()))


def _read_questions(user: str) -> QuestionsInput:
    lines: list[MemoryLine] = []
    times: list[datetime] = []
    for raw in read_section(user, "memories").splitlines():
        match = re.match(r"\[\d+\](?: \((\d{4}-\d{2}-\d{2})\))? (.*)$", raw)
        if not match:
            continue
        if match.group(1):
            times.append(datetime.fromisoformat(match.group(1)).replace(tzinfo=timezone.utc))
        body = match.group(2)
        triple = re.match(r"(.*) \[(.*) \| (.*) \| (.*)\]$", body)
        lines.append(MemoryLine(*triple.groups()) if triple else MemoryLine(body))
    wanted = re.search(r"Write at most (\d+) questions", user)
    return QuestionsInput(tuple(lines), tuple(times), int(wanted.group(1)) if wanted else 3)


#: A session of memories -> question-answer pairs with their required memories (A.1 step 3).
QUESTIONS: PromptSpec[QuestionsInput, list[GeneratedQuestion]] = PromptSpec(
    name="emg.questions",
    system=QUESTIONS_SYSTEM,
    build=build_questions_messages,
    parse=parse_questions,
    stand_in=_questions_stand_in,
    response_model=QuestionsAnswer,
    max_tokens=600,
)


def _read_lines(user: str) -> tuple[MemoryLine, ...]:
    out: list[MemoryLine] = []
    for line in read_section(user, "memories").splitlines():
        line = line[2:] if line.startswith("- ") else line
        if not line or line == "(none)":
            continue
        match = re.match(r"(.*) \[(.*) \| (.*) \| (.*)\]$", line)
        if match:
            out.append(MemoryLine(match.group(1), match.group(2), match.group(3), match.group(4)))
        else:
            out.append(MemoryLine(line))
    return tuple(out)


def emg_reply(messages: Sequence[ChatMessage]) -> str:
    """Answer one of this module's prompts by rule (see the module docstring).

    Returns ``"I can only answer EMG-RAG prompts."`` for any other prompt.
    """
    system = messages[0].content
    user = next((m.content for m in messages if m.role == "user"), messages[-1].content)
    if system == EXTRACT_SYSTEM:
        return _extract_stand_in(_read_extract(user))
    if system == ANSWER_SYSTEM:
        now = datetime(2000, 1, 1, tzinfo=timezone.utc)
        return _answer_stand_in(AnswerInput(read_section(user, "question"), _read_lines(user), now))
    if system == AUTOFILL_SYSTEM:
        return _autofill_stand_in(AutofillInput(read_section(user, "field"), _read_lines(user)))
    if system == QUESTIONS_SYSTEM:
        return _questions_stand_in(_read_questions(user))
    return "I can only answer EMG-RAG prompts."
