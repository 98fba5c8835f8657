"""Reachability of an embedded Chroma index: exact mirrors of small users, pins of large ones.

Embedded Chroma can leave records out of its HNSW graph (see :mod:`chroma_exact`). A user with
at most ``exact_below`` vectors is searched exactly over an in-process mirror; a larger
collection is sampled on its first open in a process, and records its graph cannot reach are
pinned (scored exactly and merged into every later search). Mixed into the Chroma index.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from memories_core.backends.chroma_exact import _MIRRORS, Mirror, _key_of
from memories_core.backends.chroma_verify import _READ_BATCH
from memories_core.backends.numpy_index import PROBE_DEPTH

__all__ = ["ChromaReachability"]

logger = logging.getLogger("memories_core.backends.chroma_index")


class ChromaReachability:
    """Exact search of small collections and pinning of lost records (mixed into the index).

    Attributes used:
        _exact_below, _open_check, _local, _checked: the index's reachability settings.
        _guard, _all_ids, _probe_in: the index's access to a collection.
    """

    _exact_below: int
    _open_check: int
    _local: bool
    _checked: set[str]
    _guard: Callable[..., Any]
    _all_ids: Callable[[Any], set[str]]
    _probe_in: Callable[[Any, list[str], int], set[str]]

    def _exact(self, collection: Any) -> Mirror | None:
        """The collection's complete mirror (loaded if needed), or ``None`` if it is too large.

        A collection first found too large gets its open check (:meth:`_check_sample`).
        """
        if self._exact_below == 0:
            if self._local:
                self._check_on_open(collection)
            return None
        key = _key_of(collection)
        mirror = _MIRRORS.get(key)
        if mirror is not None:
            return mirror
        if not _MIRRORS.is_large(key):
            generation = _MIRRORS.generation(key)
            if int(self._guard(collection.count)) <= self._exact_below:
                mirror = self._load_mirror(collection)
                _MIRRORS.put(key, mirror, generation)
                return mirror
            _MIRRORS.mark_large(key, generation)
        self._check_on_open(collection)
        return None

    def _load_mirror(self, collection: Any) -> Mirror:
        """Every vector and metadata of a collection, read in pages."""
        mirror = Mirror()
        offset = 0
        while True:
            got = self._guard(
                collection.get,
                include=["embeddings", "metadatas"],
                limit=_READ_BATCH,
                offset=offset,
            )
            page = [str(vid) for vid in got.get("ids") or []]
            if page:
                vectors = np.asarray(got["embeddings"], dtype=np.float32)
                metas = [dict(m or {}) for m in got.get("metadatas") or [{}] * len(page)]
                mirror.upsert(page, vectors, metas)
            if len(page) < _READ_BATCH:
                return mirror
            offset += len(page)

    def _check_on_open(self, collection: Any) -> None:
        """Sample a large collection's reachability once per instance (its first open here)."""
        key = _key_of(collection)
        if self._open_check and key not in self._checked:
            self._checked.add(key)
            self._check_sample(collection)

    def _check_sample(self, collection: Any) -> None:
        """Probe up to ``open_check`` records sampled from the collection; pin the lost."""
        if not self._open_check:
            return
        ids = sorted(self._all_ids(collection))
        sample = ids if len(ids) <= self._open_check else random.sample(ids, self._open_check)
        self._pin_lost(collection, sample)

    def _pin_lost(self, collection: Any, ids: Sequence[str], k: int = PROBE_DEPTH) -> set[str]:
        """Probe ``ids`` through the graph; pin (and log) the ones it cannot reach.

        Returns the ids newly found: those pinned earlier are reachable through their pin.
        """
        if not ids:
            return set()
        pinned = _MIRRORS.pinned(_key_of(collection))
        held_before = set(pinned.ids) if pinned is not None else set()
        lost = self._probe_in(collection, list(dict.fromkeys(ids)), k) - held_before
        if lost:
            wanted = sorted(lost)
            got = self._guard(collection.get, ids=wanted, include=["embeddings", "metadatas"])
            held = [str(vid) for vid in got.get("ids") or []]
            if held:
                _MIRRORS.pin(
                    _key_of(collection),
                    held,
                    np.asarray(got["embeddings"], dtype=np.float32),
                    [dict(m or {}) for m in got["metadatas"]],
                )
            logger.warning(
                "Chroma's HNSW graph cannot reach %d of %d checked records of collection %s; "
                "they are searched exactly from now on",
                len(lost),
                len(ids),
                getattr(collection, "name", "?"),
            )
        return lost

    def _probe_searched(self, collection: Any, wanted: list[str], k: int) -> set[str]:
        """Ids the graph cannot return; none for a user searched exactly.

        On a local store the ids found are also pinned, so search reaches them from now on.
        """
        if self._exact(collection) is not None:
            return set()
        if self._local:
            return self._pin_lost(collection, wanted, k)
        return self._probe_in(collection, wanted, k)
