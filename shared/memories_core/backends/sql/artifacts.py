"""Table family ``artifacts``: the registry of per-user files.

One row per ``(user_id, name)``: the folder holding the bytes, their size and SHA-256, when
they were registered and a JSON ``meta``. The bytes live in the artifact directory
(:class:`~memories_core.artifacts.ArtifactStore`); the registry lives here so that it
commits in the same transactions as the records that use it.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from memories_core.backends.sql.base import SQLBase
from memories_core.backends.sql.rows import dumps, from_micros, to_micros

__all__ = ["ArtifactsTable"]


class ArtifactsTable(SQLBase):
    """Register, list and unregister artifacts."""

    def register_artifact(
        self,
        user_id: str,
        name: str,
        *,
        folder: str,
        size: int,
        sha256: str,
        at: datetime,
        meta: Mapping[str, Any] | None = None,
    ) -> None:
        """Record (or replace) the registry entry of an artifact."""
        with self._write([user_id]) as conn:
            self._run(
                conn,
                "INSERT INTO artifacts (user_id, name, folder, size, sha256, created_at, meta) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (user_id, name) DO UPDATE SET "
                "folder = excluded.folder, size = excluded.size, sha256 = excluded.sha256, "
                "created_at = excluded.created_at, meta = excluded.meta",
                (user_id, name, folder, size, sha256, to_micros(at), dumps(dict(meta or {}))),
            )

    def artifact_rows(self, user_id: str | None = None) -> builtins.list[dict[str, Any]]:
        """Registry entries (of one user, or all), by user then name (code-point order)."""
        d = self.dialect
        sql = (
            f"SELECT user_id, name, folder, size, sha256, created_at, {d.json('meta')} "
            "FROM artifacts"
        )
        params: builtins.list[Any] = []
        users: builtins.list[str] = []
        if user_id is not None:
            sql += " WHERE user_id = ?"
            params.append(user_id)
            users.append(user_id)
        sql += f" ORDER BY user_id{d.collate}, name{d.collate}"
        with self._read(users) as conn:
            return [
                {
                    "user_id": row[0],
                    "name": row[1],
                    "folder": row[2],
                    "size": row[3],
                    "sha256": row[4],
                    "created_at": from_micros(row[5]),
                    "meta": json.loads(row[6]),
                }
                for row in self._run(conn, sql, params)
            ]

    def unregister_artifact(self, user_id: str, name: str) -> None:
        """Remove an artifact's registry entry."""
        with self._write([user_id]) as conn:
            self._run(conn, "DELETE FROM artifacts WHERE user_id = ? AND name = ?", (user_id, name))
