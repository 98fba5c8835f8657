"""JSON objects and lists out of chatty model output, and cut replies closed.

Small models wrap JSON in prose and code fences, write Python literals (single quotes,
``True``, trailing commas), and stop mid-list at their token cap. :func:`parse_json` finds
and repairs the value; :func:`close_cut_json` keeps the whole elements of a cut one.
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

from memories_core.errors import ParseError
from memories_core.parsing.base import MAX_PARSE_CHARS, check_text

if TYPE_CHECKING:
    import pydantic

__all__ = ["close_cut_json", "parse_json"]

M = TypeVar("M", bound="pydantic.BaseModel")

# How many candidate JSON start positions are tried in chatty text before giving up.
_MAX_JSON_STARTS = 50
# Characters the bracket matcher may scan in one parse_json call, over all start positions.
_JSON_SCAN_BUDGET = 1_000_000

_FENCE = re.compile(r"```[ \t]*([\w-]*)[ \t]*\n?(.*?)(?:```|\Z)", re.DOTALL)
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}


def _repair_json(text: str) -> str:
    """Rewrite Python-ish JSON into JSON, string-aware.

    Single-quoted strings become double-quoted, ``True``/``False``/``None`` become
    ``true``/``false``/``null``, and commas before a closing bracket are dropped. Text inside
    strings is never touched.
    """
    out: list[str] = []
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch in "\"'":
            quote = ch
            j = i + 1
            chars: list[str] = []
            while j < n and text[j] != quote:
                if text[j] == "\\" and j + 1 < n:
                    nxt = text[j + 1]
                    # \' is valid in Python strings but not in JSON; keep other escapes.
                    chars.append("'" if nxt == "'" else "\\" + nxt)
                    j += 2
                    continue
                if text[j] == '"' and quote == "'":
                    chars.append('\\"')
                elif text[j] == "\n":
                    chars.append("\\n")
                else:
                    chars.append(text[j])
                j += 1
            out.append('"' + "".join(chars) + '"')
            i = j + 1
            continue
        if ch == ",":
            k = i + 1
            while k < n and text[k].isspace():
                k += 1
            if k < n and text[k] in "]}":
                i += 1
                continue
        if ch.isalpha() or ch == "_":
            k = i
            while k < n and (text[k].isalnum() or text[k] == "_"):
                k += 1
            word = text[i:k]
            out.append(_PY_LITERALS.get(word, word))
            i = k
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _structure(text: str, start: int, stop: int, quotes: str) -> Iterator[int]:
    """Indices of the brackets outside strings, and of each string's closing quote.

    The scan runs from ``start`` up to ``stop``; a string opens with any character of
    ``quotes``.

    One scanner serves :func:`_balanced_end` and :func:`close_cut_json`, so both read
    escapes and quotes the same way.
    """
    quote: str | None = None
    i = start
    while i < stop:
        ch = text[i]
        if quote is not None:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
                yield i
        elif ch in quotes:
            quote = ch
        elif ch in "{}[]":
            yield i
        i += 1


def _balanced_end(text: str, start: int, budget: int) -> tuple[int, int]:
    """Find the bracket closing the one at ``start`` (string-aware, either quote).

    Returns:
        ``(end, steps)``: the index after the closing bracket (-1 if none within ``budget``
        characters) and how many characters were scanned.
    """
    stack: list[str] = []
    stop = min(len(text), start + budget)
    for i in _structure(text, start, stop, "\"'"):
        ch = text[i]
        if ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return -1, i - start + 1
            if not stack:
                return i + 1, i - start + 1
    return -1, stop - start


def _json_candidates(text: str) -> list[str]:
    """Substrings that may hold the JSON value, most likely first."""
    candidates: list[str] = []
    for match in _FENCE.finditer(text):
        body = match.group(2).strip()
        if body:
            candidates.append(body)
    candidates.append(text.strip())
    # Scanning from every bracket is quadratic on adversarial text ("{{{{..."), so all scans
    # share one budget of characters.
    budget = _JSON_SCAN_BUDGET
    for match in itertools.islice(re.finditer(r"[\[{]", text), _MAX_JSON_STARTS):
        if budget <= 0:
            break
        end, steps = _balanced_end(text, match.start(), budget)
        budget -= steps
        if end != -1:
            candidates.append(text[match.start() : end])
    # Keep order, drop duplicates.
    return list(dict.fromkeys(candidates))


def _load_lenient(candidate: str) -> Any:
    """Parse one candidate as JSON, then repaired JSON, then a Python literal; or raise."""
    # RecursionError: absurdly deep nesting ("[[[[...") is garbage, not a crash.
    try:
        return json.loads(candidate)
    except (ValueError, RecursionError):
        pass
    try:
        return json.loads(_repair_json(candidate))
    except (ValueError, RecursionError):
        pass
    try:
        # literal_eval only builds literals (no code runs); the size is already bounded.
        return ast.literal_eval(candidate)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        pass
    raise ValueError("not JSON")


@overload
def parse_json(text: str, model: None = None) -> Any: ...
@overload
def parse_json(text: str, model: type[M]) -> M: ...


def parse_json(text: str, model: type[pydantic.BaseModel] | None = None) -> Any:
    r"""Parse a JSON object or list out of chatty model output.

    Looks, in order, inside code fences (```json ... ```), at the whole text, then at every
    balanced ``{...}``/``[...]`` in the text (so leading and trailing prose are skipped).
    Each candidate is read as strict JSON, then after repairs (single quotes, trailing
    commas, ``True``/``False``/``None``), then as a Python literal. The first candidate that
    yields an object or a list (and, with ``model``, validates) wins.

    Args:
        text: Model output.
        model: Optional pydantic model class to validate the value against.

    Returns:
        The parsed ``dict``/``list``, or an instance of ``model``.

    Raises:
        ParseError: if no JSON object or list is found, or validation fails (the message
            carries pydantic's error).

    Example:
        >>> parse_json("Here you go:\n```json\n{'a': True, 'b': [1, 2,],}\n```")
        {'a': True, 'b': [1, 2]}
    """
    text = check_text(text)
    validation_error: Exception | None = None
    for candidate in _json_candidates(text):
        try:
            value = _load_lenient(candidate)
        except ValueError:
            continue
        if not isinstance(value, (dict, list)):
            continue
        if model is None:
            return value
        try:
            return model.model_validate(value)
        except ValueError as exc:  # pydantic.ValidationError is a ValueError
            validation_error = validation_error or exc
    # A reply cut at its token cap leaves its value open; an inner object that happens to be
    # whole is not what failed, so the message says the reply was cut.
    cut = _CUT_NOTE if json_was_cut(text) else ""
    if validation_error is not None:
        raise ParseError(
            f"{cut}the JSON does not match {model.__name__ if model else 'the schema'}: "
            f"{validation_error}",
            text,
        ) from validation_error
    raise ParseError(f"{cut}no JSON object or list found in the model output", text)


_CUT_NOTE = "the reply ends before its JSON value closes (cut at its token cap?); "


def json_was_cut(text: str) -> bool:
    """Whether the JSON value that ``text`` starts is still open where the text ends.

    A reply that reached its token cap mid-answer ends inside a string, object or list.
    Brackets are read as :func:`close_cut_json` reads them (:func:`_open_value`); a stray
    closing bracket means the text is not one cut value.
    """
    opened = False
    for index, _ in _open_value(text):
        if index < 0:
            return False
        opened = True
    return opened


def _open_value(text: str) -> Iterator[tuple[int, tuple[str, ...]]]:
    """The structural marks of the JSON value ``text`` starts, while that value is open.

    Yields each bracket's or string end's index with the closers still open after it, and
    ``(-1, ())`` where the value closes or a bracket does not match (then stops).
    """
    starts = [i for i in (text.find("{"), text.find("[")) if i != -1]
    if not starts or len(text) > MAX_PARSE_CHARS:
        return
    closers: list[str] = []
    for i in _structure(text, min(starts), len(text), '"'):
        ch = text[i]
        if ch in "{[":
            closers.append("}" if ch == "{" else "]")
        elif ch in "}]" and (not closers or closers.pop() != ch or not closers):
            yield -1, ()
            return
        yield i, tuple(closers)


def close_cut_json(text: str) -> str | None:
    """The JSON value that ``text`` starts, cut short, closed after its last whole element.

    A reply that reaches its token cap in the middle of a list (``{"notes": ["a", "b", "c``)
    ends inside a string or an object. This keeps every element of the open lists that was
    written out whole (``{"notes": ["a", "b"]}``) and closes the brackets left open; the
    element that was cut is dropped, and so is an object or list element cut anywhere inside
    it, so a field it lacked cannot validate. Strings, objects and lists count as elements
    (a list of numbers is kept whole or not at all).

    Returns:
        The closed JSON text, or ``None`` if ``text`` starts no JSON value, closes the one it
        starts (it was not cut), or was cut before any element of a list was whole (a cut
        reply with nothing whole in it is not an empty answer).
    """
    safe: tuple[int, tuple[str, ...]] | None = None
    for i, closers in _open_value(text):
        if i < 0:
            return None  # the value closed (it was not cut), or a bracket did not match
        if text[i] in "{[":
            continue
        # A string or a bracketed value just ended; directly inside a list, it is whole.
        if closers[-1] == "]" and _no_open_element(closers):
            safe = (i + 1, closers)
    if safe is None:
        return None
    end, still_open = safe
    return text[:end] + "".join(reversed(still_open))


def _no_open_element(closers: Sequence[str]) -> bool:
    """Whether no element of a list is open: nothing was opened inside the innermost list."""
    return "]" not in closers[:-1]
