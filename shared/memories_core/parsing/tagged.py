"""Tagged model output (``<Decision>: yes``) and the echo rule that keeps forged tags out.

These are the output formats of Yuan et al.'s prompts; see :func:`parse_tagged`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memories_core.errors import InvalidInputError, ParseError
from memories_core.parsing.base import check_text

__all__ = ["parse_tagged", "parse_yes_no", "strip_echoed"]

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
    text = check_text(text)
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
