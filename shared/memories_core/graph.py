"""Per-user graphs kept with the records (engine seam for EMG-RAG's memory graph, §4.1).

Nodes and edges are rows of the record store (``graph_nodes`` / ``graph_edges``), written in
its transactions, deleted by ``delete_user``, and scoped by user in every query: an edge's
ends are foreign keys into the *same user's* nodes, so a graph can never link two users.
Algorithms run on a networkx view (:meth:`GraphStore.to_networkx`); networkx is imported
only there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memories_core.types import GraphEdge, GraphNode, check_user_id

if TYPE_CHECKING:
    from memories_core.interfaces import EngineStore

__all__ = ["GraphStore"]


class GraphStore:
    """Nodes and edges per user, persisted and transactional with the records.

    Args:
        store: The record store that holds the graph tables.
    """

    def __init__(self, store: EngineStore) -> None:
        self._store = store

    def put(
        self,
        user_id: str,
        *,
        nodes: Sequence[GraphNode] = (),
        edges: Sequence[GraphEdge] = (),
    ) -> None:
        """Insert or replace nodes and edges atomically.

        Raises:
            InvalidInputError: if an edge names a node ``user_id`` does not have.
        """
        self._store.put_graph(check_user_id(user_id), nodes=nodes, edges=edges)

    def delete(
        self, user_id: str, *, node_ids: Sequence[str] = (), edge_ids: Sequence[str] = ()
    ) -> None:
        """Delete nodes (and every edge touching them) and edges."""
        self._store.delete_graph(check_user_id(user_id), node_ids=node_ids, edge_ids=edge_ids)

    def nodes(self, user_id: str, *, kind: str | None = None) -> list[GraphNode]:
        """``user_id``'s nodes, of one kind if given."""
        return self._store.graph_nodes(check_user_id(user_id), kind=kind)

    def edges(
        self, user_id: str, *, node_id: str | None = None, record_id: str | None = None
    ) -> list[GraphEdge]:
        """``user_id``'s edges, touching ``node_id`` or made from ``record_id`` if given."""
        return self._store.graph_edges(check_user_id(user_id), node_id=node_id, record_id=record_id)

    def to_networkx(self, user_id: str) -> Any:
        """``user_id``'s graph as a ``networkx.MultiDiGraph`` (a copy; edit through :meth:`put`).

        Node attributes: ``kind``, ``label``, ``data``; edge keys are edge ids, with
        attributes ``relation``, ``record_id``, ``data``.
        """
        import networkx as nx

        graph = nx.MultiDiGraph(user_id=user_id)
        for node in self.nodes(user_id):
            graph.add_node(node.id, kind=node.kind, label=node.label, data=dict(node.data))
        for edge in self.edges(user_id):
            graph.add_edge(
                edge.source,
                edge.target,
                key=edge.id,
                relation=edge.relation,
                record_id=edge.record_id,
                data=dict(edge.data),
            )
        return graph
