"""Multi-view memory (Yuan et al., §3.1 "Multi-View Memory", §5, Table 3).

Several kinds of memory record side by side: each view keeps its own records and is recalled
with its own k (paper defaults: k=3 for history and conditional, k=1 for summary), and the
recalls are rendered as separate labelled sections. The paper finds conditional + summary the
useful pair; history adds redundancy to conditional memory (Table 3), so it is optional.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memories_core.background import JobCounts, WorkStatus
from memories_core.engine import MemoryEngine, default_llm
from memories_core.errors import ConfigurationError
from memories_core.interfaces import LLM, Embedder, Mechanism
from memories_core.types import Job, Recall, Scope, Turn

if TYPE_CHECKING:
    from memories_core.usage import MemoryUsage

__all__ = ["DEFAULT_VIEW_K", "MultiViewMemory"]

#: Records recalled per view by default (Yuan et al., §5).
DEFAULT_VIEW_K: Mapping[str, int] = {"conditional": 3, "history": 3, "summary": 1}

_LABELS = {
    "conditional": "Conditional memory (context and knowledge)",
    "summary": "Summary memory (earlier sessions)",
    "history": "History memory (earlier utterances)",
}


class MultiViewMemory:
    """Combine mechanisms as views; recall each with its own k, render labelled sections.

    Views built on one :class:`~memories_core.engine.MemoryEngine` (as
    :meth:`from_defaults` builds them) share one copy of the raw turns: a save writes the
    turns once and each view derives its own records as engine jobs, so a failure in one
    view's derivation leaves the others intact. Any other mechanism can be a view too; it
    then stores what it needs itself.

    Args:
        views: Name -> mechanism, in the order the sections are rendered.
        k: Name -> records recalled from that view (default :data:`DEFAULT_VIEW_K`, else 3).
        labels: Name -> section heading.

    Raises:
        ConfigurationError: without views, or with a k for an unknown view or below 1.
    """

    def __init__(
        self,
        views: Mapping[str, Mechanism],
        *,
        k: Mapping[str, int] | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        if not views:
            raise ConfigurationError("MultiViewMemory needs at least one view")
        unknown = set(k or {}) - set(views)
        if unknown:
            raise ConfigurationError(f"k given for unknown views: {sorted(unknown)}")
        self.views = dict(views)
        self.k = {name: (k or {}).get(name, DEFAULT_VIEW_K.get(name, 3)) for name in views}
        if any(v < 1 for v in self.k.values()):
            raise ConfigurationError("every view's k must be >= 1")
        self.labels = {name: (labels or {}).get(name, _LABELS.get(name, name)) for name in views}
        self._owned: list[MemoryEngine] = []

    def _targets(self) -> list[Any]:
        """One object per distinct engine (its first view), plus every engine-less view."""
        seen: set[int] = set()
        out: list[Any] = []
        for view in self.views.values():
            engine = getattr(view, "engine", None)
            if isinstance(engine, MemoryEngine):
                if id(engine) in seen:
                    continue
                seen.add(id(engine))
                out.append(engine)
            else:
                out.append(view)
        return out

    @classmethod
    def from_defaults(
        cls,
        *,
        llm: LLM | None = None,
        embedder: Embedder | None = None,
        path: str | Path | None = None,
        views: Sequence[str] = ("conditional", "summary"),
        k: Mapping[str, int] | None = None,
        **kwargs: Any,
    ) -> MultiViewMemory:
        """Build the named views over one LLM and embedder, each under ``path/<view>``.

        The views share one engine under ``path``: one copy of the raw turns, one index.

        Args:
            llm: Shared by the views that need one (default: the bundled local model).
            embedder: Shared by every view (default: the bundled MiniLM).
            path: Directory of the shared engine; ``None`` keeps everything in memory.
            views: Any of ``"conditional"``, ``"summary"``, ``"history"`` (paper's best
                combination: conditional + summary).
            k: Per-view k (default :data:`DEFAULT_VIEW_K`).
            **kwargs: Engine options (``clock``, ``store``, ``index``, ``session_gap``,
                ``allow_embedder_change``) go to the shared engine; the rest (e.g.
                ``fusion``) to every view's constructor.
        """
        from memories_core.mechanisms.conditional import ConditionalMemory
        from memories_core.mechanisms.history import HistoryMemory
        from memories_core.mechanisms.summary import SummaryMemory

        if embedder is None:
            from memories_core.embedders import SentenceTransformerEmbedder

            embedder = SentenceTransformerEmbedder()
        if llm is None and any(v in ("conditional", "summary") for v in views):
            llm = default_llm()
        engine_keys = ("clock", "store", "index", "session_gap", "allow_embedder_change")
        engine_options = {key: kwargs.pop(key) for key in engine_keys if key in kwargs}
        engine = MemoryEngine(path=path, embedder=embedder, llm=llm, **engine_options)
        built: dict[str, Mechanism] = {}
        for name in views:
            common: dict[str, Any] = {"engine": engine, **kwargs}
            if name == "conditional":
                built[name] = ConditionalMemory(llm=llm, **common)
            elif name == "summary":
                built[name] = SummaryMemory(llm=llm, **common)
            elif name == "history":
                built[name] = HistoryMemory(**common)
            else:
                engine.close()
                raise ConfigurationError(f"unknown view {name!r}")
        memory = cls(built, k=k)
        memory._owned.append(engine)
        return memory

    def save(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Save the turns once per engine (every view on it derives its records)."""
        for target in self._targets():
            target.save(turns, scope)

    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Recall from every view; return at most ``k`` records and every view's section.

        Without ``k`` each view gives its own k (:data:`DEFAULT_VIEW_K`; the memory's k is
        their sum). With ``k`` every view is asked for ``k`` and the records are taken by rank
        across the views (each view's best, then each one's second, ...) up to ``k`` in all,
        so a retriever never gets more than it asked for and a view with fewer records leaves
        its places to the others. ``context`` keeps every view's labelled section as recalled
        (Yuan et al., §3.1): it is the prompt block, wider than the ``k`` records.
        """
        parts = {
            name: view.recall(query, scope, k=self.k[name] if k is None else k, now=now)
            for name, view in self.views.items()
        }
        return self._combine(query, parts, k)

    def clear(self, scope: Scope) -> None:
        """Clear every view."""
        for target in self._targets():
            target.clear(scope)

    def end_session(self, scope: Scope) -> None:
        """End the session in every view (summary views write their summary now)."""
        for target in self._targets():
            end = getattr(target, "end_session", None)
            if callable(end):
                end(scope)

    def delete_user(self, user_id: str) -> None:
        """Erase ``user_id`` from every view."""
        for target in self._targets():
            target.delete_user(user_id)

    async def adelete_user(self, user_id: str) -> None:
        """Async twin of :meth:`delete_user`."""
        await asyncio.to_thread(self.delete_user, user_id)

    def retry_pending(self, user_id: str | None = None) -> int:
        """Retry every view's pending derivations; returns how many remain."""
        remaining = 0
        for view in self.views.values():
            retry = getattr(view, "retry_pending", None)
            if callable(retry):
                remaining += int(retry(user_id))
        return remaining

    async def aend_session(self, scope: Scope) -> None:
        """Async twin of :meth:`end_session`."""
        await asyncio.to_thread(self.end_session, scope)

    async def aclear(self, scope: Scope) -> None:
        """Async twin of :meth:`clear`."""
        await asyncio.to_thread(self.clear, scope)

    async def asave(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Async twin of :meth:`save`."""
        await asyncio.to_thread(self.save, turns, scope)

    async def arecall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Async twin of :meth:`recall`; the views are searched concurrently."""
        names = list(self.views)
        recalls = await asyncio.gather(
            *(
                self.views[n].arecall(query, scope, k=self.k[n] if k is None else k, now=now)
                for n in names
            )
        )
        return self._combine(query, dict(zip(names, recalls, strict=True)), k)

    @property
    def usage(self) -> MemoryUsage:
        """What the views cost together (the same type as every mechanism's ``usage``).

        A model or embedder shared by several views is counted once; failures add up.
        """
        from memories_core.usage import MemoryUsage, Usage

        llms: dict[int, Usage] = {}
        embedders: dict[int, Usage] = {}
        failures: dict[str, int] = {}
        finished: dict[int, int] = {}
        engines: set[int] = set()
        for view in self.views.values():
            usage = getattr(view, "usage", None)
            if usage is None:
                continue
            for part in ("llm", "writer", "summarizer"):
                model = getattr(view, part, None)
                if model is not None and hasattr(model, "usage"):
                    llms[id(model)] = model.usage
                    break
            embedder = getattr(view, "embedder", None)
            embedders[id(embedder)] = usage.embedder
            engine = getattr(view, "engine", None)
            if engine is not None and id(engine) in engines:
                continue  # the engine's failures were counted with its first view
            if engine is not None:
                engines.add(id(engine))
            for name, count in usage.failures.items():
                failures[name] = failures.get(name, 0) + count
            for attempt, count in usage.finished_after.items():
                finished[attempt] = finished.get(attempt, 0) + count
        return MemoryUsage(
            llm=sum(llms.values(), Usage()) if llms else None,
            embedder=sum(embedders.values(), Usage()),
            failures=failures,
            finished_after=dict(sorted(finished.items())),
        )

    @property
    def engine(self) -> MemoryEngine | None:
        """The engine the views share (as :meth:`from_defaults` builds them).

        What engine-level tools take (``export_user``, ``import_user``, ``verify``); ``None``
        when the views keep their records in several engines (use each view's then).
        """
        engines = self._engines()
        shared = len(engines) == 1 and all(
            getattr(view, "engine", None) is engines[0] for view in self.views.values()
        )
        return engines[0] if shared else None

    def _engines(self) -> list[MemoryEngine]:
        """The views' distinct engines (views that share one give it once)."""
        engines: dict[int, MemoryEngine] = {}
        for view in self.views.values():
            engine = getattr(view, "engine", None)
            if isinstance(engine, MemoryEngine):
                engines.setdefault(id(engine), engine)
        return list(engines.values())

    @property
    def path(self) -> Path | None:
        """The folder of the views' shared engine (``None`` in memory or with several)."""
        engine = self.engine
        return None if engine is None else engine.path

    def pending(self, user_id: str) -> list[Job]:
        """Every view's pending jobs for ``user_id`` (each view lists its own)."""
        jobs: list[Job] = []
        for view in self.views.values():
            pending = getattr(view, "pending", None)
            if callable(pending):
                jobs.extend(pending(user_id))
        return jobs

    def status(self, user_id: str | None = None) -> WorkStatus:
        """Every view's pending, running and failed derivations, as one report.

        Views without a ``status`` (third-party mechanisms) add nothing; the worker is
        reported alive only if every view's engine has its worker running.
        """
        reports = [
            status(user_id)
            for status in (getattr(view, "status", None) for view in self.views.values())
            if callable(status)
        ]
        jobs: dict[tuple[str, str], JobCounts] = {}
        errors: dict[tuple[str, str], str] = {}
        for report in reports:
            for key, counts in report.jobs.items():
                seen = jobs.get(key, JobCounts())
                jobs[key] = JobCounts(
                    seen.pending + counts.pending,
                    seen.running + counts.running,
                    seen.failed + counts.failed,
                    seen.parked + counts.parked,
                )
            errors.update(report.last_errors)
        derive = {report.derive for report in reports}
        return WorkStatus(
            user_id=user_id,
            derive=derive.pop() if len(derive) == 1 else "mixed",
            worker_alive=bool(reports) and all(report.worker_alive for report in reports),
            jobs=jobs,
            last_errors=errors,
        )

    def flush(
        self, user_id: str | None = None, *, timeout: float | None = None, progress: bool = False
    ) -> int:
        """Wait for every view's pending derivations; returns how many jobs are left.

        Views that share an engine are waited for once.
        """
        return sum(
            int(e.flush(user_id, timeout=timeout, progress=progress)) for e in self._engines()
        )

    def close(self) -> None:
        """Close every view that can be closed, and the engine :meth:`from_defaults` built."""
        for view in self.views.values():
            close = getattr(view, "close", None)
            if callable(close):
                close()
        for engine in self._owned:
            engine.close()

    def _combine(self, query: str, parts: Mapping[str, Recall], k: int | None) -> Recall:
        sections = [
            f"## {self.labels[name]}\n{recall.context}"
            for name, recall in parts.items()
            if recall.context
        ]
        if k is None:
            records = [hit for recall in parts.values() for hit in recall.records]
        else:
            # By rank across views: every view's best first, then the second best, ...
            ranked = [recall.records for recall in parts.values()]
            depth = max((len(r) for r in ranked), default=0)
            records = [r[i] for i in range(depth) for r in ranked if i < len(r)][:k]
        return Recall(query=query, records=tuple(records), context="\n\n".join(sections))
