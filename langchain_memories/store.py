"""A LangGraph ``BaseStore`` backed by the memory engine (LangGraph apps, LangMem tools)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from langchain_memories.observability import emit_memory_event
from memories_core.agent_tools import engine_of
from memories_core.engine import MAX_K
from memories_core.errors import InvalidInputError
from memories_core.types import MemoryRecord, check_user_id

__all__ = ["STORE_KIND", "MemoryStore"]

#: Record kind of the store's items.
STORE_KIND = "store"

_NS = "store.ns"
_KEY = "store.key"
_VALUE = "store.value"
_UPDATED = "store.updated_at"
_TTL = "store_ttl_minutes"
_OPS = {"$eq": None, "$ne": "$ne", "$gt": "$gt", "$gte": "$gte", "$lt": "$lt", "$lte": "$lte"}


def _record_id(namespace: tuple[str, ...], key: str) -> str:
    return uuid.uuid5(uuid.NAMESPACE_URL, json.dumps([*namespace, key])).hex


def _text(value: Mapping[str, Any], index: Any) -> str:
    if isinstance(index, list) and index:
        parts = [value.get(field) for field in index if value.get(field) is not None]
        text = " ".join(p if isinstance(p, str) else json.dumps(p) for p in parts)
        if text.strip():
            return text
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _value_filter(conditions: Mapping[str, Any] | None) -> dict[str, Any]:
    """LangGraph's filter (``{"field": value | {"$op": value}}``) on the value's fields."""
    out: dict[str, Any] = {}
    for field, want in (conditions or {}).items():
        key = f"value.{field}"
        if isinstance(want, Mapping):
            for op, operand in want.items():
                if op not in _OPS:
                    raise InvalidInputError(f"unsupported filter operator {op!r}")
                mapped = _OPS[op]
                out.setdefault("$and", []).append(
                    {key: operand} if mapped is None else {key: {mapped: operand}}
                )
        else:
            out[key] = want
    return out


def _matches(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    part = namespace[: len(path)] if condition.match_type == "prefix" else namespace[-len(path) :]
    return all(p == "*" or p == n for p, n in zip(path, part, strict=True))


class MemoryStore(BaseStore):
    """LangGraph long-term memory on the engine of any ``memories_core`` mechanism.

    A namespace is ``(user_id, *scope)``: its first label is the user (every read and write
    is restricted to that user inside the engine), the rest is a scope of the app's choosing
    (``("alice", "memories")``, ``("alice", "profile", "food")``). Each item is an engine
    record of kind :data:`STORE_KIND` whose text is what is embedded (the JSON value, or the
    fields named by ``index``) and whose metadata keeps key, value and namespace; so items
    are in the user's portable memory file, erased by ``delete_user``, searched by the
    engine's hybrid retrieval, and shown by the command line.

    Operations: ``get``, ``put`` (``value=None`` deletes; ``index=False`` stores without a
    vector; ``ttl`` minutes sets the record's ``valid_until``), ``search`` (natural-language
    ``query`` through the engine, ``filter`` on the value's top-level fields with ``$eq``,
    ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``, ``offset``/``limit``), ``list_namespaces``.

    Setup:
        ```bash
        pip install "llm-memories[langchain]"
        ```

    Instantiate:
        ```python
        from langgraph.graph import StateGraph
        from langchain_memories import MemoryStore

        store = MemoryStore(memory)           # any mechanism, or a MemoryEngine
        graph = builder.compile(store=store)  # nodes receive it as `store`
        store.put(("alice", "memories"), "food", {"text": "likes Thai food"})
        store.search(("alice", "memories"), query="what does she eat?")
        ```

    Async:
        ``aget``/``aput``/``asearch``/... run the same operations in a worker thread.
    """

    supports_ttl = True

    def __init__(self, memory: Any) -> None:
        self.engine = engine_of(memory)

    # -- helpers ------------------------------------------------------------------------------
    @staticmethod
    def _user(namespace: tuple[str, ...]) -> str:
        if not namespace:
            raise InvalidInputError("a namespace starts with the user id: (user_id, ...)")
        return check_user_id(namespace[0])

    def _item(self, record: MemoryRecord, score: float | None = None) -> SearchItem:
        meta = record.metadata
        return SearchItem(
            namespace=(record.user_id, *json.loads(meta[_NS])),
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
        return [r for r in records if r.kind == STORE_KIND and r.state.is_live(now)]

    def _refresh(self, user_id: str, records: list[MemoryRecord]) -> None:
        now = self.engine.clock.now()
        changes = {
            r.id: {"valid_until": now + timedelta(minutes=float(r.state.attrs[_TTL]))}
            for r in records
            if r.state.attrs.get(_TTL) is not None
        }
        if changes:
            self.engine.update_state(user_id, changes, reason="store ttl refreshed")

    @staticmethod
    def _scope_filter(prefix: tuple[str, ...]) -> dict[str, Any]:
        return {f"{_NS}.{i}": label for i, label in enumerate(prefix[1:], start=1)}

    def _users(self, prefix: tuple[str, ...]) -> list[str]:
        return [self._user(prefix)] if prefix else self.engine.users()

    # -- operations -----------------------------------------------------------------------------
    def _get(self, op: GetOp) -> Item | None:
        user = self._user(op.namespace)
        found = self._live(self.engine.get(user, [_record_id(op.namespace, op.key)]))
        if not found:
            return None
        if op.refresh_ttl:
            self._refresh(user, found)
        return self._plain(self._item(found[0]))

    def _put(self, op: PutOp) -> None:
        user = self._user(op.namespace)
        rid = _record_id(op.namespace, op.key)
        if op.value is None:
            self.engine.delete_records(user, [rid], reason="store delete")
            emit_memory_event("memory_forgotten", {"user_id": user, "record_id": rid})
            return
        now = self.engine.clock.now()
        old = self.engine.get(user, [rid])
        value = dict(op.value)
        meta: dict[str, Any] = {
            f"value.{k}": v
            for k, v in value.items()
            if isinstance(v, (str, int, float, bool)) and isinstance(k, str)
        }
        meta.update(self._scope_filter(op.namespace))
        meta.update(
            {
                _NS: json.dumps(list(op.namespace[1:]), ensure_ascii=False),
                _KEY: op.key,
                _VALUE: json.dumps(value, ensure_ascii=False),
                _UPDATED: now.isoformat(),
                "store.depth": len(op.namespace),
            }
        )
        record = MemoryRecord(
            id=rid,
            user_id=user,
            kind=STORE_KIND,
            text=_text(value, op.index),
            created_at=old[0].created_at if old else now,
            metadata=meta,
        )
        ttl = op.ttl
        had_ttl = bool(old) and old[0].state.attrs.get(_TTL) is not None
        state = None
        if ttl is not None or had_ttl:
            state = {
                rid: {
                    "valid_until": None if ttl is None else now + timedelta(minutes=float(ttl)),
                    "attrs": {_TTL: ttl},
                }
            }
        # The item and its TTL in one transaction: a crash cannot leave an item that never expires.
        self.engine.add_records(
            [record], index=op.index is not False, state=state, reason="store put"
        )
        emit_memory_event("memory_saved", {"user_id": user, "record_id": rid, "key": op.key})

    def _search(self, op: SearchOp) -> list[SearchItem]:
        where = {**self._scope_filter(op.namespace_prefix), **_value_filter(op.filter)}
        wanted = op.offset + op.limit
        hits: list[tuple[MemoryRecord, float | None]] = []
        for user in self._users(op.namespace_prefix):
            if op.query and op.query.strip():
                scored = self.engine.search(
                    op.query,
                    user,
                    k=min(MAX_K, max(1, wanted)),
                    kinds=[STORE_KIND],
                    where=where or None,
                )
                # LangGraph stores report a similarity: the relevance, in [0, 1].
                hits += [(h.record, h.relevance) for h in scored]
            else:
                full = {"kind": STORE_KIND, **where}
                hits += [(r, None) for r in self._live(self.engine.records(user, where=full))]
        if op.query and op.query.strip():
            hits.sort(key=lambda pair: -(pair[1] or 0.0))
        page = hits[op.offset : wanted]
        if op.refresh_ttl:
            for user in {r.user_id for r, _ in page}:
                self._refresh(user, [r for r, _ in page if r.user_id == user])
        return [self._item(record, score) for record, score in page]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        prefix: tuple[str, ...] = ()
        for condition in op.match_conditions or ():
            if condition.match_type == "prefix" and condition.path and condition.path[0] != "*":
                prefix = (str(condition.path[0]),)
        found: set[tuple[str, ...]] = set()
        for user in self._users(prefix):
            for record in self._live(self.engine.records(user, where={"kind": STORE_KIND})):
                namespace = (user, *json.loads(record.metadata[_NS]))
                if all(_matches(namespace, c) for c in op.match_conditions or ()):
                    depth = op.max_depth
                    found.add(namespace[:depth] if depth is not None else namespace)
        ordered = sorted(found)
        return ordered[op.offset : op.offset + op.limit]

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run the operations in order; returns one result per operation."""
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, PutOp):
                self._put(op)
                results.append(None)
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise InvalidInputError(f"unknown store operation {type(op).__name__}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async twin of :meth:`batch` (runs it in a worker thread)."""
        return await asyncio.to_thread(self.batch, list(ops))
