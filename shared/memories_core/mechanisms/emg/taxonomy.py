"""The fixed layers of every user's memory graph (§4.2, Figure 2a; Table 7).

Root (the user) -> Memory Type Layer (``type:<T>``) -> Memory Subclass Layer
(``sub:<T>/<S>``). Entities of the Memory Graph Layer hang under the subclass nearest to their
name (:func:`nearest_subclass`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from memories_core.errors import ConfigurationError
from memories_core.mechanisms.emg.embeddings import EmbeddingCache
from memories_core.mechanisms.emg.schema import ROOT, cosine
from memories_core.prompts.emg import MEMORY_TYPES, TABLE7_SUBCLASSES
from memories_core.types import GraphEdge, GraphNode

__all__ = ["build_taxonomy", "labels_of", "nearest_subclass", "skeleton", "subclass_text"]


def build_taxonomy(
    subclasses: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, tuple[str, ...]]:
    """Table 7's subclasses per memory type, with ``subclasses`` appended (no duplicates).

    Raises:
        ConfigurationError: on an unknown memory type or an empty or non-string name.
    """
    taxonomy = {t: list(s) for t, s in TABLE7_SUBCLASSES.items()}
    for kind, extra in (subclasses or {}).items():
        if kind not in taxonomy:
            raise ConfigurationError(f"unknown memory type {kind!r}; use {MEMORY_TYPES}")
        for name in extra:
            if not isinstance(name, str) or not name.strip() or "/" in kind:
                raise ConfigurationError(f"bad subclass name {name!r}")
            if name not in taxonomy[kind]:
                taxonomy[kind].append(name)
    return {t: tuple(s) for t, s in taxonomy.items()}


def labels_of(taxonomy: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Every subclass as ``"<Type>/<Subclass>"``, in taxonomy order."""
    return tuple(f"{t}/{s}" for t, subs in taxonomy.items() for s in subs)


def subclass_text(label: str) -> str:
    """The text a subclass is embedded as: ``"<subclass> (<type>)"``."""
    kind, sub = label.split("/", 1)
    return f"{sub.replace('/', ' or ')} ({kind.lower()})"


def nearest_subclass(vectors: EmbeddingCache, labels: Sequence[str], name: str) -> str:
    """The subclass whose name is nearest to ``name`` (entity assignment, §4.2).

    The paper uses TransE embeddings; the sentence embedder serves here and needs no training.
    """
    embedded = vectors.vectors([name, *(subclass_text(s) for s in labels)])
    sims = [cosine(embedded[0], v) for v in embedded[1:]]
    return labels[int(np.argmax(sims))]


def skeleton(
    user_id: str, taxonomy: Mapping[str, Sequence[str]]
) -> tuple[list[GraphNode], list[GraphEdge]]:
    """The root, type and subclass nodes of ``user_id``'s graph and the edges between them."""
    nodes = [GraphNode(ROOT, "user", user_id)]
    edges: list[GraphEdge] = []
    for kind, subs in taxonomy.items():
        nodes.append(GraphNode(f"type:{kind}", "type", kind))
        edges.append(GraphEdge(f"t:{kind}", ROOT, f"type:{kind}", "has_type"))
        for sub in subs:
            label = f"{kind}/{sub}"
            nodes.append(GraphNode(f"sub:{label}", "subclass", label))
            edges.append(GraphEdge(f"s:{label}", f"type:{kind}", f"sub:{label}", "has_subclass"))
    return nodes, edges
