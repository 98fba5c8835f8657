"""Prompts of MemoryBank's hierarchical summaries and portraits (Zhong et al., §2.1).

Four tasks, each a :class:`~memories_core.prompts.spec.PromptSpec` (:data:`PROMPTS`, named
``memorybank.*`` and overridable through ``prompts=``): a system instruction plus the
untrusted input fenced in a tagged section:

* :func:`build_daily_summary_messages`: one day's dialogue -> a daily event summary
  ("Hierarchical Event Summary": summarise the events and key information of the day);
* :func:`build_global_summary_messages`: the daily summaries -> one global event summary;
* :func:`build_daily_portrait_messages`: one day's dialogue -> the personality traits and
  emotions the user showed that day ("Dynamic Personality Understanding");
* :func:`build_global_portrait_messages`: the daily notes -> a short, general user portrait.

The instructions follow the paper's steps, in our own words. The parsers
(:func:`parse_summary`, :func:`parse_portrait`) are tolerant of labels, quotes and markdown,
and reject what must never become a memory: empty output, refusals, tags and JSON (a model
echoing or forging the prompt's structure), and text that has nothing to do with its input.

:func:`memorybank_reply` is a deterministic, rule-based stand-in that answers these four
prompts offline (for tests, examples and cost benchmarks, as
``ScriptedLLM(default=memorybank_reply)``). It is not a model: never use it to judge a prompt.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memories_core.errors import ParseError
from memories_core.prompts.spec import PromptSpec, fence, read_section
from memories_core.types import ChatMessage

__all__ = [
    "DAILY_PORTRAIT_PROMPT",
    "DAILY_PORTRAIT_SYSTEM",
    "DAILY_SUMMARY_PROMPT",
    "DAILY_SUMMARY_SYSTEM",
    "GLOBAL_PORTRAIT_PROMPT",
    "GLOBAL_PORTRAIT_SYSTEM",
    "GLOBAL_SUMMARY_PROMPT",
    "GLOBAL_SUMMARY_SYSTEM",
    "PROMPTS",
    "DayInput",
    "DaysInput",
    "build_daily_portrait_messages",
    "build_daily_summary_messages",
    "build_global_portrait_messages",
    "build_global_summary_messages",
    "memorybank_reply",
    "parse_portrait",
    "parse_summary",
]

DAILY_SUMMARY_SYSTEM = (
    "You keep the long-term memory of an AI companion. You will read everything the user and "
    "the companion said on one day. Write a concise summary of that day's events and key "
    "information: what happened to the user, what they told about themselves, what they "
    "asked for, and what the companion suggested or recommended. Plain prose, third person, "
    "at most six sentences, nothing that is not in the dialogue. Reply with the summary only."
)

GLOBAL_SUMMARY_SYSTEM = (
    "You keep the long-term memory of an AI companion. You will read the summaries of the "
    "events of several days, oldest first. Condense them into one overall summary of the "
    "events and key information across all days, keeping what is likely to matter later "
    "(recurring topics, plans, advice given, important life events). Plain prose, third "
    "person, at most eight sentences. Reply with the summary only."
)

DAILY_PORTRAIT_SYSTEM = (
    "You help an AI companion understand its user. You will read everything the user and the "
    "companion said on one day. Describe the personality traits and the emotions the user "
    "showed in this dialogue, and their interests if they mention any. Base every statement "
    "on the dialogue. Two or three sentences. Reply with the description only."
)

GLOBAL_PORTRAIT_SYSTEM = (
    "You help an AI companion understand its user. You will read notes on the personality "
    "traits and emotions the user showed on several days, oldest first. Write a highly "
    "concise and general portrait of the user's personality (traits, typical emotions, "
    "interests, how to respond to them well). At most four sentences. Reply with the "
    "portrait only."
)

#: A parser of a summary or portrait: ``(reply, source lines) -> text``.
Parse = Callable[[str, Sequence[str]], str]

_TASKS = {
    DAILY_SUMMARY_SYSTEM: "dialogue",
    DAILY_PORTRAIT_SYSTEM: "dialogue",
    GLOBAL_SUMMARY_SYSTEM: "daily_summaries",
    GLOBAL_PORTRAIT_SYSTEM: "daily_notes",
}


def _fence(tag: str, lines: Sequence[str]) -> str:
    # Untrusted text is escaped (the shared prompt-spec fence), so it cannot close its section.
    return fence(tag, "\n".join(lines))


def build_daily_summary_messages(day: str, dialogue: Sequence[str]) -> list[ChatMessage]:
    """Messages asking for the event summary of one day (§2.1, "Hierarchical Event Summary").

    Args:
        day: The day, ``YYYY-MM-DD``.
        dialogue: The day's utterances, rendered ``"speaker: content"``, oldest first.
    """
    user = (
        f"Day: {day}\n{_fence('dialogue', dialogue)}\n\n"
        "Summarize the events and key information of this day."
    )
    return [ChatMessage("system", DAILY_SUMMARY_SYSTEM), ChatMessage("user", user)]


def build_global_summary_messages(daily: Sequence[str]) -> list[ChatMessage]:
    """Messages asking for the global summary of the daily ones (§2.1).

    Args:
        daily: Daily summaries rendered ``"[YYYY-MM-DD] summary"``, oldest first.
    """
    user = (
        f"{_fence('daily_summaries', daily)}\n\n"
        "Summarize the events and key information of all these days."
    )
    return [ChatMessage("system", GLOBAL_SUMMARY_SYSTEM), ChatMessage("user", user)]


def build_daily_portrait_messages(day: str, dialogue: Sequence[str]) -> list[ChatMessage]:
    """Messages asking for one day's personality and emotion note (§2.1, "Dynamic Personality").

    Args:
        day: The day, ``YYYY-MM-DD``.
        dialogue: The day's utterances, rendered ``"speaker: content"``, oldest first.
    """
    user = (
        f"Day: {day}\n{_fence('dialogue', dialogue)}\n\n"
        "Based on this dialogue, describe the user's personality traits and emotions."
    )
    return [ChatMessage("system", DAILY_PORTRAIT_SYSTEM), ChatMessage("user", user)]


def build_global_portrait_messages(notes: Sequence[str]) -> list[ChatMessage]:
    """Messages asking for the global user portrait from the daily notes (§2.1).

    Args:
        notes: Daily personality notes rendered ``"[YYYY-MM-DD] note"``, oldest first.
    """
    user = (
        f"{_fence('daily_notes', notes)}\n\n"
        "Give a highly concise and general summary of the user's personality."
    )
    return [ChatMessage("system", GLOBAL_PORTRAIT_SYSTEM), ChatMessage("user", user)]


# ----------------------------------------------------------------------------- parsing
_LABEL = re.compile(
    r"^\s*(?:[#*_>\-\s]*)(?:(?:daily|global|overall|event|user)\s+)*"
    r"(?:summary|portrait|personality|note|description)\s*(?:\*\*)?\s*[:\-]\s*(?:\*\*)?\s*",
    re.I,
)
_TAG = re.compile(r"</?\s*[A-Za-z_][\w\s\-]{0,30}>|\[/?[A-Z][\w\s]{0,20}\]\s*:")
_REFUSAL = re.compile(
    r"^\W*(?:sorry\b|i'?m sorry|i am sorry|i apologi[sz]e|i can(?:'|no)t\b|i cannot|i can only|"
    r"as an ai\b|i'?m (?:not able|unable)|i am (?:not able|unable)|i won'?t\b)",
    re.I,
)
_WORD = re.compile(r"[^\W\d_]{4,}", re.UNICODE)
_STOP = frozenset(
    [
        "this",
        "that",
        "with",
        "from",
        "have",
        "they",
        "them",
        "their",
        "there",
        "what",
        "when",
        "where",
        "which",
        "about",
        "would",
        "could",
        "should",
        "been",
        "were",
        "will",
        "your",
        "just",
        "also",
        "into",
        "than",
        "then",
        "some",
        "very",
        "more",
        "most",
        "much",
        "user",
        "assistant",
        "companion",
        "said",
        "says",
        "today",
        "dialogue",
        "summary",
        "events",
        "day",
        "days",
        "lorem",
        "ipsum",
        "dolor",
        "amet",
    ]
)
#: Words any honest note on personality or emotion may use without echoing the dialogue.
_TRAITS = frozenset(
    [
        "happy",
        "sad",
        "anxious",
        "anxiety",
        "stressed",
        "stress",
        "worried",
        "calm",
        "excited",
        "curious",
        "kind",
        "gentle",
        "shy",
        "friendly",
        "outgoing",
        "introverted",
        "extroverted",
        "confident",
        "insecure",
        "lonely",
        "tired",
        "frustrated",
        "angry",
        "grateful",
        "hopeful",
        "optimistic",
        "pessimistic",
        "caring",
        "thoughtful",
        "creative",
        "ambitious",
        "decisive",
        "straightforward",
        "outspoken",
        "helpful",
        "patient",
        "impatient",
        "emotional",
        "sensitive",
        "positive",
        "negative",
        "cheerful",
        "relaxed",
        "nervous",
        "enthusiastic",
        "passionate",
        "open",
        "reserved",
        "motivated",
        "determined",
        "warm",
        "humorous",
        "polite",
    ]
)


def _content_words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)} - _STOP


def _clean(text: str) -> str:
    if not isinstance(text, str):
        raise ParseError(f"expected text, got {type(text).__name__}", "")
    cleaned = text.strip()
    cleaned = re.sub(r"^```[\w-]*\s*\n?|\n?```\s*$", "", cleaned).strip()
    cleaned = _LABEL.sub("", cleaned, count=1).strip().strip('"').strip("*").strip()
    if not cleaned:
        raise ParseError("the reply is empty", text)
    if cleaned[0] in "{[":
        raise ParseError("the reply is JSON or a list, not prose", text)
    if _TAG.search(cleaned):
        raise ParseError("the reply holds tags (echoed or forged prompt structure)", text)
    # A refusal opens the reply; the same words inside a summary may quote the dialogue.
    if _REFUSAL.search(cleaned):
        raise ParseError("the reply is a refusal", text)
    return re.sub(r"[ \t]+", " ", cleaned)


def parse_summary(text: str, source: Sequence[str]) -> str:
    """Validate an event summary (daily or global) of ``source`` and return it cleaned.

    A leading ``Summary:`` label, quotes and code fences are removed. Rejected: empty
    replies, refusals, replies with tags or JSON, and replies sharing no content word (four
    letters or more, not a stopword) with the source (an unrelated or invented reply).

    Raises:
        ParseError: if the reply is not a usable summary.
    """
    cleaned = _clean(text)
    words = _content_words(cleaned)
    if not words:
        raise ParseError("the summary has no content words", text)
    if not words & _content_words("\n".join(source)):
        raise ParseError("the summary shares no content word with its input", text)
    return cleaned


def parse_portrait(text: str, source: Sequence[str]) -> str:
    """Validate a personality note or portrait of ``source`` and return it cleaned.

    Like :func:`parse_summary`, except that a trait or emotion word ("anxious", "kind") also
    counts as grounded: a note describes the user in words the dialogue need not contain.

    Raises:
        ParseError: if the reply is not a usable note.
    """
    cleaned = _clean(text)
    words = _content_words(cleaned)
    if not words:
        raise ParseError("the note has no content words", text)
    if not words & (_content_words("\n".join(source)) | _TRAITS):
        raise ParseError("the note shares no word with its input and names no trait", text)
    return cleaned


# ----------------------------------------------------------------------------- stand-in
_EMOTIONS = {
    "stress": "stressed",
    "anxious": "anxious",
    "anxiety": "anxious",
    "tired": "tired",
    "happy": "happy",
    "excited": "excited",
    "sad": "sad",
    "lonely": "lonely",
    "worried": "worried",
    "bored": "bored",
    "nervous": "nervous",
    "frustrat": "frustrated",
    "grateful": "grateful",
    "thank": "grateful",
    "curious": "curious",
    "love": "enthusiastic",
    "enjoy": "enthusiastic",
}
_INTEREST = re.compile(
    r"\bi (?:really |also )?(?:enjoy|love)\s+([a-z][a-z \-]{2,40})"
    r"|\binterested in\s+([a-z][a-z \-]{2,40})",
    re.I,
)


def _section(text: str, tag: str) -> list[str]:
    return [line for line in read_section(text, tag).splitlines() if line.strip()]


def _first_sentence(text: str, limit: int = 160) -> str:
    sentence = re.split(r"(?<=[.!?])\s", text.strip(), maxsplit=1)[0]
    return sentence if len(sentence) <= limit else sentence[: limit - 3].rstrip() + "..."


def _speaker_lines(lines: Sequence[str]) -> tuple[list[str], list[str]]:
    said: list[str] = []
    answered: list[str] = []
    for line in lines:
        who, _, content = line.partition(": ")
        (said if who.strip().lower() in ("user", "human") else answered).append(content or who)
    return said, answered


def _traits(lines: Sequence[str]) -> tuple[list[str], list[str]]:
    text = " ".join(lines).lower()
    emotions = list(dict.fromkeys(v for k, v in _EMOTIONS.items() if k in text))
    interests = [(m.group(1) or m.group(2)).strip(" .") for m in _INTEREST.finditer(text)]
    return emotions, list(dict.fromkeys(i for i in interests if i))[:4]


def memorybank_reply(messages: Sequence[ChatMessage]) -> str:
    """Answer one of this module's prompts by rule (see the module docstring).

    Summaries keep the first sentence of each user utterance and of the companion's
    answers; notes list emotion words found in what the user said, and what they say they
    enjoy or love. Any other prompt gets a reply the parsers reject.
    """
    system, user = messages[0].content, messages[-1].content
    task = _TASKS.get(system)
    if task is None:
        return "I can only answer the MemoryBank prompts of llm-memories."
    lines = _section(user, task)
    if system == DAILY_SUMMARY_SYSTEM:
        said, answered = _speaker_lines(lines)
        day = re.search(r"Day: (\S+)", user)
        parts = [f"On {day.group(1) if day else 'this day'} the user said: "]
        parts.append(" ".join(_first_sentence(s) for s in said[:6]) or "nothing of note.")
        if answered:
            parts.append(" The companion answered: ")
            parts.append(" ".join(_first_sentence(a) for a in answered[:6]))
        return "".join(parts)
    if system == GLOBAL_SUMMARY_SYSTEM:
        days = [re.sub(r"^\[[^\]]*\]\s*", "", line) for line in lines]
        return f"Over {len(days)} day(s): " + " ".join(_first_sentence(d, 240) for d in days)
    if system == DAILY_PORTRAIT_SYSTEM:
        said, _ = _speaker_lines(lines)
        emotions, interests = _traits(said)
        note = "The user seemed " + (", ".join(emotions) if emotions else "calm") + "."
        if interests:
            note += " They are interested in " + "; ".join(interests) + "."
        return note
    emotions, interests = _traits(lines)
    portrait = "The user often feels " + (", ".join(emotions) if emotions else "calm") + "."
    if interests:
        portrait += " Interests: " + "; ".join(interests) + "."
    return portrait


# ----------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class DayInput:
    """One day's dialogue: the input of the daily summary and the daily portrait (§2.1).

    Attributes:
        day: The day, ``YYYY-MM-DD``.
        dialogue: The day's utterances, rendered ``"speaker: content"``, oldest first.
    """

    day: str
    dialogue: tuple[str, ...]


@dataclass(frozen=True)
class DaysInput:
    """Every day's daily records: the input of the global summary and portrait (§2.1).

    Attributes:
        lines: Daily records rendered ``"[YYYY-MM-DD] text"``, oldest first.
    """

    lines: tuple[str, ...]


def _day_spec(
    name: str, system: str, build: Callable[[str, Sequence[str]], list[ChatMessage]], parse: Parse
) -> PromptSpec[DayInput, str]:
    return PromptSpec(
        name=name,
        build=lambda i: build(i.day, i.dialogue),
        parse=lambda text, i: parse(text, i.dialogue),
        stand_in=lambda i: memorybank_reply(build(i.day, i.dialogue)),
        system=system,
    )


def _days_spec(
    name: str, system: str, build: Callable[[Sequence[str]], list[ChatMessage]], parse: Parse
) -> PromptSpec[DaysInput, str]:
    return PromptSpec(
        name=name,
        build=lambda i: build(i.lines),
        parse=lambda text, i: parse(text, i.lines),
        stand_in=lambda i: memorybank_reply(build(i.lines)),
        system=system,
    )


#: One day's dialogue -> that day's event summary ("Hierarchical Event Summary").
DAILY_SUMMARY_PROMPT = _day_spec(
    "memorybank.daily_summary",
    DAILY_SUMMARY_SYSTEM,
    build_daily_summary_messages,
    parse_summary,
)
#: One day's dialogue -> that day's personality and emotion note ("Dynamic Personality").
DAILY_PORTRAIT_PROMPT = _day_spec(
    "memorybank.daily_portrait",
    DAILY_PORTRAIT_SYSTEM,
    build_daily_portrait_messages,
    parse_portrait,
)
#: The daily summaries -> one global event summary.
GLOBAL_SUMMARY_PROMPT = _days_spec(
    "memorybank.global_summary",
    GLOBAL_SUMMARY_SYSTEM,
    build_global_summary_messages,
    parse_summary,
)
#: The daily notes -> a short, general user portrait.
GLOBAL_PORTRAIT_PROMPT = _days_spec(
    "memorybank.global_portrait",
    GLOBAL_PORTRAIT_SYSTEM,
    build_global_portrait_messages,
    parse_portrait,
)
#: MemoryBank's four prompts, in the order a day is consolidated.
PROMPTS = (
    DAILY_SUMMARY_PROMPT,
    DAILY_PORTRAIT_PROMPT,
    GLOBAL_SUMMARY_PROMPT,
    GLOBAL_PORTRAIT_PROMPT,
)
