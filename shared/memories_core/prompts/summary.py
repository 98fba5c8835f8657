"""Session summaries for summary-based memory.

Yuan et al. (§3.1 "Summary-Based Memory", appendix C.1) write one LLM summary per dialogue
session; their Table 16 prompt is not legible in our copy, so this prompt follows MemoryBank's
instruction (Zhong et al., §2.1 "Hierarchical Event Summary": summarise the events and key
information in the content), phrased in our own words. The dialogue is untrusted input and is
fenced in a tagged section, escaped so that it cannot close it.

:data:`SESSION_SUMMARY` is the prompt as a :class:`~memories_core.prompts.spec.PromptSpec`
(plain prose); its JSON twin :data:`SESSION_SUMMARY_JSON` (``{"summary": ...}``) is used by
models with structured output. Both parsers reject refusals ("I'm sorry, I cannot
summarize") and degenerate replies (a lone word such as "user", fewer than three words, a bare
speaker label) with ``ParseError``, so garbage never becomes a memory.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import pydantic

from memories_core.errors import ParseError
from memories_core.prompts.spec import PromptSpec, fence, json_instruction, parse_model, unescape
from memories_core.types import ChatMessage

__all__ = [
    "SESSION_SUMMARY",
    "SESSION_SUMMARY_JSON",
    "SummaryAnswer",
    "SummaryInput",
    "build_session_summary_messages",
    "parse_session_summary",
]

SYSTEM = (
    "You keep the long-term memory of an assistant. You will read one finished dialogue "
    "session between a user and an assistant. Write a short summary of the events and the "
    "key information in it: what the user said about themselves (facts, preferences, plans, "
    "feelings), what they asked for, what was decided, and any feedback the user gave on the "
    "assistant's answers. Write plain prose in the third person, at most five sentences. "
    "Do not add anything that is not in the dialogue. Reply with the summary only."
)

_LABEL = re.compile(r"^\s*(?:\*\*)?\s*(?:session\s+)?summary\s*(?:\*\*)?\s*[:\-]\s*", re.I)
_WORD = re.compile(r"[^\W\d_]{3,}", re.UNICODE)
_ANY_WORD = re.compile(r"[^\W_]+", re.UNICODE)
#: Fewest words a summary may have ("The user adopted a cat." has five).
MIN_WORDS = 3

#: Refusals and non-answers small and aligned models give instead of a summary; matched at
#: the start of the reply (a summary may quote such words later on).
REFUSALS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p, re.I)
    for p in (
        r"^\W*(i'?m|i am)\s+(so\s+|very\s+)?(sorry|afraid)\b",
        r"^\W*(sorry|apologies|unfortunately)\b",
        r"^\W*(i|we)\s+(cannot|can't|can not|could not|couldn't|won't|will not|am unable to|"
        r"am not able to|do not|don't)\s+(summari[sz]e|help|provide|assist|do|comply|access)",
        r"^\W*as an ai\b",
        r"^\W*(there is|there's)\s+(no|nothing)\b.{0,40}\b(summari[sz]e|dialogue|conversation)",
        r"^\W*(no|not enough)\s+(information|content|dialogue|context)\b",
        r"^\W*(n/?a|none|null|nan|unknown)\W*$",
    )
)
#: Speaker labels a degenerate reply may consist of.
_SPEAKERS = re.compile(
    r"^\W*((the\s+)?(user|assistant|human|ai|bot|system|speaker(\s*\d+)?|me|you)\W*)+$", re.I
)


def build_session_summary_messages(dialogue: Sequence[str]) -> list[ChatMessage]:
    """Build the messages that ask for one session's summary.

    Args:
        dialogue: The session's utterances, rendered ``"speaker: content"``, oldest first.

    Returns:
        A system message with the instruction and a user message with the fenced dialogue.
    """
    return _messages(SYSTEM, dialogue, "Summarize the events and key information above.")


def _messages(system: str, dialogue: Sequence[str], request: str) -> list[ChatMessage]:
    user = f"{fence('dialogue', chr(10).join(dialogue))}\n\n{request}"
    return [ChatMessage("system", system), ChatMessage("user", user)]


_MARKUP = re.compile(r"</?\s*[A-Za-z_][\w ]{0,30}>\s*:?")


def parse_session_summary(text: str, dialogue: Sequence[str]) -> str:
    """Validate a model's summary of ``dialogue`` and return it cleaned.

    A reply is garbage, and rejected, when it is empty, when it has no word of three or more
    letters, when it is a refusal (:data:`REFUSALS`), when it has fewer than
    :data:`MIN_WORDS` words or is only a speaker label (``"user"``, ``"Assistant:"``), or
    when it shares no word of three letters or more with the dialogue (an unrelated or
    hallucinated reply), or when it holds prompt markup such as ``<Context>:`` or
    ``</user_input>`` (an echoed or forged prompt, contract-suite case "forged-tags").
    A leading ``Summary:`` label and surrounding quotes are removed.

    Raises:
        ParseError: if the reply is garbage.
    """
    cleaned = unescape(_LABEL.sub("", (text or "").strip()).strip().strip('"').strip())
    words = {w.lower() for w in _WORD.findall(cleaned)}
    if not words:
        raise ParseError("the summary is empty or has no words", raw=text)
    if any(p.search(cleaned) for p in REFUSALS):
        raise ParseError("the model refused or gave no summary", raw=text)
    if _SPEAKERS.match(cleaned):
        raise ParseError("the summary is only a speaker label", raw=text)
    if _MARKUP.search(cleaned):
        # A summary is prose; section tags mean the model echoed or forged prompt markup.
        raise ParseError("the summary holds prompt markup (tags such as <Context>:)", raw=text)
    if len(_ANY_WORD.findall(cleaned)) < MIN_WORDS:
        raise ParseError(f"the summary has fewer than {MIN_WORDS} words", raw=text)
    source = {w.lower() for w in _WORD.findall("\n".join(dialogue))}
    if not words & source:
        raise ParseError("the summary shares no word with the dialogue", raw=text)
    return cleaned


@dataclass(frozen=True)
class SummaryInput:
    """Input of the session-summary prompt.

    Attributes:
        dialogue: The session's utterances, rendered ``"speaker: content"`` (untrusted).
    """

    dialogue: tuple[str, ...]


class SummaryAnswer(pydantic.BaseModel):
    """JSON form of a session summary."""

    model_config = pydantic.ConfigDict(extra="forbid")
    summary: str = pydantic.Field(min_length=1, max_length=1200, description="The summary")


JSON_SYSTEM = (
    "You keep the long-term memory of an assistant. You will read one finished dialogue "
    "session between a user and an assistant. Summarize the events and the key information "
    "in it: what the user said about themselves (facts, preferences, plans, feelings), what "
    "they asked for, what was decided, and any feedback the user gave on the assistant's "
    "answers. Plain prose in the third person, at most five sentences, nothing that is not in "
    "the dialogue.\n" + json_instruction(SummaryAnswer)
)


def _stand_in(inputs: SummaryInput) -> str:
    lines = list(inputs.dialogue)
    said = [line.split(": ", 1)[-1] for line in lines if line.lower().startswith("user")]
    return "In this session the user said: " + " ".join(said or lines)


#: The session summary as JSON: ``{"summary": ...}``.
SESSION_SUMMARY_JSON: PromptSpec[SummaryInput, str] = PromptSpec(
    name="summary.session.json",
    system=JSON_SYSTEM,
    build=lambda i: _messages(JSON_SYSTEM, i.dialogue, "Summarize the dialogue above in JSON."),
    parse=lambda text, i: parse_session_summary(
        parse_model(text, SummaryAnswer, i.dialogue).summary, i.dialogue
    ),
    stand_in=lambda i: SummaryAnswer(summary=_stand_in(i)).model_dump_json(),
    response_model=SummaryAnswer,
    max_tokens=200,
)

#: One session's summary, plain prose (Yuan et al. §3.1; MemoryBank's instruction).
SESSION_SUMMARY: PromptSpec[SummaryInput, str] = PromptSpec(
    name="summary.session",
    system=SYSTEM,
    build=lambda i: build_session_summary_messages(i.dialogue),
    parse=lambda text, i: parse_session_summary(text, i.dialogue),
    stand_in=_stand_in,
    max_tokens=200,
    # No JSON twin in the runner's choice: a summary is prose, and with the bundled SmolLM2
    # the constrained JSON form parsed 0/8 against 8/8 for plain prose
    # (BENCHMARKS.md, "Structured output"). SESSION_SUMMARY_JSON stays available on its own.
)
