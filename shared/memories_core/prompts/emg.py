"""Prompts of EMG-RAG (Wang et al., 2024): memory extraction, answering and autofill.

* :data:`EXTRACT` (appendix A.1, step 2 "Memory Data Construction"): raw text (a conversation
  turn, an app notification, the OCR text of a screenshot) -> structured memories, each with
  a memory type and subclass of Table 7, the entities and the relation between them (for the
  Memory Graph Layer, §4.2), the event time and an optional end of validity. Relative dates
  ("next Monday", "tomorrow at 9") are resolved to absolute ones against the message time,
  as the paper's absolute date conversion does; :func:`resolve_date` repairs a relative phrase
  the model left in a date field.
* :data:`ANSWER` (§4.3 "LLM(Q ⊕ M)", §4.4 question answering): the question and the selected
  memories -> a short answer.
* :data:`AUTOFILL` (§4.4 autofill forms): a form field and the selected memories -> the
  field's value, or ``null`` when the memories do not hold it.
* :data:`QUESTIONS` (appendix A.1, step 3 "QA Pairs Construction"): one session of the
  user's memories (consecutive in time) -> question-answer pairs, each with the numbers of
  the memories its answer needs; questions that combine several memories are asked for
  first. The numbers are range-checked and the answer must be grounded in the cited
  memories (:func:`parse_questions`); they train the selection policy.

The instructions follow the paper's steps in our own words. Untrusted text (the raw text,
stored memories) is fenced and escaped (:func:`~memories_core.prompts.spec.fence`).

:func:`emg_reply` is a deterministic, rule-based stand-in that answers these prompts offline
(tests, the contract suite and benchmarks; ``ScriptedLLM(default=emg_reply)``). It splits the
text into sentences and guesses entities with capitalisation and keyword rules: it is not a
model, and never a judge of a prompt.
"""

from __future__ import annotations

import calendar
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, time, timedelta, timezone

import pydantic

from memories_core.errors import ParseError
from memories_core.grounding import GroundingError, find_ungrounded, log_rejection
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
    "ANSWER",
    "AUTOFILL",
    "EXTRACT",
    "MEMORY_TYPES",
    "QUESTIONS",
    "TABLE7_SUBCLASSES",
    "AnswerInput",
    "AutofillInput",
    "ExtractInput",
    "ExtractedMemory",
    "GeneratedQuestion",
    "MemoryLine",
    "QuestionsInput",
    "emg_reply",
    "question_parts",
    "resolve_date",
]

#: The four memory types of the Memory Type Layer (§4.2, appendix A.2).
MEMORY_TYPES: tuple[str, ...] = ("Relationship", "Preference", "Event", "Attribute")

#: Table 7's subclasses per type (the Memory Subclass Layer); extensible per memory.
TABLE7_SUBCLASSES: dict[str, tuple[str, ...]] = {
    "Relationship": (
        "Spouse",
        "Parents/Children",
        "Relatives",
        "Colleague/Friends",
        "Teacher/Student",
    ),
    "Preference": (
        "Diet preference",
        "Cultural preference",
        "Car preference",
        "Sports preference",
        "Gaming preference",
        "Audio-visual entertainment preference",
    ),
    "Event": ("Life events", "Arrangement", "Anniversary"),
    "Attribute": (
        "Name/Nickname",
        "Birthday/Age",
        "Gender",
        "Education",
        "Personal belongings/Pets",
        "Address",
        "Occupation",
        "Contact",
        "Documents",
    ),
}

_MARKUP = re.compile(r"</?\s*[A-Za-z_][\w ]{0,30}>\s*:?")
_WORD = re.compile(r"[^\W\d_]{3,}|\d+", re.UNICODE)


# ----------------------------------------------------------------------------- dates
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_TIME = re.compile(
    r"\b(\d{1,2})[:.h](\d{2})\s*(am|pm)?\b|\b(\d{1,2})\s*(am|pm)\b|\bat\s+(\d{1,2})\b(?![-/]|[:.h]\d)",
    re.I,
)
_ISO = re.compile(r"\b(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2}))?)?")
_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


def _clock_time(text: str) -> time | None:
    match = _TIME.search(text)
    if not match:
        return None
    if match.group(1) is not None:
        hour, minute, half = int(match.group(1)), int(match.group(2)), match.group(3)
    elif match.group(6) is not None:
        hour, minute, half = int(match.group(6)), 0, None
    else:
        hour, minute, half = int(match.group(4)), 0, match.group(5)
    if half:
        hour = hour % 12 + (12 if half.lower() == "pm" else 0)
    if not (0 <= hour < 24 and 0 <= minute < 60):
        return None
    return time(hour, minute)


def _add_months(day: datetime, months: int) -> datetime:
    month = day.month - 1 + months
    year = day.year + month // 12
    month = month % 12 + 1
    return day.replace(
        year=year, month=month, day=min(day.day, calendar.monthrange(year, month)[1])
    )


def resolve_date(text: str | None, anchor: datetime) -> datetime | None:
    """Resolve a date phrase to an absolute UTC datetime against ``anchor`` (appendix A.1).

    Understands ISO dates and datetimes, ``today``/``tonight``/``tomorrow``/``yesterday``/
    ``the day after tomorrow``, ``[next|this] <weekday>``, ``in N days|weeks|months``,
    ``next week|month|year``, each with an optional clock time (``at 9``, ``01:40``,
    ``7pm``). A phrase without a clock time resolves to midnight of that day.

    Returns:
        The datetime, or ``None`` if ``text`` holds no date it understands.
    """
    if not text or not text.strip():
        return None
    anchor = ensure_utc(anchor)
    lowered = text.lower()
    iso = _ISO.search(text)
    if iso:
        year, month, mday = int(iso.group(1)), int(iso.group(2)), int(iso.group(3))
        try:
            base = datetime(year, month, mday, tzinfo=timezone.utc)
        except ValueError:
            return None
        if iso.group(4) is not None:
            return base.replace(hour=int(iso.group(4)), minute=int(iso.group(5)))
        rest = text[: iso.start()] + text[iso.end() :]
        clock = _clock_time(rest)
        return base if clock is None else base.replace(hour=clock.hour, minute=clock.minute)
    midnight = anchor.replace(hour=0, minute=0, second=0, microsecond=0)
    day: datetime | None = None
    if "day after tomorrow" in lowered:
        day = midnight + timedelta(days=2)
    elif "tomorrow" in lowered:
        day = midnight + timedelta(days=1)
    elif "yesterday" in lowered:
        day = midnight - timedelta(days=1)
    elif "today" in lowered or "tonight" in lowered:
        day = midnight
    else:
        weekday = re.search(r"\b(next|this|on)?\s*(" + "|".join(_WEEKDAYS) + r")\b", lowered)
        span = re.search(
            r"\bin\s+(\d+|" + "|".join(_NUMBERS) + r")\s+(day|week|month)s?\b", lowered
        )
        nxt = re.search(r"\bnext\s+(week|month|year)\b", lowered)
        if weekday:
            target = _WEEKDAYS.index(weekday.group(2))
            ahead = (target - midnight.weekday()) % 7
            if ahead == 0 and weekday.group(1) != "this":
                ahead = 7  # "next Monday" / "on Monday" said on a Monday: a week later
            day = midnight + timedelta(days=ahead)
        elif span:
            raw = span.group(1)
            count = int(raw) if raw.isdigit() else _NUMBERS[raw]
            unit = span.group(2)
            if unit == "month":
                day = _add_months(midnight, count)
            else:
                day = midnight + timedelta(days=count * (7 if unit == "week" else 1))
        elif nxt:
            unit = nxt.group(1)
            if unit == "week":
                day = midnight + timedelta(days=7)
            elif unit == "month":
                day = _add_months(midnight, 1)
            else:
                day = _add_months(midnight, 12)
    if day is None:
        return None
    clock = _clock_time(text)
    if clock is None and "tonight" in lowered:
        clock = time(20, 0)
    return day if clock is None else day.replace(hour=clock.hour, minute=clock.minute)


# ----------------------------------------------------------------------------- extraction
@dataclass(frozen=True)
class ExtractInput:
    """Input of the extraction prompt.

    Attributes:
        text: The raw text (untrusted).
        at: When it was said or received; relative dates are resolved against it.
        source: What the text is (``"user"`` turn, ``"notification"``, ``"screenshot"``...).
        subclasses: The memory's subclasses as ``"Type/Subclass"`` labels.
    """

    text: str
    at: datetime
    source: str = "user"
    subclasses: tuple[str, ...] = field(
        default_factory=lambda: tuple(
            f"{t}/{s}" for t, subs in TABLE7_SUBCLASSES.items() for s in subs
        )
    )


class ExtractedMemoryModel(pydantic.BaseModel):
    """JSON form of one extracted memory."""

    model_config = pydantic.ConfigDict(extra="forbid")
    text: str = pydantic.Field(
        min_length=3, max_length=600, description="One self-contained statement, absolute dates"
    )
    type: str = pydantic.Field(description="Relationship, Preference, Event or Attribute")
    subclass: str = pydantic.Field(description="A subclass of the type, from the list")
    subject: str = pydantic.Field(min_length=1, max_length=120, description="Head entity")
    relation: str = pydantic.Field(min_length=1, max_length=80, description="Relation name")
    object: str = pydantic.Field(min_length=1, max_length=200, description="Tail entity or value")
    when: str | None = pydantic.Field(default=None, description="ISO time of the event or null")
    valid_until: str | None = pydantic.Field(
        default=None, description="ISO time the memory stops being true, or null"
    )


class ExtractAnswer(pydantic.BaseModel):
    """JSON form of the extraction answer."""

    model_config = pydantic.ConfigDict(extra="forbid")
    memories: list[ExtractedMemoryModel] = pydantic.Field(max_length=20)


@dataclass(frozen=True)
class ExtractedMemory:
    """One parsed memory (type and subclass as the model named them; the graph maps them).

    Attributes:
        text: The memory as one statement.
        type: Memory type (one of :data:`MEMORY_TYPES`, matched case-insensitively).
        subclass: Subclass label as given (mapped to the nearest known subclass later).
        subject: Head entity.
        relation: Relation name (lower case, words joined by ``_``).
        object: Tail entity or value.
        when: Time of the event, if any (absolute, UTC).
        valid_until: End of validity, if any (absolute, UTC).
    """

    text: str
    type: str
    subclass: str
    subject: str
    relation: str
    object: str
    when: datetime | None = None
    valid_until: datetime | None = None


EXTRACT_SYSTEM = (
    "You build the personal memory of a smartphone assistant. You will read one piece of raw "
    "text about the user: something they said, an app notification, or text read from a "
    "screenshot, and the time it was received. Pull out the facts worth keeping about the "
    "user and the people, plans and things around them, and ignore small talk. For each "
    "fact give: a short self-contained statement in which every relative date or time "
    "(tomorrow, next Monday, in two weeks) is rewritten as an absolute date against the "
    "received time; its type (Relationship, Preference, Event or Attribute) and the best "
    "fitting subclass from the list; the main entity it is about (subject), the relation, "
    "and the other entity or value (object); the absolute time of the event if it has one "
    "(ISO 8601, else null); and, if the fact stops being true at a known time (a voucher "
    "that expires, a booking that ends), that time as valid_until (ISO 8601, else null). "
    "Use the same relation name for the same kind of fact, so that a later change can be "
    "matched to it. If nothing is worth keeping, return an empty list.\n"
    + json_instruction(ExtractAnswer)
)


def build_extract_messages(inputs: ExtractInput) -> list[ChatMessage]:
    """Messages asking for the memories in one raw text (appendix A.1, step 2)."""
    user = (
        f"Received: {ensure_utc(inputs.at):%Y-%m-%d %H:%M} UTC ({ensure_utc(inputs.at):%A})\n"
        f"Source: {inputs.source}\n"
        f"Subclasses: {'; '.join(inputs.subclasses)}\n"
        f"{fence('raw_text', inputs.text)}\n\nExtract the memories as JSON."
    )
    return [ChatMessage("system", EXTRACT_SYSTEM), ChatMessage("user", user)]


def _relation(value: str) -> str:
    words = re.findall(r"[^\W_]+", value.lower())
    return "_".join(words)[:80] or "related_to"


def _date_field(value: str | None, anchor: datetime, raw: str) -> datetime | None:
    if value is None or not str(value).strip() or str(value).strip().lower() in {"null", "none"}:
        return None
    resolved = resolve_date(str(value), anchor)
    if resolved is None:
        raise ParseError(f"the date {value!r} is neither ISO 8601 nor a known phrase", raw)
    return resolved


def parse_extract(text: str, inputs: ExtractInput) -> list[ExtractedMemory]:
    """Validate an extraction answer; return the memories (possibly none).

    A memory is rejected (the whole answer raises ``ParseError``) when its type is not one of
    the four, when it holds prompt markup, when its statement shares no word with the raw
    text (a hallucinated or forged memory), or when it is not grounded in the raw text
    (:mod:`memories_core.grounding`): it copies an instruction the text gives the model
    ("OUTPUT EXACTLY ...", a JSON payload), or its statement or value names an identifier
    (a flight number, a booking code) the text does not contain. A stored memory with the
    same relation is replaced by a new one (EMG-RAG §4.2), so an edit's new value must
    come from the text. Dates are resolved with :func:`resolve_date`.

    Raises:
        GroundingError: if a memory is not grounded (a ``ParseError``: the extraction falls
            back to storing the raw text, which replaces nothing).
        ParseError: on an unusable answer.
    """
    answer = parse_model(text, ExtractAnswer, (inputs.text,))
    source = {w.lower() for w in _WORD.findall(inputs.text)}
    types = {t.lower(): t for t in MEMORY_TYPES}
    out: list[ExtractedMemory] = []
    for item in answer.memories:
        statement = unescape(item.text).strip()
        kind = types.get(item.type.strip().lower())
        if kind is None:
            raise ParseError(f"unknown memory type {item.type!r}", text)
        fields = (statement, item.subject, item.relation, item.object, item.subclass)
        if any(_MARKUP.search(unescape(value)) for value in fields):
            raise ParseError("a memory holds prompt markup", text)
        if not {w.lower() for w in _WORD.findall(statement)} & source:
            raise ParseError(f"the memory {statement!r} shares no word with the text", text)
        rejection = find_ungrounded(
            {"subject": unescape(item.subject)},
            [inputs.text],
            values={"text": statement, "object": unescape(item.object)},
        )
        if rejection is not None:
            log_rejection("emg", "extracted memory", rejection)
            raise GroundingError(rejection, text)
        out.append(
            ExtractedMemory(
                text=statement,
                type=kind,
                subclass=unescape(item.subclass).strip(),
                subject=unescape(item.subject).strip(),
                relation=_relation(unescape(item.relation)),
                object=unescape(item.object).strip(),
                when=_date_field(item.when, inputs.at, text),
                valid_until=_date_field(item.valid_until, inputs.at, text),
            )
        )
    return out


# -------------------------------------------------------------- rule-based stand-in
_KEYWORDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("Event", "Anniversary", ("anniversary",)),
    ("Attribute", "Birthday/Age", ("birthday", "born", "years old")),
    ("Relationship", "Spouse", ("wife", "husband", "spouse")),
    ("Relationship", "Parents/Children", ("mom", "mother", "dad", "father", "son", "daughter")),
    ("Relationship", "Colleague/Friends", ("boss", "colleague", "friend", "coworker")),
    ("Attribute", "Contact", ("phone", "mobile", "email")),
    ("Attribute", "Documents", ("passport", "licence", "license", "id card")),
    ("Attribute", "Address", ("address", "live in", "reside")),
    ("Attribute", "Name/Nickname", ("my name", "call me")),
    ("Attribute", "Occupation", ("work as", "i am a", "job")),
    ("Preference", "Diet preference", ("food", "eat", "drink", "tea", "coffee", "spicy")),
    ("Preference", "Cultural preference", ("travel", "museum", "like", "love", "enjoy")),
    (
        "Event",
        "Arrangement",
        ("flight", "hotel", "booked", "reservation", "meeting", "visit", "voucher", "trip"),
    ),
)
_STOP = frozenset(
    [
        "i",
        "me",
        "my",
        "the",
        "a",
        "an",
        "is",
        "are",
        "was",
        "were",
        "be",
        "to",
        "of",
        "and",
        "at",
        "on",
        "in",
        "for",
        "with",
        "it",
        "this",
        "that",
        "his",
        "her",
        "their",
        "our",
        "your",
        "has",
        "have",
        "had",
        "will",
        "would",
        "just",
        "also",
        "very",
        "so",
    ]
)
_DATE_PHRASE = re.compile(
    r"\b(?:\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2})?|the day after tomorrow|tomorrow|today|"
    r"tonight|yesterday|(?:next|this)\s+(?:week|month|year|" + "|".join(_WEEKDAYS) + r")|"
    r"in\s+\w+\s+(?:days?|weeks?|months?))(?:\s+at\s+\d{1,2}(?::\d{2})?\s*(?:am|pm)?)?",
    re.I,
)


def _stand_in_memories(inputs: ExtractInput) -> list[dict[str, str | None]]:
    memories: list[dict[str, str | None]] = []
    for sentence in re.split(r"(?<=[.!?])\s+|\n+", inputs.text):
        sentence = sentence.strip()
        phrase = _DATE_PHRASE.search(sentence)
        undated = sentence.replace(phrase.group(0), " ") if phrase else sentence
        words = re.findall(r"[^\W_]+(?:[:'][^\W_]+)*", undated)
        if len(words) < 3 or sentence.endswith("?"):
            continue
        lowered = sentence.lower()
        kind, subclass = "Event", "Life events"
        for t, s, keys in _KEYWORDS:
            if any(re.search(rf"\b{re.escape(k)}", lowered) for k in keys):
                kind, subclass = t, s
                break
        names = [w for w in words if w[0].isupper() and w.lower() not in _STOP]
        first_person = any(w.lower() in {"i", "my", "me"} for w in words)
        subject = "user" if first_person or not names else names[0]
        rest = [n for n in names if n != subject]
        tokens = [w for w in words if w.lower() not in _STOP and w != subject]
        obj = rest[-1] if rest else (tokens[-1] if tokens else words[-1])
        relation = (
            "_".join(
                w.lower() for w in tokens if w != obj and not w[0].isupper() and not w[0].isdigit()
            )[:40].strip("_")
            or "mentions"
        )
        when = None
        if phrase:
            iso = _ISO.match(phrase.group(0))
            when = resolve_date(sentence if iso else phrase.group(0), inputs.at)
        statement = sentence
        if phrase and when is not None and not _ISO.match(phrase.group(0)):
            stamp = (
                f"{when:%Y-%m-%d}" if when.hour == when.minute == 0 else f"{when:%Y-%m-%d %H:%M}"
            )
            statement = sentence.replace(phrase.group(0), f"{phrase.group(0)} ({stamp})")
        expires = re.search(r"\b(expires?|valid until|ends?)\b", lowered) is not None
        memories.append(
            {
                "text": statement,
                "type": kind,
                "subclass": subclass,
                "subject": subject,
                "relation": relation,
                "object": obj,
                "when": None if expires or when is None else when.isoformat(),
                "valid_until": when.isoformat() if expires and when is not None else None,
            }
        )
    return memories


#: Words that ask rather than name (left out of a question's entities and relation).
_ASKING = frozenset(
    {
        *("what", "when", "where", "who", "whom", "whose", "which", "why", "how"),
        *("did", "does", "do", "is", "are", "was", "were", "can", "could", "should"),
        *("shall", "may", "might", "must", "kind", "sort", "type", "much", "many", "ever"),
        *("any", "some"),
    }
)


def question_parts(question: str, names: Sequence[str] = ()) -> tuple[list[str], str]:
    """The entities and the relation of a question, without a model (§4.3, Eq. 1's N_Q, R_Q).

    The paper extracts the question's entity and relation before building the state; we do
    it with the rules the offline extractor uses for statements, so no LLM is called before
    retrieval:

    * **entities**: the graph's entity ``names`` that occur in the question as whole words
      (longest first; the caller passes the names of the candidate memories' nodes), then
      capitalised words that are not asking words, then ``"the user"`` for a first-person
      question ("my", "I", "me");
    * **relation**: the remaining words, without asking words and stop words, in order
      ("What time is my boss's flight to Amsterdam?" with the known names ``boss`` and
      ``Amsterdam`` -> entities ``boss``, ``Amsterdam``, ``the user``; relation
      ``"time flight"``).

    Args:
        question: The question.
        names: Entity names of the graph that may be mentioned.

    Returns:
        ``(entities, relation)``; the relation is ``""`` when no word is left.
    """
    lowered = " " + " ".join(re.findall(r"[^\W_]+", question.lower())) + " "
    found: list[str] = []
    covered = lowered
    for name in sorted({n for n in names if n}, key=lambda n: -len(n)):
        key = " ".join(re.findall(r"[^\W_]+", name.lower()))
        if key and key not in _STOP and f" {key} " in covered:
            found.append(name)
            covered = covered.replace(f" {key} ", " ")
    words = re.findall(r"[^\W_]+(?:'[^\W_]+)?", question)
    taken = {w for n in found for w in re.findall(r"[^\W_]+", n.lower())}
    for word in words:
        bare = word.split("'")[0]
        low = bare.lower()
        if bare[:1].isupper() and low not in _STOP and low not in _ASKING and low not in taken:
            found.append(bare)
            taken.add(low)
    if any(w.lower() in {"i", "my", "me", "mine", "myself"} for w in words):
        found.append("the user")
    relation = " ".join(
        w.split("'")[0].lower()
        for w in words
        if w.split("'")[0].lower() not in taken
        and w.split("'")[0].lower() not in _STOP
        and w.split("'")[0].lower() not in _ASKING
        and w.lower() not in {"i", "me", "my", "mine", "myself"}
    )
    return found, relation


def _extract_stand_in(inputs: ExtractInput) -> str:
    return json.dumps({"memories": _stand_in_memories(inputs)})


def _read_extract(user: str) -> ExtractInput:
    match = re.search(r"Received: (\d{4}-\d{2}-\d{2} \d{2}:\d{2})", user)
    at = (
        datetime.strptime(match.group(1), "%Y-%m-%d %H:%M").replace(tzinfo=timezone.utc)
        if match
        else datetime(2000, 1, 1, tzinfo=timezone.utc)
    )
    source = re.search(r"Source: (.*)", user)
    return ExtractInput(read_section(user, "raw_text"), at, source.group(1) if source else "user")


#: Raw text -> memories with type, subclass, entities, relation and times (A.1 step 2).
EXTRACT: PromptSpec[ExtractInput, list[ExtractedMemory]] = PromptSpec(
    name="emg.extract",
    build=build_extract_messages,
    parse=parse_extract,
    stand_in=_extract_stand_in,
    response_model=ExtractAnswer,
    max_tokens=800,
)


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
    build=build_autofill_messages,
    parse=parse_autofill,
    stand_in=_autofill_stand_in,
    response_model=AutofillAnswer,
    max_tokens=100,
)


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
    "time), and also write some that one memory answers. For each question give a short "
    "answer taken from the memories (names, dates, numbers as they are written there) and "
    "the numbers of every memory the answer needs. Do not ask about anything the memories "
    "do not say.\n" + json_instruction(QuestionsAnswer)
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
    pass if the question shares a word with them), when it holds prompt markup, or when it
    repeats an earlier question. Numbers are 1-based in the reply, 0-based in the result.

    Raises:
        ParseError: if the reply is not the JSON answer, or the model gave pairs and every one
            was dropped.
    """
    answer = parse_model(text, QuestionsAnswer)
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
