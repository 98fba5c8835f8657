"""Index-side search keys: extra texts that point to a record and help recall find it.

A search key is a :class:`~memories_core.types.MemoryRecord` with ``kind="search_key"``
whose text is the key (a fact derived from a turn, a conditional-memory knowledge line, a
memo's topic and summary) and whose ``metadata["key_for"]`` is the id of its target, a record
of the same user. Mechanisms write keys with the derivation that produced them
(``Derivation.add`` or ``MemoryEngine.add_records``), so derived knowledge improves the
recall of the raw record without replacing it: the question "When did Caroline go to the
support group?" may match the observation "Caroline attended an LGBTQ support group" much
better than the turn "I went to a LGBTQ support group yesterday", and the key brings the
turn back.

:class:`KeyedBackend` wraps any :class:`~memories_core.retrieval.RecallBackend` and does
the mapping, per candidate source: every source asks the inner backend for the records
themselves (key records excluded) and for the keys (the dense source in one index query
when the backend has ``dense_many``: :class:`DenseMany`); a key hit becomes a hit
of its target, which must exist, not be a key, and satisfy the request's filter (kinds and
``where`` apply to the target, never to the key). The target's score is the best of its own
score and its keys' scores (``key_fusion="max"``) or its own plus ``key_weight`` times its
best key (``"sum"``); both rules were measured on LoCoMo dev with the observations as keys
of their turns (BENCHMARKS.md, "Retrieval quality", its search-keys rows). Key records
themselves are never returned.

The engine validates keys on write (:func:`check_keys`) and deletes a record's keys with
the record (:func:`key_filter`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from memories_core.errors import ConfigurationError, SearchKeyError
from memories_core.retrieval.base import RecallBackend, Where, filters_match
from memories_core.retrieval.fusion import Ranking
from memories_core.types import MemoryRecord

__all__ = [
    "DEFAULT_KEY_FUSION",
    "DEFAULT_KEY_WEIGHT",
    "KEY_FOR",
    "SEARCH_KEY_KIND",
    "DenseMany",
    "KeyLookup",
    "KeyedBackend",
    "check_keys",
    "key_filter",
    "target_of",
]

#: The ``kind`` of a search-key record.
SEARCH_KEY_KIND = "search_key"
#: The metadata field naming a key's target record.
KEY_FOR = "key_for"
#: How a target's own score and its keys' scores combine (chosen on LoCoMo dev by
#: leave-one-conversation-out cross-validation; BENCHMARKS.md, "Retrieval quality",
#: search-keys rows).
DEFAULT_KEY_FUSION: Literal["max", "sum"] = "max"
#: Weight of the best key's score under ``"sum"`` (and a scale under ``"max"``).
DEFAULT_KEY_WEIGHT = 1.0


def target_of(record: MemoryRecord) -> str | None:
    """The id a search-key record points to (``None`` for other records or a bad key)."""
    if record.kind != SEARCH_KEY_KIND:
        return None
    target = record.metadata.get(KEY_FOR)
    return target if isinstance(target, str) and target else None


def key_filter(target_ids: Sequence[str]) -> dict[str, Any]:
    """The filter selecting the search keys of ``target_ids``."""
    return {"kind": SEARCH_KEY_KIND, KEY_FOR: {"$in": list(target_ids)}}


class _Targets(Protocol):
    def __call__(self, ids: Sequence[str], *, user_id: str) -> Iterable[MemoryRecord]: ...


def check_keys(records: Sequence[MemoryRecord], existing: _Targets) -> None:
    """Check that every search key of ``records`` points to a record of its own user.

    A target may be one of ``records`` (written in the same call) or already stored.

    Args:
        records: Records about to be written.
        existing: ``(ids, user_id=) -> records of that user among ids`` (the store's ``get``).

    Raises:
        SearchKeyError: if a key has no ``key_for`` string, points to itself, to another
            search key, to another user's record or to a missing record.
    """
    batch = {r.id: r for r in records}
    wanted: dict[str, set[str]] = {}
    for record in records:
        if record.kind != SEARCH_KEY_KIND:
            continue
        target = target_of(record)
        if target is None:
            raise SearchKeyError(
                f"search key {record.id!r} needs metadata[{KEY_FOR!r}] = the id of its target"
            )
        if target == record.id:
            raise SearchKeyError(f"search key {record.id!r} points to itself")
        same = batch.get(target)
        if same is not None:
            if same.user_id != record.user_id:
                raise SearchKeyError(
                    f"search key {record.id!r} points to {target!r}, a record of another user"
                )
            if same.kind == SEARCH_KEY_KIND:
                raise SearchKeyError(f"search key {record.id!r} points to another search key")
            continue
        wanted.setdefault(record.user_id, set()).add(target)
    for user_id, ids in wanted.items():
        found = {r.id: r for r in existing(sorted(ids), user_id=user_id) if r.user_id == user_id}
        for target in sorted(ids):
            if target not in found:
                raise SearchKeyError(
                    f"search key target {target!r} is not a record of user {user_id!r} "
                    "(missing, or another user's)"
                )
            if found[target].kind == SEARCH_KEY_KIND:
                raise SearchKeyError(f"search key target {target!r} is itself a search key")


@runtime_checkable
class KeyLookup(Protocol):
    """Optional backend method: whether a user has records of a kind (skips key queries)."""

    def has_kind(self, user_id: str, kind: str) -> bool:
        """Whether ``user_id`` has at least one record of ``kind``."""
        ...


@runtime_checkable
class DenseMany(Protocol):
    """Optional backend method: several filtered dense searches of one vector at once.

    Each ranking must equal ``dense(vector, user_id=, depth=, where=where)``; a backend
    whose index over-fetches and filters (Chroma) shares that over-fetch between the filters,
    so the records and the keys of a recall cost one index query instead of two.
    """

    def dense_many(
        self,
        vector: npt.NDArray[np.float32],
        *,
        user_id: str,
        depth: int,
        wheres: Sequence[Where],
    ) -> list[Ranking]:
        """One ranking per filter of ``wheres``."""
        ...


def _excluding_keys(where: Where | None) -> Where:
    """``where`` restricted to records that are not search keys."""
    kind = (where or {}).get("kind")
    if isinstance(kind, str) and kind != SEARCH_KEY_KIND:
        return where or {}
    if isinstance(kind, Mapping) and set(kind) == {"$in"} and SEARCH_KEY_KIND not in kind["$in"]:
        return where or {}
    not_key = {"kind": {"$ne": SEARCH_KEY_KIND}}
    return not_key if not where else {"$and": [dict(where), not_key]}


class KeyedBackend:
    """A recall backend that maps search-key hits onto their targets.

    Create one per recall (it caches the records it loads). With no search key for the
    user (checked once, through the inner backend's ``has_kind`` when it has one), every
    call is forwarded unchanged, so recall costs what it did.

    Args:
        inner: The backend holding records and keys.
        key_fusion: ``"max"``: a target scores the best of its own score and its keys';
            ``"sum"``: its own score (the ranking's weakest if it was not returned itself)
            plus ``key_weight`` times its best key's.
        key_weight: See ``key_fusion``; under ``"max"`` it scales the key scores.
    """

    def __init__(
        self,
        inner: RecallBackend,
        *,
        key_fusion: Literal["max", "sum"] = DEFAULT_KEY_FUSION,
        key_weight: float = DEFAULT_KEY_WEIGHT,
    ) -> None:
        if key_fusion not in ("max", "sum"):
            raise ConfigurationError(f"unknown key_fusion {key_fusion!r}")
        if not (isinstance(key_weight, (int, float)) and 0 <= key_weight < float("inf")):
            raise ConfigurationError("key_weight must be a finite number >= 0")
        self.inner = inner
        #: The inner backend's clock (the pipeline reads "now" from it when not given).
        self.clock = getattr(inner, "clock", None)
        self.key_fusion = key_fusion
        self.key_weight = float(key_weight)
        self._has_keys: dict[str, bool] = {}
        self._records: dict[str, MemoryRecord | None] = {}

    # -- helpers
    def has_keys(self, user_id: str) -> bool:
        """Whether ``user_id`` has search keys (cached for this backend's life)."""
        if user_id not in self._has_keys:
            if isinstance(self.inner, KeyLookup):
                self._has_keys[user_id] = self.inner.has_kind(user_id, SEARCH_KEY_KIND)
            else:
                self._has_keys[user_id] = True
        return self._has_keys[user_id]

    def _load(self, ids: Sequence[str], user_id: str) -> dict[str, MemoryRecord]:
        missing = [item for item in dict.fromkeys(ids) if item not in self._records]
        if missing:
            found = self.inner.load(missing, user_id=user_id)
            for item in missing:
                record = found.get(item)
                self._records[item] = record if record and record.user_id == user_id else None
        return {item: r for item in ids if (r := self._records.get(item)) is not None}

    def _merge(self, own: Ranking, keys: Ranking, user_id: str, where: Where | None) -> Ranking:
        if not keys:
            return own
        key_records = self._load([item for item, _ in keys], user_id)
        pointed = {item: target_of(r) for item, r in key_records.items()}
        targets = self._load([t for t in pointed.values() if t is not None], user_id)
        best: dict[str, float] = {}
        for item, score in keys:
            target = pointed.get(item)
            record = targets.get(target) if target is not None else None
            if record is None or record.kind == SEARCH_KEY_KIND:
                continue
            if target in best or not filters_match(record, where):
                continue
            assert target is not None
            best[target] = self.key_weight * float(score)
        if not best:
            return own
        merged: dict[str, float] = {}
        for item, score in own:
            merged.setdefault(item, float(score))
        floor = min(merged.values(), default=0.0)
        for target, score in best.items():
            if self.key_fusion == "max":
                merged[target] = max(merged.get(target, -float("inf")), score)
            else:
                merged[target] = merged.get(target, floor) + score
        order = {item: n for n, item in enumerate(merged)}
        return sorted(merged.items(), key=lambda pair: (-pair[1], order[pair[0]]))

    # -- RecallBackend
    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """Forwarded to the inner backend."""
        return self.inner.embed_query(text)

    def dense(
        self, vector: npt.NDArray[np.float32], *, user_id: str, depth: int, where: Where | None
    ) -> Ranking:
        """Nearest records, a key hit counting for its target."""
        if not self.has_keys(user_id):
            return self.inner.dense(vector, user_id=user_id, depth=depth, where=where)
        wheres = (_excluding_keys(where), {"kind": SEARCH_KEY_KIND})
        if isinstance(self.inner, DenseMany):
            own, keys = self.inner.dense_many(vector, user_id=user_id, depth=depth, wheres=wheres)
        else:
            own, keys = (
                self.inner.dense(vector, user_id=user_id, depth=depth, where=part)
                for part in wheres
            )
        return list(self._merge(own, keys, user_id, where))[:depth]

    def lexical(self, query: str, *, user_id: str, depth: int, where: Where | None) -> Ranking:
        """Best BM25 matches, a key hit counting for its target."""
        if not self.has_keys(user_id):
            return self.inner.lexical(query, user_id=user_id, depth=depth, where=where)
        own = self.inner.lexical(query, user_id=user_id, depth=depth, where=_excluding_keys(where))
        keys = self.inner.lexical(
            query, user_id=user_id, depth=depth, where={"kind": SEARCH_KEY_KIND}
        )
        return list(self._merge(own, keys, user_id, where))[:depth]

    def load(self, ids: Sequence[str], *, user_id: str) -> dict[str, MemoryRecord]:
        """Records among ``ids``; search keys are never returned."""
        return {
            item: record
            for item, record in self._load(ids, user_id).items()
            if record.kind != SEARCH_KEY_KIND
        }

    def texts(self, ids: Sequence[str], *, user_id: str) -> dict[str, str]:
        """Texts of the records among ``ids``; search keys are never returned.

        A user without search keys is served by the inner backend's text-only read when it
        has one; otherwise the records are loaded, so that keys are told apart by kind.
        """
        read = getattr(self.inner, "texts", None)
        if callable(read) and not self.has_keys(user_id):
            return dict(read(ids, user_id=user_id))
        return {item: record.text for item, record in self.load(ids, user_id=user_id).items()}

    def adjacent(
        self, ids: Sequence[str], *, user_id: str, gap: timedelta | None
    ) -> dict[str, tuple[str | None, str | None]]:
        """Forwarded to the inner backend."""
        return self.inner.adjacent(ids, user_id=user_id, gap=gap)

    def __getattr__(self, name: str) -> Any:
        # Optional backend methods (e.g. ``vectors`` for MMR) only where the inner one has them.
        if name == "vectors":
            return getattr(self.inner, name)
        raise AttributeError(name)
