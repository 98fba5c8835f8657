"""Search: the engine's hybrid recall over one user's records."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from memories_core.engine_parts.deletion import EngineDeletion
from memories_core.engine_parts.rules import MAX_K, check_k, check_query
from memories_core.types import (
    ScoredRecord,
    check_user_id,
)

if TYPE_CHECKING:
    from memories_core.interfaces import (
        Filter,
    )
    from memories_core.retrieval import FusionConfig, Pipeline

__all__ = ["EngineSearch"]


class EngineSearch(EngineDeletion):
    """The engine's search: hybrid recall over one user's records."""

    def search(
        self,
        query: str,
        user_id: str,
        *,
        k: int,
        kinds: Sequence[str] | None = None,
        where: Filter | None = None,
        now: datetime | None = None,
        fusion: FusionConfig | None = None,
        include_archived: bool = False,
        on_recalled: Callable[[list[ScoredRecord], datetime], None] | None = None,
        pipeline: Pipeline | None = None,
    ) -> list[ScoredRecord]:
        """Search ``user_id``'s records through the retrieval pipeline, scoped by user.

        Candidate sources (dense and lexical by default) -> fusion -> rerankers (context
        spreading by default) -> load; every backend query is restricted to ``user_id``.

        Records that are archived or outside their validity at ``now`` are not returned
        unless ``include_archived``.

        Args:
            query: Free text.
            user_id: Owner.
            k: Results wanted (1 to :data:`MAX_K`).
            kinds: Record kinds searched together on one score scale (default: all).
            where: Filter in the engine's filter language.
            now: The time of the recall (default: the clock's).
            fusion: Fusion settings for this search (default: the engine's).
            pipeline: A retrieval pipeline (sources, fusion, rerankers) instead of the one
                ``fusion`` describes; mechanisms configure theirs here.
            include_archived: Return archived and expired records too.
            on_recalled: Called with the hits and ``now`` (reinforcement, MemoryBank §2.3).

        Raises:
            InvalidInputError: on an empty query or a bad ``k``.
        """
        query = check_query(query)
        k = check_k(k)
        check_user_id(user_id)
        when = now or self.clock.now()
        if self.store.is_deleting(user_id):
            self._finish_deletion(user_id)
            return []
        from memories_core.retrieval import RecallRequest
        from memories_core.retrieval.keys import KeyedBackend

        chosen = pipeline or (fusion or self.retriever.fusion).pipeline()
        # Search keys count for their targets and are never returned (retrieval.keys).
        backend = KeyedBackend(self._backend)
        # Archived and expired records are dropped after ranking (they are rare, and a state
        # filter inside the lexical query would cost a join per match); read a little past k
        # in the ranking of k (same candidates, so a smaller k returns a prefix of a larger
        # one) and, if too many were dropped, rank deeper.
        want = k if include_archived else min(MAX_K, k + 10)
        depth_k = k
        while True:
            request = RecallRequest(
                query=query,
                user_id=user_id,
                k=depth_k,
                where=where,
                now=when,
                kinds=tuple(kinds) if kinds else None,
            )
            ranked = chosen.run(request, backend, limit=want)
            hits = (
                ranked if include_archived else [h for h in ranked if h.record.state.is_live(when)]
            )
            if len(hits) >= k or want >= MAX_K:
                break
            if len(ranked) < want:
                if depth_k >= want or len(ranked) < chosen.candidate_depth(depth_k, request):
                    break  # every candidate was read: the user has no more matches
                depth_k = want  # the ranking ran out: ask the sources for more candidates
                continue
            want = min(MAX_K, want * 4)
        hits = hits[:k]
        if on_recalled is not None and hits:
            on_recalled(hits, when)
        return hits
