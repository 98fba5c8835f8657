"""Reading a user's memory graph out: memories as of a time, triples, networkx, JSON, GraphML.

networkx is imported only for the graph views (it is a core dependency, but nothing on the
save or recall path needs it).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from memories_core.errors import InvalidInputError
from memories_core.mechanisms.emg.schema import MEMORY_KIND, ROOT
from memories_core.types import MemoryRecord, check_user_id, ensure_utc

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine

__all__ = ["export_graph", "memories_of", "to_networkx", "triples"]


def memories_of(
    engine: MemoryEngine,
    user_id: str,
    *,
    now: datetime | None = None,
    include_expired: bool = False,
) -> list[MemoryRecord]:
    """The user's memories as of ``now`` (all with ``include_expired``), oldest first.

    As of ``now``: formed at or before it, not archived, and inside their validity.
    """
    records = engine.records(check_user_id(user_id), where={"kind": MEMORY_KIND})
    if include_expired:
        return records
    when = ensure_utc(now) if now is not None else engine.clock.now()
    # "As of" ``now``: valid then, and already known then (formed at or before it).
    return [r for r in records if r.state.is_live(when) and r.created_at <= when]


def triples(
    engine: MemoryEngine, user_id: str, *, now: datetime | None = None
) -> set[tuple[str, str, str]]:
    """The live ``(subject, relation, object)`` edges of the user's graph at ``now``."""
    live = {r.id for r in memories_of(engine, user_id, now=now)}
    labels = {n.id: n.label for n in engine.graph.nodes(user_id)}
    labels[ROOT] = "user"
    return {
        (labels[e.source], e.relation, labels[e.target])
        for e in engine.graph.edges(user_id)
        if e.record_id in live
    }


def to_networkx(engine: MemoryEngine, user_id: str) -> Any:
    """The user's graph as a ``networkx.MultiDiGraph`` (see ``GraphStore.to_networkx``)."""
    return engine.graph.to_networkx(check_user_id(user_id))


def export_graph(
    engine: MemoryEngine,
    user_id: str,
    path: str | Path | None = None,
    *,
    format: Literal["json", "graphml"] = "json",
    now: datetime | None = None,
) -> str:
    """Export one user's graph for inspection; returns the text (and writes ``path``).

    JSON: ``{"nodes": [...], "edges": [...]}`` (node-link form); GraphML: attribute values
    that are dicts are JSON strings. Each relation edge carries its memory's text and
    ``live`` (whether it is valid at ``now``).

    Raises:
        InvalidInputError: on an unknown ``format``.
    """
    import networkx as nx

    graph = to_networkx(engine, user_id)
    when = ensure_utc(now) if now is not None else engine.clock.now()
    records = {r.id: r for r in memories_of(engine, user_id, include_expired=True)}
    for _, _, data in graph.edges(data=True):
        record = records.get(data.get("record_id") or "")
        data["memory"] = record.text if record is not None else ""
        data["live"] = bool(record is not None and record.state.is_live(when))
    if format == "json":
        text = json.dumps(nx.node_link_data(graph, edges="edges"), default=str, indent=1)
    elif format == "graphml":
        flat = nx.MultiDiGraph()
        for node, data in graph.nodes(data=True):
            flat.add_node(node, **{k: _flat(v) for k, v in data.items()})
        for u, v, key, data in graph.edges(keys=True, data=True):
            flat.add_edge(u, v, key=key, **{k: _flat(x) for k, x in data.items()})
        text = "\n".join(nx.generate_graphml(flat))
    else:
        raise InvalidInputError("format must be 'json' or 'graphml'")
    if path is not None:
        Path(path).write_text(text, encoding="utf-8")
    return text


def _flat(value: Any) -> Any:
    """A GraphML attribute value: scalars as they are, ``None`` as ``""``, the rest as JSON."""
    if value is None:
        return ""
    if isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, default=str)
