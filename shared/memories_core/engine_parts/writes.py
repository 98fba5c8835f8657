"""Writes: turns, records, state and text edits, deletions, and the sessions they open and end."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memories_core.engine_parts.jobs import EngineJobs
from memories_core.engine_parts.rules import _SESSION_KEY, check_scope, check_turns, turn_metadata
from memories_core.errors import (
    InvalidInputError,
)
from memories_core.types import (
    JobSpec,
    MemoryRecord,
    Scope,
    StateChange,
    Turn,
    check_user_id,
    new_id,
)

if TYPE_CHECKING:
    from memories_core.artifacts import ArtifactInfo

__all__ = ["EngineWrites"]


class EngineWrites(EngineJobs):
    """The engine's writes: turns, records, state, text edits, deletions and sessions."""

    # ------------------------------------------------------------------ write path
    def save(self, turns: Sequence[Turn], scope: Scope) -> list[MemoryRecord]:
        """Store turns, create the attached mechanisms' jobs, index, then derive.

        The turns, the session bookkeeping and the jobs are one transaction: after it
        returns nothing can lose them. The turns are indexed before ``save`` returns. The
        derivations (model calls) run in the background worker (default; :meth:`flush`
        waits for them) or, with ``derive="inline"``, here; if they fail the turns stay,
        the failure is counted, and the work is retried later.

        Raises:
            InvalidInputError: if ``turns`` or ``scope`` is malformed (nothing is stored).
        """
        scope = check_scope(scope)
        checked = check_turns(turns)
        if not checked:
            return []
        self._finish_deletion(scope.user_id)
        records, new_jobs = self._write_turns(checked, scope)
        self._index_pending()
        self._derive(scope.user_id, new_jobs)
        return records

    def _derive(self, user_id: str, first: Sequence[str]) -> None:
        """Run a save's (or session end's) jobs: hand them to the worker, or run them now."""
        if self._worker is None:
            self.run_pending(user_id, first=first, inline=True)
        elif first or self.store.jobs(user_id=user_id, mechanisms=list(self._hooks), limit=1):
            self._worker.wake(user_id)

    def write_turns(self, turns: Sequence[Turn], scope: Scope) -> list[MemoryRecord]:
        """Store turns and create jobs, without indexing or running jobs (see :meth:`save`)."""
        scope = check_scope(scope)
        checked = check_turns(turns)
        if not checked:
            return []
        self._finish_deletion(scope.user_id)
        return self._write_turns(checked, scope)[0]

    def _write_turns(self, turns: list[Turn], scope: Scope) -> tuple[list[MemoryRecord], list[str]]:
        now = self.clock.now()
        batch = new_id()[:16]
        with self.store.transaction():
            session_id, ended = self._route(scope, [t.timestamp or now for t in turns])
            records = [
                MemoryRecord(
                    id=new_id(),
                    user_id=scope.user_id,
                    kind="turn",
                    text=turn.render(),
                    created_at=turn.timestamp or now,
                    session_id=session_id,
                    metadata=turn_metadata(turn, batch),
                )
                for turn in turns
            ]
            self.store.add(records, indexed=self._index_turns)
            specs = self._session_end_jobs(scope.user_id, ended)
            for hooks in self._hooks.values():
                if hooks.on_turns is not None:
                    specs += list(hooks.on_turns(records))
            self.store.add_jobs(scope.user_id, specs, now=now)
        if not specs:
            return records, []
        keys = {(s.mechanism, s.key) for s in specs}
        new_jobs = [
            j.id
            for j in self.store.jobs(user_id=scope.user_id, mechanisms=list(self._hooks))
            if (j.mechanism, j.key) in keys
        ]
        return records, new_jobs

    def add_records(
        self,
        records: Sequence[MemoryRecord],
        *,
        replace: Sequence[str] = (),
        index: bool = True,
        state: Mapping[str, Mapping[str, Any]] | None = None,
        reason: str | None = None,
    ) -> None:
        """Store records (delete ``replace``, set ``state``) in one transaction, then index them.

        Args:
            records: The records (of one user when ``replace`` or ``state`` is given).
            replace: Ids of that user's records deleted in the same transaction.
            index: Whether the records get vectors.
            state: State changes (record id -> ``{field: value}``) of the new records, written
                in the same transaction, so that e.g. a validity end can never be missing.
            reason: Kept in the update history for ``state``.

        Search keys (``kind="search_key"``, ``metadata["key_for"]`` = a record of the same
        user, stored before or in this call) make that record easier to find; deleting a
        record, here through ``replace`` or elsewhere, deletes its keys.

        Raises:
            InvalidInputError: if records of several users are mixed with ``replace``/``state``.
            SearchKeyError: if a search key points to a missing record or another user's.
        """
        owners = {r.user_id for r in records}
        if (replace or state) and len(owners) > 1:
            raise InvalidInputError("replace= and state= need records of one user")
        with self.store.transaction():
            self._check_keys(records)
            self.store.add(records, indexed=index)
            if replace:
                replace = self._with_keys(next(iter(owners)), replace)
                self.store.delete(list(replace), user_id=next(iter(owners)))
            if state and owners:
                self.store.update_state(
                    next(iter(owners)), state, at=self.clock.now(), reason=reason
                )
        if replace:
            self._drop_vectors(next(iter(owners)), replace)
        self._index_pending()

    def update_state(
        self,
        user_id: str,
        changes: Mapping[str, Mapping[str, Any]],
        *,
        reason: str | None = None,
        at: datetime | None = None,
    ) -> list[StateChange]:
        """Change records' mutable state; never calls the embedder.

        Args:
            user_id: Owner (other users' ids are skipped).
            changes: Record id -> ``{field: value}``; fields are those of
                :class:`~memories_core.types.RecordState` (``attrs`` merges).
            reason: Why; kept in the update history.
            at: When (default: now).

        Returns:
            The history entries written.
        """
        check_user_id(user_id)
        return list(
            self.store.update_state(user_id, changes, at=at or self.clock.now(), reason=reason)
        )

    def edit_text(
        self, user_id: str, record_id: str, text: str, *, reason: str | None = None
    ) -> bool:
        """Replace a record's text; only that record is re-embedded. Kept in the history.

        Returns:
            Whether the record existed.
        """
        from memories_core.types import clean_text

        check_user_id(user_id)
        text = clean_text(text)
        with self.store.transaction():
            old = self.store.edit_text(record_id, text, user_id=user_id)
            if old is None:
                return False
            self.store.add_history(
                user_id,
                record_id,
                old={"text": old},
                new={"text": text},
                at=self.clock.now(),
                reason=reason,
            )
        self._index_pending()
        return True

    def set_user_state(self, user_id: str, key: str, value: Any) -> None:
        """Write one key of ``user_id``'s key-value state (a mechanism's bookkeeping).

        The rules of every engine write apply: the user id is checked, the key must be a
        non-empty string and the value JSON with finite numbers (checked before anything is
        written), a deletion of the user left pending is finished first, and the write joins
        a transaction the caller holds (so a hook's write commits with the turns it was
        planned for, or not at all). ``None`` removes the key.

        Raises:
            InvalidInputError: on a bad user id, key or value (nothing is written).
        """
        check_user_id(user_id)
        if not isinstance(key, str) or not key.strip():
            raise InvalidInputError(f"a state key must be a non-empty string, got {key!r}")
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"state {key!r} must be JSON with finite numbers") from exc
        self._finish_deletion(user_id)
        with self.store.transaction():
            self.store.set_state(key, value, user_id=user_id)

    def put_artifact(
        self,
        owner: str,
        name: str,
        files: Mapping[str, bytes],
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> ArtifactInfo | None:
        """Write (or replace) an artifact of ``owner``: a user, or a store-wide owner.

        An owner being deleted gets nothing: the deletion is finished and ``None`` returned,
        so a background job (a model call, a training run) that outlives a ``delete_user``
        cannot leave that user's data behind. Otherwise the artifact store's rules apply
        (names checked, files staged and registered atomically).

        Raises:
            InvalidInputError: on a bad owner, name or file name (nothing is written).
        """
        if self.store.is_deleting(owner):
            self._finish_deletion(owner)
            return None
        return self.artifacts.put(owner, name, files, meta=meta)

    def delete_records(
        self, user_id: str, ids: Sequence[str], *, reason: str | None = None, erase: bool = False
    ) -> int:
        """Delete some of ``user_id``'s records (text and vectors).

        Args:
            user_id: Owner (other users' ids are skipped).
            ids: Records to delete.
            reason: Kept in the update history.
            erase: Keep no copy of the text in the history (only that the record was deleted,
                when and why); otherwise the history keeps the old text, as an audit trail.

        Returns:
            How many records were deleted (the records' search keys included).
        """
        check_user_id(user_id)
        found = self.store.get(self._with_keys(user_id, ids), user_id=user_id)
        if not found:
            return 0
        now = self.clock.now()
        with self.store.transaction():
            for record in found:
                old = {"kind": record.kind} if erase else {"text": record.text, "kind": record.kind}
                self.store.add_history(
                    user_id, record.id, old=old, new={"deleted": True}, at=now, reason=reason
                )
            self.store.delete([r.id for r in found], user_id=user_id)
        self._drop_vectors(user_id, [r.id for r in found])
        return len(found)

    # ------------------------------------------------------------------ sessions
    def _route(self, scope: Scope, times: Sequence[datetime]) -> tuple[str, list[str]]:
        """Return the session of new turns and the sessions they end (inside a transaction)."""
        opened = self.store.get_state(_SESSION_KEY, user_id=scope.user_id)
        ended: list[str] = []
        session_id: str | None = None
        if opened:
            last_at = datetime.fromisoformat(opened["last_at"])
            same = scope.session_id in (None, opened["session_id"])
            idle = self.session_gap is not None and times[0] - last_at > self.session_gap
            if same and not idle:
                session_id = str(opened["session_id"])
            else:
                ended.append(str(opened["session_id"]))
        if session_id is None:
            session_id = scope.session_id or f"auto-{new_id()[:12]}"
        last = max(
            [
                *times,
                *(
                    [datetime.fromisoformat(opened["last_at"])]
                    if opened and session_id == opened["session_id"]
                    else []
                ),
            ]
        )
        self.store.set_state(
            _SESSION_KEY,
            {"session_id": session_id, "last_at": last.isoformat()},
            user_id=scope.user_id,
        )
        return session_id, ended

    def _session_end_jobs(self, user_id: str, ended: Sequence[str]) -> list[JobSpec]:
        specs: list[JobSpec] = []
        for session_id in ended:
            for hooks in self._hooks.values():
                if hooks.on_session_end is not None:
                    specs += list(hooks.on_session_end(user_id, session_id))
        return specs

    def open_session(self, user_id: str) -> str | None:
        """The id of ``user_id``'s open session, if any."""
        opened = self.store.get_state(_SESSION_KEY, user_id=check_user_id(user_id))
        return None if not opened else str(opened["session_id"])

    def end_session(self, scope: Scope) -> list[str]:
        """End the user's open session (or ``scope.session_id``); derive what it creates.

        Like :meth:`save`, the jobs run in the background worker unless ``derive="inline"``.

        Returns:
            The sessions ended.
        """
        scope = check_scope(scope)
        now = self.clock.now()
        with self.store.transaction():
            opened = self.store.get_state(_SESSION_KEY, user_id=scope.user_id)
            ended: list[str] = []
            if opened and scope.session_id in (None, opened["session_id"]):
                ended.append(str(opened["session_id"]))
                self.store.set_state(_SESSION_KEY, None, user_id=scope.user_id)
            elif scope.session_id is not None:
                ended.append(scope.session_id)
            specs = self._session_end_jobs(scope.user_id, ended)
            self.store.add_jobs(scope.user_id, specs, now=now)
        keys = {(s.mechanism, s.key) for s in specs}
        first = [
            j.id for j in self.store.jobs(user_id=scope.user_id) if (j.mechanism, j.key) in keys
        ]
        self._derive(scope.user_id, first)
        return ended
