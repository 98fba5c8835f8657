"""The index step: embedding pending records, dropping vectors, reindex, verify, failures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memories_core.engine_parts.reads import EngineReads
from memories_core.engine_parts.rules import _EMBEDDER_STATE_KEY, VerifyReport, logger
from memories_core.errors import (
    EmbedderMismatchError,
)
from memories_core.types import (
    check_user_id,
)

if TYPE_CHECKING:
    from memories_core.retrieval import Pipeline
    from memories_core.usage import MemoryUsage

__all__ = ["EngineIndexing"]


class EngineIndexing(EngineReads):
    """The engine's index step: pending records embedded, vectors dropped, reindex, verify."""

    def count_failure(self, name: str) -> None:
        """Count a failed derivation or index write under ``name`` (``usage.failures``)."""
        with self._failures_lock:
            self._failures[name] += 1

    @property
    def failures(self) -> dict[str, int]:
        """Failed derivations and index writes so far, by name."""
        with self._failures_lock:
            return dict(self._failures)

    def count_finish(self, attempt: int) -> None:
        """Count a job that finished on its ``attempt``-th run (``usage.finished_after``)."""
        with self._failures_lock:
            self._finished_after[attempt] += 1

    @property
    def finished_after(self) -> dict[int, int]:
        """Jobs finished so far, by the run that succeeded (1: the first)."""
        with self._failures_lock:
            return dict(sorted(self._finished_after.items()))

    @property
    def usage(self) -> MemoryUsage:
        """The engine's LLM and embedder usage, failures and finished jobs."""
        from memories_core.usage import MemoryUsage

        return MemoryUsage(
            llm=self.llm.usage if self.llm is not None else None,
            embedder=self.embedder.usage,
            failures=self.failures,
            finished_after=self.finished_after,
        )

    # ------------------------------------------------------------------ vector index
    def _index_pending(self, *, blocking: bool = True, progress: bool = False) -> int:
        """Embed and index pending records; a record the index refuses is set aside.

        Never raises: the records are committed already, and indexing heals on a later call.
        A search does not wait for another thread's indexing (``blocking=False``); records
        that are still pending are found lexically meanwhile.
        """
        if not self._index_lock.acquire(blocking=blocking):
            return 0
        try:
            try:
                return self.retriever.index_pending(progress=progress)
            except Exception:
                self.count_failure("index")
                logger.warning("vector indexing failed; records stay pending", exc_info=True)
            # Isolate a record the index refuses, so that it cannot block the others:
            # index one by one; if some succeed, the ones that fail are set aside (counted,
            # repaired by verify()). If all fail, the index itself is down: all stay pending.
            pending = self.store.pending_index(limit=1000)
            if len(pending) <= 1:
                return 0
            from memories_core.retrieval import index_metadata

            done: list[str] = []
            refused: list[str] = []
            for record in pending:
                try:
                    vector = self.embedder.embed_documents([record.text])
                    self.index.add([record.id], vector, [index_metadata(record)])
                    self.store.mark_indexed([record.id])
                    done.append(record.id)
                except Exception:
                    refused.append(record.id)
            if done and refused:
                logger.warning("%d record(s) cannot be indexed; set aside", len(refused))
                self.store.mark_index_failed(refused)
            return len(done)
        finally:
            self._index_lock.release()

    def index_pending(self, *, progress: bool = False) -> int:
        """Index every pending record now; returns how many were indexed."""
        return self._index_pending(progress=progress)

    def _drop_vectors(self, user_id: str, ids: Sequence[str]) -> None:
        try:
            self.index.delete(list(ids), user_id=user_id)
        except Exception:
            # Harmless: a search loads from the store and skips vectors without a record;
            # verify(repair=True) removes such orphans.
            self.count_failure("index")
            logger.warning("deleting vectors failed; verify() will remove them", exc_info=True)

    def warm(self, user_id: str) -> bool:
        """Load ``user_id``'s part of the vector index now, where the index loads lazily.

        Calls the index's ``warm(user_id)`` when it offers one
        (:meth:`ChromaIndex.warm <memories_core.backends.ChromaIndex.warm>`: Chroma reads a
        collection's graph on its first query); ``False`` when it does not or the user has
        no vectors. A failure is counted and logged, never raised: warming only saves time.
        """
        check_user_id(user_id)
        warm = getattr(self.index, "warm", None)
        if not callable(warm):
            return False
        try:
            return bool(warm(user_id))
        except Exception:
            self.count_failure("index")
            logger.warning("warming the vector index failed", exc_info=True)
            return False

    def prefetch(self, user_id: str, pipeline: Pipeline, *, progress: bool = False) -> int:
        """Prepare ``pipeline``'s per-record caches for all of ``user_id``'s records.

        For a reranker that caches per record (the late-interaction token vectors), a
        recall then pays only its warm cost; without such a stage nothing happens. Search
        keys are skipped (recall never returns them).

        Returns:
            How many records the pipeline's stages prepared now.
        """
        from memories_core.retrieval.keys import SEARCH_KEY_KIND, KeyedBackend

        check_user_id(user_id)
        records = [r for r in self.records(user_id) if r.kind != SEARCH_KEY_KIND]
        return pipeline.prefetch(KeyedBackend(self._backend), user_id, records, progress=progress)

    def reindex(self, *, progress: bool = True) -> int:
        """Rebuild the vector index from the record store; returns the records indexed.

        Handles an embedder change, a new dimension included: the index is emptied, every
        record marked pending and the new embedder recorded *before* embedding starts, so
        an interrupted reindex resumes (the remaining records stay pending and are indexed
        by the next save, search or :meth:`index_pending`) instead of starting over.
        """
        with self._index_lock:
            self.index.reset()
            self.store.mark_all_pending()
            self.store.set_state(_EMBEDDER_STATE_KEY, self._embedder_identity())
            return self.retriever.index_pending(progress=progress)

    def verify(self, *, repair: bool = False, users: Sequence[str] | None = None) -> VerifyReport:
        """Compare the record store with the vector index, and optionally repair the index.

        Finds records marked indexed whose vector is missing, vectors without a record, and
        vectors that a query with their own vector does not reach (a damaged index), plus
        records the index refused earlier. With ``repair=True`` the first, third and fourth
        are re-indexed and orphans deleted.
        """
        targets = list(users) if users is not None else list(self.store.users())
        missing: list[str] = []
        orphans: list[str] = []
        unreachable: list[str] = []
        failed: list[str] = []
        ids_of = getattr(self.index, "ids", None)
        probe = getattr(self.index, "probe", None)
        for user_id in targets:
            states = self.store.index_states(user_id)
            indexed = {rid for rid, s in states.items() if s == "indexed"}
            user_failed = [rid for rid, s in states.items() if s == "failed"]
            failed += user_failed
            user_missing: list[str] = []
            user_orphans: list[str] = []
            user_unreachable: list[str] = []
            if callable(ids_of):
                stored = set(ids_of(user_id))
                user_missing = sorted(indexed - stored)
                user_orphans = sorted(stored - set(states))
                if callable(probe):
                    user_unreachable = sorted(probe(sorted(indexed & stored), user_id=user_id))
            missing += user_missing
            orphans += user_orphans
            unreachable += user_unreachable
            if repair:
                if user_orphans or user_unreachable:
                    self.index.delete([*user_orphans, *user_unreachable], user_id=user_id)
                self.store.mark_pending(
                    [*user_missing, *user_unreachable, *user_failed], user_id=user_id
                )
        if repair:
            self._index_pending()
        return VerifyReport(
            users=len(targets),
            missing=tuple(missing),
            orphans=tuple(orphans),
            unreachable=tuple(unreachable),
            failed=tuple(failed),
            repaired=repair,
        )

    def _embedder_identity(self) -> dict[str, Any]:
        return {"name": self.embedder.name, "dimension": self.embedder.dimension}

    def _check_embedder(self, allow_change: bool) -> None:
        stored = self.store.get_state(_EMBEDDER_STATE_KEY)
        current = self._embedder_identity()
        if stored is None:
            self.store.set_state(_EMBEDDER_STATE_KEY, current)
            return
        if stored == current:
            return
        if not allow_change:
            raise EmbedderMismatchError(
                f"this memory was built with embedder {stored['name']!r} "
                f"(dimension {stored['dimension']}), not {current['name']!r} "
                f"(dimension {current['dimension']}); open it with the original embedder, or "
                "pass allow_embedder_change=True to re-embed every record",
                stored=str(stored.get("name")),
                given=str(current["name"]),
            )
        try:
            self.reindex(progress=True)
        except Exception:
            # The change is recorded and every record is pending: indexing resumes later.
            self.count_failure("index")
            logger.warning(
                "reindex after the embedder change stopped; it resumes later", exc_info=True
            )
