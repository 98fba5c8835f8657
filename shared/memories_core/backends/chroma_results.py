"""What a Chroma collection reports (space, dimension, query results, folder), read defensively."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from memories_core.backends.chroma_exact import _MIRRORS, _key_of
from memories_core.interfaces import Filter


def _with_pinned(
    found: list[tuple[str, float]],
    collection: Any,
    query: npt.NDArray[np.float32],
    k: int,
    where: Filter | None,
) -> list[tuple[str, float]]:
    """Merge the exactly scored pinned records of a collection into a graph answer."""
    pinned = _MIRRORS.pinned(_key_of(collection))
    if pinned is None:
        return found
    merged = dict(found)
    for vid, score in pinned.search(query, k, where):
        merged[vid] = max(score, merged.get(vid, score))
    return sorted(merged.items(), key=lambda p: (-p[1], p[0]))[:k]


def _space_of(collection: Any) -> str | None:
    """Distance space of a Chroma collection, from its configuration or legacy metadata."""
    config = getattr(collection, "configuration", None)
    if isinstance(config, Mapping):
        hnsw = config.get("hnsw")
        if isinstance(hnsw, Mapping) and hnsw.get("space"):
            return str(hnsw["space"])
    metadata = getattr(collection, "metadata", None)
    if isinstance(metadata, Mapping) and metadata.get("hnsw:space"):
        return str(metadata["hnsw:space"])
    return None


def _dimension_of(collection: Any) -> int | None:
    """Dimension of a collection's vectors, or ``None`` if it is empty."""
    got = collection.get(limit=1, include=["embeddings"])
    embeddings = got.get("embeddings")
    if embeddings is not None and len(embeddings) > 0:
        return len(embeddings[0])
    return None


def _pairs(result: Mapping[str, Any]) -> list[tuple[str, float]]:
    """``(id, cosine)`` pairs of a one-query Chroma result."""
    ids = result["ids"][0] if result.get("ids") else []
    distances = result["distances"][0] if result.get("distances") else []
    return [(str(vid), 1.0 - float(dist)) for vid, dist in zip(ids, distances, strict=True)]


def _local_folder(client: Any | None) -> Path | None:
    """The folder of a caller's embedded persistent client, else ``None``."""
    if client is None:
        return None
    try:
        settings = client.get_settings()
    except Exception:
        return None
    impl = str(getattr(settings, "chroma_api_impl", "")).lower()
    directory = getattr(settings, "persist_directory", None)
    if not getattr(settings, "is_persistent", False) or not directory or "fastapi" in impl:
        return None
    return Path(directory)
