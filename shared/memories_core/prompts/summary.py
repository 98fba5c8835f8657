"""Session summaries for summary-based memory.

Yuan et al. (§3.1 "Summary-Based Memory", appendix C.1) write one LLM summary per dialogue
session; their Table 16 prompt is not legible in our copy, so this prompt follows MemoryBank's
instruction (Zhong et al., §2.1 "Hierarchical Event Summary": summarise the events and key
information in the content), phrased in our own words. The dialogue is untrusted input and is
fenced in a tagged section.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memories_core.errors import ParseError
from memories_core.types import ChatMessage

__all__ = ["build_session_summary_messages", "parse_session_summary"]

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


def build_session_summary_messages(dialogue: Sequence[str]) -> list[ChatMessage]:
    """Build the messages that ask for one session's summary.

    Args:
        dialogue: The session's utterances, rendered ``"speaker: content"``, oldest first.

    Returns:
        A system message with the instruction and a user message with the fenced dialogue.
    """
    body = "\n".join(dialogue)
    user = f"<dialogue>\n{body}\n</dialogue>\n\nSummarize the events and key information above."
    return [ChatMessage("system", SYSTEM), ChatMessage("user", user)]


def parse_session_summary(text: str, dialogue: Sequence[str]) -> str:
    """Validate a model's summary of ``dialogue`` and return it cleaned.

    A reply is garbage, and rejected, when it is empty, when it has no word of three or more
    letters, or when it shares no such word with the dialogue (an unrelated or hallucinated
    reply). A leading ``Summary:`` label and surrounding quotes are removed.

    Raises:
        ParseError: if the reply is garbage.
    """
    cleaned = _LABEL.sub("", (text or "").strip()).strip().strip('"').strip()
    words = {w.lower() for w in _WORD.findall(cleaned)}
    if not words:
        raise ParseError("the summary is empty or has no words", raw=text)
    source = {w.lower() for w in _WORD.findall("\n".join(dialogue))}
    if not words & source:
        raise ParseError("the summary shares no word with the dialogue", raw=text)
    return cleaned
