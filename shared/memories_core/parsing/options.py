"""MemoChat-style option lists (``2#4``), with the "none of them" option."""

from __future__ import annotations

import re

from memories_core.errors import InvalidInputError, ParseError
from memories_core.parsing.base import check_text

__all__ = ["parse_options"]

_HASH_LIST = re.compile(r"\d+(?:[ \t]*#[ \t]*\d+)+")
_BRACKET_LIST = re.compile(r"[\[(]\s*\d+(?:\s*[,;]\s*\d+)*\s*,?\s*[\])]")
_ANSWER_ANCHOR = re.compile(r"\b(?:answer|output|options?|topics?|choices?|result)\s*[:：=]", re.I)
_NUMBER = re.compile(r"(?<![\w.])\d+(?![\w.]*\d)")


def parse_options(text: str, n_options: int, *, none_option: int | None = None) -> list[int]:
    """Parse a MemoChat-style choice of 1-based options, e.g. ``2#4``.

    The choice is read from, in order of preference: the last ``#``-separated list
    (``2#4``, ``Answer: 1 # 3``); else the last bracketed list (``[2, 4]``); else the numbers
    after the last ``Answer:``/``Topics:``-like anchor; else every number in the text
    (``topics 2 and 4``). Numbers outside ``1..n_options`` are dropped. When ``none_option``
    (the "none of these" option) is chosen together with real options, the real ones win.

    Args:
        text: Model output.
        n_options: How many options were offered (numbered ``1..n_options``).
        none_option: The number of the "none of them" option, if the prompt has one.

    Returns:
        The chosen options, sorted and unique; never empty.

    Raises:
        ParseError: if no valid option number is found.
        InvalidInputError: if ``n_options`` is not a positive int.

    Example:
        >>> parse_options("Sure! The relevant topics are 2#4.", 5)
        [2, 4]
    """
    text = check_text(text)
    if isinstance(n_options, bool) or not isinstance(n_options, int) or n_options < 1:
        raise InvalidInputError(f"n_options must be a positive int, got {n_options!r}")
    region = text
    hashes = _HASH_LIST.findall(text)
    brackets = _BRACKET_LIST.findall(text)
    anchors = list(_ANSWER_ANCHOR.finditer(text))
    if hashes:
        region = hashes[-1]
    elif brackets:
        region = brackets[-1]
    elif anchors and _NUMBER.search(text, anchors[-1].end()):
        region = text[anchors[-1].end() :]
    numbers = [int(n) for n in _NUMBER.findall(region)]
    chosen = sorted({n for n in numbers if 1 <= n <= n_options})
    if none_option is not None and none_option in chosen and len(chosen) > 1:
        chosen.remove(none_option)
    if not chosen:
        raise ParseError(
            f"no option number between 1 and {n_options} found in the model output", text
        )
    return chosen
