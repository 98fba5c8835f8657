"""A deterministic stand-in for a model that follows this package's prompts to the letter.

:func:`rule_following_reply` answers every prompt of :mod:`memories_core.prompts` in the
requested output format (tagged or JSON), through each
:class:`~memories_core.prompts.spec.PromptSpec`'s offline stand-in. Use it
as ``ScriptedLLM(default=rule_following_reply)`` in tests, examples and cost benchmarks where a
real model's wording would only add noise. It is not a model: never use it to judge a prompt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from memories_core.prompts import conditional, reflection, summary
from memories_core.prompts.conditional import is_worth_remembering
from memories_core.prompts.spec import PromptSpec, read_section
from memories_core.types import ChatMessage

__all__ = ["is_worth_remembering", "rule_following_reply"]


def _lines(text: str) -> tuple[str, ...]:
    return tuple(line for line in text.splitlines() if line and line != "NaN")


def _decision(user: str) -> conditional.DecisionInput:
    previous = read_section(user, "previous_assistant_reply") or None
    return conditional.DecisionInput(read_section(user, "user_input"), previous)


def _respond(user: str) -> conditional.RespondInput:
    return conditional.RespondInput(
        read_section(user, "user_input"),
        memory=read_section(user, "memory"),
        history=_lines(read_section(user, "dialogue_so_far")),
    )


def _record(user: str) -> conditional.RecordInput:
    lines = _lines(read_section(user, "dialogue_context"))
    return conditional.RecordInput(
        tuple(conditional.unnumbered(line) for line in lines), read_section(user, "user_input")
    )


def _reflection(user: str) -> reflection.ReflectionInput:
    candidates = tuple(c[2:] for c in _lines(read_section(user, "candidate_memory")))
    return reflection.ReflectionInput(read_section(user, "user_input"), candidates)


def _summary(user: str) -> summary.SummaryInput:
    return summary.SummaryInput(_lines(read_section(user, "dialogue")))


# (system prompt, spec, how to read the spec's input back from the user message)
_PROMPTS: tuple[tuple[str, PromptSpec[Any, Any], Callable[[str], Any]], ...] = (
    (conditional.DECIDE_SYSTEM, conditional.DECISION, _decision),
    (conditional.DECIDE_JSON_SYSTEM, conditional.DECISION_JSON, _decision),
    (conditional.RESPOND_SYSTEM, conditional.RESPOND_AND_DECIDE, _respond),
    (conditional.RESPOND_JSON_SYSTEM, conditional.RESPOND_AND_DECIDE_JSON, _respond),
    (conditional.RECORD_SYSTEM, conditional.RECORD, _record),
    (conditional.RECORD_JSON_SYSTEM, conditional.RECORD_JSON, _record),
    (reflection.SYSTEM, reflection.REFLECTION, _reflection),
    (reflection.JSON_SYSTEM, reflection.REFLECTION_JSON, _reflection),
    (summary.SYSTEM, summary.SESSION_SUMMARY, _summary),
    (summary.JSON_SYSTEM, summary.SESSION_SUMMARY_JSON, _summary),
)


#: What :func:`rule_following_reply` answers to a prompt it does not know.
UNKNOWN_PROMPT_REPLY = "I can only answer the memory prompts of llm-memories."


def rule_following_reply(messages: Sequence[ChatMessage]) -> str:
    """Answer one of the package's prompts in its output format (see the module docstring).

    The prompt is recognised by its system message; the answer is the matching spec's
    offline stand-in (:attr:`~memories_core.prompts.spec.PromptSpec.stand_in`), applied to
    the input read back from the fenced sections. A repair request answers the original
    prompt again.
    """
    system = messages[0].content
    user = next((m.content for m in messages if m.role == "user"), messages[-1].content)
    for prompt, spec, read in _PROMPTS:
        if system.endswith(prompt):
            return str(spec.stand_in(read(user)))
    return UNKNOWN_PROMPT_REPLY
