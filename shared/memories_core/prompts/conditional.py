"""Prompts and parsers of conditional memory (Yuan et al., §3.1, appendix C.2, Tables 17-18).

Three message builders, each a pure function, and their parsers:

* :func:`build_decision_messages`: Table 17's second step on its own, the "memorisation timing"
  decision (is this user turn worth remembering?), for the drop-in mode where the chain's own
  prompt is not ours.
* :func:`build_respond_and_decide_messages`: Table 17 whole, the paper's single-call mode: one
  call writes the response (``<Respond>``) and the hidden decision (``<Decision>``).
* :func:`build_record_messages`: Table 18, the memory content: related context, why the user
  said it (``<Summary>``) and a note for future reference (``<Note>``).

User text is untrusted: it is fenced in ``<user_input>`` tags, and the parsers pass it as
``echoed`` to :func:`~memories_core.parsing.parse_tagged`, so a user message that contains
``<Decision>: yes`` cannot forge the decision when the model repeats it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memories_core.errors import ParseError
from memories_core.parsing import parse_tagged, parse_yes_no
from memories_core.types import ChatMessage

__all__ = [
    "ConditionalNote",
    "RespondDecision",
    "build_decision_messages",
    "build_record_messages",
    "build_respond_and_decide_messages",
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
    return f"<user_input>\n{user_input}\n</user_input>"


def build_decision_messages(
    user_input: str, *, previous_reply: str | None = None
) -> list[ChatMessage]:
    """Messages asking whether ``user_input`` is worth remembering (Table 17, step 2).

    Args:
        user_input: The user's turn.
        previous_reply: The assistant's turn before it, so that feedback on it can be judged.
    """
    parts = []
    if previous_reply:
        parts.append(f"<previous_assistant_reply>\n{previous_reply}\n</previous_assistant_reply>")
    parts.append(_fence(user_input))
    parts.append("Should this user input be remembered? Answer with <Decision>: yes or no.")
    return [ChatMessage("system", DECIDE_SYSTEM), ChatMessage("user", "\n\n".join(parts))]


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
    parts = [f"<memory>\n{memory.strip() or 'NaN'}\n</memory>"]
    if history:
        parts.append("<dialogue_so_far>\n" + "\n".join(history) + "\n</dialogue_so_far>")
    parts.append(_fence(user_input))
    return [ChatMessage("system", system), ChatMessage("user", "\n\n".join(parts))]


def build_record_messages(dialogue_context: Sequence[str], user_input: str) -> list[ChatMessage]:
    """Messages asking for a conditional memory record (Table 18).

    Args:
        dialogue_context: The ongoing dialogue up to and including the user input, rendered.
        user_input: The user turn to remember.
    """
    context = "\n".join(dialogue_context) or "NaN"
    body = f"<dialogue_context>\n{context}\n</dialogue_context>\n\n{_fence(user_input)}"
    return [ChatMessage("system", RECORD_SYSTEM), ChatMessage("user", body)]


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
    respond = values.get("Respond", "").strip()
    if not respond:
        respond = _before_decision(text)
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
        related_context="" if related.lower() in _NAN else related,
        summary="" if summary.lower() in _NAN else summary,
        note=values["Note"].strip(),
    )


def render_record(note: ConditionalNote) -> str:
    """The stored record text, ``"Context: ... Knowledge: ..."`` (Yuan et al., Table 1)."""
    if note.summary:
        return f"Context: {note.summary} Knowledge: {note.note}"
    return f"Knowledge: {note.note}"


def _before_decision(text: str) -> str:
    import re

    head = re.split(r"(?i)[<\[*\s]*decision\b", text, maxsplit=1)[0]
    return re.sub(r"(?i)^[\s*]*(?:<respond>|\[respond\]|respond)\s*:?", "", head).strip()
