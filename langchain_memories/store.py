"""A LangGraph ``BaseStore`` backed by the memory engine (LangGraph apps, LangMem tools)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import uuid
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    IndexConfig,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)

from langchain_memories.observability import emit_memory_event
from langchain_memories.store_values import (
    compile_fields,
    finite_or_none,
    index_texts,
    resolve_embedder,
    to_json_value,
    validate_filter,
    value_matches,
)
from memories_core.agent_tools import engine_of
from memories_core.engine import MAX_K, MemoryEngine
from memories_core.errors import ConfigurationError, InvalidInputError, MissingUserError
from memories_core.interfaces import Clock
from memories_core.retrieval import KEY_FOR, SEARCH_KEY_KIND
from memories_core.retrieval.keys import key_filter
from memories_core.retrieval.pipeline import DenseSource, Pipeline
from memories_core.types import MemoryRecord, check_user_id, holds_lone_surrogate, new_id

__all__ = [
    "MAPPED_USER_PREFIX",
    "SHARED_USER_ID",
    "STORE_KIND",
    "UNINDEXED_KIND",
    "MemoryStore",
    "StoreNamespaceError",
    "user_id_of_label",
]

#: Record kind of the store's items that a query can find (they have a vector).
STORE_KIND = "store"
#: Record kind of items put with ``index=False`` (or with no text at the indexed fields):
#: listed, filtered and fetched like the others, never found by a query.
UNINDEXED_KIND = "store_unindexed"
#: Owner of the items of namespaces too short to hold a user label.
SHARED_USER_ID = "langgraph-store:shared"

_KINDS = [STORE_KIND, UNINDEXED_KIND]
_NAMESPACE = "store.namespace"  # the full namespace (JSON list)
_LEGACY_NS = "store.ns"  # namespace without the user label, before the user label moved
_KEY = "store.key"
_VALUE = "store.value"
_UPDATED = "store.updated_at"
_TTL = "store_ttl_minutes"
#: Plain vector search: scores are cosine similarities, max-pooled over an item's fields.
_DENSE = Pipeline(sources=(DenseSource(weight=1.0),), rerankers=())


class StoreNamespaceError(InvalidInputError, InvalidNamespaceError):
    """A namespace LangGraph rejects, or whose user label is not a valid user id."""


def _record_id(namespace: tuple[str, ...], key: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, json.dumps([*namespace, key])).hex


def _check_labels(namespace: Sequence[Any], *, allow_wildcard: bool = False) -> None:
    for label in namespace:
        if allow_wildcard and label == "*":
            continue
        if not isinstance(label, str) or not label or "." in label or "\x00" in label:
            raise StoreNamespaceError(
                f"namespace labels are non-empty strings without '.' or NUL, got {label!r} in "
                f"{tuple(namespace)!r}"
            )
        if holds_lone_surrogate(label):  # as LangGraph's PostgresStore, which cannot store it
            raise StoreNamespaceError(
                f"namespace label {label!r} holds a lone surrogate (not valid Unicode)"
            )


#: Start of the user id that a user label maps to when it cannot be one as it is.
MAPPED_USER_PREFIX = "~lg~"


def user_id_of_label(label: str) -> str:
    """The engine user that owns the items of namespaces whose user label is ``label``.

    A label that is a valid user id (:func:`~memories_core.types.check_user_id`) is that id.
    LangGraph accepts labels that are not: whitespace only, the library's reserved
    ``__name__`` shape, longer than 1,024 characters. Such a label maps to ``~lg~`` and the
    SHA-256 of its UTF-8 bytes, and so does a label that itself starts with ``~lg~``, so that
    no label can pose as another's mapped id. Erase or export such a user with this id
    (:meth:`MemoryStore.user_id_of`).
    """
    if not label.startswith(MAPPED_USER_PREFIX):
        try:
            return check_user_id(label)
        except (InvalidInputError, MissingUserError):
            pass
    digest = hashlib.sha256(label.encode("utf-8")).hexdigest()
    return MAPPED_USER_PREFIX + digest


def _matches(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    return all(p == "*" or p == n for p, n in zip(path, part, strict=True))


def _emit_each(name: str, events: Sequence[dict[str, Any]]) -> None:
    """Dispatch one event per item; outside a run the first tells, and the rest are skipped."""
    for data in events:
        if not emit_memory_event(name, data):
            return


class MemoryStore(BaseStore):
    """LangGraph long-term memory on the engine of any ``memories_core`` mechanism.

    Every item is an engine record of the user its namespace names, so items are in that
    user's portable memory file, erased by ``delete_user``, and never returned to another
    user. The **user label** is the namespace label at position ``user_label``: by default
    the second, as in LangMem's default namespace ``("memories", "{langgraph_user_id}")``
    and LangGraph's ``("users", user_id)``; pass ``user_label=0`` for ``(user_id, ...)``
    layouts. A namespace too short to hold it (``("docs",)``) belongs to
    :data:`SHARED_USER_ID`. Namespace labels are those LangGraph accepts (non-empty
    strings without ``.``; NUL and lone surrogates are refused, as LangGraph's PostgresStore
    cannot store them either); a user label
    that is not a valid user id maps to one (:func:`user_id_of_label`, :meth:`user_id_of`).

    Values are stored as JSON, as LangGraph's database stores keep them (datetimes, UUIDs,
    pydantic models ... are converted; see :mod:`langchain_memories.store_values`).

    Search: ``query`` ranks the items of the namespace prefix by the cosine similarity of
    the query to the item's indexed texts (the best field counts, as in LangGraph's stores);
    ``SearchItem.score`` is that similarity clamped into ``[0, 1]``. Without ``query`` the
    items come in insertion order without a score. ``filter`` follows ``InMemoryStore``
    (top-level keys, nested dicts, lists, ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``,
    ``$lte``). Items put with ``index=False`` are never found by a query.

    Setup:
        ```bash
        pip install "llm-memories[langchain]"
        ```

    Key init args:
        memory: Any mechanism, or a ``MemoryEngine``, whose engine holds the items;
            ``None`` builds an engine at ``path`` with the embedder of ``index["embed"]``.
        index: LangGraph's ``IndexConfig``: ``embed`` (LangChain ``Embeddings``, a
            function, a provider string such as ``"hashing"``, ``"minilm"`` or
            ``"openai:text-embedding-3-small"``; only when ``memory`` is ``None``),
            ``dims`` (checked against the embedder), ``fields`` (paths embedded per
            item, default ``["$"]``: the whole value).
        ttl_config: LangGraph's ``TTLConfig``: ``default_ttl`` (minutes),
            ``refresh_on_read`` (default ``True``), ``sweep_interval_minutes``
            (used by :meth:`start_ttl_sweeper`). Expired items are never returned.
        user_label: Position of the user label in a namespace.
        path: Folder of the engine built when ``memory`` is ``None`` (``None``: in memory).
        clock: Source of "now" of that engine (e.g. a ``FixedClock`` in tests).

    Instantiate:
        ```python
        from langgraph.graph import StateGraph
        from langchain_memories import MemoryStore

        store = MemoryStore(memory)                   # any mechanism, or a MemoryEngine
        store = MemoryStore(index={"embed": "hashing", "fields": ["text"]},
                            ttl_config={"default_ttl": 60 * 24})
        graph = builder.compile(store=store)          # nodes receive it as `store`
        store.put(("memories", "alice"), "food", {"text": "likes Thai food"})
        store.search(("memories", "alice"), query="what does she eat?")
        ```

    Async:
        ``aget``/``aput``/``asearch``/... run the same operations in a worker thread.

    Raises:
        ConfigurationError: on contradictory or invalid arguments (``embed`` together with
            a memory, ``dims`` unlike the embedder's, a negative ``user_label``).
    """

    supports_ttl = True

    def __init__(
        self,
        memory: Any = None,
        *,
        index: IndexConfig | Mapping[str, Any] | None = None,
        ttl_config: TTLConfig | None = None,
        user_label: int = 1,
        path: str | Path | None = None,
        clock: Clock | None = None,
    ) -> None:
        if isinstance(user_label, bool) or not isinstance(user_label, int) or user_label < 0:
            raise ConfigurationError(f"user_label must be an int >= 0, got {user_label!r}")
        config = dict(index or {})
        unknown = set(config) - {"dims", "embed", "fields"}
        if unknown:
            raise ConfigurationError(f"unknown index settings {sorted(unknown)}")
        dims = config.get("dims")
        if memory is not None:
            if "embed" in config:
                raise ConfigurationError(
                    "index['embed'] is for a store that builds its engine (memory=None); this "
                    "memory's engine embeds with its own embedder"
                )
            if path is not None or clock is not None:
                raise ConfigurationError(
                    "path and clock are for a store that builds its engine (memory=None)"
                )
            self.engine = engine_of(memory)
            self._owns_engine = False
        else:
            embed = config.get("embed")
            embedder = resolve_embedder(embed, dims) if embed is not None else None
            self.engine = MemoryEngine(path=path, embedder=embedder, clock=clock)
            self._owns_engine = True
        dimension = self.engine.embedder.dimension
        if dims is not None and dims != dimension:
            raise ConfigurationError(
                f"index dims is {dims}, the embedder's vectors have {dimension}"
            )
        self._fields = compile_fields(config.get("fields"))
        from langchain_memories.bridges import CoreEmbeddings

        self.index_config: dict[str, Any] = {
            "dims": dimension,
            "embed": CoreEmbeddings(self.engine.embedder),
            "fields": [name for name, _ in self._fields],
        }
        self.ttl_config = ttl_config
        self.user_label = user_label
        self._sweeper: threading.Thread | None = None
        self._sweeper_stop = threading.Event()

    # -- namespaces -------------------------------------------------------------------------
    def _owner(self, namespace: tuple[str, ...]) -> str:
        """The user whose memory holds the items of ``namespace``."""
        if not namespace:
            raise StoreNamespaceError("a namespace has at least one label")
        _check_labels(namespace)
        if len(namespace) <= self.user_label:
            return SHARED_USER_ID
        return user_id_of_label(namespace[self.user_label])

    def _owners(self, prefix: Sequence[str]) -> list[str]:
        """The users whose items can lie under ``prefix`` (every user without a user label)."""
        if len(prefix) > self.user_label and prefix[self.user_label] != "*":
            return [user_id_of_label(prefix[self.user_label])]
        return self.engine.users()

    def user_id_of(self, namespace: Sequence[str]) -> str:
        """The engine user whose memory holds ``namespace``'s items (for export or erasure).

        Usually the user label itself (``("memories", "alice")`` -> ``"alice"``); see
        :func:`user_id_of_label` for labels that are not valid user ids, and
        :data:`SHARED_USER_ID` for namespaces too short to have a user label.

        Raises:
            StoreNamespaceError: if ``namespace`` is not one LangGraph accepts.
        """
        return self._owner(tuple(namespace))

    def _namespace_where(self, prefix: Sequence[str]) -> dict[str, Any]:
        return {
            f"{_LEGACY_NS}.{i}": label
            for i, label in enumerate(prefix)
            if i != self.user_label and label != "*"
        }

    @staticmethod
    def _namespace(record: MemoryRecord) -> tuple[str, ...]:
        meta = record.metadata
        if _NAMESPACE in meta:
            return tuple(json.loads(meta[_NAMESPACE]))
        return (record.user_id, *json.loads(meta[_LEGACY_NS]))  # an item of an older version

    # -- records <-> items ----------------------------------------------------------------------
    def _item(self, record: MemoryRecord, score: float | None = None) -> SearchItem:
        meta = record.metadata
        return SearchItem(
            namespace=self._namespace(record),
            key=str(meta[_KEY]),
            value=json.loads(meta[_VALUE]),
            created_at=record.created_at,
            updated_at=datetime.fromisoformat(meta[_UPDATED]),
            score=score,
        )

    @staticmethod
    def _plain(item: SearchItem) -> Item:
        return Item(
            value=item.value,
            key=item.key,
            namespace=item.namespace,
            created_at=item.created_at,
            updated_at=item.updated_at,
        )

    def _live(self, records: Iterable[MemoryRecord]) -> list[MemoryRecord]:
        now = self.engine.clock.now()
        return [r for r in records if r.kind in _KINDS and r.state.is_live(now)]

    def _refresh(self, records: Sequence[MemoryRecord]) -> None:
        now = self.engine.clock.now()
        by_user: dict[str, dict[str, Any]] = defaultdict(dict)
        for r in records:
            if r.state.attrs.get(_TTL) is not None:
                minutes = float(r.state.attrs[_TTL])
                by_user[r.user_id][r.id] = {"valid_until": now + timedelta(minutes=minutes)}
        for user, changes in by_user.items():
            self.engine.update_state(user, changes, reason="store ttl refreshed")

    @staticmethod
    def _value_matches(record: MemoryRecord, conditions: Mapping[str, Any] | None) -> bool:
        """Whether the item's stored value matches a filter (decoded only when there is one)."""
        return not conditions or value_matches(json.loads(record.metadata[_VALUE]), conditions)

    # -- operations -----------------------------------------------------------------------------
    def _get(self, op: GetOp) -> Item | None:
        user = self._owner(op.namespace)
        found = self._live(self.engine.get(user, [_record_id(op.namespace, op.key)]))
        if not found:
            return None
        if op.refresh_ttl:
            self._refresh(found)
        return self._plain(self._item(found[0]))

    def _put_many(self, ops: Sequence[PutOp]) -> None:
        """Apply puts and deletes, one engine transaction per user (the last op of a key wins)."""
        latest: dict[tuple[tuple[str, ...], str], tuple[PutOp, str]] = {}
        encoded: dict[int, tuple[dict[str, Any], str]] = {}
        for op in ops:
            owner = self._owner(op.namespace)  # validate every op before writing any
            if not isinstance(op.key, str):
                raise InvalidInputError(f"a store key is a str, got {type(op.key).__name__}")
            if holds_lone_surrogate(op.key):  # as a namespace label's (no store can keep it)
                raise InvalidInputError(
                    f"store key {op.key!r} holds a lone surrogate (not valid Unicode)"
                )
            if op.value is not None:
                encoded[id(op)] = to_json_value(op.value)
            latest[(op.namespace, op.key)] = (op, owner)
        by_user: dict[str, list[PutOp]] = defaultdict(list)
        for op, owner in latest.values():
            by_user[owner].append(op)
        for user, user_ops in by_user.items():
            self._put_user(user, user_ops, encoded)

    def _put_user(
        self, user: str, ops: Sequence[PutOp], encoded: Mapping[int, tuple[dict[str, Any], str]]
    ) -> None:
        deleted = [_record_id(op.namespace, op.key) for op in ops if op.value is None]
        if deleted:
            self.engine.delete_records(user, deleted, reason="store delete")
            _emit_each("memory_forgotten", [{"user_id": user, "record_id": rid} for rid in deleted])
        puts = [op for op in ops if op.value is not None]
        if not puts:
            return
        now = self.engine.clock.now()
        ids = [_record_id(op.namespace, op.key) for op in puts]
        old = {r.id: r for r in self.engine.get(user, ids)}
        old_keys = [
            r.id
            for start in range(0, len(old), 500)
            for r in self.engine.records(user, where=key_filter(list(old)[start : start + 500]))
        ]
        records: list[MemoryRecord] = []
        state: dict[str, dict[str, Any]] = {}
        for op, rid in zip(puts, ids, strict=True):
            value, text = encoded[id(op)]
            fields = (
                []
                if op.index is False
                else self._fields
                if op.index is None
                else compile_fields(op.index)
            )
            texts = index_texts(value, fields)
            previous = old.get(rid)
            records.append(
                MemoryRecord(
                    id=rid,
                    user_id=user,
                    kind=STORE_KIND if texts else UNINDEXED_KIND,
                    text=texts[0] if texts else text,
                    created_at=previous.created_at if previous else now,
                    metadata={
                        _NAMESPACE: json.dumps(list(op.namespace), ensure_ascii=False),
                        **{f"{_LEGACY_NS}.{i}": label for i, label in enumerate(op.namespace)},
                        "store.depth": len(op.namespace),
                        _KEY: op.key,
                        _VALUE: text,
                        _UPDATED: now.isoformat(),
                    },
                )
            )
            # Each further text is a search key of the item: a query matching any indexed
            # field finds it, scored by its best field (LangGraph max-pools field vectors).
            records += [
                MemoryRecord(
                    id=new_id(),
                    user_id=user,
                    kind=SEARCH_KEY_KIND,
                    text=extra,
                    created_at=now,
                    metadata={KEY_FOR: rid},
                )
                for extra in texts[1:]
            ]
            had_ttl = previous is not None and previous.state.attrs.get(_TTL) is not None
            if op.ttl is not None or had_ttl:
                until = None if op.ttl is None else now + timedelta(minutes=float(op.ttl))
                state[rid] = {"valid_until": until, "attrs": {_TTL: op.ttl}}
        # Items, their keys and their TTLs in one transaction: a crash cannot leave an item
        # that never expires, or the keys of an older version of an item.
        self.engine.add_records(records, replace=old_keys, state=state or None, reason="store put")
        _emit_each(
            "memory_saved",
            [
                {"user_id": user, "record_id": rid, "key": op.key}
                for op, rid in zip(puts, ids, strict=True)
            ],
        )

    def _ranked(
        self, user: str, op: SearchOp, wanted: int
    ) -> list[tuple[MemoryRecord, float | None]]:
        """``user``'s items ranked for the query, filtered, at least ``wanted`` if there are.

        The namespace prefix and the value filter are applied to the ranking, not inside the
        index: a user's items usually share one namespace, and an index-side filter costs a
        metadata test per candidate; a selective prefix or filter reads deeper instead.
        """
        assert op.query is not None
        prefix = tuple(op.namespace_prefix)
        k = min(MAX_K, max(1, wanted))
        while True:
            hits = self.engine.search(op.query, user, k=k, kinds=[STORE_KIND], pipeline=_DENSE)
            kept = [
                (h.record, finite_or_none(h.score))
                for h in hits
                if self._namespace(h.record)[: len(prefix)] == prefix
                and self._value_matches(h.record, op.filter)
            ]
            if len(kept) >= wanted or len(hits) < k or k >= MAX_K:
                return kept
            k = min(MAX_K, k * 4)

    def _search(self, op: SearchOp) -> list[SearchItem]:
        _check_labels(op.namespace_prefix, allow_wildcard=True)
        validate_filter(op.filter)
        if op.offset < 0 or op.limit < 0:
            raise InvalidInputError("search offset and limit must be >= 0")
        where = self._namespace_where(op.namespace_prefix)
        wanted = op.offset + op.limit
        prefix = tuple(op.namespace_prefix)
        hits: list[tuple[MemoryRecord, float | None]] = []
        for user in self._owners(prefix):
            if op.query and op.query.strip():
                hits += self._ranked(user, op, wanted)
            else:
                listed = self.engine.records(user, where={"kind": {"$in": _KINDS}, **where})
                hits += [(r, None) for r in self._live(listed) if self._value_matches(r, op.filter)]
        # Namespaces of the shared owner or short legacy ones: the prefix must still match.
        hits = [h for h in hits if self._namespace(h[0])[: len(prefix)] == prefix]
        if op.query and op.query.strip():
            hits.sort(key=lambda pair: -(pair[1] or 0.0))
        page = hits[op.offset : wanted]
        if op.refresh_ttl:
            self._refresh([record for record, _ in page])
        return [self._item(record, score) for record, score in page]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        conditions = list(op.match_conditions or ())
        for condition in conditions:
            _check_labels(condition.path, allow_wildcard=True)
        prefix: tuple[str, ...] = ()
        for condition in conditions:
            if condition.match_type == "prefix":
                prefix = tuple(condition.path)
        found: set[tuple[str, ...]] = set()
        for user in self._owners(prefix):
            listed = self.engine.records(user, where={"kind": {"$in": _KINDS}})
            for record in self._live(listed):
                namespace = self._namespace(record)
                if all(_matches(namespace, c) for c in conditions):
                    depth = op.max_depth
                    found.add(namespace[:depth] if depth is not None else namespace)
        ordered = sorted(found)
        return ordered[op.offset : op.offset + op.limit]

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order; returns one result per operation.

        Consecutive puts are written together (one transaction per user), which is what
        makes batched puts fast; a read after a put sees it.
        """
        results: list[Result] = []
        pending: list[PutOp] = []
        for op in ops:
            if isinstance(op, PutOp):
                pending.append(op)
                results.append(None)
                continue
            if pending:
                self._put_many(pending)
                pending = []
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise InvalidInputError(f"unknown store operation {type(op).__name__}")
        if pending:
            self._put_many(pending)
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async twin of :meth:`batch` (runs it in a worker thread)."""
        return await asyncio.to_thread(self.batch, list(ops))

    # -- TTL ------------------------------------------------------------------------------------
    def sweep_ttl(self) -> int:
        """Delete every expired item (its text is not kept in the history); returns how many."""
        now = self.engine.clock.now()
        swept = 0
        for user in self.engine.users():
            expired = self.engine.records(
                user, where={"kind": {"$in": _KINDS}, "valid_until": {"$lt": now}}
            )
            if expired:
                ids = [r.id for r in expired]
                self.engine.delete_records(user, ids, reason="store ttl expired", erase=True)
                swept += len(ids)
        return swept

    async def asweep_ttl(self) -> int:
        """Async :meth:`sweep_ttl`."""
        return await asyncio.to_thread(self.sweep_ttl)

    def start_ttl_sweeper(self, sweep_interval_minutes: float | None = None) -> Future[None]:
        """Sweep expired items every ``sweep_interval_minutes`` in a daemon thread.

        The interval defaults to ``ttl_config["sweep_interval_minutes"]``, else 5 minutes.
        Returns a future that completes when :meth:`stop_ttl_sweeper` stops the thread.
        """
        minutes = sweep_interval_minutes or (self.ttl_config or {}).get("sweep_interval_minutes")
        interval = 60.0 * float(minutes or 5)
        done: Future[None] = Future()
        if self._sweeper is not None and self._sweeper.is_alive():
            done.set_result(None)
            return done
        self._sweeper_stop.clear()

        def loop() -> None:
            try:
                while not self._sweeper_stop.wait(interval):
                    self.sweep_ttl()
            finally:
                done.set_result(None)

        self._sweeper = threading.Thread(target=loop, name="memory-store-ttl", daemon=True)
        self._sweeper.start()
        return done

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; returns whether it stopped within ``timeout`` seconds."""
        thread = self._sweeper
        if thread is None:
            return True
        self._sweeper_stop.set()
        thread.join(timeout)
        stopped = not thread.is_alive()
        if stopped:
            self._sweeper = None
        return stopped

    def close(self) -> None:
        """Stop the sweeper, and close the engine if this store built it."""
        self.stop_ttl_sweeper()
        if self._owns_engine:
            self.engine.close()
