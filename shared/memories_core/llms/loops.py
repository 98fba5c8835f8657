"""Loop detection for greedy replies, shared by every runtime and served model.

A small model decoding greedily can fall into a cycle, writing the same note again and
again until its token cap. :func:`loop_end` tells where such a reply should end; the
transformers and llama.cpp runtimes of :class:`~memories_core.llms.LocalLLM` call it on
token ids, :class:`~memories_core.llms.OpenAIChatLLM` on streamed pieces.

A reply constrained by a schema that bounds every string (:func:`strings_bounded`) is not
ended inside a string: a cut string would lose every field written after it (a memo topic's
line range after its summary), while the schema's ``maxLength`` closes a runaway string on
its own (:func:`inside_json_string`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "LOOP_REPEATS",
    "MAX_LOOP_PERIOD",
    "MIN_LOOP_PERIOD",
    "inside_json_string",
    "loop_end",
    "strings_bounded",
]

#: Shortest span whose back-to-back repetition ends a reply (tokens). A note or a list item
#: is longer; a list of one-word labels (``"fact", "fact", ...``) repeats a shorter span
#: legitimately and is never stopped.
MIN_LOOP_PERIOD = 12
#: Longest such span (tokens): a cycle of several list items.
MAX_LOOP_PERIOD = 256
#: Times the span must be written in a row before generation stops.
LOOP_REPEATS = 3  # at least 3: two writings are kept


def loop_end(
    tokens: Sequence[int],
    *,
    min_period: int = MIN_LOOP_PERIOD,
    max_period: int = MAX_LOOP_PERIOD,
    repeats: int = LOOP_REPEATS,
) -> int | None:
    """Where a reply that has started to repeat itself should end, or ``None``.

    Greedy decoding of a small model can fall into a cycle: the 1.5B model wrote the same
    note (or the same three notes, or one sentence inside a note) again and again until its
    token cap, several minutes of decoding for nothing. The end of ``tokens`` is such a
    cycle when one span of ``min_period`` to ``max_period`` tokens was written ``repeats``
    times back to back, and that span is not itself a run of a shorter span (a run of
    one-word labels, a rule of dashes).

    Returns:
        The number of tokens to keep, or ``None`` if the end of ``tokens`` is not a cycle.
        The span's first two writings are kept: a cycle is found at an arbitrary token, so
        its first writing alone may cut an item of the cycle in two, while in two writings
        every item of the cycle is whole at least once (a JSON list's cut reply keeps its
        whole items; repeated items are the parser's to drop).
    """
    n = len(tokens)
    for period in range(min_period, min(max_period, n // repeats) + 1):
        if tokens[n - 1] != tokens[n - 1 - period]:
            continue
        window = list(tokens[n - repeats * period :])
        if window[period:] != window[:-period]:
            continue
        if any(window[d:] == window[:-d] for d in range(1, min_period)):
            return None  # a run of a short span: not an item loop
        return n - (repeats - 2) * period
    return None


def inside_json_string(text: str) -> bool:
    """Whether ``text``, the start of a JSON value, ends inside a string literal.

    A cycle found there is left running when the reply is schema-constrained: the schema
    closes the string at its ``maxLength`` and the fields after it are still written (ending
    the reply there made every memo topic whose summary looped unreadable). A cycle of whole
    items (outside any string) still ends the reply.
    """
    inside = escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif inside and char == "\\":
            escaped = True
        elif char == '"':
            inside = not inside
    return inside


def strings_bounded(schema: Mapping[str, Any] | None) -> bool:
    """Whether every string ``schema`` allows has a ``maxLength`` (or is an ``enum``/``const``).

    Under such a schema a constrained decoder closes a runaway string itself, so a cycle
    inside a string is left to it; with an unbounded string (or no schema) the loop stop
    ends the reply as anywhere else.
    """
    if not schema:
        return False

    def bounded(node: Any) -> bool:
        if isinstance(node, list):
            return all(bounded(item) for item in node)
        if not isinstance(node, Mapping):
            return True
        kind = node.get("type")
        is_string = kind == "string" or (isinstance(kind, list) and "string" in kind)
        if is_string and not ({"maxLength", "enum", "const"} & set(node)):
            return False
        return all(bounded(value) for value in node.values())

    return bounded(schema)
