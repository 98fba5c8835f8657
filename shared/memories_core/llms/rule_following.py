"""A deterministic stand-in for a model that follows this package's prompts to the letter.

:func:`rule_following_reply` answers every prompt of :mod:`memories_core.prompts` in the
requested output format, applying the papers' rules with simple, documented heuristics. Use it
as ``ScriptedLLM(default=rule_following_reply)`` in tests, examples and cost benchmarks where a
real model's wording would only add noise. It is not a model: never use it to judge a prompt.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memories_core.prompts import conditional, reflection, summary
from memories_core.types import ChatMessage

__all__ = ["is_worth_remembering", "rule_following_reply"]

_PHATIC = re.compile(
    r"^\W*(hi|hello|hey|good (morning|evening|night)|thanks|thank you|ok|okay|bye|cool|great)\b",
    re.I,
)
_QUESTION_START = re.compile(
    r"^\W*(what|when|where|who|whom|which|why|how|can|could|would|will|do|does|did|is|are|"
    r"should|may)\b",
    re.I,
)
_FEEDBACK = re.compile(
    r"(^\W*no\b|\bnot what\b|\binstead\b|\bactually\b|\bi meant\b|\bi prefer\b|\balways\b|"
    r"\bnever\b|\bfrom now on\b|\bwrong\b|\bremember\b)",
    re.I,
)
# A one-off task ("Capitalize these words: ...") is answered, not remembered.
_TASK_START = re.compile(
    r"^\W*(please\b|capitalize|translate|write|tell|give|show|list|summari[sz]e|explain|help|"
    r"make|find|suggest|recommend|plan|convert|book|draft|fix)\b",
    re.I,
)


def is_worth_remembering(text: str) -> bool:
    """Yuan et al.'s Table 17 rule, as heuristics.

    Yes for standing requirements, feedback on earlier answers and knowledge; no for simple
    questions, one-off tasks and phatic talk. Feedback and requirement words ("no, ...",
    "always", "I prefer", "from now on") win over the question or task shape.
    """
    stripped = text.strip()
    if _FEEDBACK.search(stripped):
        return True
    if _PHATIC.match(stripped) and len(stripped.split()) <= 6:
        return False
    return not (
        stripped.endswith("?") or _QUESTION_START.match(stripped) or _TASK_START.match(stripped)
    )


def _section(text: str, tag: str) -> str:
    match = re.search(rf"<{tag}>\n(.*?)\n</{tag}>", text, re.S)
    return match.group(1) if match else ""


def rule_following_reply(messages: Sequence[ChatMessage]) -> str:
    """Answer one of the package's prompts in its output format (see the module docstring)."""
    system, user = messages[0].content, messages[-1].content
    if system.endswith(conditional.DECIDE_SYSTEM):
        decision = is_worth_remembering(_section(user, "user_input"))
        return f"<Decision>: {'yes' if decision else 'no'}"
    if system.endswith(conditional.RESPOND_SYSTEM):
        text = _section(user, "user_input")
        memory = _section(user, "memory")
        answer = f"Answering {text!r}" + (
            f" with what I remember: {memory}" if memory != "NaN" else "."
        )
        return f"<Respond>: {answer}\n<Decision>: {'yes' if is_worth_remembering(text) else 'no'}"
    if system.endswith(conditional.RECORD_SYSTEM):
        text = _section(user, "user_input")
        lines = _section(user, "dialogue_context").splitlines()
        related = lines[-3:-1] if len(lines) > 1 else []
        asked = [line.split(": ", 1)[-1] for line in related if line.startswith("user: ")]
        why = (
            f"The user reacted to the assistant's answer to '{asked[-1]}'."
            if asked
            else "The user said this without earlier context."
        )
        return (
            f"<Context>: {' | '.join(related) or 'NaN'}\n<Summary>: {why}\n"
            f"<Note>: The user said: {text}"
        )
    if system.endswith(reflection.SYSTEM):
        query = _section(user, "user_input")
        candidates = [c[2:] for c in _section(user, "candidate_memory").splitlines() if c != "NaN"]
        words = {w.lower() for w in re.findall(r"\w{4,}", query)}
        relevant = [c for c in candidates if words & {w.lower() for w in re.findall(r"\w{4,}", c)}]
        if relevant:
            return "<Memory>: " + " ".join(relevant)
        return "<Query>: " + ", ".join(sorted(words)[:5] or ["details"])
    if system.endswith(summary.SYSTEM):
        lines = _section(user, "dialogue").splitlines()
        said = [line.split(": ", 1)[-1] for line in lines if line.lower().startswith("user")]
        return "In this session the user said: " + " ".join(said or lines)
    return "I can only answer the memory prompts of llm-memories."
