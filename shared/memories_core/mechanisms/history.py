"""History-based memory (Yuan et al., §3.1 "History-Based Memory", Table 1).

Every utterance is stored verbatim as one record, ``"role: content"`` (or
``"speaker: content"`` for dialogues between named people), and the top-k records most
relevant to the query are recalled. The paper retrieves k=3 history records (§5, Figure 6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from memories_core.mechanisms.base import MemoryBase

if TYPE_CHECKING:
    from memories_core.retrieval.pipeline import Pipeline

__all__ = ["HistoryMemory"]


class HistoryMemory(MemoryBase):
    """Store every turn as-is; recall the most relevant turns.

    No LLM is involved: saving costs one embedding per turn, recalling one query embedding
    plus a BM25 lookup.

    Example:
        >>> from memories_core import HistoryMemory, Scope, Turn
        >>> from memories_core.embedders import HashingEmbedder
        >>> memory = HistoryMemory(embedder=HashingEmbedder())
        >>> memory.save([Turn("user", "I am allergic to peanuts")], Scope("alice"))
        >>> memory.recall("which allergies do I have?", Scope("alice")).context
        'user: I am allergic to peanuts'

    Retrieval: with no ``pipeline``, the late-interaction reranker joins the default first
    stage when the ``rerank`` extra is installed
    (:func:`~memories_core.retrieval.late_interaction.default_turn_pipeline`: the best
    retrieval measured on LoCoMo, R@5 0.704 -> 0.756 held out), and the first stage runs
    alone otherwise. Pass ``pipeline=Pipeline()`` (or set ``LLM_MEMORIES_LATE_INTERACTION=off``)
    to keep the first stage alone.

    Args:
        k: Turns recalled by default (paper: 3).
        pipeline: Retrieval pipeline; ``None`` chooses as above.
        **kwargs: Storage and model options of :class:`~memories_core.mechanisms.base.MemoryBase`
            (``path``, ``embedder``, ``store``, ``index``, ``fusion``, ``clock``, ...).
    """

    mechanism_name: ClassVar[str] = "history"
    recall_kinds: ClassVar[tuple[str, ...]] = ("turn",)
    index_turns: ClassVar[bool] = True

    def __init__(self, *, k: int = 3, pipeline: Pipeline | None = None, **kwargs: Any) -> None:
        if pipeline is None:
            from memories_core.retrieval.late_interaction import default_turn_pipeline

            pipeline = default_turn_pipeline()
        super().__init__(k=k, pipeline=pipeline, **kwargs)
