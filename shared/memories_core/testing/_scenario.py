"""Scenario helpers shared by the contract suites (private: names may change)."""

from __future__ import annotations

import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from memories_core.types import MemoryRecord, Recall, Turn

_Outcome = dict[str, tuple[list[str], str]]
_BASE_TIME = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)
_SECRET_QUERY = "what is my secret code"
# Five unrelated facts, so that no mechanism merges them into one record.
_K_FACTS = (
    "I love hiking in the Alps.",
    "My sister lives in Lisbon.",
    "I am allergic to peanuts.",
    "I play the cello on weekends.",
    "My favourite hiking trail is in Norway.",
)


def _token(prefix: str = "tok") -> str:
    """A unique lower-case token that tokenizers keep whole."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def _exchange(user_text: str, reply: str, at: datetime) -> list[Turn]:
    return [
        Turn("user", user_text, timestamp=at),
        Turn("assistant", reply, timestamp=at + timedelta(seconds=1)),
    ]


def _secret_exchange(secret: str, at: datetime) -> list[Turn]:
    return _exchange(f"My secret code is {secret}.", f"Noted, your code is {secret}.", at)


def _recall_text(recall: Recall) -> str:
    return "\n".join([recall.context, *(hit.record.text for hit in recall.records)])


def _derived(recall: Recall) -> list[MemoryRecord]:
    return [hit.record for hit in recall.records if hit.record.kind != "turn"]


def _duplicates(records: Iterable[MemoryRecord]) -> list[str]:
    """Derived records that occur more than once (same kind and text, or same sources)."""
    records = list({r.id: r for r in records}.values())
    by_text = Counter((r.kind, r.text) for r in records)
    by_source = Counter((r.kind, r.source_ids) for r in records if r.source_ids)
    return [f"{kind}: {text!r} x{n}" for (kind, text), n in by_text.items() if n > 1] + [
        f"{kind} from sources {src} x{n}" for (kind, src), n in by_source.items() if n > 1
    ]


def _call_optional(memory: Any, name: str, *args: Any) -> Any:
    method = getattr(memory, name, None)
    return method(*args) if callable(method) else None


def _close(memory: Any) -> None:
    _call_optional(memory, "close")


def _glob_key(key: str, test_id: str) -> bool:
    if "*" not in key:
        return key == test_id
    pattern = ".*".join(re.escape(part) for part in key.split("*"))
    return re.fullmatch(pattern, test_id) is not None


def _every_storage(func: Callable[..., None]) -> Callable[..., None]:
    func._contract_every_storage = True  # type: ignore[attr-defined]
    return func


def _disk_only(func: Callable[..., None]) -> Callable[..., None]:
    func._contract_disk_only = True  # type: ignore[attr-defined]
    return func


def _slow(func: Callable[..., None]) -> Callable[..., None]:
    func._contract_slow = True  # type: ignore[attr-defined]
    return func
