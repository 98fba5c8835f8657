"""Erasure: clearing a scope, deleting a user, finishing an interrupted deletion."""

from __future__ import annotations

from memories_core.engine_parts.indexing import EngineIndexing
from memories_core.engine_parts.rules import _SESSION_KEY, check_scope
from memories_core.types import (
    Scope,
    check_user_id,
)

__all__ = ["EngineDeletion"]


class EngineDeletion(EngineIndexing):
    """The engine's erasure: a scope cleared, a user deleted, an interrupted deletion finished."""

    # ------------------------------------------------------------------ deletion
    def clear(self, scope: Scope) -> None:
        """Forget ``scope.user_id``'s memories.

        One session's if ``scope.session_id`` is set, else everything of the user
        (:meth:`delete_user`).
        """
        scope = check_scope(scope)
        if scope.session_id is None:
            self.delete_user(scope.user_id)
            return
        records = self.store.list(user_id=scope.user_id, where={"session_id": scope.session_id})
        ids = self._with_keys(scope.user_id, [r.id for r in records])
        with self.store.transaction():
            self.store.delete(ids, user_id=scope.user_id)
            opened = self.store.get_state(_SESSION_KEY, user_id=scope.user_id)
            if opened and opened["session_id"] == scope.session_id:
                self.store.set_state(_SESSION_KEY, None, user_id=scope.user_id)
        self._drop_vectors(scope.user_id, ids)

    def delete_user(self, user_id: str, *, vacuum: bool = False) -> None:
        """Erase everything of ``user_id``.

        Records, vectors, state, history, jobs, graph, artifacts and what attached mechanisms
        keep elsewhere.

        Deletion is one recoverable operation: a tombstone is written first, then every part
        is purged; if the process dies midway, the next open (or the next access to that
        user) finishes it, and meanwhile nothing of the user is served. The SQLite store
        overwrites deleted content and compacts its full-text index; ``vacuum=True`` also
        rewrites the database file.
        """
        check_user_id(user_id)
        self.store.mark_deleting(user_id, at=self.clock.now())
        self._purge(user_id, vacuum=vacuum)

    def finish_deletion(self, user_id: str) -> bool:
        """Finish a deletion of ``user_id`` left pending (by a crash); whether there was one.

        Every write path does this before writing (:meth:`save`, :meth:`write_derivation`);
        a mechanism that reads the user's state to plan a write calls it before reading.
        """
        check_user_id(user_id)
        if not self.store.is_deleting(user_id):
            return False
        self._purge(user_id, vacuum=False)
        return True

    def _finish_deletion(self, user_id: str) -> None:
        if self.store.is_deleting(user_id):
            self._purge(user_id, vacuum=False)

    def _purge(self, user_id: str, *, vacuum: bool) -> None:
        self.index.delete_user(user_id)
        self.artifacts.delete_user(user_id)
        for hooks in self._hooks.values():
            if hooks.on_delete_user is not None:
                hooks.on_delete_user(user_id)
        self.store.purge_user(user_id)
        compact = getattr(self.store, "compact", None)
        if callable(compact):
            compact()
        if vacuum:
            self.store.vacuum()
        with self._user_locks_guard:
            self._user_locks.pop(user_id, None)
