"""Prompt and parser of self-reflective retrieval (Yuan et al., §3.2, appendix C.3, Table 19).

Given the user input and the retrieved candidate memories, the model either judges them
sufficient and copies the relevant sentences after ``<Memory>:``, or judges them insufficient
and extends the query with keywords after ``<Query>:``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memories_core.errors import ParseError
from memories_core.parsing import parse_tagged
from memories_core.types import ChatMessage

__all__ = ["ReflectionVerdict", "build_reflection_messages", "parse_reflection"]

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
    """Messages asking whether ``candidates`` suffice to answer ``user_input`` (Table 19)."""
    listed = "\n".join(f"- {c}" for c in candidates) or "NaN"
    body = (
        f"<candidate_memory>\n{listed}\n</candidate_memory>\n\n"
        f"<user_input>\n{user_input}\n</user_input>"
    )
    return [ChatMessage("system", SYSTEM), ChatMessage("user", body)]


def parse_reflection(text: str, user_input: str) -> ReflectionVerdict:
    """Read ``<Memory>: ...`` or ``<Query>: k1, k2``.

    When a confused model gives both, a non-empty ``<Memory>`` wins: the candidates are then
    used as they are, which costs no further retrieval.

    Raises:
        ParseError: if neither tag carries a value, or the query has no keyword.
    """
    values = parse_tagged(text, ["Memory", "Query"], echoed=user_input)
    memory = values.get("Memory", "").strip()
    query = values.get("Query", "").strip()
    if memory and memory.lower() not in {"nan", "none"}:
        return ReflectionVerdict(memory=memory, keywords=())
    keywords = tuple(k.strip(" .\"'") for k in re.split(r"[,;\n]", query) if k.strip(" .\"'"))
    if not keywords:
        raise ParseError("the reflection gave neither memory sentences nor keywords", raw=text)
    return ReflectionVerdict(memory=None, keywords=keywords)
