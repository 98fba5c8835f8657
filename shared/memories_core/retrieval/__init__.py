"""Retrieval: recall as a pipeline of candidate sources, fusion, rerankers and a load stage.

* :mod:`~memories_core.retrieval.pipeline`: :class:`Pipeline`, :class:`RecallRequest`, the
  :class:`RecallBackend` protocol the engine implements, the dense and lexical sources.
* :mod:`~memories_core.retrieval.fusion`: z-score and reciprocal rank fusion.
* :mod:`~memories_core.retrieval.context`: conversation neighbours and context spreading.
* :mod:`~memories_core.retrieval.rerankers`: time decay, recency, MMR, a cross-encoder seam.
* :mod:`~memories_core.retrieval.memory_backend`: an in-memory reference backend.
* :mod:`~memories_core.retrieval.hybrid`: :class:`HybridRetriever`, the facade the
  mechanisms search through today.
"""

from memories_core.retrieval.context import (
    DEFAULT_CONTEXT_GAP,
    ContextSpreading,
    NeighbourRow,
    adjacent_rows,
    linked,
    spread_context,
)
from memories_core.retrieval.fusion import Fusion, Ranking, rrf_fuse, zscore_fuse
from memories_core.retrieval.hybrid import (
    FusionConfig,
    HybridRetriever,
    SearchMode,
    index_metadata,
)
from memories_core.retrieval.hybrid import _adjacent_via_list as _adjacent_via_list
from memories_core.retrieval.pipeline import (
    DEFAULT_DEPTH,
    CandidateSource,
    DenseSource,
    LexicalSource,
    Pipeline,
    RecallBackend,
    RecallContext,
    RecallRequest,
    Reranker,
    filters_match,
)
from memories_core.retrieval.rerankers import (
    MMR,
    CrossEncoderReranker,
    Recency,
    TimeDecay,
    VectorLookup,
    forgetting_curve,
    half_life_decay,
)

__all__ = [
    "DEFAULT_CONTEXT_GAP",
    "DEFAULT_DEPTH",
    "MMR",
    "CandidateSource",
    "ContextSpreading",
    "CrossEncoderReranker",
    "DenseSource",
    "Fusion",
    "FusionConfig",
    "HybridRetriever",
    "LexicalSource",
    "NeighbourRow",
    "Pipeline",
    "Ranking",
    "RecallBackend",
    "RecallContext",
    "RecallRequest",
    "Recency",
    "Reranker",
    "SearchMode",
    "TimeDecay",
    "VectorLookup",
    "adjacent_rows",
    "filters_match",
    "forgetting_curve",
    "half_life_decay",
    "index_metadata",
    "linked",
    "rrf_fuse",
    "spread_context",
    "zscore_fuse",
]
