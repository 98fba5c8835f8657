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

from memories_core.errors import ConfigurationError
from memories_core.interfaces import LLM, Embedder, Mechanism
from memories_core.types import Recall, Scope, ScoredRecord, Turn

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

    Each view stores what it needs (its own copy of the raw turns included), so any
    mechanism can be a view and a failure in one view's derivation leaves the others intact.

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

        Args:
            llm: Shared by the views that need one (default: the bundled local model).
            embedder: Shared by every view (default: the bundled MiniLM).
            path: Parent directory; ``None`` keeps every view in memory.
            views: Any of ``"conditional"``, ``"summary"``, ``"history"`` (paper's best
                combination: conditional + summary).
            k: Per-view k (default :data:`DEFAULT_VIEW_K`).
            **kwargs: Passed to every view's constructor (e.g. ``clock``, ``fusion``).
        """
        from memories_core.mechanisms.conditional import ConditionalMemory
        from memories_core.mechanisms.history import HistoryMemory
        from memories_core.mechanisms.summary import SummaryMemory

        if embedder is None:
            from memories_core.embedders import SentenceTransformerEmbedder

            embedder = SentenceTransformerEmbedder()
        if llm is None and any(v in ("conditional", "summary") for v in views):
            from memories_core.llms import LocalLLM

            llm = LocalLLM()
        built: dict[str, Mechanism] = {}
        for name in views:
            where = Path(path) / name if path is not None else None
            common: dict[str, Any] = {"path": where, "embedder": embedder, **kwargs}
            if name == "conditional":
                built[name] = ConditionalMemory(llm=llm, **common)
            elif name == "summary":
                built[name] = SummaryMemory(llm=llm, **common)
            elif name == "history":
                built[name] = HistoryMemory(**common)
            else:
                raise ConfigurationError(f"unknown view {name!r}")
        return cls(built, k=k)

    def save(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Save the turns into every view."""
        for view in self.views.values():
            view.save(turns, scope)

    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Recall from every view with its own k; ``k`` (if given) overrides every view's."""
        parts = {
            name: view.recall(query, scope, k=k or self.k[name], now=now)
            for name, view in self.views.items()
        }
        return self._combine(query, parts)

    def clear(self, scope: Scope) -> None:
        """Clear every view."""
        for view in self.views.values():
            view.clear(scope)

    def end_session(self, scope: Scope) -> None:
        """End the session in every view (summary views write their summary now)."""
        for view in self.views.values():
            end = getattr(view, "end_session", None)
            if callable(end):
                end(scope)

    async def aend_session(self, scope: Scope) -> None:
        """Async twin of :meth:`end_session`."""
        await asyncio.to_thread(self.end_session, scope)

    async def aclear(self, scope: Scope) -> None:
        """Async twin of :meth:`clear`."""
        for view in self.views.values():
            await view.aclear(scope)

    async def asave(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Async twin of :meth:`save` (views run one after another, as in :meth:`save`)."""
        for view in self.views.values():
            await view.asave(turns, scope)

    async def arecall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Async twin of :meth:`recall`; the views are searched concurrently."""
        names = list(self.views)
        recalls = await asyncio.gather(
            *(self.views[n].arecall(query, scope, k=k or self.k[n], now=now) for n in names)
        )
        return self._combine(query, dict(zip(names, recalls, strict=True)))

    @property
    def usage(self) -> dict[str, MemoryUsage]:
        """Each view's usage, by view name."""
        return {name: view.usage for name, view in self.views.items() if hasattr(view, "usage")}

    def close(self) -> None:
        """Close every view that can be closed."""
        for view in self.views.values():
            close = getattr(view, "close", None)
            if callable(close):
                close()

    def _combine(self, query: str, parts: Mapping[str, Recall]) -> Recall:
        records: list[ScoredRecord] = []
        sections: list[str] = []
        for name, recall in parts.items():
            records.extend(recall.records)
            if recall.context:
                sections.append(f"## {self.labels[name]}\n{recall.context}")
        return Recall(query=query, records=tuple(records), context="\n\n".join(sections))
