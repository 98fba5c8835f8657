"""Reading a user's records and history, and the record-key checks writes share."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from memories_core.engine_parts.base import EngineBase
from memories_core.types import (
    MemoryRecord,
    StateChange,
    check_user_id,
)

if TYPE_CHECKING:
    from memories_core.interfaces import (
        Filter,
    )

__all__ = ["EngineReads"]


class EngineReads(EngineBase):
    """The engine's reads: a user's records and history, and the key checks writes share."""

    def history(self, user_id: str, *, record_id: str | None = None) -> list[StateChange]:
        """``user_id``'s update history (state changes, text edits, deletions), oldest first."""
        return list(self.store.history(check_user_id(user_id), record_id=record_id))

    # ------------------------------------------------------------------ read path
    def get(self, user_id: str, ids: Sequence[str]) -> list[MemoryRecord]:
        """``user_id``'s records with these ids (with their state), in the given order."""
        return list(self.store.get(list(ids), user_id=check_user_id(user_id)))

    def records(
        self,
        user_id: str,
        *,
        where: Filter | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int | None = None,
    ) -> list[MemoryRecord]:
        """``user_id``'s records matching ``where``, oldest first."""
        return list(
            self.store.list(
                user_id=check_user_id(user_id), where=where, since=since, until=until, limit=limit
            )
        )

    def users(self) -> list[str]:
        """Every user with at least one record."""
        return list(self.store.users())

    def _check_keys(self, records: Sequence[MemoryRecord]) -> None:
        """Reject search keys whose target is missing or another user's (retrieval.keys)."""
        from memories_core.retrieval.keys import SEARCH_KEY_KIND, check_keys

        if any(r.kind == SEARCH_KEY_KIND for r in records):
            check_keys(records, lambda ids, user_id: self.store.get(list(ids), user_id=user_id))

    def _with_keys(self, user_id: str, ids: Sequence[str]) -> list[str]:
        """``ids`` plus the ids of the search keys that point to them."""
        from memories_core.retrieval.keys import SEARCH_KEY_KIND, key_filter

        ids = list(dict.fromkeys(ids))
        if not ids or not self.store.list(
            user_id=user_id, where={"kind": SEARCH_KEY_KIND}, limit=1
        ):
            return ids
        keys: list[str] = []
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            found = self.store.list(user_id=user_id, where=key_filter(chunk))
            keys += [r.id for r in found if r.id not in chunk]
        return ids + list(dict.fromkeys(keys))
