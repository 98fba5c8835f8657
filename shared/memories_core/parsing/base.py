"""The guard every parser applies to model output before reading it."""

from __future__ import annotations

from memories_core.errors import ParseError

# Inputs above this size are not worth rescuing, and bound the cost of the repair passes.
MAX_PARSE_CHARS = 1_000_000


def check_text(text: str) -> str:
    """Return ``text`` if it is a non-empty ``str`` of at most :data:`MAX_PARSE_CHARS`.

    Raises:
        ParseError: otherwise (model output is untrusted, and an empty reply is not an
            empty answer).
    """
    if not isinstance(text, str):
        raise ParseError(f"expected model output as str, got {type(text).__name__}", "")
    if not text.strip():
        raise ParseError("the model output is empty", text)
    if len(text) > MAX_PARSE_CHARS:
        raise ParseError(
            f"the model output has {len(text)} characters; the limit is {MAX_PARSE_CHARS}",
            text[:1000],
        )
    return text
