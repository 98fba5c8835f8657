"""Table family ``graph_nodes`` / ``graph_edges``: per-user graphs.

Edges reference nodes through ``(user_id, node id)`` foreign keys (``ON DELETE CASCADE``), so
an edge can never join two users' nodes and deleting a node deletes its edges. Both tables
keep insertion order (the dialect's order column), which is the order they are listed in.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Sequence
from typing import Any

from memories_core.backends.sql.base import SQLBase
from memories_core.backends.sql.rows import dumps
from memories_core.errors import InvalidInputError
from memories_core.types import GraphEdge, GraphNode

__all__ = ["GraphTables"]


class GraphTables(SQLBase):
    """Insert, delete and list a user's graph nodes and edges."""

    def put_graph(
        self,
        user_id: str,
        *,
        nodes: Sequence[GraphNode] = (),
        edges: Sequence[GraphEdge] = (),
    ) -> None:
        """Insert or replace nodes and edges of ``user_id``'s graph, atomically.

        Raises:
            InvalidInputError: if an edge names a node the user does not have (nothing is
                written).
        """
        d = self.dialect
        node_rows = [(user_id, n.id, n.kind, n.label, dumps(dict(n.data))) for n in nodes]
        edge_rows = [
            (user_id, e.id, e.source, e.target, e.relation, e.record_id, dumps(dict(e.data)))
            for e in edges
        ]
        with self._write([user_id]) as conn:
            self._many(
                conn,
                "INSERT INTO graph_nodes (user_id, id, kind, label, data) "
                "VALUES (?, ?, ?, ?, ?) ON CONFLICT (user_id, id) DO UPDATE SET "
                "kind = excluded.kind, label = excluded.label, data = excluded.data",
                node_rows,
            )
            ends = sorted({e.source for e in edges} | {e.target for e in edges})
            if ends:
                known = {
                    row[0]
                    for row in self._run(
                        conn,
                        f"SELECT id FROM graph_nodes WHERE user_id = ? AND {d.ids_in('id')}",
                        (user_id, d.ids(ends)),
                    )
                }
                unknown = [end for end in ends if end not in known]
                if unknown:
                    # Raising inside the transaction rolls the nodes above back too.
                    raise InvalidInputError(
                        f"edges name nodes this user does not have: {unknown[:5]}"
                    )
            self._many(
                conn,
                "INSERT INTO graph_edges (user_id, id, source, target, relation, record_id, "
                "data) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (user_id, id) DO UPDATE SET "
                "source = excluded.source, target = excluded.target, "
                "relation = excluded.relation, record_id = excluded.record_id, "
                "data = excluded.data",
                edge_rows,
            )

    def delete_graph(
        self,
        user_id: str,
        *,
        node_ids: Sequence[str] = (),
        edge_ids: Sequence[str] = (),
    ) -> None:
        """Delete nodes (with their edges) and edges of ``user_id``'s graph."""
        d = self.dialect
        with self._write([user_id]) as conn:
            for table, ids in (("graph_edges", edge_ids), ("graph_nodes", node_ids)):
                self._run(
                    conn,
                    f"DELETE FROM {table} WHERE user_id = ? AND {d.ids_in('id')}",
                    (user_id, d.ids(ids)),
                )

    def graph_nodes(self, user_id: str, *, kind: str | None = None) -> builtins.list[GraphNode]:
        """``user_id``'s nodes (of one kind if given), in insertion order."""
        d = self.dialect
        sql = f"SELECT id, kind, label, {d.json('data')} FROM graph_nodes WHERE user_id = ?"
        params: builtins.list[Any] = [user_id]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        sql += f" ORDER BY {d.order('graph_nodes')}"
        with self._read([user_id]) as conn:
            return [
                GraphNode(id=row[0], kind=row[1], label=row[2], data=json.loads(row[3]))
                for row in self._run(conn, sql, params)
            ]

    def graph_edges(
        self,
        user_id: str,
        *,
        node_id: str | None = None,
        record_id: str | None = None,
    ) -> builtins.list[GraphEdge]:
        """``user_id``'s edges (touching ``node_id`` / from ``record_id`` if given)."""
        d = self.dialect
        sql = (
            f"SELECT id, source, target, relation, record_id, {d.json('data')} "
            "FROM graph_edges WHERE user_id = ?"
        )
        params: builtins.list[Any] = [user_id]
        if node_id is not None:
            sql += " AND (source = ? OR target = ?)"
            params += [node_id, node_id]
        if record_id is not None:
            sql += " AND record_id = ?"
            params.append(record_id)
        sql += f" ORDER BY {d.order('graph_edges')}"
        with self._read([user_id]) as conn:
            return [
                GraphEdge(
                    id=row[0],
                    source=row[1],
                    target=row[2],
                    relation=row[3],
                    record_id=row[4],
                    data=json.loads(row[5]),
                )
                for row in self._run(conn, sql, params)
            ]
