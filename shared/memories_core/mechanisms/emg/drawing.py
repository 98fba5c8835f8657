"""Drawing a user's memory graph as a PNG (layers top to bottom; expired edges dashed).

Needs matplotlib (extra ``graph``), imported only here.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from memories_core.mechanisms.emg.export import memories_of, to_networkx
from memories_core.mechanisms.emg.schema import ROOT
from memories_core.types import ensure_utc

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine

__all__ = ["draw"]


def draw(
    engine: MemoryEngine, user_id: str, path: str | Path, *, now: datetime | None = None
) -> Path:
    """Draw one user's graph as a PNG; expired edges dashed.

    Needs matplotlib (extra ``graph``), imported here.

    Raises:
        MissingExtraError: if matplotlib is not installed.
    """
    try:
        import matplotlib
    except ImportError as exc:
        from memories_core.errors import MissingExtraError

        raise MissingExtraError("matplotlib", "graph") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import networkx as nx

    graph = to_networkx(engine, user_id)
    when = ensure_utc(now) if now is not None else engine.clock.now()
    live = {r.id for r in memories_of(engine, user_id, now=when)}
    layers = {"user": 0, "type": 1, "subclass": 2, "entity": 3}
    for _node, data in graph.nodes(data=True):
        data["layer"] = layers.get(data["kind"], 3)
    used = {n for u, v, d in graph.edges(data=True) if d["record_id"] for n in (u, v)}
    used |= {f"sub:{graph.nodes[n]['data'].get('subclass')}" for n in used if n != ROOT}
    used |= {f"type:{s.split('/', 1)[0][4:]}" for s in list(used) if s.startswith("sub:")}
    keep = [n for n in graph.nodes if n in used or graph.nodes[n]["kind"] in {"user", "type"}]
    view = graph.subgraph(keep).copy()
    # Layers left to right, nodes stacked in each: horizontal labels never overlap.
    pos = nx.multipartite_layout(view, subset_key="layer", align="vertical", scale=3)
    colours = {"user": "#d62728", "type": "#ff7f0e", "subclass": "#2ca02c", "entity": "#1f77b4"}
    fig, ax = plt.subplots(figsize=(16, 10))
    nx.draw_networkx_nodes(
        view,
        pos,
        ax=ax,
        node_size=500,
        node_color=[colours.get(view.nodes[n]["kind"], "#999999") for n in view.nodes],
    )
    nx.draw_networkx_labels(
        view,
        pos,
        ax=ax,
        font_size=7,
        labels={n: str(view.nodes[n]["label"])[:28] for n in view.nodes},
    )
    solid = [
        (u, v) for u, v, d in view.edges(data=True) if not d["record_id"] or d["record_id"] in live
    ]
    dashed = [
        (u, v) for u, v, d in view.edges(data=True) if d["record_id"] and d["record_id"] not in live
    ]
    # Arcs: edges between entities of one column bow out instead of running over each other.
    arc = "arc3,rad=0.35"
    nx.draw_networkx_edges(
        view, pos, ax=ax, edgelist=solid, alpha=0.6, arrows=True, connectionstyle=arc
    )
    nx.draw_networkx_edges(
        view,
        pos,
        ax=ax,
        edgelist=dashed,
        style="dashed",
        alpha=0.4,
        edge_color="#888888",
        arrows=True,
        connectionstyle=arc,
    )
    nx.draw_networkx_edge_labels(
        view,
        pos,
        ax=ax,
        font_size=6,
        connectionstyle=arc,
        edge_labels={(u, v): d["relation"] for u, v, d in view.edges(data=True) if d["record_id"]},
    )
    ax.set_title(f"Editable memory graph (dashed: no longer valid at {when:%Y-%m-%d %H:%M})")
    ax.axis("off")
    target = Path(path)
    fig.savefig(target, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return target
