"""A conformance suite for LangGraph stores, written from LangGraph's documented ``BaseStore``.

The suite checks what LangGraph documents for every ``BaseStore`` (``put``/``get``/
``delete``/``search``/``list_namespaces``, their batch and async forms, filters, the index
configuration, TTL and scores), through the public store API only. LangGraph's own
``InMemoryStore`` passes it (the control, proving the suite asks nothing LangGraph does not
promise); ``langchain_memories.MemoryStore`` passes it on every storage backend.

Where LangGraph's stores differ among themselves the suite asks only what they share: the
order of a search without a query, a read inside the batch that writes, how ``created_at``
changes on an overwrite, and what a missing field does under an order operator are left
open. Options a store may lack are class attributes: :attr:`StoreConformance.bounded_scores`
(scores are similarities in ``[0, 1]``) and TTL (run when the store's ``supports_ttl`` is
true and the factory returns ``advance``). TTL times are in units of
:attr:`StoreConformance.ttl_unit_minutes`: 1 minute for a store whose clock the factory moves,
a fraction of one for a store on the real clock (``advance`` then sleeps).

It needs the ``langchain`` extra: LangGraph's operation types are imported where a test uses
them, so that importing the core never imports a framework. Stores are typed ``Any`` here
for the same reason.

Usage:

.. code-block:: python

    # tests/langchain/test_my_store_conformance.py
    import pytest
    from memories_core.testing.langgraph_store import StoreConformance, StoreFactory

    class TestMyStore(StoreConformance):
        bounded_scores = True

        @pytest.fixture
        def store_factory(self) -> StoreFactory:
            def make(index, ttl_config):
                store = MyStore(index=index, ttl_config=ttl_config)
                return store, None          # or a function that advances the clock (minutes)
            return make
"""

from __future__ import annotations

import asyncio
import importlib
import math
from collections.abc import Callable
from typing import Any, ClassVar

import pytest

from memories_core.embedders import HashingEmbedder
from memories_core.errors import MissingExtraError

__all__ = ["DIMS", "StoreConformance", "StoreFactory", "hashing_embed"]

#: A LangGraph ``BaseStore`` (typed loosely: the core does not import LangGraph).
BaseStore = Any
#: LangGraph's ``IndexConfig`` and ``TTLConfig`` (dicts).
IndexConfig = dict[str, Any]
TTLConfig = dict[str, Any]

#: Vector length of the suite's embeddings.
DIMS = 64

#: ``(index, ttl_config) -> (store, advance)``; ``advance(minutes)`` moves the store's clock
#: forward (``None``: the store's clock cannot be moved, TTL tests are skipped).
StoreFactory = Callable[
    [IndexConfig | None, TTLConfig | None],
    tuple[BaseStore, Callable[[float], None] | None],
]


_EMBEDDER = HashingEmbedder(DIMS)


def hashing_embed(texts: list[str]) -> list[list[float]]:
    """Deterministic embeddings (the package's hashing embedder, :data:`DIMS` long), no model.

    An embedding function as LangGraph's ``index={"embed": ...}`` takes it.
    """
    return [[float(x) for x in row] for row in _EMBEDDER.embed_documents(list(texts))]


def _ops() -> Any:
    """LangGraph's store module (its operation types), imported where a test needs it."""
    try:
        return importlib.import_module("langgraph.store.base")
    except ImportError as exc:
        raise MissingExtraError("langgraph", "langchain") from exc


def _index(fields: list[str] | None = None) -> IndexConfig:
    config: IndexConfig = {"dims": DIMS, "embed": hashing_embed}
    if fields is not None:
        config["fields"] = fields
    return config


_ALICE = ("memories", "alice")
_BOB = ("memories", "bob")


class StoreConformance:
    """LangGraph's ``BaseStore`` contract as tests; subclass it and provide ``store_factory``."""

    #: Whether search scores are similarities clamped into ``[0, 1]``.
    bounded_scores: ClassVar[bool] = False
    #: Minutes per unit of the TTL tests' times (TTLs, defaults and ``advance`` calls).
    ttl_unit_minutes: ClassVar[float] = 1.0

    @pytest.fixture
    def store_factory(self) -> StoreFactory:
        """The store under test; subclasses override this fixture."""
        raise NotImplementedError

    # -- helpers
    @staticmethod
    def _make(
        factory: StoreFactory,
        index: IndexConfig | None = None,
        ttl_config: TTLConfig | None = None,
    ) -> BaseStore:
        return factory(index, ttl_config)[0]

    def _check_scores(self, scores: list[float | None]) -> None:
        assert all(isinstance(s, float) for s in scores), scores
        values = [s for s in scores if s is not None]
        assert values == sorted(values, reverse=True), "scored results come best first"
        assert all(s <= 1.0 + 1e-6 for s in values), "a cosine similarity is at most 1"
        if self.bounded_scores:
            assert all(0.0 <= s <= 1.0 for s in values), values

    # -- put / get / delete
    def test_put_get_round_trip(self, store_factory: StoreFactory) -> None:
        """A put value comes back from get unchanged, with its key, namespace and times."""
        store = self._make(store_factory)
        value = {"text": "Alice likes Thai food", "n": 3, "tags": ["food"], "x": {"y": None}}
        store.put(_ALICE, "food", value)
        item = store.get(_ALICE, "food")
        assert item is not None
        assert item.value == value and item.key == "food" and item.namespace == _ALICE
        assert item.created_at is not None and item.updated_at >= item.created_at
        assert store.get(_ALICE, "missing") is None
        assert store.get(_BOB, "food") is None

    def test_overwrite_replaces_the_value(self, store_factory: StoreFactory) -> None:
        """A second put of a key replaces the value and keeps one item."""
        store = self._make(store_factory)
        store.put(_ALICE, "k", {"v": 1, "old": True})
        first = store.get(_ALICE, "k")
        store.put(_ALICE, "k", {"v": 2})
        item = store.get(_ALICE, "k")
        assert item is not None and first is not None
        assert item.value == {"v": 2}
        assert item.updated_at >= first.updated_at
        assert [i.key for i in store.search(_ALICE)] == ["k"]

    def test_delete(self, store_factory: StoreFactory) -> None:
        """A deleted item is gone from get and search; deleting a missing key is no error."""
        store = self._make(store_factory)
        store.put(_ALICE, "a", {"text": "gone soon"})
        store.put(_ALICE, "b", {"text": "stays"})
        store.delete(_ALICE, "a")
        assert store.get(_ALICE, "a") is None
        assert [i.key for i in store.search(_ALICE)] == ["b"]
        store.delete(_ALICE, "never-there")  # deleting a missing key is not an error

    def test_large_and_non_finite_numbers_round_trip(self, store_factory: StoreFactory) -> None:
        """Integers of any size and infinite floats round-trip."""
        store = self._make(store_factory)
        store.put(_ALICE, "n", {"big": 2**80, "neg": -(2**70), "inf": math.inf, "f": 0.1})
        item = store.get(_ALICE, "n")
        assert item is not None
        assert item.value["big"] == 2**80 and item.value["neg"] == -(2**70)
        assert item.value["inf"] == math.inf and item.value["f"] == 0.1

    def test_unicode_labels_keys_and_values(self, store_factory: StoreFactory) -> None:
        """Any non-empty label without '.' is accepted, Unicode included."""
        store = self._make(store_factory)
        namespace = ("mémoires", "ユーザー", "a b-c")
        store.put(namespace, "clé/1", {"texte": "café ☕"})
        item = store.get(namespace, "clé/1")
        assert item is not None and item.value == {"texte": "café ☕"}
        assert item.namespace == namespace

    def test_invalid_namespaces_raise_value_error(self, store_factory: StoreFactory) -> None:
        """Namespaces LangGraph rejects raise a ValueError."""
        store = self._make(store_factory)
        for bad in [(), ("a.b", "c"), ("memories", ""), ("langgraph", "x")]:
            with pytest.raises(ValueError):
                store.put(bad, "k", {"v": 1})

    # -- namespaces
    def test_namespaces_are_separate(self, store_factory: StoreFactory) -> None:
        """One key in two namespaces is two items; a prefix covers sub-namespaces."""
        store = self._make(store_factory)
        store.put(_ALICE, "k", {"who": "alice"})
        store.put(_BOB, "k", {"who": "bob"})
        store.put((*_ALICE, "work"), "k", {"who": "alice at work"})
        alice, bob = store.get(_ALICE, "k"), store.get(_BOB, "k")
        assert alice is not None and alice.value == {"who": "alice"}
        assert bob is not None and bob.value == {"who": "bob"}
        assert {i.value["who"] for i in store.search(_BOB)} == {"bob"}
        assert {i.value["who"] for i in store.search(_ALICE)} == {"alice", "alice at work"}
        assert {i.value["who"] for i in store.search(("memories",))} == {
            "alice",
            "bob",
            "alice at work",
        }

    def test_prefix_is_label_wise(self, store_factory: StoreFactory) -> None:
        """A namespace prefix matches whole labels, never a label's prefix."""
        store = self._make(store_factory)
        store.put(("memories", "al"), "k", {"v": 1})
        store.put(("memories", "alice"), "k", {"v": 2})
        assert [i.value["v"] for i in store.search(("memories", "al"))] == [1]

    def test_list_namespaces(self, store_factory: StoreFactory) -> None:
        """list_namespaces: sorted, prefix, suffix, '*' wildcard, max_depth, limit/offset."""
        store = self._make(store_factory)
        for namespace in [
            ("memories", "alice", "food"),
            ("memories", "alice", "work"),
            ("memories", "bob", "food"),
            ("profiles", "bob"),
        ]:
            store.put(namespace, "k", {"v": 1})
        everything = store.list_namespaces()
        assert everything == sorted(everything) and len(everything) == 4
        assert store.list_namespaces(prefix=("memories", "alice")) == [
            ("memories", "alice", "food"),
            ("memories", "alice", "work"),
        ]
        assert store.list_namespaces(suffix=("food",)) == [
            ("memories", "alice", "food"),
            ("memories", "bob", "food"),
        ]
        assert store.list_namespaces(prefix=("memories", "*", "food")) == [
            ("memories", "alice", "food"),
            ("memories", "bob", "food"),
        ]
        assert store.list_namespaces(prefix=("memories",), max_depth=2) == [
            ("memories", "alice"),
            ("memories", "bob"),
        ]
        assert store.list_namespaces(limit=2, offset=1) == everything[1:3]

    # -- search without a query
    def test_search_limit_offset_and_no_score(self, store_factory: StoreFactory) -> None:
        """A search without a query pages with limit/offset and has no scores."""
        store = self._make(store_factory)
        for i in range(6):
            store.put(_ALICE, f"k{i}", {"n": i})
        found = store.search(_ALICE, limit=10)
        assert sorted(i.key for i in found) == [f"k{i}" for i in range(6)]
        assert all(i.score is None for i in found)
        assert len(store.search(_ALICE, limit=4)) == 4
        page = store.search(_ALICE, limit=4, offset=4)
        assert len(page) == 2
        assert {i.key for i in page}.isdisjoint(i.key for i in store.search(_ALICE, limit=4))

    # -- filters
    def _filtered(
        self, store: BaseStore, conditions: dict[str, Any], prefix: tuple[str, ...] = ("memories",)
    ) -> list[str]:
        return sorted(i.key for i in store.search(prefix, filter=conditions, limit=50))

    def test_filters(self, store_factory: StoreFactory) -> None:
        """Filters follow InMemoryStore: top-level keys, lists, nested dicts, operators, numbers."""
        store = self._make(store_factory)
        store.put(_ALICE, "a", {"n": 1, "tags": ["x", "y"], "user": {"level": "admin", "id": 7}})
        store.put(_ALICE, "b", {"n": 5, "tags": ["y"], "user": {"level": "guest", "id": 8}})
        store.put(_BOB, "c", {"n": 10, "user.level": "dotted"})
        other = ("other", "bob")
        store.put(other, "d", {"big": 2**70, "inf": math.inf, "nan": math.nan, "flag": True})
        assert self._filtered(store, {"n": 5}) == ["b"]
        assert self._filtered(store, {"tags": ["x", "y"]}) == ["a"]
        assert self._filtered(store, {"tags": ["y", "x"]}) == []
        assert self._filtered(store, {"tags": ["x"]}) == []
        assert self._filtered(store, {"user": {"level": "admin"}}) == ["a"]
        assert self._filtered(store, {"user": {"level": "admin", "id": 8}}) == []
        # A key is a top-level field: dots are part of the name.
        assert self._filtered(store, {"user.level": "dotted"}) == ["c"]
        assert self._filtered(store, {"user.level": "admin"}) == []
        assert self._filtered(store, {"n": {"$gt": 1}}) == ["b", "c"]
        assert self._filtered(store, {"n": {"$gte": 1, "$lt": 10}}) == ["a", "b"]
        assert self._filtered(store, {"n": {"$lte": 5}}) == ["a", "b"]
        assert self._filtered(store, {"n": {"$eq": 10}}) == ["c"]
        assert self._filtered(store, {"n": {"$ne": 1}}) == ["b", "c"]
        assert self._filtered(store, {"n": {"$gt": 2**70}}) == []
        assert self._filtered(store, {"user": {"level": {"$ne": "admin"}}}) == ["b"]
        assert self._filtered(store, {"n": 1, "tags": ["x", "y"]}) == ["a"]
        assert self._filtered(store, {"n": 1, "tags": ["y"]}) == []
        assert self._filtered(store, {"missing": "x"}) == []
        assert self._filtered(store, {"big": 2**70}, other) == ["d"]
        assert self._filtered(store, {"big": 2**70 + 1}, other) == []
        assert self._filtered(store, {"big": {"$gt": 2**69}}, other) == ["d"]
        assert self._filtered(store, {"inf": math.inf}, other) == ["d"]
        assert self._filtered(store, {"inf": {"$gt": 1e308}}, other) == ["d"]
        assert self._filtered(store, {"nan": math.nan}, other) == []
        assert self._filtered(store, {"flag": True}, other) == ["d"]
        assert self._filtered(store, {"missing": {"$ne": 3}}, other) == ["d"]

    def test_unknown_operator_raises(self, store_factory: StoreFactory) -> None:
        """An unknown filter operator raises a ValueError."""
        store = self._make(store_factory)
        store.put(_ALICE, "a", {"n": 1})
        with pytest.raises(ValueError):
            store.search(_ALICE, filter={"n": {"$regex": "1"}})

    # -- semantic search
    def test_query_ranks_by_similarity(self, store_factory: StoreFactory) -> None:
        """A query ranks the prefix's items by similarity, best first; filters apply."""
        store = self._make(store_factory, _index(["text"]))
        texts = {
            "food": "Alice loves spicy Thai curry",
            "city": "Alice lives in Lisbon near the river",
            "job": "Alice works as a nurse at night",
        }
        for key, text in texts.items():
            store.put(_ALICE, key, {"text": text})
        store.put(_BOB, "food", {"text": "Alice loves spicy Thai curry"})
        hits = store.search(_ALICE, query="Alice loves spicy Thai curry", limit=3)
        assert hits[0].key == "food"
        assert all(h.namespace == _ALICE for h in hits)
        self._check_scores([h.score for h in hits])
        assert hits[0].score is not None and hits[0].score > 0.99
        assert [h.key for h in store.search(_ALICE, query="Lisbon river", limit=1)] == ["city"]
        assert len(store.search(_ALICE, query="nurse", limit=2)) == 2
        filtered = store.search(_ALICE, query="Thai curry", filter={"text": texts["job"]})
        assert [h.key for h in filtered] == ["job"]

    def test_query_offset_pages_the_ranking(self, store_factory: StoreFactory) -> None:
        """offset/limit page the ranking of a query."""
        store = self._make(store_factory, _index(["text"]))
        for i in range(5):
            store.put(_ALICE, f"k{i}", {"text": f"note {i} about the garden " + "x" * i})
        full = [h.key for h in store.search(_ALICE, query="garden note", limit=5)]
        assert [h.key for h in store.search(_ALICE, query="garden note", limit=2, offset=2)] == (
            full[2:4]
        )

    def test_index_fields_and_per_put_index(self, store_factory: StoreFactory) -> None:
        """Every configured field is indexed (the best counts); a put's list overrides."""
        store = self._make(store_factory, _index(["title", "body"]))
        store.put(_ALICE, "a", {"title": "gardening tips", "body": "water tomatoes at dawn"})
        store.put(_ALICE, "b", {"title": "travel plans", "body": "flight to Osaka in May"})
        store.put(_ALICE, "c", {"title": "recipes", "other": "quantum chromodynamics lecture"})
        store.put(_ALICE, "d", {"other": "quantum chromodynamics lecture"}, index=["other"])
        # Any indexed field finds its item; the best field counts.
        assert store.search(_ALICE, query="flight to Osaka in May", limit=1)[0].key == "b"
        assert store.search(_ALICE, query="water tomatoes at dawn", limit=1)[0].key == "a"
        # A per-put field list overrides the store's fields.
        hits = store.search(_ALICE, query="quantum chromodynamics lecture", limit=4)
        assert hits[0].key == "d"
        best = hits[0].score
        others = [h.score for h in hits[1:] if h.key == "c"]
        assert best is not None and all(s is None or s < best for s in others)

    def test_index_false_is_never_found_by_a_query(self, store_factory: StoreFactory) -> None:
        """An item put with index=False is never scored by a query, yet is stored."""
        store = self._make(store_factory, _index(["text"]))
        store.put(_ALICE, "secret", {"text": "the vault code is 4711"}, index=False)
        store.put(_ALICE, "open", {"text": "the garden gate is green"})
        hits = store.search(_ALICE, query="the vault code is 4711", limit=5)
        assert hits and hits[0].key == "open"
        assert all(h.score is None for h in hits if h.key == "secret")
        item = store.get(_ALICE, "secret")
        assert item is not None and item.value == {"text": "the vault code is 4711"}
        assert [i.key for i in store.search(_ALICE, filter={"text": "the vault code is 4711"})] == [
            "secret"
        ]

    def test_nested_field_paths_are_indexed(self, store_factory: StoreFactory) -> None:
        """Dotted paths and ``[*]`` wildcards index nested JSON values."""
        store = self._make(store_factory, _index(["profile.bio", "tags[*]"]))
        store.put(_ALICE, "a", {"profile": {"bio": "retired sailor who builds kayaks"}})
        store.put(_ALICE, "b", {"tags": ["sourdough baking", "rye starter"], "profile": {}})
        store.put(_ALICE, "c", {"bio": "retired sailor who builds kayaks"})  # not at the path
        hits = store.search(_ALICE, query="retired sailor who builds kayaks", limit=3)
        assert hits[0].key == "a"
        assert hits[0].score is not None and hits[0].score > 0.99
        assert store.search(_ALICE, query="rye starter", limit=1)[0].key == "b"
        assert all(h.score is None for h in hits if h.key == "c")

    def test_index_config_is_exposed(self, store_factory: StoreFactory) -> None:
        """``index_config`` holds the configuration's dims and fields."""
        store = self._make(store_factory, _index(["text", "profile.bio"]))
        assert store.index_config["dims"] == DIMS
        assert list(store.index_config["fields"]) == ["text", "profile.bio"]

    def test_embed_may_be_a_langchain_embeddings(self, store_factory: StoreFactory) -> None:
        """``embed`` may be a LangChain ``Embeddings`` object."""
        try:
            base = importlib.import_module("langchain_core.embeddings")
        except ImportError as exc:
            raise MissingExtraError("langchain-core", "langchain") from exc

        class Hashing(base.Embeddings):  # type: ignore[name-defined]
            def embed_documents(self, texts: list[str]) -> list[list[float]]:
                return hashing_embed(texts)

            def embed_query(self, text: str) -> list[float]:
                return hashing_embed([text])[0]

        store = self._make(store_factory, {"dims": DIMS, "embed": Hashing(), "fields": ["text"]})
        store.put(_ALICE, "a", {"text": "a lighthouse on the cliff"})
        store.put(_ALICE, "b", {"text": "a bakery in the old town"})
        assert store.search(_ALICE, query="lighthouse cliff", limit=1)[0].key == "a"

    def test_whole_value_is_indexed_by_default(self, store_factory: StoreFactory) -> None:
        """Without fields the whole value is indexed."""
        store = self._make(store_factory, _index())
        store.put(_ALICE, "a", {"note": "pick up the dry cleaning", "when": "friday"})
        store.put(_ALICE, "b", {"note": "call the plumber about the leak"})
        assert store.search(_ALICE, query="plumber leak", limit=1)[0].key == "b"

    # -- batch and async
    def test_batch(self, store_factory: StoreFactory) -> None:
        """Batch returns one result per operation, in order."""
        ops = _ops()
        GetOp, PutOp, SearchOp = ops.GetOp, ops.PutOp, ops.SearchOp
        store = self._make(store_factory)
        results = store.batch(
            [PutOp(_ALICE, "a", {"v": 1}), PutOp(_ALICE, "b", {"v": 2}), PutOp(_BOB, "a", {})]
        )
        assert results == [None, None, None]
        got = store.batch(
            [
                GetOp(_ALICE, "a"),
                GetOp(_ALICE, "zzz"),
                SearchOp(_ALICE, filter={"v": 2}),
                GetOp(_BOB, "a"),
            ]
        )
        first, missing, found, bob = got
        assert first is not None and first.value == {"v": 1}
        assert missing is None
        assert [i.key for i in found] == ["b"]
        assert bob is not None and bob.value == {}

    def test_async_twins(self, store_factory: StoreFactory) -> None:
        """The async methods do what the sync ones do."""
        store = self._make(store_factory, _index(["text"]))

        async def run() -> None:
            await store.aput(_ALICE, "a", {"text": "async gardening"})
            await store.aput(_ALICE, "b", {"text": "async cooking"})
            item = await store.aget(_ALICE, "a")
            assert item is not None and item.value == {"text": "async gardening"}
            hits = await store.asearch(_ALICE, query="async gardening", limit=1)
            assert [h.key for h in hits] == ["a"]
            assert await store.alist_namespaces() == [_ALICE]
            await store.adelete(_ALICE, "a")
            assert await store.aget(_ALICE, "a") is None
            ops = _ops()
            results = await store.abatch([ops.GetOp(_ALICE, "b"), ops.SearchOp(_ALICE)])
            assert results[0] is not None
            assert [i.key for i in results[1]] == ["b"]

        asyncio.run(run())

    # -- TTL
    def _ttl_store(
        self, factory: StoreFactory, ttl_config: TTLConfig | None = None
    ) -> tuple[BaseStore, Callable[[float], None]]:
        unit = self.ttl_unit_minutes
        if ttl_config is not None and ttl_config.get("default_ttl") is not None:
            ttl_config = {**ttl_config, "default_ttl": ttl_config["default_ttl"] * unit}
        store, advance = factory(None, ttl_config)
        if not store.supports_ttl or advance is None:
            pytest.skip("the store has no TTL, or its clock cannot be moved")
        moved = advance
        return store, lambda units: moved(units * unit)

    def test_ttl_expires_items(self, store_factory: StoreFactory) -> None:
        """An item with a TTL is gone once it expires; others stay."""
        store, advance = self._ttl_store(store_factory)
        unit = self.ttl_unit_minutes
        store.put(_ALICE, "otp", {"code": "123"}, ttl=10 * unit)
        store.put(_ALICE, "keep", {"code": "456"})
        advance(5)
        assert store.get(_ALICE, "otp", refresh_ttl=False) is not None
        advance(6)
        assert store.get(_ALICE, "otp") is None
        assert [i.key for i in store.search(_ALICE)] == ["keep"]
        assert store.get(_ALICE, "keep") is not None

    def test_ttl_refresh_on_read(self, store_factory: StoreFactory) -> None:
        """A read with refresh_ttl extends the TTL; one without does not."""
        store, advance = self._ttl_store(store_factory)
        unit = self.ttl_unit_minutes
        store.put(_ALICE, "a", {"v": 1}, ttl=10 * unit)
        store.put(_ALICE, "b", {"v": 2}, ttl=10 * unit)
        advance(8)
        assert store.get(_ALICE, "a", refresh_ttl=True) is not None
        assert store.get(_ALICE, "b", refresh_ttl=False) is not None
        advance(8)
        assert store.get(_ALICE, "a", refresh_ttl=False) is not None
        assert store.get(_ALICE, "b") is None
        store.search(_ALICE, refresh_ttl=True)
        advance(8)
        assert store.get(_ALICE, "a") is not None

    def test_ttl_config_default_and_no_refresh(self, store_factory: StoreFactory) -> None:
        """ttl_config's default_ttl applies; refresh_on_read=False reads do not extend."""
        store, advance = self._ttl_store(
            store_factory, {"default_ttl": 10, "refresh_on_read": False}
        )
        store.put(_ALICE, "a", {"v": 1})
        store.put(_ALICE, "forever", {"v": 2}, ttl=None)
        advance(8)
        assert store.get(_ALICE, "a") is not None  # does not refresh by default
        advance(3)
        assert store.get(_ALICE, "a") is None
        assert store.get(_ALICE, "forever") is not None
