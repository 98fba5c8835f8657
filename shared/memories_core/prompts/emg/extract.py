"""The EMG extraction prompt: typed memories from one turn (paper Table 7 types)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pydantic

from memories_core.clock import memory_time
from memories_core.errors import ParseError
from memories_core.grounding import GroundingError, find_ungrounded, log_rejection
from memories_core.prompts.emg.dates import _ISO, _WEEKDAYS, resolve_date
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
    "EXTRACT",
    "EXTRACT_SYSTEM",
    "MEMORY_TYPES",
    "TABLE7_SUBCLASSES",
    "ExtractAnswer",
    "ExtractInput",
    "ExtractedMemory",
    "ExtractedMemoryModel",
    "build_extract_messages",
    "parse_extract",
    "question_parts",
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


# ----------------------------------------------------------------------------- extraction
@dataclass(frozen=True)
class ExtractInput:
    """Input of the extraction prompt.

    Attributes:
        text: The raw text (untrusted).
        at: When it was said or received; relative dates are resolved against it.
        source: What the text is (``"user"`` turn, ``"notification"``, ``"screenshot"``...).
        subclasses: The memory's subclasses as ``"Type/Subclass"`` labels.
        speaker: Who said or sent the text, when it is known (a named speaker of a dialogue
            between people); the memories then name that person instead of "I".
    """

    text: str
    at: datetime
    source: str = "user"
    subclasses: tuple[str, ...] = field(
        default_factory=lambda: tuple(
            f"{t}/{s}" for t, subs in TABLE7_SUBCLASSES.items() for s in subs
        )
    )
    speaker: str | None = None


class ExtractedMemoryModel(pydantic.BaseModel):
    """JSON form of one extracted memory."""

    model_config = pydantic.ConfigDict(extra="forbid")
    text: str = pydantic.Field(
        min_length=3, max_length=600, description="One self-contained statement, absolute dates"
    )
    # The schema's enum keeps a schema-constrained model to the four types (the 1.5B model
    # wrote the prompt's "Event/Life events" label here); parsing accepts any text, which
    # :func:`parse_extract` reads as the type a model meant.
    type: str = pydantic.Field(
        description="Relationship, Preference, Event or Attribute",
        json_schema_extra={"enum": list(MEMORY_TYPES)},
    )
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
    "fact give: a short self-contained statement that names who it is about (the sender "
    "by name when the sender is given, else the user; never I or my) and in which every "
    "relative date or time (yesterday, tomorrow, next Monday, in two weeks) is rewritten as "
    "an absolute date against the received time; its type (Relationship, Preference, "
    "Event or Attribute) and the best fitting subclass from the list; the main entity it "
    "is about (subject), the relation, "
    "and the other entity or value (object); the absolute time of the event if it has one "
    "(ISO 8601, else null); and, if the fact stops being true at a known time (a voucher "
    "that expires, a booking that ends), that time as valid_until (ISO 8601, else null). "
    "Use the same relation name for the same kind of fact, so that a later change can be "
    "matched to it. If nothing is worth keeping, return an empty list.\n"
    + json_instruction(ExtractAnswer)
)


def build_extract_messages(inputs: ExtractInput) -> list[ChatMessage]:
    """Messages asking for the memories in one raw text (appendix A.1, step 2).

    What every call shares (instructions, subclasses) comes before what each text brings
    (its time, source, sender), so a local model reads the shared start once.
    """
    user = (
        f"Subclasses: {'; '.join(inputs.subclasses)}\n"
        f"Received: {ensure_utc(inputs.at):%Y-%m-%d %H:%M} UTC ({ensure_utc(inputs.at):%A})\n"
        f"Source: {inputs.source}\n"
        + (f"Sender: {inputs.speaker}\n" if inputs.speaker else "")
        + f"{fence('raw_text', inputs.text)}\n\nExtract the memories as JSON."
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


def _type_and_subclass(kind: str, subclass: str) -> tuple[str | None, str]:
    """The memory type (one of :data:`MEMORY_TYPES`) and subclass a model meant.

    The prompt lists subclasses as ``"Type/Subclass"`` labels, and a model may write such a
    label as the type (``"Event/Life events"``) or as the subclass: its first part is then
    the type and the rest the subclass. ``None`` when no type is named.
    """
    types = {t.lower(): t for t in MEMORY_TYPES}

    def split(label: str) -> tuple[str | None, str]:
        head, _, rest = label.strip().partition("/")
        named = types.get(head.strip().lower())
        return (named, rest.strip()) if named is not None and rest.strip() else (None, label)

    found = types.get(kind.strip().lower())
    if found is None:
        found, rest = split(kind)
        if found is not None and not subclass.strip():
            subclass = rest
    named, rest = split(subclass)
    if named is not None and found in (None, named):
        found, subclass = named, rest
    return found, subclass.strip()


def parse_extract(text: str, inputs: ExtractInput) -> list[ExtractedMemory]:
    """Validate an extraction answer; return the memories (possibly none).

    A question is not a fact and is left out. A memory is rejected (the whole answer raises
    ``ParseError``) when its type is not one of
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
    answer = parse_model(text, ExtractAnswer, (inputs.text,), cut_ok=True)
    source = {w.lower() for w in _WORD.findall(inputs.text)}
    out: list[ExtractedMemory] = []
    for item in answer.memories:
        statement = unescape(item.text).strip()
        if statement.endswith("?"):
            continue  # a question keeps no fact (the 1.5B model kept greetings as memories)
        kind, subclass = _type_and_subclass(item.type, unescape(item.subclass))
        if kind is None:
            raise ParseError(f"unknown memory type {item.type!r}", text)
        fields = (statement, item.subject, item.relation, item.object, subclass)
        if any(_MARKUP.search(unescape(value)) for value in fields):
            raise ParseError("a memory holds prompt markup", text)
        if not {w.lower() for w in _WORD.findall(statement)} & source:
            raise ParseError(f"the memory {statement!r} shares no word with the text", text)
        rejection = find_ungrounded(
            {"subject": unescape(item.subject)},
            [inputs.text, *([inputs.speaker] if inputs.speaker else [])],
            values={"text": statement, "object": unescape(item.object)},
        )
        if rejection is not None:
            log_rejection("emg", "extracted memory", rejection)
            raise GroundingError(rejection, text)
        out.append(
            ExtractedMemory(
                text=attributed(statement, inputs),
                type=kind,
                subclass=subclass,
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


_FIRST_PERSON = re.compile(r"\bI\b|\b(?i:me|my|mine|myself)\b")


def attributed(statement: str, inputs: ExtractInput) -> str:
    """A memory's statement with its relative date made absolute and its speaker named.

    Appendix A.1 keeps memories with absolute times and about named people; a model may
    keep the sender's words ("I went to a support group yesterday"). The first relative date
    phrase gets its date against the received time (``yesterday (7 May 2023)``, written as
    every mechanism writes dates for a reader, :func:`~memories_core.clock.memory_time`), and a
    first-person statement of a named sender that does not name them says who "I" is
    (``Caroline said: ...``). Applied to the model's memories and the offline stand-in alike.
    """
    phrase = _DATE_PHRASE.search(statement)
    if phrase and not _ISO.match(phrase.group(0)):
        when = resolve_date(phrase.group(0), inputs.at)
        if when is not None:
            stamp = memory_time(when, time_of_day=not when.hour == when.minute == 0)
            statement = statement.replace(phrase.group(0), f"{phrase.group(0)} ({stamp})", 1)
    speaker = inputs.speaker
    if speaker and _FIRST_PERSON.search(statement) and speaker.lower() not in statement.lower():
        statement = f"{speaker} said: {statement}"
    return statement


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
        me = inputs.speaker or "user"
        subject = me if first_person or not names else names[0]
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
        statement = attributed(sentence, inputs)
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
    sender = re.search(r"Sender: (.*)", user)
    return ExtractInput(
        read_section(user, "raw_text"),
        at,
        source.group(1) if source else "user",
        speaker=sender.group(1).strip() if sender else None,
    )


#: Raw text -> memories with type, subclass, entities, relation and times (A.1 step 2).
EXTRACT: PromptSpec[ExtractInput, list[ExtractedMemory]] = PromptSpec(
    name="emg.extract",
    system=EXTRACT_SYSTEM,
    build=build_extract_messages,
    parse=parse_extract,
    stand_in=_extract_stand_in,
    response_model=ExtractAnswer,
    max_tokens=800,
)
