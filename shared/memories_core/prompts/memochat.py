"""Prompts of MemoChat (Lu et al., 2023, §3.2, Figure 3, appendix B Tables 6-8).

Three prompts, phrased in our own words after the released ones, keeping their steps and
output formats:

* **memo writing** (Table 6): numbered dialogue lines in, a JSON list of
  ``{"topic", "summary", "start", "end"}`` out. Following appendix C, the task explanation
  comes *after* the material (prompt misplacement) and the format example uses the dummy
  line numbers ``M``/``N`` instead of digits (prompt copy);
* **memo retrieval** (Table 7): numbered options ``(i) topic. summary`` with a
  none-of-the-others option (``NOTO``) inserted at a position that varies with the query and
  the options (:func:`noto_position`; §3.2 inserts it at random); the answer is ``N#M``;
* **chat with memo** (Table 8): Related Evidences, Recent Dialogs, User Input.

Each is a :class:`~memories_core.prompts.spec.PromptSpec` (:data:`PROMPTS`:
``memochat.writing``, ``memochat.retrieval`` with its JSON twin ``memochat.retrieval.json``,
``memochat.chat``) whose system instruction may be overridden through
``MemoChatMemory(prompts=...)``; the task text with the output format stays in the user
message, after the material, so an override cannot lose it.

Every piece of user or model text is untrusted: it goes inside a fenced section whose fence
cannot occur in it (:func:`fence`), so it can neither close its section nor forge another.
The parsers are tolerant (chatty prefixes, ``3 # 6``, ``Options: 2 and 4``, single-quoted or
truncated JSON) and raise :class:`~memories_core.errors.ParseError` when nothing usable is left.
"""

from __future__ import annotations

import json
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pydantic

from memories_core.errors import ParseError
from memories_core.parsing import parse_json, parse_options
from memories_core.prompts.spec import PromptSpec, dialogue_users, parse_model
from memories_core.types import ChatMessage

__all__ = [
    "CHAT_SYSTEM",
    "MEMO_CHAT",
    "MEMO_RETRIEVAL",
    "MEMO_RETRIEVAL_JSON",
    "MEMO_WRITING",
    "NOTO",
    "PROMPTS",
    "RETRIEVE_SYSTEM",
    "WRITE_SYSTEM",
    "ChatInput",
    "MemoSelectionAnswer",
    "MemoSpan",
    "MemoTopic",
    "MemoWritingAnswer",
    "RetrievalInput",
    "WritingInput",
    "build_chat_messages",
    "build_retrieval_messages",
    "build_writing_messages",
    "fence",
    "noto_position",
    "parse_memo_spans",
    "parse_selection",
    "repair_spans",
    "rule_following_reply",
]

#: Label of the none-of-the-others option (Table 7).
NOTO = "NOTO. None of the others."

WRITE_SYSTEM = (
    "You keep the memo of a long conversation between a user and a bot. You split dialogue "
    "lines into topics and write a short summary of each topic."
)
RETRIEVE_SYSTEM = (
    "You keep the memo of a long conversation between a user and a bot. You decide which "
    "topics of the memo a new sentence is about."
)
CHAT_SYSTEM = (
    "You are a helpful bot chatting with a user over a long time. A memo of earlier topics "
    "helps you stay consistent with what was said before."
)

_WRITE_TASK = (
    "Task:\n"
    "1. Find every topic of the conversation above, each named by a short phrase.\n"
    "2. Give the line range of each topic. The ranges follow each other without gaps or "
    "overlaps and together cover every line, from line 1 to the last line.\n"
    "3. Summarize what was said about each topic in one or two short sentences.\n"
    "4. Answer with JSON only: a list of objects with the keys 'topic', 'summary', 'start' "
    "and 'end'. Example for a conversation of M lines that discusses a trip from line 1 to "
    "line N and then a recipe from line N+1 to line M: "
    '[{"topic": "trip", "summary": "The user plans a trip with the bot.", "start": 1, '
    '"end": N}, {"topic": "recipe", "summary": "The bot shares a recipe.", "start": N+1, '
    '"end": M}].\n'
    "Every 'start' is at most its 'end'; both lie between 1 and {lines}, the number of lines."
)
_RETRIEVE_TASK = (
    "Task: choose the topic options that the query sentence above is related to. If no "
    "option but the NOTO option is related, choose only NOTO. Answer with the option numbers "
    "only, separated by '#': if options N and M are chosen, answer N#M. Every number lies "
    "between 1 and {options}, the number of options."
)
_RETRIEVE_JSON_TASK = (
    "Task: choose the topic options that the query sentence above is related to. If no "
    "option but the NOTO option is related, choose only NOTO. Answer with JSON only, the "
    'chosen option numbers in a list: if options N and M are chosen, answer {"options": [N, M]}. '
    "Every number lies between 1 and {options}, the number of options."
)
_CHAT_TASK = (
    "Task: reply to the user input above as the bot, in a few sentences. Use the related "
    "evidences from the memo when they matter, and stay consistent with them and with the "
    "recent dialogs."
)

_FENCE = re.compile(r"`{3,}")


def fence(text: str, label: str) -> str:
    """Wrap untrusted ``text`` in a fenced, labelled section it cannot close.

    The fence is one backtick longer than the longest backtick run inside ``text``, so an
    echoed fence or a forged section heading stays inside the section.

    Example:
        >>> print(fence("hi ``` there", "Query"))
        Query:
        ````
        hi ``` there
        ````
    """
    longest = max((len(m.group()) for m in _FENCE.finditer(text)), default=2)
    bar = "`" * max(3, longest + 1)
    return f"{label}:\n{bar}\n{text}\n{bar}"


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def build_writing_messages(lines: Sequence[str]) -> list[ChatMessage]:
    """Messages asking to partition ``lines`` into topics (Table 6).

    Args:
        lines: Dialogue lines ``"speaker: content"``, oldest first; they are numbered
            ``(line 1)`` ... in the prompt (newlines inside a line are folded).

    Returns:
        A system message and a user message: the numbered conversation, then the task.
    """
    numbered = "\n".join(f"(line {i}) {_one_line(line)}" for i, line in enumerate(lines, 1))
    user = (
        f"{fence(numbered, 'Conversation')}\n\n"
        f"{_WRITE_TASK.replace('{lines}', str(len(lines)))}\n\nResult:"
    )
    return [ChatMessage("system", WRITE_SYSTEM), ChatMessage("user", user)]


def noto_position(query: str, options: Sequence[str]) -> int:
    """Where the NOTO option goes among ``options``: 1-based, from 1 to ``len(options) + 1``.

    MemoChat inserts NOTO at a random place among the options (Lu et al., 2023, §3.2; Table 7
    shows it third of five), so a model cannot learn to skip or pick the last line. The place
    here is pseudo-random but reproducible: a checksum of the query and the options, so the
    same recall sends the same prompt (tests, caches) while different recalls spread NOTO over
    every position.

    Example:
        >>> noto_position("q", ["a", "b"]) in (1, 2, 3)
        True
    """
    digest = zlib.crc32("\x1f".join([query, *options]).encode("utf-8"))
    return digest % (len(options) + 1) + 1


def build_retrieval_messages(
    query: str, options: Sequence[str], *, noto_at: int | None = None, json_answer: bool = False
) -> tuple[list[ChatMessage], int]:
    """Messages asking which options ``query`` relates to, with a NOTO option (Table 7).

    Args:
        query: The query sentence (untrusted).
        options: ``"topic. summary"`` strings, one per memo entry.
        noto_at: 1-based position of the NOTO option (default: after the last option;
            :class:`~memories_core.mechanisms.memochat.MemoChatMemory` passes
            :func:`noto_position`, the paper's random place).
        json_answer: Ask for ``{"options": [N, M]}`` instead of ``N#M`` (the JSON twin, for
            models with schema-constrained decoding).

    Returns:
        The messages, and the 1-based number of the NOTO option.
    """
    position = len(options) + 1 if noto_at is None else max(1, min(noto_at, len(options) + 1))
    shown = [_one_line(o) for o in options]
    shown.insert(position - 1, NOTO)
    listed = "\n".join(f"({i}) {text}" for i, text in enumerate(shown, 1))
    task = (_RETRIEVE_JSON_TASK if json_answer else _RETRIEVE_TASK).replace(
        "{options}", str(len(shown))
    )
    user = (
        f"{fence(_one_line(query), 'Query sentence')}\n\n{fence(listed, 'Topic options')}\n\n"
        f"{task}\n\nResult:"
    )
    return [ChatMessage("system", RETRIEVE_SYSTEM), ChatMessage("user", user)], position


def build_chat_messages(
    user_input: str, evidences: Sequence[Any], recent: Sequence[str]
) -> list[ChatMessage]:
    """Messages asking for a reply grounded on memo evidences (Table 8).

    Args:
        user_input: What the user just said.
        evidences: Memo entries (objects with ``topic``, ``summary`` and ``dialogs``, or
            ready strings); shown as numbered Related Evidences.
        recent: The most recent dialogue lines (the memo buffer), oldest first.

    Returns:
        A system message and a user message: evidences, recent dialogs, the input, the task.
    """
    rows = []
    for i, ev in enumerate(evidences, 1):
        if isinstance(ev, str):
            rows.append(f"({i}) {_one_line(ev)}")
        else:
            dialogs = " ### ".join(_one_line(d) for d in ev.dialogs)
            rows.append(
                f"({i}) Topic: {_one_line(ev.topic)} | Summary: {_one_line(ev.summary)} | "
                f"Dialogs: {dialogs}"
            )
    user = (
        f"{fence(chr(10).join(rows) or 'None.', 'Related evidences')}\n\n"
        f"{fence(' ### '.join(_one_line(r) for r in recent) or 'None.', 'Recent dialogs')}\n\n"
        f"{fence(_one_line(user_input), 'User input')}\n\n{_CHAT_TASK}\n\nReply:"
    )
    return [ChatMessage("system", CHAT_SYSTEM), ChatMessage("user", user)]


# --------------------------------------------------------------------------------- parsing
@dataclass(frozen=True)
class MemoSpan:
    """One topic of a memo-writing answer: 1-based inclusive line range."""

    topic: str
    summary: str
    start: int
    end: int


_OBJECT = re.compile(r"\{[^{}]*\}", re.S)
_NUMBER = re.compile(r"-?\d+")


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        found = _NUMBER.search(value)
        return int(found.group()) if found else None
    return None


def _span(item: Any) -> MemoSpan | None:
    if not isinstance(item, dict):
        return None
    keys = {str(k).strip().lower(): v for k, v in item.items()}
    topic = keys.get("topic")
    summary = keys.get("summary")
    start, end = _as_int(keys.get("start")), _as_int(keys.get("end"))
    if not isinstance(topic, str) or not topic.strip() or start is None or end is None:
        return None
    text = summary.strip() if isinstance(summary, str) else ""
    return MemoSpan(_one_line(topic), _one_line(text), start, end)


def parse_memo_spans(text: str) -> list[MemoSpan]:
    """Read a memo-writing answer (Table 6's JSON list), tolerantly.

    Accepts code fences, prose around the JSON, single quotes, a single object instead of a
    list, ``{"topics": [...]}`` wrappers, numbers given as strings, and *truncated* JSON (a
    list cut off mid-object keeps its complete objects).

    Raises:
        ParseError: if no object with a topic and integer ``start``/``end`` is found.
    """
    spans: list[MemoSpan] = []
    try:
        value = parse_json(text)
    except ParseError:
        value = None
    if isinstance(value, dict):
        inner = next((v for v in value.values() if isinstance(v, list)), None)
        value = inner if inner is not None else [value]
    if isinstance(value, list):
        spans = [s for s in (_span(item) for item in value) if s is not None]
    if not spans:
        # Truncated or broken lists: read each complete flat object on its own.
        for match in _OBJECT.finditer(text or ""):
            try:
                item = parse_json(match.group())
            except ParseError:
                continue
            span = _span(item)
            if span is not None:
                spans.append(span)
    if not spans:
        raise ParseError("no memo topic with integer 'start' and 'end' found", text or "")
    return spans


def repair_spans(spans: Sequence[MemoSpan], lines: int) -> list[MemoSpan]:
    """Validate and repair topic ranges so they are in range, ordered, disjoint and covering.

    Ranges are clipped to ``1..lines`` and sorted by start; an overlap is resolved by moving
    the later range's start after the earlier one's end; a gap is closed by extending the
    earlier range; a range left empty is dropped; the first range starts at 1 and the last
    ends at ``lines`` (MemoChat appendix C: a small model's ranges are often slightly off).

    Raises:
        ParseError: if no usable range is left, or the ranges are so wrong that repairing
            would invent most of the coverage (less than half the lines were inside a
            range as answered).
    """
    if lines < 1:
        raise ParseError("nothing to partition", "")
    clipped = []
    covered: set[int] = set()
    for span in spans:
        start, end = max(1, span.start), min(lines, span.end)
        if start > end:
            continue
        covered.update(range(start, end + 1))
        clipped.append(MemoSpan(span.topic, span.summary, start, end))
    if not clipped or len(covered) * 2 < lines:
        raise ParseError(f"the topic ranges cover {len(covered)} of {lines} lines", "")
    clipped.sort(key=lambda s: (s.start, s.end))
    out: list[MemoSpan] = []
    for span in clipped:
        start = 1 if not out else out[-1].end + 1
        if out and span.start > start:  # a gap: the earlier topic runs on
            prev = out[-1]
            out[-1] = MemoSpan(prev.topic, prev.summary, prev.start, span.start - 1)
            start = span.start
        if span.end < start:
            continue  # swallowed by the previous range
        out.append(MemoSpan(span.topic, span.summary, start, span.end))
    last = out[-1]
    if last.end < lines:
        out[-1] = MemoSpan(last.topic, last.summary, last.start, lines)
    return out


_ECHOED_OPTION = re.compile(r"^\s*\(\d+\)\s+\S", re.M)
_NONE_WORDS = re.compile(r"\b(noto|none of the others|none of them|none)\b", re.I)
_OPTIONS_PROSE = re.compile(
    r"(?:options?|topics?|answer|result)\s*[:=]?\s*((?:\d+[\s,&#]*(?:and|or)?\s*)+)", re.I
)


def parse_selection(
    text: str, n_options: int, noto: int, options: Sequence[str] | None = None
) -> list[int]:
    """Read a memo-retrieval answer: the chosen option numbers, NOTO excluded.

    An answer that lists the options back (``(1) ...`` lines, what small models often do)
    is not a choice. Tolerates prose, duplicates, spaces (``3 # 6``), ``Options: 2 and 4``,
    numbers out of range (dropped) and a NOTO chosen together with real options (the real
    ones win). An answer naming NOTO (by number or by the word) and no real option returns
    ``[]``. With ``options`` given, an answer without numbers that names some options' topics
    (``"party preparation"``) chooses those options; naming every option is no choice.

    Args:
        text: Model output.
        n_options: Options shown, NOTO included.
        noto: The NOTO option's number.
        options: The options as shown, NOTO included (``"topic. summary"``), to read an
            answer given as topic text.

    Raises:
        ParseError: if the answer names no option at all.
    """
    if not isinstance(text, str) or not text.strip():
        raise ParseError("the model output is empty", text if isinstance(text, str) else "")
    if len(_ECHOED_OPTION.findall(text)) >= 2:
        raise ParseError("the model echoed the option list instead of choosing", text)
    try:
        chosen = parse_options(text, n_options, none_option=noto)
    except ParseError:
        named = _named_options(text, options or (), noto)
        if named:
            return named
        if _NONE_WORDS.search(text):
            return []
        raise
    prose = _OPTIONS_PROSE.findall(text)
    if "#" not in text and prose:
        numbers = {int(n) for n in _NUMBER.findall(prose[-1]) if 1 <= int(n) <= n_options}
        if numbers:
            chosen = sorted(numbers)
            if noto in chosen and len(chosen) > 1:
                chosen.remove(noto)
    return [c for c in chosen if c != noto]


def _named_options(text: str, options: Sequence[str], noto: int) -> list[int]:
    """Options (1-based, NOTO excluded) whose topic phrase the answer text contains.

    Raises:
        ParseError: if it names every option (a copy of the list is no choice).
    """
    said = " ".join(_tokenise(text))
    named = []
    for number, option in enumerate(options, 1):
        if number == noto:
            continue
        topic = " ".join(_tokenise(option.split(". ", 1)[0]))
        if len(topic) >= 3 and f" {topic} " in f" {said} ":
            named.append(number)
    real = len(options) - (1 if 1 <= noto <= len(options) else 0)
    if len(named) == real and real > 1:
        raise ParseError("the model named every option back instead of choosing", text)
    return named


def _tokenise(text: str) -> list[str]:
    return re.findall(r"[^\W_]+", text.lower())


def _parse_selection_json(text: str, inputs: RetrievalInput) -> list[int]:
    shown = len(inputs.options) + 1
    noto = inputs.noto()
    answer = parse_model(text, MemoSelectionAnswer, [inputs.query])
    numbers = sorted({n for n in answer.options if 1 <= n <= shown})
    if answer.options and not numbers:
        raise ParseError(f"no chosen option lies between 1 and {shown}", text)
    return [n for n in numbers if n != noto]


def _parse_selection_text(text: str, inputs: RetrievalInput) -> list[int]:
    messages, noto = build_retrieval_messages(inputs.query, inputs.options, noto_at=inputs.noto_at)
    shown = [text for _, text in _OPTION.findall(_section(messages[-1].content, "Topic options"))]
    return parse_selection(text, len(inputs.options) + 1, noto, shown)


@dataclass(frozen=True)
class RetrievalInput:
    """Input of the memo-retrieval prompt (Table 7).

    Attributes:
        query: The query sentence(s).
        options: ``"topic. summary"`` strings (NOTO not included; it is inserted).
        noto_at: 1-based position of NOTO (default: last).
    """

    query: str
    options: tuple[str, ...]
    noto_at: int | None = None

    def noto(self) -> int:
        """The NOTO option's number as shown."""
        return (
            len(self.options) + 1
            if self.noto_at is None
            else max(1, min(self.noto_at, len(self.options) + 1))
        )


class MemoSelectionAnswer(pydantic.BaseModel):
    """JSON form of a memo-retrieval answer, for schema-constrained decoding."""

    model_config = pydantic.ConfigDict(extra="forbid")
    # At most 10 numbers: a schema-constrained small model then has to close the list.
    options: list[int] = pydantic.Field(max_length=10, description="Chosen option numbers")


def _retrieval_stand_in(inputs: RetrievalInput) -> str:
    messages, _ = build_retrieval_messages(inputs.query, inputs.options, noto_at=inputs.noto_at)
    reply = rule_following_reply(messages)
    assert reply is not None
    return reply


#: Table 7 as JSON: ``{"options": [N, M]}`` (used when the model offers structured output).
MEMO_RETRIEVAL_JSON: PromptSpec[RetrievalInput, list[int]] = PromptSpec(
    name="memochat.retrieval.json",
    build=lambda i: build_retrieval_messages(
        i.query, i.options, noto_at=i.noto_at, json_answer=True
    )[0],
    parse=_parse_selection_json,
    stand_in=lambda i: MemoSelectionAnswer(
        options=[int(n) for n in _retrieval_stand_in(i).split("#")]
    ).model_dump_json(),
    response_model=MemoSelectionAnswer,
    max_tokens=64,
    system=RETRIEVE_SYSTEM,
)

#: Table 7: which options the query relates to, answered ``N#M``; returns the chosen option
#: numbers as shown, NOTO excluded (``[]`` for NOTO).
MEMO_RETRIEVAL: PromptSpec[RetrievalInput, list[int]] = PromptSpec(
    name="memochat.retrieval",
    build=lambda i: build_retrieval_messages(i.query, i.options, noto_at=i.noto_at)[0],
    parse=_parse_selection_text,
    stand_in=_retrieval_stand_in,
    max_tokens=40,
    structured=MEMO_RETRIEVAL_JSON,
    system=RETRIEVE_SYSTEM,
)


# --------------------------------------------------------------------------- stand-in model
_LINE = re.compile(r"^\(line (\d+)\) (.*)$", re.M)
_OPTION = re.compile(r"^\((\d+)\) (.*)$", re.M)
_CONTENT = re.compile(r"[^\W\d_]{4,}", re.UNICODE)
_COMMON = frozenset(
    re.findall(
        r"\w+",
        "about after again also been before being could does doing from have just know like "
        "more much need right said some than that their them then there these they this those "
        "very want well were what when where which while will with would your yours tell user "
        "assistant please thanks thank sure okay really",
    )
)


def _section(text: str, label: str) -> str:
    match = re.search(rf"{label}:\n(`{{3,}})\n(.*?)\n\1", text, re.S)
    return match.group(2) if match else ""


def _words(text: str) -> set[str]:
    return {w.lower() for w in _CONTENT.findall(text)} - _COMMON


def _said(said: Sequence[str]) -> str:
    if not said:
        return "The bot talks to the user."
    if len(said) == 1:
        return f"The user says: {said[0]}"
    return f"The user says: {said[0]} ... {said[-1]}"


def rule_following_reply(messages: Sequence[ChatMessage]) -> str | None:
    """Answer a MemoChat prompt of this module in its output format, by simple rules.

    A deterministic stand-in for a model (tests, examples, cost benchmarks; never to judge
    a prompt). Memo writing starts a new topic at a user line sharing no content word with
    the current topic's user lines (in a dialogue between named people, the first speaker's
    lines are the user's); retrieval chooses the options sharing a content word
    with the query (else NOTO); chat replies by quoting the first evidence's topic.

    Returns:
        The reply, or ``None`` if ``messages`` is not one of this module's prompts.
    """
    if not messages:
        return None
    system, user = messages[0].content, messages[-1].content
    if system == WRITE_SYSTEM:
        lines = [(int(n), text) for n, text in _LINE.findall(_section(user, "Conversation"))]
        topics: list[dict[str, Any]] = []
        seen: set[str] = set()
        users = dialogue_users([text for _, text in lines])
        for number, text in lines:
            speaker, _, content = text.partition(": ")
            words = _words(content)
            is_user = speaker.strip() in users
            if not topics or (is_user and words and seen and not words & seen):
                topics.append({"start": number, "end": number, "words": [], "said": []})
                seen = set()
            topics[-1]["end"] = number
            if is_user:
                seen |= words
                topics[-1]["words"] += [w.lower() for w in _CONTENT.findall(content)]
                topics[-1]["said"].append(content.strip())
        out = []
        for topic in topics:
            counted = [w for w in topic["words"] if w not in _COMMON]
            name = max(counted, key=counted.count) if counted else "chat"
            out.append(
                {
                    "topic": name,
                    "summary": _said(topic["said"]),
                    "start": topic["start"],
                    "end": topic["end"],
                }
            )
        return json.dumps(out)
    if system == RETRIEVE_SYSTEM:
        query = _words(_section(user, "Query sentence"))
        options = _OPTION.findall(_section(user, "Topic options"))
        chosen = [n for n, text in options if text != NOTO and query & _words(text)]
        noto = next((n for n, text in options if text == NOTO), "1")
        return "#".join(chosen) if chosen else noto
    if system == CHAT_SYSTEM:
        evidences = _section(user, "Related evidences")
        said = _section(user, "User input")
        found = re.search(r"Topic: (.*?) \|", evidences)
        if found:
            return f"From our memo on {found.group(1)}: {said}"
        return f"I have nothing in the memo about that; you said: {said}"
    return None


# ------------------------------------------------------------------- memo writing as a spec
@dataclass(frozen=True)
class WritingInput:
    """Input of the memo-writing prompt (Table 6): the buffered dialogue lines, oldest first."""

    lines: tuple[str, ...]


class MemoTopic(pydantic.BaseModel):
    """One topic of a memo-writing answer (Table 6's fields)."""

    model_config = pydantic.ConfigDict(extra="forbid")
    topic: str = pydantic.Field(min_length=1, max_length=120, description="The topic")
    summary: str = pydantic.Field(max_length=600, description="What was said about it")
    start: int = pydantic.Field(ge=1, description="First line of the topic")
    end: int = pydantic.Field(ge=1, description="Last line of the topic")


class MemoWritingAnswer(pydantic.BaseModel):
    """JSON form of a memo-writing answer, for schema-constrained decoding."""

    model_config = pydantic.ConfigDict(extra="forbid")
    topics: list[MemoTopic] = pydantic.Field(min_length=1, description="Topics in line order")


def _writing_stand_in(inputs: WritingInput) -> str:
    reply = rule_following_reply(build_writing_messages(inputs.lines))
    assert reply is not None  # the stand-in knows this module's prompts
    return reply


#: Memo writing (Lu et al., Table 6) as a prompt spec: the runner uses schema-constrained
#: JSON where the model offers it (``{"topics": [...]}``), else the prompt's JSON list with
#: tolerant parsing, a repair retry, and range validation/repair (:func:`repair_spans`).
MEMO_WRITING: PromptSpec[WritingInput, list[MemoSpan]] = PromptSpec(
    name="memochat.writing",
    build=lambda i: build_writing_messages(i.lines),
    parse=lambda text, i: repair_spans(parse_memo_spans(text), len(i.lines)),
    stand_in=_writing_stand_in,
    response_model=MemoWritingAnswer,
    max_tokens=600,
    system=WRITE_SYSTEM,
)


# ----------------------------------------------------------------- chat with memo as a spec
@dataclass(frozen=True)
class ChatInput:
    """Input of the chat-with-memo prompt (Table 8).

    Attributes:
        user_input: What the user just said (untrusted).
        evidences: Memo entries (objects with ``topic``, ``summary`` and ``dialogs``) or
            ready strings, shown as numbered Related Evidences.
        recent: The most recent dialogue lines, oldest first.
    """

    user_input: str
    evidences: tuple[Any, ...] = ()
    recent: tuple[str, ...] = ()


def _chat_stand_in(inputs: ChatInput) -> str:
    reply = rule_following_reply(
        build_chat_messages(inputs.user_input, inputs.evidences, inputs.recent)
    )
    assert reply is not None  # the stand-in knows this module's prompts
    return reply


def _parse_reply(text: str, inputs: ChatInput) -> str:
    """The reply as the model wrote it, stripped (Table 8 asks for free text)."""
    return text.strip()


#: Chat with memo (Lu et al., Table 8) as a prompt spec: evidences, recent dialogs and the
#: user input in, the bot's free-text reply out.
MEMO_CHAT: PromptSpec[ChatInput, str] = PromptSpec(
    name="memochat.chat",
    build=lambda i: build_chat_messages(i.user_input, i.evidences, i.recent),
    parse=_parse_reply,
    stand_in=_chat_stand_in,
    system=CHAT_SYSTEM,
)

#: MemoChat's prompts, in pipeline order (the names ``prompts=`` overrides).
PROMPTS: tuple[PromptSpec[Any, Any], ...] = (MEMO_WRITING, MEMO_RETRIEVAL, MEMO_CHAT)
