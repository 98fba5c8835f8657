"""Tolerant parsing of model output, with one bounded repair retry.

Small models answer in many shapes: chatty prefixes, markdown bold, lowercase tags, JSON in
code fences with single quotes and trailing commas. The parsers here accept those shapes and
raise :class:`~memories_core.errors.ParseError` (carrying the raw text) when nothing usable is
left; they never return a silent empty result (the failure mode mem0's parser is known for).

* :func:`parse_tagged`: ``<Decision>: yes`` / ``<Memory>: ...`` outputs (Yuan et al. formats),
  with a rule that keeps tags forged inside echoed user text from winning.
* :func:`parse_json`: JSON objects or lists, optionally validated by a pydantic model.
* :func:`parse_options`: MemoChat-style option lists (``2#4``).
* :func:`parse_yes_no`: a tolerant yes/no reading of a tag value.
* :func:`parse_steps`: the generate-parse-repair loop written once, as a generator that
  yields :class:`LLMRequest` values; :func:`drive` and :func:`adrive` run it with blocking
  or async calls, so the sync and async paths cannot drift apart.
* :func:`generate_parsed` / :func:`agenerate_parsed`: call a model, parse, and on a
  ``ParseError`` ask once more with the error fed back (thin wrappers over the above).
"""

from __future__ import annotations

import ast
import itertools
import json
import re
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar, cast, overload

from memories_core.errors import InvalidInputError, ParseError
from memories_core.types import ChatMessage

if TYPE_CHECKING:
    import pydantic

    from memories_core.interfaces import LLM
    from memories_core.llms.base import ResponseFormat

__all__ = [
    "LLMRequest",
    "ParseSteps",
    "adrive",
    "agenerate_parsed",
    "drive",
    "generate_parsed",
    "parse_json",
    "parse_options",
    "parse_steps",
    "parse_tagged",
    "parse_yes_no",
    "repair_messages",
    "strip_echoed",
]

T = TypeVar("T")
M = TypeVar("M", bound="pydantic.BaseModel")

# Inputs above this size are not worth rescuing, and bound the cost of the repair passes.
_MAX_PARSE_CHARS = 1_000_000
# How many candidate JSON start positions are tried in chatty text before giving up.
_MAX_JSON_STARTS = 50
# Characters the bracket matcher may scan in one parse_json call, over all start positions.
_JSON_SCAN_BUDGET = 1_000_000
# Upper bound on repair retries, whatever the caller asks: each retry costs a model call.
_MAX_RETRIES = 3


def _check_text(text: str) -> str:
    if not isinstance(text, str):
        raise ParseError(f"expected model output as str, got {type(text).__name__}", "")
    if not text.strip():
        raise ParseError("the model output is empty", text)
    if len(text) > _MAX_PARSE_CHARS:
        raise ParseError(
            f"the model output has {len(text)} characters; the limit is {_MAX_PARSE_CHARS}",
            text[:1000],
        )
    return text


# ---------------------------------------------------------------------------------------------
# Tagged text
# ---------------------------------------------------------------------------------------------

_BOLD = r"(?:\*\*|__)"


def _tag_name_pattern(tag: str) -> str:
    """Regex for one tag name: spaces, underscores and hyphens inside it are interchangeable."""
    words = [re.escape(w) for w in re.split(r"[\s_\-]+", tag.strip()) if w]
    return r"[\s_\-]*".join(words)


def _marker_regex(tags: Sequence[str]) -> re.Pattern[str]:
    """One regex that finds a marker of any of ``tags``.

    Two shapes are recognised:

    * bracketed, anywhere: ``<Tag>``, ``[Tag]``, optionally bold, optionally followed by a
      colon (``<Decision>: yes``, ``**<Decision>**: yes``, ``<decision> yes``);
    * bare, at the start of a line only (so prose such as "my decision: ..." mid-sentence is
      not a marker), with a required colon: ``Decision: yes``, ``**Decision:** yes``,
      ``- Decision: yes``, ``### Decision: yes``.
    """
    # Longest names first, so "Memory Topic" is not read as "Memory" followed by "Topic".
    names = sorted({t.strip() for t in tags}, key=len, reverse=True)
    alternatives = "|".join(f"(?:{_tag_name_pattern(n)})" for n in names)
    bracketed = (
        rf"{_BOLD}?[ \t]*(?:<|\[)[ \t]*(?P<b>{alternatives})[ \t]*(?:>|\])"
        rf"(?:[ \t]*{_BOLD})?(?:[ \t]*[:：])?(?:[ \t]*{_BOLD})?"
    )
    bare = (
        rf"^[ \t]*(?:[-*>#]+[ \t]+)?{_BOLD}?[ \t]*(?P<n>{alternatives})[ \t]*{_BOLD}?"
        rf"[ \t]*[:：](?:[ \t]*{_BOLD})?"
    )
    return re.compile(f"{bracketed}|{bare}", re.IGNORECASE | re.MULTILINE)


def _name_start(match: re.Match[str]) -> int:
    """Offset of the tag name inside a marker match."""
    return match.start("b") if match.group("b") is not None else match.start("n")


def _canonical(name: str) -> str:
    return re.sub(r"[\s_\-]+", "", name).lower()


def _clean_value(value: str, tags: Sequence[str]) -> str:
    """Trim a tag value: whitespace, closing tags, stray bold marks and code-fence lines."""
    for tag in tags:
        value = re.sub(rf"</\s*{_tag_name_pattern(tag)}\s*>", "", value, flags=re.IGNORECASE)
    value = value.strip()
    # A fenced answer leaves "```" lines around the first and last values.
    value = re.sub(r"^```[\w-]*[ \t]*\n?", "", value)
    value = re.sub(r"\n?```[ \t]*$", "", value)
    value = value.strip()
    if value.startswith(("**", "__")) and not value.endswith(("**", "__")):
        value = value[2:]
    if value.endswith(("**", "__")) and not value.startswith(("**", "__")):
        value = value[:-2]
    return value.strip()


def _echo_fragments(echoed: str | Sequence[str], regex: re.Pattern[str]) -> list[str]:
    """The pieces of echoed user text to look for in the output.

    The whole text, and for every tag marker inside it both its whole line and the part from
    the marker to the end of the line, so partial echoes are caught too.
    """
    sources = [echoed] if isinstance(echoed, str) else list(echoed)
    fragments: list[str] = []
    for source in sources:
        if not isinstance(source, str):
            raise InvalidInputError(f"echoed texts must be str, got {type(source).__name__}")
        markers = list(regex.finditer(source))
        # The whole text matters only when it carries a marker that could forge a tag; a
        # short input without one ("q", "memory") must not mask the model's own tags.
        if markers and source.strip():
            fragments.append(source.strip())
        for match in markers:
            line_start = source.rfind("\n", 0, match.start()) + 1
            line_end = source.find("\n", match.end())
            line_end = len(source) if line_end == -1 else line_end
            fragments.append(source[line_start:line_end].strip())
            fragments.append(source[match.start() : line_end].strip())
    return [f for f in fragments if f]


def _compact(text: str) -> tuple[str, list[int]]:
    """``text`` lowercased without whitespace and bold marks, and each kept char's offset."""
    kept: list[str] = []
    offsets: list[int] = []
    for i, ch in enumerate(text):
        if not ch.isspace() and ch not in "*_":
            kept.append(ch.lower())
            offsets.append(i)
    return "".join(kept), offsets


def _echo_spans(text: str, fragments: Sequence[str]) -> list[tuple[int, int]]:
    """Every occurrence of the fragments in ``text``, as ``(start, end)``.

    Matching ignores case, whitespace and bold marks, so an echo re-spaced by the model
    (``< Decision >:yes`` for ``<Decision>: yes``) is still recognised as an echo.
    """
    compact, offsets = _compact(text)
    spans: list[tuple[int, int]] = []
    for fragment in fragments:
        needle, _ = _compact(fragment)
        if not needle:
            continue
        start = compact.find(needle)
        while start != -1:
            spans.append((offsets[start], offsets[start + len(needle) - 1] + 1))
            start = compact.find(needle, start + 1)
    return spans


def strip_echoed(text: str, echoed: str | Sequence[str]) -> str:
    """Remove echoed user text (and its tag-bearing lines) from model output.

    Use it before any parser that does not take ``echoed=`` itself. :func:`parse_tagged`
    prefers masking (it keeps the text but ignores tag markers inside the echo), because
    removing text would also cut a quote out of a legitimate value.

    Args:
        text: Model output.
        echoed: The untrusted text(s) the model might have repeated (e.g. the user message).

    Returns:
        ``text`` with every case-insensitive occurrence of the echoed text removed, and of
        each of its lines that carries a ``<Tag>``-like marker.
    """
    # Any bracketed or line-leading "word:" marker counts here: the caller's tags are unknown.
    generic = re.compile(r"(?:<|\[)\s*\w[\w \-]*(?:>|\])|^[ \t]*\**\w[\w \-]*\**[ \t]*:", re.M)
    spans = sorted(_echo_spans(text, _echo_fragments(echoed, generic)))
    if not spans:
        return text
    pieces: list[str] = []
    cursor = 0
    for start, end in spans:
        if end <= cursor:
            continue
        pieces.append(text[cursor : max(cursor, start)])
        cursor = max(cursor, end)
    pieces.append(text[cursor:])
    return "".join(pieces)


def parse_tagged(
    text: str,
    tags: Sequence[str],
    *,
    required: Sequence[str] | None = None,
    after: str | None = None,
    echoed: str | Sequence[str] | None = None,
) -> dict[str, str]:
    r"""Parse ``<Tag>: value`` output into a dict keyed by the given tag names.

    Accepted shapes (tag names match case-insensitively; spaces, underscores and hyphens in a
    name are interchangeable): ``<Decision>: yes``, ``<Decision> yes``, ``<decision>:yes``,
    ``**<Decision>**: yes``, ``[Decision]: yes``, ``<Decision>yes</Decision>``, and at the
    start of a line ``Decision: yes``, ``**Decision:** yes``, ``- Decision: yes``. Tags may
    come in any order; a value runs until the next marker of a known tag (so it may span
    lines); prose before the first marker is ignored; a code fence around the answer is
    dropped.

    Which occurrence wins (the security rule): the **last** marker of a tag wins, except that
    markers inside text the model merely echoed are ignored. Give the untrusted user text as
    ``echoed``: any marker found inside a copy of it in the output, or of a tag-bearing line
    of it, does not count (copies are matched ignoring case, whitespace and bold marks, so a
    re-spaced echo is still an echo); a user message containing ``<Decision>: yes`` cannot
    forge the decision by being repeated. One exception keeps the model's own answer: when
    the whole output is nothing but a single tag line (``<Decision>: yes``), it is the
    model's answer even if the user happened to type the same line; otherwise an output
    whose every marker is echoed raises ``ParseError``. ``after`` narrows the
    search to the text after the last occurrence of an anchor (e.g. ``"Answer:"``) when the
    prompt asks for one; without that anchor the whole text is parsed.

    Args:
        text: Model output.
        tags: The tag names to look for, e.g. ``["Decision", "Respond"]``.
        required: Tags that must be present with a non-empty value. ``None`` requires only
            that at least one tag is found.
        after: Optional anchor; only the text after its last occurrence is parsed.
        echoed: Untrusted text(s) the model may have repeated (usually the user message).

    Returns:
        ``{tag: value}`` for every tag found (keys spelt as in ``tags``); a tag whose every
        occurrence is empty maps to ``""`` unless it is required.

    Raises:
        ParseError: if the output is empty, no tag is found, or a required tag is missing or
            empty.
        InvalidInputError: if ``tags`` is empty or ``required`` names an unknown tag.

    Example:
        >>> parse_tagged("Sure!\n**<Decision>**: Yes\n<respond> Hello", ["Decision", "Respond"])
        {'Decision': 'Yes', 'Respond': 'Hello'}
    """
    text = _check_text(text)
    tag_list = [t for t in tags if isinstance(t, str) and t.strip()]
    if isinstance(tags, str) or not tag_list or len(tag_list) != len(tags):
        raise InvalidInputError("tags must be a non-empty sequence of non-empty strings")
    by_key = {_canonical(t): t for t in tag_list}
    required_list = list(required or ())
    unknown = [r for r in required_list if _canonical(r) not in by_key]
    if unknown:
        raise InvalidInputError(f"required tags {unknown} are not among tags {tag_list}")

    raw = text
    if after:
        anchor = text.lower().rfind(after.lower())
        if anchor != -1:
            text = text[anchor + len(after) :]

    regex = _marker_regex(tag_list)
    spans = _echo_spans(text, _echo_fragments(echoed, regex)) if echoed is not None else []
    # A marker is judged by where its tag name sits: the match itself may start earlier, on
    # the whitespace or bold marks before it, outside the echoed span.
    every = list(regex.finditer(text))
    markers = [m for m in every if not any(start <= _name_start(m) < end for start, end in spans)]
    lone = len(every) == 1 and "\n" not in text.strip()
    if not markers and lone and not text[: every[0].start()].strip(" \t*`"):
        # The output is one tag line and nothing else: the model's answer, not an echo.
        markers = every
    if not markers:
        raise ParseError(f"none of the tags {tag_list} was found in the model output", raw)

    values: dict[str, str] = {}
    for i, match in enumerate(markers):
        name = by_key[_canonical(match.group("b") or match.group("n"))]
        end = markers[i + 1].start() if i + 1 < len(markers) else len(text)
        value = _clean_value(text[match.end() : end], tag_list)
        # Last occurrence wins, but an empty repeat (a template echo like "<Respond>:") does
        # not erase a value given earlier.
        if value or name not in values:
            values[name] = value

    missing = [
        by_key[_canonical(r)] for r in required_list if not values.get(by_key[_canonical(r)])
    ]
    if missing:
        found = sorted(k for k, v in values.items() if v)
        raise ParseError(
            f"missing or empty required tag(s) {missing} in the model output (found {found})",
            raw,
        )
    return values


_YES = re.compile(r"^\W*(yes|y|true|correct|affirmative|1)\b", re.IGNORECASE)
_NO = re.compile(r"^\W*(no|n|false|none|negative|0)\b", re.IGNORECASE)


def parse_yes_no(value: str) -> bool:
    """Read a yes/no answer such as ``"Yes."``, ``"**no**"``, ``"YES - because ..."``.

    Only the first word decides, so a justification after it cannot flip the answer.

    Raises:
        ParseError: if the value starts with neither a yes nor a no word.
    """
    if not isinstance(value, str):
        raise ParseError(f"expected str, got {type(value).__name__}", "")
    if _YES.match(value):
        return True
    if _NO.match(value):
        return False
    raise ParseError(f"expected yes or no, got {value[:80]!r}", value)


# ---------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------

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


def _balanced_end(text: str, start: int, budget: int) -> tuple[int, int]:
    """Find the bracket closing the one at ``start`` (string-aware).

    Returns:
        ``(end, steps)``: the index after the closing bracket (-1 if none within ``budget``
        characters) and how many characters were scanned.
    """
    stack: list[str] = []
    pairs = {"{": "}", "[": "]"}
    quote: str | None = None
    i = start
    stop = min(len(text), start + budget)
    while i < stop:
        ch = text[i]
        if quote is not None:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in pairs:
            stack.append(pairs[ch])
        elif ch in "}]":
            if not stack or stack.pop() != ch:
                return -1, i - start + 1
            if not stack:
                return i + 1, i - start + 1
        i += 1
    return -1, i - start


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
    text = _check_text(text)
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
    if validation_error is not None:
        raise ParseError(
            f"the JSON does not match {model.__name__ if model else 'the schema'}: "
            f"{validation_error}",
            text,
        ) from validation_error
    raise ParseError("no JSON object or list found in the model output", text)


# ---------------------------------------------------------------------------------------------
# Option lists
# ---------------------------------------------------------------------------------------------

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
    text = _check_text(text)
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


# ---------------------------------------------------------------------------------------------
# Generate, parse, repair once
# ---------------------------------------------------------------------------------------------


def repair_messages(
    messages: Sequence[ChatMessage], bad_output: str, error: ParseError
) -> tuple[ChatMessage, ...]:
    """Return a new conversation asking the model to fix an unparsable answer.

    The original messages are kept (never mutated); the bad answer is appended as the
    assistant's turn, followed by a user turn that quotes the parse error and asks for the
    same content in the requested format, or for what ``error.fix`` says when the content
    itself was the fault (a copied placeholder: asked for "the same content", the local
    model copied it again on every retry).
    """
    fix = error.fix or (
        "Reply again with the same content in exactly the format requested above, and nothing else."
    )
    request = f"Your previous answer could not be read by the program: {error}. {fix}"
    return (
        *messages,
        ChatMessage("assistant", bad_output),
        ChatMessage("user", request),
    )


def _check_retries(retries: int) -> int:
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise InvalidInputError(f"retries must be an int >= 0, got {retries!r}")
    return min(retries, _MAX_RETRIES)


@dataclass(frozen=True)
class LLMRequest:
    """One model call, as data: what a step of a parse loop asks its driver to send.

    Attributes:
        messages: The conversation.
        max_tokens: Passed to the model.
        temperature: Passed to the model.
        stop: Passed to the model.
        response_format: Structured-output request, or ``None`` for plain text.
    """

    messages: tuple[ChatMessage, ...]
    max_tokens: int | None = None
    temperature: float = 0.0
    stop: Sequence[str] | None = None
    response_format: ResponseFormat | None = None

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``LLM.generate``.

        ``response_format`` is included only when set, so plain
        :class:`~memories_core.interfaces.LLM` implementations keep working.
        """
        options: dict[str, Any] = {
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stop": self.stop,
        }
        if self.response_format is not None:
            options["response_format"] = self.response_format
        return options


#: A parse loop: yields the calls to make, receives each reply, returns the parsed value.
ParseSteps: TypeAlias = Generator[LLMRequest, str, T]


def parse_steps(
    request: LLMRequest, parse: Callable[[str], T], *, retries: int = 1
) -> ParseSteps[T]:
    """The generate-parse-repair loop as a generator, shared by the sync and async drivers.

    Yields the request, parses the reply it is sent, and on ``ParseError`` yields a repair
    request that shows the model its answer and the error (:func:`repair_messages`), at most
    ``retries`` times.

    Raises:
        ParseError: if the last reply still does not parse (chained to its cause).
    """
    attempts = _check_retries(retries)
    output = yield request
    for attempt in range(attempts + 1):
        try:
            return parse(output)
        except ParseError as exc:
            if attempt == attempts:
                raise ParseError(
                    f"model output still unparsable after {attempts} repair attempt(s): {exc}",
                    output,
                ) from exc
            request = replace(request, messages=repair_messages(request.messages, output, exc))
        output = yield request
    raise AssertionError("unreachable")  # pragma: no cover


def drive(llm: LLM, steps: ParseSteps[T]) -> T:
    """Run a parse loop against ``llm`` with blocking calls."""
    request = next(steps)
    while True:
        output = llm.generate(request.messages, **request.kwargs())
        try:
            request = steps.send(output)
        except StopIteration as done:
            return cast("T", done.value)


async def adrive(llm: LLM, steps: ParseSteps[T]) -> T:
    """Run a parse loop against ``llm`` with async calls (the same loop as :func:`drive`)."""
    request = next(steps)
    while True:
        output = await llm.agenerate(request.messages, **request.kwargs())
        try:
            request = steps.send(output)
        except StopIteration as done:
            return cast("T", done.value)


def generate_parsed(
    llm: LLM,
    messages: Sequence[ChatMessage],
    parse: Callable[[str], T],
    *,
    retries: int = 1,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    stop: Sequence[str] | None = None,
) -> T:
    """Call ``llm``, parse its answer, and on failure ask again with the error fed back.

    Prefer :func:`memories_core.prompts.spec.run_spec` for this package's prompts: it also
    uses the model's structured-output modes.

    Args:
        llm: Any :class:`~memories_core.interfaces.LLM`.
        messages: The prompt (not mutated).
        parse: A parser that raises ``ParseError`` on bad output, e.g.
            ``lambda t: parse_tagged(t, ["Decision"], required=["Decision"])``.
        retries: Repair attempts after the first answer (default one; capped at 3).
        max_tokens: Passed to the model.
        temperature: Passed to the model.
        stop: Passed to the model.

    Returns:
        What ``parse`` returns.

    Raises:
        ParseError: if the last attempt still does not parse (chained to its cause).
        LLMError: if the model call fails (not retried here: that is the backend's job).
    """
    request = LLMRequest(tuple(messages), max_tokens, temperature, stop)
    return drive(llm, parse_steps(request, parse, retries=retries))


async def agenerate_parsed(
    llm: LLM,
    messages: Sequence[ChatMessage],
    parse: Callable[[str], T],
    *,
    retries: int = 1,
    max_tokens: int | None = None,
    temperature: float = 0.0,
    stop: Sequence[str] | None = None,
) -> T:
    """Async twin of :func:`generate_parsed` (same arguments and errors)."""
    request = LLMRequest(tuple(messages), max_tokens, temperature, stop)
    return await adrive(llm, parse_steps(request, parse, retries=retries))
