"""Value types shared by every mechanism and adapter.

All types are immutable dataclasses so that a recall handed to an adapter can never be
changed behind the memory's back. Times are timezone-aware UTC datetimes; naive datetimes
given by a caller are taken to be UTC.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from memories_core.errors import InvalidInputError, MissingUserError

__all__ = [
    "RECORD_FIELDS",
    "RESERVED_METADATA_KEYS",
    "STATE_FIELDS",
    "ChatMessage",
    "MemoryRecord",
    "Recall",
    "RecordState",
    "Scope",
    "ScoredRecord",
    "Turn",
    "check_metadata",
    "check_owner_id",
    "check_user_id",
    "ensure_utc",
    "holds_lone_surrogate",
    "is_reserved_user_id",
    "new_id",
    "texts_from_turns",
    "turns_from_texts",
    "utcnow",
    "without_surrogates",
]

#: Largest turn accepted, in characters. A 1 MB message fits; larger input raises.
MAX_TURN_CHARS = 4_000_000

#: Longest user id accepted, in characters.
MAX_USER_ID_CHARS = 1024

#: Smallest and largest integer stored in metadata: the signed 64-bit range every backend
#: (SQLite, PostgreSQL ``jsonb`` filters, Chroma, pgvector) holds exactly.
MIN_META_INT = -(2**63)
MAX_META_INT = 2**63 - 1

#: Immutable record fields a filter can name (``memories_core.filters``).
RECORD_FIELDS: frozenset[str] = frozenset({"id", "kind", "session_id", "created_at"})

#: Mutable record-state fields a filter can name; they live apart from the text and vector.
STATE_FIELDS: frozenset[str] = frozenset(
    {
        "strength",
        "recall_count",
        "last_recalled_at",
        "tier",
        "valid_from",
        "valid_until",
        "archived",
    }
)

#: Metadata keys a caller may not set: they name record fields, record state, or are written
#: by the library itself (``role``, ``speaker`` and ``batch_id`` of turns).
RESERVED_METADATA_KEYS: frozenset[str] = (
    RECORD_FIELDS
    | STATE_FIELDS
    | frozenset({"user_id", "text", "source_ids", "state", "attrs", "role", "speaker", "batch_id"})
)


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
    return without_surrogates(text)


def holds_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a lone UTF-16 surrogate: no UTF-8 store can keep it.

    Names (user ids, keys) that hold one are refused; texts take :func:`without_surrogates`.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def without_surrogates(text: str) -> str:
    """``text`` with each lone UTF-16 surrogate (not storable as UTF-8) replaced by U+FFFD."""
    if holds_lone_surrogate(text):
        text = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
    return text


def is_reserved_user_id(user_id: str) -> bool:
    """Whether ``user_id`` is in the library's own namespace: it starts and ends with ``__``.

    The library keeps store-wide data under such owners (EMG's selection policy belongs to
    ``__emg_store__``); a caller who could save, import or delete as one of them would
    install or remove what every user is served with.
    """
    return len(user_id) >= 4 and user_id.startswith("__") and user_id.endswith("__")


def check_owner_id(owner: Any) -> str:
    """Validate the owner of stored data: a user id, or one of the library's reserved owners.

    The rules of :func:`check_user_id` except the reserved namespace; only the library calls
    this, where it stores data under its own owners (artifacts of a whole store).

    Raises:
        MissingUserError: if ``owner`` is not a string or is empty or only whitespace.
        InvalidInputError: if it holds a lone surrogate or NUL, or is too long.
    """
    if not isinstance(owner, str) or not owner.strip():
        raise MissingUserError("user_id is required and must be a non-empty string")
    if len(owner) > MAX_USER_ID_CHARS:
        raise InvalidInputError(f"user_id is longer than {MAX_USER_ID_CHARS} characters")
    if holds_lone_surrogate(owner):
        raise InvalidInputError("user_id holds a lone surrogate and is not valid Unicode")
    if "\x00" in owner:
        raise InvalidInputError("user_id may not contain NUL characters")
    return owner


def check_user_id(user_id: Any) -> str:
    """Validate a user id given by a caller.

    A non-empty string of valid Unicode without NUL, at most 1,024 characters, and not in the
    library's reserved namespace (:func:`is_reserved_user_id`: ids that start and end with
    ``__``, such as EMG's store-wide policy owner ``__emg_store__``).

    Raises:
        MissingUserError: if ``user_id`` is not a string or is empty or only whitespace.
        InvalidInputError: if it holds a lone surrogate (it could not be stored as UTF-8,
            and silently replacing it would merge two users) or NUL, is too long, or is
            reserved.
    """
    check_owner_id(user_id)
    if is_reserved_user_id(user_id):
        raise InvalidInputError(
            f"user_id {user_id!r} is reserved: ids that start and end with '__' belong to "
            "the library's store-wide data"
        )
    return user_id


def _check_meta_key_text(key: str) -> None:
    """A metadata key is a name: one with a lone surrogate is refused, not replaced."""
    if holds_lone_surrogate(key):
        raise InvalidInputError(f"metadata key {key!r} holds a lone surrogate (not valid Unicode)")


def _check_meta_value(value: Any, path: str) -> Any:
    if value is None or isinstance(value, (str, bool)):
        if isinstance(value, str):
            return clean_text(value, what=path) if value.strip() else value
        return value
    if isinstance(value, int):
        if not MIN_META_INT <= value <= MAX_META_INT:
            raise InvalidInputError(
                f"metadata {path} is {value}; integers are stored in the signed 64-bit range "
                "(store a larger number as a string)"
            )
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(f"metadata {path} is {value!r}; only finite numbers are stored")
        return value
    if isinstance(value, datetime):
        return ensure_utc(value).isoformat()
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInputError(f"metadata {path} has a non-string key {key!r}")
            _check_meta_key_text(key)
            out[key] = _check_meta_value(item, f"{path}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [_check_meta_value(item, f"{path}[{i}]") for i, item in enumerate(value)]
    raise InvalidInputError(
        f"metadata {path} has a {type(value).__name__}; use str, int, float, bool, None, "
        "datetime, lists or dicts of those"
    )


def check_metadata(
    metadata: Any, *, allow_reserved: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Validate caller metadata before anything is stored.

    Keys must be non-empty strings without NUL or lone surrogates, not start with ``$`` or
    ``chroma:`` (vector backends reject or reinterpret those) and not be one of
    :data:`RESERVED_METADATA_KEYS` (they would collide with record fields and filters).
    String values take :func:`clean_text`'s fallback. Values must be JSON-representable
    with finite numbers and integers in the signed 64-bit range (:data:`MIN_META_INT` to
    :data:`MAX_META_INT`: a vector index refuses larger ones, and a record it refuses would
    stay unindexed); datetimes become ISO-8601 UTC strings.

    Args:
        metadata: The mapping to check.
        allow_reserved: Reserved keys the library itself may write (e.g. ``role``).

    Returns:
        A plain, validated copy.

    Raises:
        InvalidInputError: on any violation; nothing is stored.
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"metadata must be a mapping, got {type(metadata).__name__}")
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        if not isinstance(key, str) or not key.strip():
            raise InvalidInputError(f"metadata keys must be non-empty strings, got {key!r}")
        if "\x00" in key or key.startswith(("$", "chroma:")) or key.startswith("attrs."):
            raise InvalidInputError(f"metadata key {key!r} is not allowed")
        _check_meta_key_text(key)
        if key in RESERVED_METADATA_KEYS and key not in allow_reserved:
            raise InvalidInputError(
                f"metadata key {key!r} is reserved (it names a record field or is written by "
                "the library); rename it"
            )
        out[key] = _check_meta_value(value, repr(key))
    try:
        json.dumps(out, allow_nan=False)
    except (TypeError, ValueError) as exc:  # pragma: no cover - guarded above
        raise InvalidInputError(f"metadata is not JSON-serialisable: {exc}") from exc
    return out


def check_timestamp(value: Any, *, what: str = "timestamp") -> datetime | None:
    """Validate an optional timestamp; naive datetimes are taken to be UTC.

    Raises:
        InvalidInputError: if ``value`` is neither ``None`` nor a ``datetime`` (a string or a
            number is refused rather than guessed at).
    """
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidInputError(
            f"{what} must be a datetime or None, got {type(value).__name__} {value!r}"
        )
    return ensure_utc(value)


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
        if self.speaker is not None and (not isinstance(self.speaker, str) or not self.speaker):
            raise InvalidInputError("Turn.speaker must be a non-empty string or None")
        # The same fallback as the content's: a lone surrogate could not be stored.
        object.__setattr__(self, "role", without_surrogates(self.role))
        if self.speaker is not None:
            object.__setattr__(self, "speaker", without_surrogates(self.speaker))
        object.__setattr__(self, "content", clean_text(self.content, what="Turn.content"))
        object.__setattr__(
            self, "timestamp", check_timestamp(self.timestamp, what="Turn.timestamp")
        )
        object.__setattr__(self, "metadata", MappingProxyType(check_metadata(self.metadata)))

    @property
    def label(self) -> str:
        """The name shown before the content: the speaker if known, else the role."""
        return self.speaker or self.role

    def render(self) -> str:
        """Render as ``"label: content"`` (Yuan et al. §3.1, history-based memory)."""
        return f"{self.label}: {self.content}"


def turns_from_texts(texts: Iterable[tuple[str, str]]) -> list[Turn]:
    """Turns for the ``(role, text)`` pairs a framework's run produced, ready to save.

    For the adapters that save a run after the model answered (LangChain's middleware and
    legacy memory, LlamaIndex's memory block, the MemoChat chat loops), where refusing a
    text would fail the user's run and lose the turns with it. Documented fallbacks:

    * a text that is empty or only whitespace (a model's empty reply) is skipped, and the
      other texts are kept;
    * a text over :data:`MAX_TURN_CHARS` is kept whole, as consecutive turns of at most that
      many characters, cut after a space or a newline where one falls in the last tenth of
      a part; each part's metadata says ``part`` (from 1) and ``parts``. Parts that are
      only whitespace are dropped.

    Raises:
        InvalidInputError: if a role or a text is not a string.
    """
    turns: list[Turn] = []
    for role, text in texts:
        if not isinstance(text, str):
            raise InvalidInputError(f"a {role!r} text must be a str, got {type(text).__name__}")
        if not text.strip():
            continue
        if len(text) <= MAX_TURN_CHARS:
            turns.append(Turn(role, text))
            continue
        parts = [part for part in _cut(text, MAX_TURN_CHARS) if part.strip()]
        turns += [
            Turn(role, part, metadata={"part": n, "parts": len(parts)})
            for n, part in enumerate(parts, start=1)
        ]
    return turns


def texts_from_turns(turns: Iterable[Turn]) -> list[tuple[str, str]]:
    """The ``(role, text)`` pairs of stored turns: the inverse of :func:`turns_from_texts`.

    Consecutive parts of one text (metadata ``part`` 1..``parts``) are joined again; every
    other turn is one pair.
    """
    pairs: list[tuple[str, str]] = []
    pending: list[str] = []
    for turn in turns:
        part, parts = turn.metadata.get("part"), turn.metadata.get("parts")
        if isinstance(part, int) and isinstance(parts, int) and parts > 1:
            pending.append(turn.content)
            if part < parts:
                continue
        pairs.append((turn.role, "".join(pending) or turn.content))
        pending = []
    return pairs


def _cut(text: str, size: int) -> list[str]:
    """``text`` in pieces of at most ``size`` characters, cut after a space or newline if near."""
    pieces = []
    start = 0
    while len(text) - start > size:
        end = start + size
        space = max(text.rfind(" ", end - size // 10, end), text.rfind("\n", end - size // 10, end))
        if space > start:
            end = space + 1
        pieces.append(text[start:end])
        start = end
    pieces.append(text[start:])
    return pieces


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
        check_user_id(self.user_id)
        if self.session_id is not None and (
            not isinstance(self.session_id, str) or not self.session_id.strip()
        ):
            raise InvalidInputError("Scope.session_id must be a non-empty string or None")
        if self.session_id is not None:
            check_owner_id(self.session_id)  # valid Unicode, bounded length, no NUL


#: RecordState's datetime fields (ISO strings in its JSON form).
_STATE_TIMES = ("last_recalled_at", "valid_from", "valid_until")


@dataclass(frozen=True)
class RecordState:
    """The mutable part of a record: changed after it is written, never re-embedded.

    Mechanisms write it through :meth:`~memories_core.engine.MemoryEngine.update_state`; each
    change is kept in the user's update history with its reason.

    Attributes:
        strength: Memory strength S (MemoryBank §2.3: starts at 1, grows on recall).
        recall_count: How often the record was recalled (and reinforced).
        last_recalled_at: When it was last recalled (``None``: never).
        tier: A mechanism's tier label (e.g. DPeM's ``"stm"`` / ``"ltm"``).
        valid_from: Start of validity (``None``: since written).
        valid_until: End of validity (EMG-RAG §4.2: an expired memory is not recalled).
        archived: Forgotten or superseded: kept, listed, restorable, never recalled.
        attrs: Mechanism-specific mutable values (JSON), e.g. a recurrence count.
    """

    strength: float = 1.0
    recall_count: int = 0
    last_recalled_at: datetime | None = None
    tier: str | None = None
    valid_from: datetime | None = None
    valid_until: datetime | None = None
    archived: bool = False
    attrs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in _STATE_TIMES:
            object.__setattr__(self, name, check_timestamp(getattr(self, name), what=name))
        object.__setattr__(self, "attrs", MappingProxyType(dict(self.attrs)))

    def is_live(self, now: datetime) -> bool:
        """Whether the record may be recalled at ``now`` (not archived, inside its validity)."""
        if self.archived:
            return False
        if self.valid_until is not None and self.valid_until <= now:
            return False
        return not (self.valid_from is not None and self.valid_from > now)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (datetimes as ISO strings), used by the update history."""
        return {
            "strength": self.strength,
            "recall_count": self.recall_count,
            "last_recalled_at": _iso(self.last_recalled_at),
            "tier": self.tier,
            "valid_from": _iso(self.valid_from),
            "valid_until": _iso(self.valid_until),
            "archived": self.archived,
            "attrs": dict(self.attrs),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecordState:
        """The state that :meth:`to_json` wrote (ISO strings back to datetimes)."""
        times = {
            name: None if data.get(name) is None else datetime.fromisoformat(data[name])
            for name in _STATE_TIMES
        }
        return cls(
            strength=float(data["strength"]),
            recall_count=int(data["recall_count"]),
            tier=data.get("tier"),
            archived=bool(data.get("archived", False)),
            attrs=dict(data.get("attrs") or {}),
            **times,
        )


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


@dataclass(frozen=True)
class MemoryRecord:
    """One stored memory: a raw turn, a summary, a note, ...

    Attributes:
        id: Unique id (the store owns ids; mechanisms create them with :func:`new_id`).
        user_id: Owner. Never empty.
        kind: What the record is (``"turn"``, ``"summary"``, ``"conditional"``, ...).
        text: The text that is retrieved and shown to the model (a lone surrogate, which a
            model's reply can hold, becomes U+FFFD as in :func:`clean_text`).
        created_at: When the memory was formed (for a turn, when it was said).
        session_id: Session the record came from, if any.
        metadata: Free JSON-serialisable metadata.
        source_ids: Ids of the records this one was derived from (e.g. a summary's turns).
        state: The mutable state (strength, tier, validity, ...); see :class:`RecordState`.
    """

    id: str
    user_id: str
    kind: str
    text: str
    created_at: datetime
    session_id: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    source_ids: tuple[str, ...] = ()
    state: RecordState = field(default_factory=RecordState)

    def __post_init__(self) -> None:
        if not self.user_id:
            raise MissingUserError("MemoryRecord.user_id is required")
        if not isinstance(self.kind, str) or not self.kind:
            raise InvalidInputError("MemoryRecord.kind must be a non-empty string")
        if isinstance(self.text, str):  # a model's reply may hold one: the turns' fallback
            object.__setattr__(self, "text", without_surrogates(self.text))
        object.__setattr__(self, "created_at", ensure_utc(self.created_at))
        object.__setattr__(self, "metadata", MappingProxyType(dict(self.metadata)))
        object.__setattr__(self, "source_ids", tuple(self.source_ids))


@dataclass(frozen=True)
class ScoredRecord:
    """A record with its retrieval score (higher is more relevant).

    ``score`` is on the scale of the pipeline that produced it (fused ranks, reranker logits,
    decayed similarities), so it is unbounded; :attr:`relevance` is a similarity in
    ``[0, 1]`` for frameworks that expect one there.

    Attributes:
        record: The record.
        score: The pipeline's own score (the ranking order).
        similarity: Cosine similarity of the query to the record's vector when the dense
            source returned the record (through a search key: the best of its texts);
            ``None`` for a record that only another source or a reranker brought in.
    """

    record: MemoryRecord
    score: float
    similarity: float | None = None

    @property
    def relevance(self) -> float:
        """A similarity in ``[0, 1]``: the dense cosine when known, else the score mapped.

        With :attr:`similarity`, the cosine clamped into ``[0, 1]`` (as LangGraph stores
        score: an exact match is 1.0, so a similarity cutoff keeps it). Without it,
        ``score`` mapped by the logistic function (monotone in ``score``; 0.5 at 0).
        """
        if self.similarity is not None and not math.isnan(self.similarity):
            return min(1.0, max(0.0, float(self.similarity)))
        if self.score >= 0:
            return 1.0 / (1.0 + math.exp(-self.score))
        z = math.exp(self.score)  # no overflow for very negative scores
        return z / (1.0 + z)

    def to_metadata(self) -> dict[str, Any]:
        """The metadata an adapter attaches to a document or node, the same in every adapter.

        The record's own metadata comes first; the library's keys are written last, so free
        metadata can never spoof them: ``record_id``, ``kind``, ``score`` and
        ``fused_score`` (the pipeline's own score), ``relevance`` (a similarity in
        ``[0, 1]``, :attr:`relevance`), ``created_at``
        (ISO 8601, UTC), ``session_id``, ``user_id``, ``source_ids``, and the state fields
        ``strength``, ``recall_count``, ``last_recalled_at``, ``valid_until``.
        """
        record = self.record
        state = record.state
        metadata: dict[str, Any] = dict(record.metadata)
        metadata.update(
            record_id=record.id,
            kind=record.kind,
            score=self.score,
            fused_score=self.score,
            relevance=self.relevance,
            created_at=record.created_at.isoformat(),
            session_id=record.session_id,
            user_id=record.user_id,
            source_ids=list(record.source_ids),
            strength=state.strength,
            recall_count=state.recall_count,
            last_recalled_at=_iso(state.last_recalled_at),
            valid_until=_iso(state.valid_until),
        )
        return metadata


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


@dataclass(frozen=True)
class StateChange:
    """One entry of a user's update history: what changed on a record, when and why.

    Attributes:
        seq: Position in the store's history (increasing).
        user_id: Owner.
        record_id: The record that changed.
        at: When the change was made.
        old: The changed fields before (JSON values; ``text`` for text edits).
        new: The same fields after.
        reason: Why, as given by the caller (``None`` if none was given).
    """

    seq: int
    user_id: str
    record_id: str
    at: datetime
    old: Mapping[str, Any]
    new: Mapping[str, Any]
    reason: str | None = None


@dataclass(frozen=True)
class JobSpec:
    """A derivation to run later (pending work as data).

    Attributes:
        mechanism: Name of the mechanism whose handler runs it.
        kind: What to derive (e.g. ``"decision"``, ``"summary"``); failures count under it.
        key: Deduplication key, unique per user and mechanism (e.g. ``"turn:<id>"``): a job
            enqueued twice exists once.
        payload: JSON input of the handler.
    """

    mechanism: str
    kind: str
    key: str
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    """A stored pending derivation.

    Attributes:
        id: Job id.
        user_id: Owner.
        mechanism: Mechanism whose handler runs it.
        kind: What it derives.
        key: Deduplication key.
        payload: JSON input (handlers may update it between attempts).
        attempts: Failed attempts so far.
        last_error: The last failure's message.
        next_attempt_at: Not retried on a save before this time (backoff).
        created_at: When it was enqueued.
    """

    id: str
    user_id: str
    mechanism: str
    kind: str
    key: str
    payload: Mapping[str, Any]
    attempts: int
    last_error: str | None
    next_attempt_at: datetime
    created_at: datetime


@dataclass(frozen=True)
class GraphNode:
    """A node of a user's graph (EMG-RAG §4.1 layers: user, type, subclass, entity)."""

    id: str
    kind: str
    label: str
    data: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class GraphEdge:
    """A directed edge of a user's graph, optionally tied to the memory record it came from."""

    id: str
    source: str
    target: str
    relation: str
    record_id: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
