"""Prompt and parser of self-reflective retrieval (Yuan et al., §3.2, appendix C.3, Table 19).

Given the user input and the retrieved candidate memories, the model either judges them
sufficient and copies the relevant sentences after ``<Memory>:``, or judges them insufficient
and extends the query with keywords after ``<Query>:``.

:data:`REFLECTION` is the prompt as a :class:`~memories_core.prompts.spec.PromptSpec`; its
JSON twin :data:`REFLECTION_JSON` (``{"enough": "yes"|"no", "memory": ..., "keywords": [...]}``)
carries the same two outcomes for models with structured output (see
:mod:`memories_core.prompts.conditional` for the choice). The candidates are stored memories,
hence untrusted like the user input: both are fenced and escaped, and both count as echoed
text, so a stored turn holding ``<Memory>: ...`` cannot replace the model's verdict.

Both instructions may be overridden by name (``reflection``, ``reflection.json``) through
``SelfReflectiveRetrieval(prompts=...)`` or ``SelfReflectiveMemory(prompts=...)``; an
override of the tagged prompt must keep ``<Memory>`` and ``<Query>``, one of the JSON twin
its field names (:mod:`memories_core.prompts.overrides`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import pydantic

from memories_core.errors import ParseError
from memories_core.parsing import parse_tagged, strip_echoed
from memories_core.prompts.spec import PromptSpec, fence, json_instruction, parse_model, unescape
from memories_core.types import ChatMessage

__all__ = [
    "REFLECTION",
    "REFLECTION_JSON",
    "ReflectionAnswer",
    "ReflectionInput",
    "ReflectionVerdict",
    "build_reflection_messages",
    "parse_reflection",
]

SYSTEM = (
    "You are a helpful assistant about to respond to the user input. First decide whether "
    "the candidate memories contain enough information to respond to it.\n"
    'If they do, start your answer with "<Memory>:" and copy the memory sentences that relate '
    "to the user input.\n"
    'If they do not, start your answer with "<Query>:" and extend the user input with new '
    "keywords that would retrieve the missing information, separated by commas.\n"
    'Output format: "<Memory>: the relevant memory sentences" or '
    '"<Query>: keyword, keyword, ..."'
)


@dataclass(frozen=True)
class ReflectionVerdict:
    """The model's verdict on the candidates.

    Attributes:
        memory: The relevant memory sentences, when the candidates suffice.
        keywords: Keywords to extend the query with, when they do not.
    """

    memory: str | None
    keywords: tuple[str, ...]

    @property
    def sufficient(self) -> bool:
        """Whether the candidates were judged enough to respond."""
        return self.memory is not None


def build_reflection_messages(user_input: str, candidates: Sequence[str]) -> list[ChatMessage]:
    """Messages asking whether ``candidates`` suffice to answer ``user_input`` (Table 19).

    Each candidate sits on one ``- `` line; its own line breaks are flattened so a stored
    memory cannot fake further candidates.
    """
    return _messages(SYSTEM, user_input, candidates)


def _messages(system: str, user_input: str, candidates: Sequence[str]) -> list[ChatMessage]:
    listed = "\n".join(f"- {' '.join(c.split())}" for c in candidates) or "NaN"
    body = f"{fence('candidate_memory', listed)}\n\n{fence('user_input', user_input)}"
    return [ChatMessage("system", system), ChatMessage("user", body)]


def parse_reflection(
    text: str, user_input: str, candidates: Sequence[str] = ()
) -> ReflectionVerdict:
    """Read ``<Memory>: ...`` or ``<Query>: k1, k2``.

    When a confused model gives both, a non-empty ``<Memory>`` wins: the candidates are then
    used as they are, which costs no further retrieval.

    Args:
        text: The model's reply.
        user_input: The user input (untrusted; echoed tags in it do not count).
        candidates: The candidate memories shown (untrusted likewise).

    Raises:
        ParseError: if neither tag carries a value, or the query has no keyword.
    """
    untrusted = [user_input, *candidates]
    values = parse_tagged(text, ["Memory", "Query"], echoed=untrusted)
    memory = unescape(values.get("Memory", "")).strip()
    query = values.get("Query", "").strip()
    if memory and memory.lower() not in {"nan", "none"}:
        _check_grounded(memory, candidates, text)
        return ReflectionVerdict(memory=memory, keywords=())
    # An echoed candidate line after the query is not a keyword.
    keywords = _keywords(re.split(r"[,;\n]", unescape(strip_echoed(query, untrusted))))
    if not keywords:
        raise ParseError("the reflection gave neither memory sentences nor keywords", raw=text)
    return ReflectionVerdict(memory=None, keywords=keywords)


#: Share of a copied memory's words (3+ letters) that must appear in the candidates.
GROUNDING = 0.6
_CONTENT = re.compile(r"[^\W\d_]{3,}", re.UNICODE)


def _check_grounded(memory: str, candidates: Sequence[str], raw: str) -> None:
    """Refuse a memory the candidates do not hold (Table 19 asks the model to copy them).

    A hallucinated or injected "memory" must never become the recall context.

    Checked when candidates were shown: at least :data:`GROUNDING` of the memory's words of
    three letters or more must occur in them.

    Raises:
        ParseError: if the memory is not grounded in the candidates.
    """
    if not candidates:
        return
    words = [w.lower() for w in _CONTENT.findall(memory)]
    if not words:
        raise ParseError("the memory sentences hold no words", raw=raw)
    known = {w.lower() for c in candidates for w in _CONTENT.findall(c)}
    share = sum(w in known for w in words) / len(words)
    if share < GROUNDING:
        raise ParseError(
            f"the memory is not copied from the candidates ({share:.0%} of its words are)",
            raw=raw,
        )


def _keywords(raw: Sequence[str]) -> tuple[str, ...]:
    return tuple(k.strip(" .\"'") for k in raw if k.strip(" .\"'"))


@dataclass(frozen=True)
class ReflectionInput:
    """Input of the reflection prompt (Table 19).

    Attributes:
        user_input: The user input (untrusted).
        candidates: The retrieved candidate memories, rendered (untrusted).
    """

    user_input: str
    candidates: tuple[str, ...] = ()


class ReflectionAnswer(pydantic.BaseModel):
    """JSON form of Table 19's two outcomes."""

    model_config = pydantic.ConfigDict(extra="forbid")
    enough: Literal["yes", "no"] = pydantic.Field(description="Do the memories suffice?")
    memory: str = pydantic.Field(max_length=600, description="Copied memory sentences")
    keywords: list[str] = pydantic.Field(
        min_length=1, max_length=5, description="New keywords to search if not enough"
    )


JSON_SYSTEM = (
    "You are a helpful assistant about to respond to the user input. First decide whether "
    'the candidate memories contain enough information to respond to it ("enough": yes or '
    'no). If they do, copy the memory sentences that relate to the user input ("memory"). '
    'If they do not, leave "memory" empty. Always give one to five keywords that would '
    'retrieve missing information ("keywords").\n' + json_instruction(ReflectionAnswer)
)


def _parse_json(text: str, inputs: ReflectionInput) -> ReflectionVerdict:
    answer = parse_model(text, ReflectionAnswer, [inputs.user_input, *inputs.candidates])
    memory = unescape(answer.memory).strip()
    if answer.enough == "yes" and memory and memory.lower() not in {"nan", "none"}:
        _check_grounded(memory, inputs.candidates, text)
        return ReflectionVerdict(memory=memory, keywords=())
    keywords = _keywords([unescape(k) for k in answer.keywords])
    if not keywords:
        raise ParseError("the reflection gave neither memory sentences nor keywords", raw=text)
    return ReflectionVerdict(memory=None, keywords=keywords)


_WORD = re.compile(r"\w{4,}")


def _relevant(inputs: ReflectionInput) -> tuple[list[str], list[str]]:
    """The stand-in's judgement: candidates sharing a 4+ letter word with the input."""
    words = {w.lower() for w in _WORD.findall(inputs.user_input)}
    relevant = [c for c in inputs.candidates if words & {w.lower() for w in _WORD.findall(c)}]
    return relevant, sorted(words)[:5] or ["details"]


def _stand_in(inputs: ReflectionInput) -> str:
    relevant, keywords = _relevant(inputs)
    if relevant:
        return "<Memory>: " + " ".join(" ".join(c.split()) for c in relevant)
    return "<Query>: " + ", ".join(keywords)


def _json_stand_in(inputs: ReflectionInput) -> str:
    relevant, keywords = _relevant(inputs)
    return ReflectionAnswer(
        enough="yes" if relevant else "no",
        memory=" ".join(" ".join(c.split()) for c in relevant),
        keywords=keywords,
    ).model_dump_json()


#: Table 19 as JSON: ``{"enough", "memory", "keywords"}``.
REFLECTION_JSON: PromptSpec[ReflectionInput, ReflectionVerdict] = PromptSpec(
    name="reflection.json",
    build=lambda i: _messages(JSON_SYSTEM, i.user_input, i.candidates),
    parse=_parse_json,
    stand_in=_json_stand_in,
    response_model=ReflectionAnswer,
    max_tokens=160,
    system=JSON_SYSTEM,
)

#: Table 19: ``<Memory>: ...`` when the candidates suffice, else ``<Query>: k1, k2``.
REFLECTION: PromptSpec[ReflectionInput, ReflectionVerdict] = PromptSpec(
    name="reflection",
    build=lambda i: build_reflection_messages(i.user_input, i.candidates),
    parse=lambda text, i: parse_reflection(text, i.user_input, i.candidates),
    stand_in=_stand_in,
    max_tokens=160,
    structured=REFLECTION_JSON,
    system=SYSTEM,
)
