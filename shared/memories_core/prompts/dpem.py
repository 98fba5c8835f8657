"""Coordinator prompts of DPeM (Zhang et al., 2023, "DPeM Mechanism", "Components").

The coordinator ``C`` does three things in DPeM, one prompt each:

* **Learning** (:data:`NOTES`): read one iteration's dialogue ``d_i`` and take every note worth
  taking (``nts = C(d_i)``); the notes fill the working memory.
* **Summarizing** (:data:`KNOWLEDGE`): keep only the relevant notes ``nt+`` and state each as
  one self-contained knowledge item ``k``.
* **Typing** (:data:`TYPING`, first step of the executive process): label each knowledge item
  ``user-specific`` (about this user: conditions, history, preferences) or ``common-sense``
  (general knowledge, true for anyone).

The paper gives no prompt text; these follow its steps in our own words. Each prompt answers
in tagged lines (``<Note>: ...``, ``<Knowledge>: ...``, ``<Type 2>: common-sense``) and has a
JSON twin used by models with structured output. The dialogue and the notes are untrusted and
are fenced (:func:`~memories_core.prompts.spec.fence`). Parsers accept a reply only if every
line is one of the prompt's own tags, reject refusals, prompt markup, placeholders, and text
whose words its input never used (an ungrounded or invented note), and raise
:class:`~memories_core.errors.ParseError` otherwise, so a garbled coordinator never writes
memory (the turn stays stored and the job is retried). An item with nothing to remember (only
function words) or one that reads as an apology is left out of an otherwise good answer; an
answer made only of such apologies is a refusal and fails.

:func:`dpem_reply` answers the three prompts by rule for offline tests and demos
(``ScriptedLLM(default=dpem_reply)``); it is not a model.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Final, Literal

import pydantic

from memories_core.errors import ParseError
from memories_core.prompts.spec import (
    PromptSpec,
    check_not_placeholder,
    dialogue_users,
    fence,
    json_instruction,
    parse_model,
    read_section,
    schema_max_length,
    unescape,
)
from memories_core.prompts.summary import REFUSALS
from memories_core.types import ChatMessage

__all__ = [
    "COMMON_SENSE",
    "KNOWLEDGE",
    "KNOWLEDGE_JSON",
    "NOTES",
    "NOTES_JSON",
    "TYPING",
    "TYPING_JSON",
    "USER_SPECIFIC",
    "KnowledgeInput",
    "KnowledgeType",
    "NotesInput",
    "TypingInput",
    "dpem_reply",
]

#: The two knowledge types of the executive process.
KnowledgeType = Literal["user-specific", "common-sense"]
USER_SPECIFIC: Final = "user-specific"
COMMON_SENSE: Final = "common-sense"

#: Longest note or knowledge item kept (characters). It is also the JSON schema's
#: ``maxLength``: a schema-constrained model closes a note here. The 1.5B model, decoding
#: greedily, wrote single "notes" of 2,000 characters (a session's small talk, then one
#: sentence over and over) until its token cap, which left no whole note to parse
#: (BENCHMARKS.md, "DPeM: replies that loop").
MAX_ITEM_CHARS = 400

#: A note or knowledge item in a JSON answer: the length limit is the schema's (for a
#: constrained model); a longer item from a model that ignores it is cut, not refused.
_Item = Annotated[str, schema_max_length(MAX_ITEM_CHARS)]

_WORD = re.compile(r"[^\W\d_]{3,}", re.UNICODE)
_MARKUP = re.compile(r"</?\s*[A-Za-z_][\w ]{0,30}>\s*:?")
_NONE = re.compile(r"^\W*(none|nothing|n/?a)\W*$", re.I)
#: Frequent words that do not make a note grounded in its input.
_STOP = frozenset(
    re.findall(
        r"\w+",
        "the and for are was were you your this that with have has had not but they their "
        "them what when where which who will would can could should about from into just very "
        "also user assistant said says there here been being its our out all any",
    )
)


# ---------------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class NotesInput:
    """Input of the learning step.

    Attributes:
        dialogue: The iteration's utterances, rendered ``"speaker: content"`` (untrusted).
        max_notes: Most notes wanted (the working memory's size).
    """

    dialogue: tuple[str, ...]
    max_notes: int = 16


@dataclass(frozen=True)
class KnowledgeInput:
    """Input of the summarizing step.

    Attributes:
        notes: The working memory's notes (untrusted: they come from the dialogue).
    """

    notes: tuple[str, ...]


@dataclass(frozen=True)
class TypingInput:
    """Input of the typing step.

    Attributes:
        items: The knowledge items to type, in order (untrusted).
    """

    items: tuple[str, ...]


# ---------------------------------------------------------------------------- helpers
def _content_words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)} - _STOP


class _Left(enum.Enum):
    """Why :func:`_clean_item` left an item out of an otherwise usable answer."""

    EMPTY = "nothing to remember"
    REFUSAL = "reads as a refusal"


def _clean_item(value: str, what: str, raw: str, source: Sequence[str]) -> str | _Left:
    """Validate one note or knowledge item; raise ``ParseError`` if it is garbage.

    Returns:
        The item's text; or :attr:`_Left.EMPTY` for an item with nothing to remember (only
        function words: "You can do it."), or :attr:`_Left.REFUSAL` for one that reads as a
        refusal ("I'm sorry to hear that", which a model also copies from the dialogue).
        :func:`_clean_items` leaves both out.

    Raises:
        ParseError: for an empty or one-word item, prompt markup, or words the input never
            used (an invented item).
    """
    text = " ".join(unescape(value).split()).strip().strip('"').strip()
    if not text:
        raise ParseError(f"the model gave an empty {what}", raw)
    if _MARKUP.search(text):
        raise ParseError(f"a {what} holds prompt markup", raw)
    if any(p.search(text) for p in REFUSALS):
        return _Left.REFUSAL
    if len(_WORD.findall(text)) < 2:
        raise ParseError(f"the {what} {text!r} has fewer than two words", raw)
    words = _content_words(text)
    if not words:
        return _Left.EMPTY
    if not words & _content_words("\n".join(source)):
        raise ParseError(f"the {what} {text!r} shares no word with its input", raw)
    return _cut(text)


def _cut(text: str) -> str:
    """``text`` within :data:`MAX_ITEM_CHARS`, at its last sentence end if it has one there.

    An item of the full length was closed by the schema's limit, not by the model: it is
    cut back to a sentence end as well.
    """
    if len(text) < MAX_ITEM_CHARS:
        return text
    head = text[:MAX_ITEM_CHARS]
    ends = [m.end() for m in re.finditer(r"[.!?](?=\s|$)", head)]
    return head[: ends[-1]] if ends else head


def _until_runaway(values: Sequence[str]) -> list[str]:
    """A JSON answer's items up to the first one that reached :data:`MAX_ITEM_CHARS`.

    A constrained model whose item reached the schema's limit had lost the item's end; it
    goes on with the same text as the next items (the 1.5B model went on with a session's
    small talk in 400-character pieces, or with ``"+"`` and ``" and"`` pieces, as if it were
    writing code). Those pieces are dropped; the cut item keeps its whole sentences.
    """
    kept: list[str] = []
    for value in values:
        kept.append(value)
        if len(value) >= MAX_ITEM_CHARS:
            break
    return kept


def _clean_items(values: Sequence[str], what: str, raw: str, source: Sequence[str]) -> list[str]:
    """The valid items of an answer; one garbage item fails it (see :func:`_clean_item`).

    Items with nothing to remember and items that read as a refusal are left out; an answer
    whose every item reads as a refusal is the model refusing, and fails.
    """
    cleaned = [_clean_item(value, what, raw, source) for value in values]
    kept = [item for item in cleaned if isinstance(item, str)]
    if not kept and _Left.REFUSAL in cleaned:
        raise ParseError(f"the model refused instead of giving a {what}", raw)
    return kept


def _tagged_lines(text: str, tag: str, raw: str) -> list[str] | None:
    """Values of ``<tag>: value`` lines; ``None`` for an explicit "none" answer.

    Raises:
        ParseError: if a non-empty line is not such a line, or there is none.
    """
    values: list[str] = []
    pattern = re.compile(rf"^\s*(?:[-*]\s*)?<{re.escape(tag)}>\s*:\s*(.*)$", re.I)
    lines = [line for line in (text or "").splitlines() if line.strip()]
    if not lines:
        raise ParseError("the reply is empty", raw)
    for line in lines:
        match = pattern.match(line)
        if match is None:
            raise ParseError(f"line {line.strip()[:40]!r} is not a <{tag}>: line", raw)
        values.append(match.group(1).strip())
    if len(values) == 1 and _NONE.match(values[0]):
        return None
    return values


def _dedupe(items: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for item in items:
        key = item.lower()
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _numbered(items: Sequence[str]) -> str:
    return "\n".join(f"{i}. {item}" for i, item in enumerate(items, 1))


def _lines(text: str) -> tuple[str, ...]:
    return tuple(line for line in text.splitlines() if line.strip())


# ---------------------------------------------------------------------------- 1. learning
NOTES_SYSTEM = (
    "You are the note-taker of an assistant's long-term memory. You will read the newest "
    "part of a conversation between a user and an assistant. Take notes of everything in "
    "it that could matter in later conversations: facts about the user (for example health "
    "conditions, symptoms, history, circumstances), how the user likes to be answered, and "
    "general knowledge or advice the assistant gave. Each note is one short, "
    "self-contained sentence in the third person (write 'The user ...', never 'I' or "
    "'you'). Do not invent anything.\nWrite one note a line, in this format:\n<Note>: "
    "first note\n<Note>: second note\nIf there is nothing worth noting, write exactly: "
    "<Note>: none"
)
NOTES_JSON_SYSTEM = (
    "You are the note-taker of an assistant's long-term memory. Read the newest part of a "
    "conversation and take notes of everything that could matter later: facts about the "
    "user (conditions, symptoms, history, circumstances), how the user likes to be "
    "answered, and general knowledge or advice the assistant gave. One short "
    "self-contained third-person sentence per note; an empty list if nothing is worth "
    "noting; invent nothing.\n"
)


class NotesAnswer(pydantic.BaseModel):
    """JSON form of the learning step."""

    model_config = pydantic.ConfigDict(extra="forbid")
    notes: list[_Item] = pydantic.Field(max_length=32, description="The notes")


def _notes_request(inputs: NotesInput) -> str:
    return (
        f"{fence('dialogue', chr(10).join(inputs.dialogue))}\n\n"
        f"Take at most {inputs.max_notes} notes of the dialogue above."
    )


def _finish_notes(values: Sequence[str], inputs: NotesInput, raw: str) -> tuple[str, ...]:
    notes = _clean_items(values, "note", raw, inputs.dialogue)
    return tuple(_dedupe(notes)[: inputs.max_notes])


def parse_notes(text: str, inputs: NotesInput) -> tuple[str, ...]:
    """Parse the tagged notes (``()`` for an explicit ``<Note>: none``).

    Raises:
        ParseError: on any line that is not a ``<Note>:`` line, or a garbage note.
    """
    values = _tagged_lines(text, "Note", text)
    return () if values is None else _finish_notes(values, inputs, text)


def _parse_notes_json(text: str, inputs: NotesInput) -> tuple[str, ...]:
    answer = parse_model(text, NotesAnswer, inputs.dialogue, cut_ok=True)
    return _finish_notes(_until_runaway(answer.notes), inputs, text)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _notes_stand_in(inputs: NotesInput) -> list[str]:
    """Notes a rule-following coordinator takes: one per sentence of an utterance.

    ``The user said: <sentence>`` or ``The assistant said: <sentence>``; sentences of fewer
    than two words (``Okay.``) are not noted. In a dialogue between named people, where no
    line is the user's by role, the first speaker is taken to be the user.
    """
    users = dialogue_users(inputs.dialogue, ("user", "human", "patient"))
    notes: list[str] = []
    for line in inputs.dialogue:
        speaker, _, content = line.partition(": ")
        who = "The user" if speaker.strip() in users else "The assistant"
        for sentence in _SENTENCE_END.split(" ".join(content.split())):
            if sentence and len(_WORD.findall(sentence)) >= 2:
                notes.append(f"{who} said: {sentence}")
    return notes[: inputs.max_notes]


def _notes_reply(inputs: NotesInput) -> str:
    notes = _notes_stand_in(inputs)
    return "\n".join(f"<Note>: {n}" for n in notes) if notes else "<Note>: none"


#: Learning, JSON twin: ``{"notes": [...]}``.
NOTES_JSON: PromptSpec[NotesInput, tuple[str, ...]] = PromptSpec(
    name="dpem.notes.json",
    system=NOTES_JSON_SYSTEM,
    build=lambda i: [
        ChatMessage("system", NOTES_JSON_SYSTEM + json_instruction(NotesAnswer)),
        ChatMessage("user", _notes_request(i)),
    ],
    parse=_parse_notes_json,
    stand_in=lambda i: NotesAnswer(notes=_notes_stand_in(i)).model_dump_json(),
    response_model=NotesAnswer,
    max_tokens=400,
)

#: Learning (rehearsal process, step 1): ``nts = C(d_i)``, tagged ``<Note>:`` lines.
NOTES: PromptSpec[NotesInput, tuple[str, ...]] = PromptSpec(
    name="dpem.notes",
    system=NOTES_SYSTEM,
    build=lambda i: [ChatMessage("system", NOTES_SYSTEM), ChatMessage("user", _notes_request(i))],
    parse=parse_notes,
    stand_in=_notes_reply,
    max_tokens=400,
    structured=NOTES_JSON,
)


# ---------------------------------------------------------------------------- 2. summarizing
KNOWLEDGE_SYSTEM = (
    "You decide what an assistant keeps in its long-term memory. You will read the notes "
    "taken from the newest part of a conversation. Keep only the notes that are relevant "
    "and useful for helping this user later: facts about the user's health, history and "
    "circumstances, the way the user wants to be answered, and medical or practical "
    "knowledge worth reusing. Drop greetings, thanks, small talk, acknowledgements and "
    "anything vague. Write each kept note as one knowledge item: a short, self-contained "
    "third-person sentence. Do not invent anything that is not in the notes.\nWrite one "
    "item a line, in this format:\n<Knowledge>: first item\n<Knowledge>: second item\nIf "
    "no note is worth keeping, write exactly: <Knowledge>: none"
)
KNOWLEDGE_JSON_SYSTEM = (
    "You decide what an assistant keeps in its long-term memory. Read the notes taken from "
    "the newest part of a conversation and keep only the relevant, reusable ones: facts "
    "about the user's health, history and circumstances, how the user wants to be "
    "answered, and medical or practical knowledge. Drop greetings, thanks, small talk and "
    "vague notes. Each kept note becomes one short self-contained third-person sentence; "
    "an empty list if none is worth keeping; invent nothing.\n"
)


class KnowledgeAnswer(pydantic.BaseModel):
    """JSON form of the summarizing step."""

    model_config = pydantic.ConfigDict(extra="forbid")
    knowledge: list[_Item] = pydantic.Field(max_length=32, description="The knowledge items")


def _knowledge_request(inputs: KnowledgeInput) -> str:
    return (
        f"{fence('notes', _numbered(inputs.notes))}\n\n"
        "Keep the relevant notes above as knowledge items."
    )


def _finish_knowledge(values: Sequence[str], inputs: KnowledgeInput, raw: str) -> tuple[str, ...]:
    items = _clean_items(
        [re.sub(r"^\d+\.\s*", "", v) for v in values], "knowledge item", raw, inputs.notes
    )
    return tuple(_dedupe(items))


def parse_knowledge(text: str, inputs: KnowledgeInput) -> tuple[str, ...]:
    """Parse the tagged knowledge items (``()`` for an explicit ``<Knowledge>: none``).

    Raises:
        ParseError: on any line that is not a ``<Knowledge>:`` line, or a garbage item.
    """
    values = _tagged_lines(text, "Knowledge", text)
    return () if values is None else _finish_knowledge(values, inputs, text)


def _parse_knowledge_json(text: str, inputs: KnowledgeInput) -> tuple[str, ...]:
    answer = parse_model(text, KnowledgeAnswer, inputs.notes, cut_ok=True)
    return _finish_knowledge(_until_runaway(answer.knowledge), inputs, text)


#: Words that make an assistant's note advice worth keeping (stand-in rule).
_ADVICE = re.compile(
    r"\b(should|can|helps?|avoid|keep|try|recommend\w*|important|eases?|reduces?|"
    r"causes?|because|usually|often|may|might|means?)\b",
    re.I,
)


def _knowledge_stand_in(inputs: KnowledgeInput) -> list[str]:
    """Keep what the user said (three words or more) and the assistant's advice.

    Greetings ("Hello doctor.") and acknowledgements ("Noted.") are dropped.
    """
    kept: list[str] = []
    for note in inputs.notes:
        if note.startswith("The user said: "):
            if len(note.split()) >= 6:  # "The user said:" + at least three words
                kept.append(note)
        elif note.startswith("The assistant said: "):
            content = note[len("The assistant said: ") :]
            if _ADVICE.search(content) and len(_WORD.findall(content)) >= 4:
                kept.append(content)
        else:
            kept.append(note)
    return kept


def _knowledge_reply(inputs: KnowledgeInput) -> str:
    items = _knowledge_stand_in(inputs)
    return "\n".join(f"<Knowledge>: {k}" for k in items) if items else "<Knowledge>: none"


#: Summarizing, JSON twin: ``{"knowledge": [...]}``.
KNOWLEDGE_JSON: PromptSpec[KnowledgeInput, tuple[str, ...]] = PromptSpec(
    name="dpem.knowledge.json",
    system=KNOWLEDGE_JSON_SYSTEM,
    build=lambda i: [
        ChatMessage("system", KNOWLEDGE_JSON_SYSTEM + json_instruction(KnowledgeAnswer)),
        ChatMessage("user", _knowledge_request(i)),
    ],
    parse=_parse_knowledge_json,
    stand_in=lambda i: KnowledgeAnswer(knowledge=_knowledge_stand_in(i)).model_dump_json(),
    response_model=KnowledgeAnswer,
    max_tokens=400,
)

#: Summarizing (rehearsal process, step 2): the relevant notes ``nt+`` as knowledge items.
KNOWLEDGE: PromptSpec[KnowledgeInput, tuple[str, ...]] = PromptSpec(
    name="dpem.knowledge",
    system=KNOWLEDGE_SYSTEM,
    build=lambda i: [
        ChatMessage("system", KNOWLEDGE_SYSTEM),
        ChatMessage("user", _knowledge_request(i)),
    ],
    parse=parse_knowledge,
    stand_in=_knowledge_reply,
    max_tokens=400,
    structured=KNOWLEDGE_JSON,
)


# ---------------------------------------------------------------------------- 3. typing
TYPING_SYSTEM = (
    "You sort the knowledge an assistant keeps in memory into two types. 'user-specific' "
    "knowledge is about this particular user: their conditions, symptoms, history, "
    "circumstances, habits or how they like to be answered. 'common-sense' knowledge is "
    "general: medical or practical facts and advice that hold for anyone. You will read "
    "numbered knowledge items. Give every item exactly one type, in this format, one line "
    "per item in the items' order:\n<Type 1>: user-specific\n<Type 2>: common-sense"
)
TYPING_JSON_SYSTEM = (
    "You sort the knowledge an assistant keeps in memory into two types: 'user-specific' "
    "(about this particular user: conditions, symptoms, history, circumstances, habits, "
    "how they like to be answered) or 'common-sense' (general medical or practical facts "
    "and advice that hold for anyone). Read the numbered knowledge items and give every "
    "item exactly one type, by its number.\n"
)


class ItemType(pydantic.BaseModel):
    """The type of one numbered item."""

    model_config = pydantic.ConfigDict(extra="forbid")
    item: int = pydantic.Field(ge=1, le=64, description="Item number")
    type: KnowledgeType = pydantic.Field(description="user-specific or common-sense")


class TypingAnswer(pydantic.BaseModel):
    """JSON form of the typing step."""

    model_config = pydantic.ConfigDict(extra="forbid")
    types: list[ItemType] = pydantic.Field(max_length=64, description="One entry per item")


_TYPE_LINE = re.compile(r"^\s*(?:[-*]\s*)?<Type\s+(\d+)>\s*:\s*(.*?)\s*\.?\s*$", re.I)


def _type_of(value: str, raw: str) -> KnowledgeType:
    norm = re.sub(r"[\s_]+", "-", value.strip().lower().strip("'\"*"))
    if norm in ("user-specific", "userspecific", "user"):
        return USER_SPECIFIC
    if norm in ("common-sense", "commonsense", "common", "general"):
        return COMMON_SENSE
    raise ParseError(f"{value!r} is neither user-specific nor common-sense", raw)


def _finish_types(
    pairs: Sequence[tuple[int, KnowledgeType]], inputs: TypingInput, raw: str
) -> tuple[KnowledgeType, ...]:
    """One type per item, from the answer's ``(number, type)`` pairs.

    Numbers past the last item are ignored once every item has its type: the 1.5B model,
    given one knowledge item of several sentences, typed "items" 2, 3, ... (one per
    sentence) until its token cap, and every retry wrote the same answer.
    """
    found: dict[int, KnowledgeType] = {}
    for number, kind in pairs:
        if number > len(inputs.items):
            continue
        if number < 1:
            raise ParseError(f"there is no item {number}", raw)
        if found.setdefault(number, kind) != kind:
            raise ParseError(f"item {number} got two different types", raw)
    missing = [n for n in range(1, len(inputs.items) + 1) if n not in found]
    if missing:
        raise ParseError(f"items {missing} got no type", raw)
    return tuple(found[n] for n in range(1, len(inputs.items) + 1))


def parse_types(text: str, inputs: TypingInput) -> tuple[KnowledgeType, ...]:
    """Parse ``<Type n>: user-specific|common-sense`` lines into one type per item.

    Raises:
        ParseError: on a line in another format, an unknown type or number, or a missing item.
    """
    lines = [line for line in (text or "").splitlines() if line.strip()]
    if not lines:
        raise ParseError("the reply is empty", text)
    pairs: list[tuple[int, KnowledgeType]] = []
    for line in lines:
        match = _TYPE_LINE.match(line)
        if match is None:
            raise ParseError(f"line {line.strip()[:40]!r} is not a <Type n>: line", text)
        pairs.append((int(match.group(1)), _type_of(match.group(2), text)))
    return _finish_types(pairs, inputs, text)


def _parse_types_json(text: str, inputs: TypingInput) -> tuple[KnowledgeType, ...]:
    answer = parse_model(text, TypingAnswer, inputs.items, cut_ok=True)
    check_not_placeholder(answer, text)
    return _finish_types([(t.item, t.type) for t in answer.types], inputs, text)


_ABOUT_USER = re.compile(r"\b(the user|user's|patient|i|i'm|i've|my|me|mine)\b", re.I)


def _types_stand_in(inputs: TypingInput) -> list[KnowledgeType]:
    return [USER_SPECIFIC if _ABOUT_USER.search(item) else COMMON_SENSE for item in inputs.items]


def _typing_request(inputs: TypingInput) -> str:
    count = len(inputs.items)
    items = "1 item" if count == 1 else f"{count} items"
    return f"{fence('knowledge', _numbered(inputs.items))}\n\nType every item above ({items})."


def _typing_limit(inputs: TypingInput) -> int:
    """Tokens enough for one type per item (an entry is 8-20 tokens, tagged or JSON).

    The 1.5B model, given one knowledge item of several sentences, typed it sentence by
    sentence as "items" 2, 3, ... until the 300-token cap; answers past the last item are
    ignored (:func:`_finish_types`), so they need not be written.
    """
    return 32 + 32 * len(inputs.items)


#: Typing, JSON twin: ``{"types": [{"item": 1, "type": "user-specific"}, ...]}``.
TYPING_JSON: PromptSpec[TypingInput, tuple[KnowledgeType, ...]] = PromptSpec(
    name="dpem.typing.json",
    system=TYPING_JSON_SYSTEM,
    build=lambda i: [
        ChatMessage("system", TYPING_JSON_SYSTEM + json_instruction(TypingAnswer)),
        ChatMessage("user", _typing_request(i)),
    ],
    parse=_parse_types_json,
    stand_in=lambda i: TypingAnswer(
        types=[ItemType(item=n, type=t) for n, t in enumerate(_types_stand_in(i), 1)]
    ).model_dump_json(),
    response_model=TypingAnswer,
    max_tokens=300,
    limit=_typing_limit,
)

#: Typing (executive process): user-specific or common-sense, one per knowledge item.
TYPING: PromptSpec[TypingInput, tuple[KnowledgeType, ...]] = PromptSpec(
    name="dpem.typing",
    system=TYPING_SYSTEM,
    build=lambda i: [ChatMessage("system", TYPING_SYSTEM), ChatMessage("user", _typing_request(i))],
    parse=parse_types,
    stand_in=lambda i: "\n".join(f"<Type {n}>: {t}" for n, t in enumerate(_types_stand_in(i), 1)),
    max_tokens=300,
    structured=TYPING_JSON,
    limit=_typing_limit,
)


# ---------------------------------------------------------------------------- offline model
def _items_of(user: str, tag: str) -> tuple[str, ...]:
    return tuple(re.sub(r"^\d+\.\s", "", line) for line in _lines(read_section(user, tag)))


def dpem_reply(messages: Sequence[ChatMessage]) -> str:
    """Answer the three DPeM prompts by rule, as an obedient coordinator would.

    Notes: one per utterance (``The user said: ...``); knowledge: what the user said and the
    assistant's advice; types: items about the user are user-specific. Any other prompt gets
    a reply that no DPeM parser accepts.
    """
    system = messages[0].content
    user = next((m.content for m in messages if m.role == "user"), messages[-1].content)
    if system.startswith(NOTES_SYSTEM[:40]):
        limit = re.search(r"at most (\d+) notes", user)
        inputs = NotesInput(
            _lines(read_section(user, "dialogue")), int(limit.group(1)) if limit else 16
        )
        return NOTES.stand_in(inputs) if system == NOTES_SYSTEM else NOTES_JSON.stand_in(inputs)
    if system.startswith(KNOWLEDGE_SYSTEM[:40]):
        k_inputs = KnowledgeInput(_items_of(user, "notes"))
        spec = KNOWLEDGE if system == KNOWLEDGE_SYSTEM else KNOWLEDGE_JSON
        return spec.stand_in(k_inputs)
    if system.startswith(TYPING_SYSTEM[:40]):
        t_inputs = TypingInput(_items_of(user, "knowledge"))
        t_spec = TYPING if system == TYPING_SYSTEM else TYPING_JSON
        return t_spec.stand_in(t_inputs)
    return "I can only answer the DPeM prompts of llm-memories."
