"""Filtered searches of a Chroma collection: over-fetch, filter in Python, size by experience.

A filtered search asks Chroma for more neighbours than ``k`` without a ``where`` (a Chroma
pre-filter's cost grows with the rows it matches), keeps those whose metadata pass the
filter, and only if too few pass asks again with the filter as ``where``. How many to fetch
depends on the share of neighbours that pass: a user whose collection holds only turns passes
every hit of a ``kind = turn`` filter, and fetching four times ``k`` there made a deep search
(``k`` = 150, the late-interaction pool) cost about 29 ms of a 100k-record recall. The share
each collection and filter showed on its last searches sizes the next fetch (never below
``k`` plus a margin, never above the former ``4 * k + 20``); a fetch that comes up short
still falls back to the filtered query, so a filter is always honoured. Chroma's HNSW search
explores as many candidates as it is asked to return, so a smaller fetch is also a less
exhaustive graph search: on a 100k-record profile store (hashing embedder, random token
vectors) a late-interaction recall went from 77.0 to 59.9 ms p50 and 16 of 20 top-5 lists
stayed identical (0.97 of their records shared). Users searched exactly are not affected.

The shares of filters on ``kind`` alone (what every mechanism's recall filters on) are kept
in ``llm_memories_filter_shares.json`` in an embedded index's folder, written when the index
closes and read when it opens, so a reopened index sizes its first deep search by what it
learned before instead of the 4k + 20 guess (BENCHMARKS.md, "Retrieval quality", the cold
first recall). Other filters' signatures hold their values (session ids, user metadata), so
they stay in memory only. The file is untrusted input: a damaged one is ignored with a
warning.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from memories_core.backends.chroma_exact import _key_of
from memories_core.backends.chroma_results import _pairs, _with_pinned
from memories_core.backends.numpy_index import as_query, check_filter, metadata_matcher
from memories_core.errors import InvalidInputError
from memories_core.files import read_json_file, write_json_atomic
from memories_core.interfaces import Filter
from memories_core.types import check_user_id

__all__ = ["SHARES_FILE", "ChromaFiltering", "KindReader"]

#: Reads the ``kind`` of some of the searched user's records: ids in, ``{id: kind}`` out
#: (ids it does not hold left out). The engine passes its record store's, the record of
#: truth the index is derived from: a deep search filtered on ``kind`` (the
#: late-interaction pool) then asks Chroma for distances only: its metadata cost about 8 of
#: 11.5 ms for 208 hits at 10k records, and a late recall's whole index search, the kinds
#: read included, fell from 13.9 to 4.7 ms (BENCHMARKS.md, "Late-interaction vectors kept
#: with the records").
KindReader = Callable[[Sequence[str]], Mapping[str, str]]

logger = logging.getLogger("memories_core.backends.chroma_index")

#: File of an embedded index's folder keeping the learned shares of ``kind`` filters.
SHARES_FILE = "llm_memories_filter_shares.json"
#: Largest shares file read (bytes); a bigger one is ignored as damaged.
_SHARES_MAX_BYTES = 4 * 2**20

#: Share of hits assumed to pass a filter never seen on a collection (fetch 4k + 20).
_FIRST_SHARE = 0.25
#: Margin of safety on a learned share (a share of 1.0 fetches k / 0.8 + 20).
_SHARE_MARGIN = 0.8
#: Extra neighbours fetched beyond ``k / share``.
_EXTRA = 20
#: (collection, filter) pairs whose share is remembered, least recently used dropped.
_REMEMBERED = 4096


class ChromaFiltering:
    """Over-fetch sizing and Python-side filtering (mixed into the index).

    Attributes used:
        _guard: the index's error translation around Chroma calls.
    """

    _guard: Callable[..., Any]
    _folder: Path | None
    _lock: threading.RLock
    _on_collection: Callable[..., Any]
    _check_dimension: Callable[..., None]
    _exact: Callable[[Any], Any]

    def _init_filtering(self) -> None:
        """Start with the shares kept on disk, if any (called by the index's ``__init__``)."""
        self._shares_lock = threading.Lock()
        #: (collection key, filter signature) -> pass share seen last, least recent first.
        self._shares: OrderedDict[tuple[str, str], float] = OrderedDict(self._read_shares())

    def _shares_path(self) -> Path | None:
        folder = getattr(self, "_folder", None)
        return Path(folder) / SHARES_FILE if folder is not None else None

    def _read_shares(self) -> list[tuple[tuple[str, str], float]]:
        """The kept shares, validated (``[]`` if absent; a damaged file is logged, ignored)."""
        path = self._shares_path()
        if path is None:
            return []
        try:
            data = read_json_file(path, max_bytes=_SHARES_MAX_BYTES)
            if data is None:
                return []
            if not isinstance(data, list):
                raise ValueError("not a list")
            kept: list[tuple[tuple[str, str], float]] = []
            for item in data[-_REMEMBERED:]:
                if not (
                    isinstance(item, list)
                    and len(item) == 3
                    and isinstance(item[0], str)
                    and isinstance(item[1], str)
                    and _persistable(item[1])
                    and isinstance(item[2], int | float)
                    and not isinstance(item[2], bool)
                    and 0.0 <= float(item[2]) <= 1.0
                ):
                    raise ValueError(f"not a [collection, filter, share] entry: {item!r:.80}")
                kept.append(((item[0], item[1]), float(item[2])))
        except (OSError, ValueError) as exc:
            logger.warning("ignoring the damaged filter shares file %s: %s", path, exc)
            return []
        return kept

    def _write_shares(self) -> None:
        """Keep the learned shares of ``kind`` filters on disk (called when the index closes)."""
        path = self._shares_path()
        if path is None:
            return
        with self._shares_lock:
            entries = [[key, sig, share] for (key, sig), share in self._shares.items()]
        entries = [entry for entry in entries if _persistable(str(entry[1]))]
        try:
            if entries:
                write_json_atomic(path, entries, indent=None)
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:  # a cache: the next open starts from the first guess
            logger.warning("could not keep the filter shares in %s: %s", path, exc)

    def _forget_shares(self, key: str) -> None:
        """Drop what was learned on the collection ``key`` (its user was deleted), on disk too."""
        with self._shares_lock:
            gone = [pair for pair in self._shares if pair[0] == key]
            for pair in gone:
                del self._shares[pair]
        path = self._shares_path()
        if path is not None and path.is_file():
            self._write_shares()

    def search_many(
        self,
        vector: npt.NDArray[np.float32],
        *,
        user_id: str,
        k: int,
        wheres: Sequence[Filter],
        kinds_of: KindReader | None = None,
    ) -> list[list[tuple[str, float]]]:
        """:meth:`search` once per filter of ``wheres``, sharing one Chroma query.

        Each result equals ``search(vector, user_id=user_id, k=k, where=where)``: a filtered
        search over-fetches the nearest rows without a filter and filters them in Python,
        and that over-fetch is the same for every filter, so it runs once; a filter that
        keeps too few rows still gets its own pre-filtered query. Search keys use it (the
        records and the keys of one recall, :mod:`memories_core.retrieval.keys`).

        Raises:
            InvalidInputError: if ``k < 1``, a filter is empty or invalid, or the vector is
                malformed.
        """
        check_user_id(user_id)
        if k < 1:
            raise InvalidInputError("k must be >= 1")
        for where in wheres:
            if not where:
                raise InvalidInputError("search_many needs non-empty filters")
            check_filter(where)
        query = as_query(vector)

        def run(collection: Any) -> list[list[tuple[str, float]]]:
            self._guard(self._check_dimension, query.shape[0], collection)
            mirror = self._exact(collection)
            if mirror is not None:
                return [mirror.search(query, k, where) for where in wheres]
            fetched = self._overfetch(collection, query, k, wheres, kinds_of)
            return [
                _with_pinned(
                    self._filtered(collection, query, k, where, fetched),
                    collection,
                    query,
                    k,
                    where,
                )
                for where in wheres
            ]

        with self._lock:
            return self._on_collection(user_id, False, run, [[] for _ in wheres])

    def _search_in(
        self,
        collection: Any,
        query: npt.NDArray[np.float32],
        k: int,
        where: Filter | None,
        kinds_of: KindReader | None,
    ) -> list[tuple[str, float]]:
        self._guard(self._check_dimension, query.shape[0], collection)
        mirror = self._exact(collection)
        if mirror is not None:
            return mirror.search(query, k, where)
        if not where:
            result = self._guard(
                collection.query,
                query_embeddings=[query],
                n_results=k,
                include=["distances"],
            )
            found = _pairs(result)[:k]
        else:
            fetched = self._overfetch(collection, query, k, [where], kinds_of)
            found = self._filtered(collection, query, k, where, fetched)
        return _with_pinned(found, collection, query, k, where)

    def _share_of(self, collection: Any, wheres: Sequence[Filter]) -> float:
        """The smallest learned pass share among ``wheres`` on ``collection``."""
        key = _key_of(collection)
        with self._shares_lock:
            known = [self._shares.get((key, _signature(where))) for where in wheres]
        if any(share is None for share in known):
            return _FIRST_SHARE
        return max(_FIRST_SHARE, min(share for share in known if share is not None))

    def _learn_share(self, collection: Any, where: Filter, share: float) -> None:
        pair = (_key_of(collection), _signature(where))
        with self._shares_lock:
            self._shares[pair] = share
            self._shares.move_to_end(pair)
            while len(self._shares) > _REMEMBERED:
                self._shares.popitem(last=False)

    def _overfetch(
        self,
        collection: Any,
        query: npt.NDArray[np.float32],
        k: int,
        wheres: Sequence[Filter] = (),
        kinds_of: KindReader | None = None,
    ) -> tuple[list[tuple[str, float]], list[Any], int]:
        """The nearest neighbours without a Chroma pre-filter, as many as ``wheres`` need.

        With ``kinds_of`` and filters on ``kind`` alone, the hits' kinds come from it
        instead of Chroma's metadata (see :data:`KindReader`); a hit it does not know
        passes no filter.

        Returns ``(pairs, metadatas, fetch)``; Chroma returns fewer rows if it holds fewer.
        """
        share = self._share_of(collection, wheres) if wheres else _FIRST_SHARE
        fetch = min(4 * k + _EXTRA, math.ceil(k / share) + _EXTRA)
        by_kind = kinds_of is not None and bool(wheres) and all(set(w) == {"kind"} for w in wheres)
        result = self._guard(
            collection.query,
            query_embeddings=[query],
            n_results=fetch,
            include=["distances"] if by_kind else ["distances", "metadatas"],
        )
        pairs = _pairs(result)
        if by_kind:
            assert kinds_of is not None  # narrows the type: by_kind needs it
            kinds = kinds_of([item for item, _ in pairs])
            metas: list[Any] = [
                {"kind": kinds[item]} if item in kinds else None for item, _ in pairs
            ]
            return pairs, metas, fetch
        metas = result["metadatas"][0] if result.get("metadatas") else []
        return pairs, list(metas), fetch

    def _filtered(
        self,
        collection: Any,
        query: npt.NDArray[np.float32],
        k: int,
        where: Filter,
        fetched: tuple[list[tuple[str, float]], list[Any], int],
    ) -> list[tuple[str, float]]:
        """The ``k`` best fetched hits that pass ``where``, or Chroma's filtered query."""
        pairs, metas, fetch = fetched
        matches = metadata_matcher(where)  # read once: a deep search checks hundreds of hits
        kept = [
            pair
            for pair, meta in zip(pairs, metas, strict=True)
            if meta is not None and matches(meta)
        ]
        if pairs:
            self._learn_share(collection, where, _SHARE_MARGIN * len(kept) / len(pairs))
        if len(kept) >= k or len(pairs) < fetch:
            return kept[:k]
        # Too few passed and there may be more rows: let Chroma apply the filter.
        clauses = [{key: value} for key, value in where.items()]
        result = self._guard(
            collection.query,
            query_embeddings=[query],
            n_results=k,
            where=clauses[0] if len(clauses) == 1 else {"$and": clauses},
            include=["distances"],
        )
        return _pairs(result)[:k]


def _signature(where: Filter) -> str:
    """A filter's identity for the share memory (its canonical JSON)."""
    return json.dumps(where, sort_keys=True, default=str)


def _persistable(signature: str) -> bool:
    """Whether a filter's share may go to disk: a filter on ``kind`` alone (no user data)."""
    try:
        where = json.loads(signature)
    except ValueError:
        return False
    return isinstance(where, dict) and set(where) == {"kind"}
