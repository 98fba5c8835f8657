"""Value types shared by every mechanism and adapter.

All types are immutable dataclasses so that a recall handed to an adapter can never be
changed behind the memory's back. Times are timezone-aware UTC datetimes; naive datetimes
given by a caller are taken to be UTC.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from memories_core.errors import InvalidInputError, MissingUserError

__all__ = [
    "ChatMessage",
    "MemoryRecord",
    "Recall",
    "Scope",
    "ScoredRecord",
    "Turn",
    "ensure_utc",
    "new_id",
    "utcnow",
]

#: Largest turn accepted, in characters. A 1 MB message fits; larger input raises.
MAX_TURN_CHARS = 4_000_000


def utcnow() -> datetime:
    """Return the current time as an aware UTC datetime."""
    return datetime.now(timezone.utc)


def ensure_utc(value: datetime) -> datetime:
    """Return ``value`` as an aware UTC datetime (naive values are taken to be UTC)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc)


def new_id() -> str:
    """Return a new random record id (hex uuid4)."""
    return uuid.uuid4().hex


def clean_text(text: str, *, what: str = "text") -> str:
    """Validate and normalise user text.

    Documented fallback: lone UTF-16 surrogates (which cannot be stored as UTF-8) are
    replaced by U+FFFD; every other character, NUL and control characters included, is kept.

    Raises:
        InvalidInputError: if ``text`` is not a string, is empty or only whitespace, or is
            longer than :data:`MAX_TURN_CHARS`.
    """
    if not isinstance(text, str):
        raise InvalidInputError(f"{what} must be a str, got {type(text).__name__}")
    if not text.strip():
        raise InvalidInputError(f"{what} is empty or only whitespace")
    if len(text) > MAX_TURN_CHARS:
        raise InvalidInputError(f"{what} has {len(text)} characters; the limit is {MAX_TURN_CHARS}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return text


@dataclass(frozen=True)
class ChatMessage:
    """One message of a prompt sent to an :class:`~memories_core.interfaces.LLM`.

    Attributes:
        role: ``"system"``, ``"user"`` or ``"assistant"``.
        content: The message text.
    """

    role: str
    content: str

    def to_dict(self) -> dict[str, str]:
        """Return the OpenAI-style ``{"role": ..., "content": ...}`` dict."""
        return {"role": self.role, "content": self.content}


@dataclass(frozen=True)
class Turn:
    """One utterance of a dialogue.

    Attributes:
        role: Who spoke, as the chat model sees it: ``"user"``, ``"assistant"``, ``"system"``
            or any other label.
        content: What was said. Must not be empty.
        speaker: Optional speaker name, so that dialogues between two named people (LoCoMo)
            fit; rendered instead of the role when set.
        timestamp: When it was said (UTC); ``None`` means "when saved".
        metadata: Free metadata, kept verbatim on the stored record (JSON-serialisable).
    """

    role: str
    content: str
    speaker: str | None = None
    timestamp: datetime | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.role, str) or not self.role.strip():
            raise InvalidInputError("Turn.role must be a non-empty string")
        object.__setattr__(self, "content", clean_text(self.content, what="Turn.content"))
        if self.timestamp is not None:
            object.__setattr__(self, "timestamp", ensure_utc(self.timestamp))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))

    @property
    def label(self) -> str:
        """The name shown before the content: the speaker if known, else the role."""
        return self.speaker or self.role

    def render(self) -> str:
        """Render as ``"label: content"`` (Yuan et al. §3.1, history-based memory)."""
        return f"{self.label}: {self.content}"


@dataclass(frozen=True)
class Scope:
    """Who a read or write belongs to.

    Attributes:
        user_id: Required on every read and write; enforced inside backend queries.
        session_id: Optional dialogue session; mechanisms that summarise sessions use it.
    """

    user_id: str
    session_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.user_id, str) or not self.user_id.strip():
            raise MissingUserError("Scope.user_id is required and must be a non-empty string")
        if self.session_id is not None and not isinstance(self.session_id, str):
            raise InvalidInputError("Scope.session_id must be a string or None")


@dataclass(frozen=True)
class MemoryRecord:
    """One stored memory: a raw turn, a summary, a note, ...

    Attributes:
        id: Unique id (the store owns ids; mechanisms create them with :func:`new_id`).
        user_id: Owner. Never empty.
        kind: What the record is (``"turn"``, ``"summary"``, ``"conditional"``, ...).
        text: The text that is retrieved and shown to the model.
        created_at: When the memory was formed (for a turn, when it was said).
        session_id: Session the record came from, if any.
        metadata: Free JSON-serialisable metadata.
        source_ids: Ids of the records this one was derived from (e.g. a summary's turns).
    """

    id: str
    user_id: str
    kind: str
    text: str
    created_at: datetime
    session_id: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    source_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.user_id:
            raise MissingUserError("MemoryRecord.user_id is required")
        object.__setattr__(self, "created_at", ensure_utc(self.created_at))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))
        object.__setattr__(self, "source_ids", tuple(self.source_ids))


@dataclass(frozen=True)
class ScoredRecord:
    """A record with its retrieval score (higher is more relevant)."""

    record: MemoryRecord
    score: float


@dataclass(frozen=True)
class Recall:
    """What a mechanism recalled for one query.

    Attributes:
        query: The query as given.
        records: The recalled records, best first.
        context: The records rendered as one block of text, ready to put into a prompt.
    """

    query: str
    records: tuple[ScoredRecord, ...] = ()
    context: str = ""

    def __bool__(self) -> bool:
        return bool(self.records)
