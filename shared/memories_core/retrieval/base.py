"""What every retrieval part shares: the request, the backend and stage protocols, the context."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from memories_core.errors import InvalidInputError, check_count
from memories_core.retrieval.fusion import Ranking
from memories_core.types import MemoryRecord, ScoredRecord, check_user_id, ensure_utc

__all__ = [
    "DEFAULT_DEPTH",
    "CandidateSource",
    "DenseSource",
    "LexicalSource",
    "OnRecalled",
    "RecallBackend",
    "RecallContext",
    "RecallRequest",
    "Reranker",
    "Where",
    "filters_match",
]


#: A filter as the pipeline passes it on (the filter language of ``memories_core.filters``).
Where = Mapping[str, Any]


#: Candidates each source fetches (at least ``k``). Fixed, so that ``k`` does not change
#: the fusion statistics and a smaller ``k`` returns a prefix of a larger one.
DEFAULT_DEPTH = 50


#: Called with the returned hits and the request's ``now`` after every non-empty recall.
OnRecalled = Callable[[Sequence[ScoredRecord], datetime], None]


@dataclass(frozen=True)
class RecallRequest:
    """One recall.

    Attributes:
        query: Free text; must not be empty.
        user_id: Owner; only this user's records can come back.
        k: Number of results, >= 1.
        where: Filter on record fields or metadata (``memories_core.filters`` language).
        now: The time recency and decay are measured against; ``None`` means "now" (the
            pipeline fills it in once, so every stage sees the same instant).
        kinds: Record kinds to search, all on one score scale; ``None`` means every kind.
            Cannot be combined with a ``kind`` key in ``where``.
    """

    query: str
    user_id: str
    k: int
    where: Where | None = None
    now: datetime | None = None
    kinds: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.query, str) or not self.query.strip():
            raise InvalidInputError("query is empty or only whitespace")
        check_user_id(self.user_id)
        object.__setattr__(self, "k", check_count("k", self.k, error=InvalidInputError))
        if self.now is not None:
            object.__setattr__(self, "now", ensure_utc(self.now))
        if self.kinds is not None:
            kinds = (self.kinds,) if isinstance(self.kinds, str) else tuple(self.kinds)
            if not kinds or not all(isinstance(kind, str) and kind for kind in kinds):
                raise InvalidInputError("kinds must be a non-empty list of kind names")
            if self.where and "kind" in self.where:
                raise InvalidInputError("give kinds or a 'kind' filter, not both")
            object.__setattr__(self, "kinds", tuple(dict.fromkeys(kinds)))

    @property
    def filter(self) -> Where | None:
        """``where`` with the ``kinds`` restriction added (what the backend receives)."""
        if self.kinds is None:
            return self.where
        kind: Any = self.kinds[0] if len(self.kinds) == 1 else {"$in": list(self.kinds)}
        return {**(self.where or {}), "kind": kind}


@runtime_checkable
class RecallBackend(Protocol):
    """What the pipeline needs from storage; the engine implements it.

    Every method is restricted to ``user_id`` inside the backend's own query. Rankings are
    ``(id, score)`` lists, best first, higher = better, at most ``depth`` long; equal scores
    in a stable order (e.g. storage order).
    """

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """The query's embedding."""
        ...

    def dense(
        self, vector: npt.NDArray[np.float32], *, user_id: str, depth: int, where: Where | None
    ) -> Ranking:
        """Nearest records by cosine similarity to ``vector``."""
        ...

    def lexical(self, query: str, *, user_id: str, depth: int, where: Where | None) -> Ranking:
        """Best records by BM25 (score = negated FTS5 ``bm25()``, higher = better)."""
        ...

    def load(self, ids: Sequence[str], *, user_id: str) -> dict[str, MemoryRecord]:
        """The records of ``user_id`` among ``ids`` (unknown ids are left out)."""
        ...

    def adjacent(
        self, ids: Sequence[str], *, user_id: str, gap: timedelta | None
    ) -> dict[str, tuple[str | None, str | None]]:
        """Each record's ``(previous id, next id)`` by the rule of ``context.linked``."""
        ...


class CandidateSource(Protocol):
    """A source of candidates (dense, lexical, a graph walk, an LLM choosing options).

    Attributes:
        name: Short label (used in reports).
        weight: Weight in fusion; a source with weight 0 is not queried.
    """

    @property
    def name(self) -> str:
        """Short label."""
        ...

    @property
    def weight(self) -> float:
        """Fusion weight (>= 0)."""
        ...

    def candidates(self, request: RecallRequest, backend: RecallBackend, depth: int) -> Ranking:
        """Up to ``depth`` ``(id, score)`` pairs for ``request``, best first."""
        ...


class Reranker(Protocol):
    """A stage that rewrites the fused ranking (may add ids, e.g. neighbours).

    A stage may also offer ``begin(request, ctx)``: the pipeline calls it before the sources
    run, so that work needing only the query (encoding it with the stage's own model) can
    start on another thread and overlap the first stage; what it starts goes in
    :attr:`RecallContext.started`. And it may offer ``depth_for(request) -> int``: the
    candidates per source it needs for this request (``0``: no more than the pipeline's
    own), so that a stage that leaves a request alone does not deepen its first stage.
    """

    def rerank(self, ranking: Ranking, request: RecallRequest, ctx: RecallContext) -> Ranking:
        """Return the new ranking, best first."""
        ...


@dataclass(frozen=True)
class DenseSource:
    """Candidates by embedding similarity (cosine), through ``backend.dense``."""

    weight: float = 0.35
    name: str = "dense"

    def candidates(self, request: RecallRequest, backend: RecallBackend, depth: int) -> Ranking:
        """Embed the query and return the nearest records."""
        vector = backend.embed_query(request.query)
        return backend.dense(vector, user_id=request.user_id, depth=depth, where=request.filter)


@dataclass(frozen=True)
class LexicalSource:
    """Candidates by BM25 over the records' text, through ``backend.lexical``.

    The default weights (lexical 0.65 over dense 0.35) were measured on LoCoMo, where the
    small embedding model is the weaker signal on dialogue memories (BENCHMARKS.md).
    """

    weight: float = 0.65
    name: str = "lexical"

    def candidates(self, request: RecallRequest, backend: RecallBackend, depth: int) -> Ranking:
        """Return the best BM25 matches."""
        return backend.lexical(
            request.query, user_id=request.user_id, depth=depth, where=request.filter
        )


class RecallContext:
    """One run's view of the backend: caches the query vector and loaded records.

    It implements :class:`RecallBackend` itself (sources receive it as their backend), so
    a record loaded by a reranker is not loaded again by the load stage.

    Attributes:
        request: The request being served (``now`` filled in).
        backend: The underlying backend.
    """

    def __init__(self, request: RecallRequest, backend: RecallBackend) -> None:
        self.request = request
        self.backend = backend
        self._vectors: dict[str, npt.NDArray[np.float32]] = {}
        self._records: dict[str, MemoryRecord | None] = {}
        self._texts: dict[str, str | None] = {}
        #: Work a stage started in ``begin`` for this run, under a key of the stage's own.
        self.started: dict[int, Future[Any]] = {}
        #: Record id -> cosine of the query, for the records the dense source returned.
        self.similarity: dict[str, float] = {}

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """The query's embedding (computed once per text)."""
        if text not in self._vectors:
            self._vectors[text] = self.backend.embed_query(text)
        return self._vectors[text]

    def query_vector(self) -> npt.NDArray[np.float32]:
        """The embedding of the request's query."""
        return self.embed_query(self.request.query)

    def dense(
        self, vector: npt.NDArray[np.float32], *, user_id: str, depth: int, where: Where | None
    ) -> Ranking:
        """Forwarded to the backend."""
        return self.backend.dense(vector, user_id=user_id, depth=depth, where=where)

    def lexical(self, query: str, *, user_id: str, depth: int, where: Where | None) -> Ranking:
        """Forwarded to the backend."""
        return self.backend.lexical(query, user_id=user_id, depth=depth, where=where)

    def remember(self, records: Iterable[MemoryRecord]) -> None:
        """Take records already loaded for this run's user; :meth:`load` then reads them here.

        Records of another user are ignored.
        """
        for record in records:
            if record.user_id == self.request.user_id:
                self._records[record.id] = record

    def load(self, ids: Sequence[str], *, user_id: str) -> dict[str, MemoryRecord]:
        """Records of ``ids`` (cached; ids the backend did not return stay unknown)."""
        if user_id != self.request.user_id:
            raise InvalidInputError("a recall context serves one user")
        missing = [item for item in dict.fromkeys(ids) if item not in self._records]
        if missing:
            found = self.backend.load(missing, user_id=user_id)
            for item in missing:
                record = found.get(item)
                # Defence in depth: a record of another user is treated as unknown.
                self._records[item] = record if record and record.user_id == user_id else None
        return {item: r for item in ids if (r := self._records.get(item)) is not None}

    def texts(self, ids: Sequence[str], *, user_id: str) -> dict[str, str]:
        """Texts of the records of ``ids`` (cached), for stages that score text only.

        A record already loaded gives its text; the others are read with the backend's
        ``texts`` when it has one (no metadata or state decoded), else loaded as records.
        Ids the backend does not return for ``user_id`` are left out, as with :meth:`load`.
        """
        if user_id != self.request.user_id:
            raise InvalidInputError("a recall context serves one user")
        wanted = list(dict.fromkeys(ids))
        for item in wanted:
            if item not in self._texts and item in self._records:
                record = self._records[item]
                self._texts[item] = None if record is None else record.text
        missing = [item for item in wanted if item not in self._texts]
        if missing:
            read = getattr(self.backend, "texts", None)
            if callable(read):
                found: Mapping[str, str] = read(missing, user_id=user_id)
            else:
                found = {item: r.text for item, r in self.load(missing, user_id=user_id).items()}
            for item in missing:
                self._texts[item] = found.get(item)
        return {item: text for item in wanted if (text := self._texts.get(item)) is not None}

    def adjacent(
        self, ids: Sequence[str], *, user_id: str, gap: timedelta | None
    ) -> dict[str, tuple[str | None, str | None]]:
        """Forwarded to the backend."""
        return self.backend.adjacent(ids, user_id=user_id, gap=gap)


def filters_match(record: MemoryRecord, where: Where | None) -> bool:
    """Whether a loaded record satisfies ``where`` (re-checked: an index may be stale).

    The one place the pipeline evaluates a filter in Python, with the evaluator of
    :mod:`memories_core.filters` (the same semantics as every backend's translation).
    """
    from memories_core.filters import compile_filter, record_getter

    expr = compile_filter(where)
    return expr is None or expr.matches(record_getter(record))
