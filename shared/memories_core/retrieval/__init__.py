"""Retrieval: recall as a pipeline of candidate sources, fusion, rerankers and a load stage.

* :mod:`~memories_core.retrieval.pipeline`: :class:`Pipeline`, :class:`RecallRequest`, the
  :class:`RecallBackend` protocol the engine implements, the dense and lexical sources.
* :mod:`~memories_core.retrieval.fusion`: z-score and reciprocal rank fusion.
* :mod:`~memories_core.retrieval.context`: conversation neighbours and context spreading.
* :mod:`~memories_core.retrieval.rerankers`: time decay, recency, MMR, a cross-encoder seam.
* :mod:`~memories_core.retrieval.temporal` / :mod:`~memories_core.retrieval.entity`: boosts for
  questions that name a time, person names and quoted phrases.
* :mod:`~memories_core.retrieval.keys`: index-side search keys mapped onto their targets.
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
from memories_core.retrieval.entity import EntityBoost, query_entities
from memories_core.retrieval.fusion import Fusion, Ranking, rrf_fuse, zscore_fuse
from memories_core.retrieval.hybrid import (
    FusionConfig,
    HybridRetriever,
    SearchMode,
    index_metadata,
)
from memories_core.retrieval.hybrid import _adjacent_via_list as _adjacent_via_list
from memories_core.retrieval.keys import KEY_FOR, SEARCH_KEY_KIND, KeyedBackend
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
from memories_core.retrieval.temporal import TemporalBoost, TimeWindow, parse_time_window

__all__ = [
    "DEFAULT_CONTEXT_GAP",
    "DEFAULT_DEPTH",
    "KEY_FOR",
    "MMR",
    "SEARCH_KEY_KIND",
    "CandidateSource",
    "ContextSpreading",
    "CrossEncoderReranker",
    "DenseSource",
    "EntityBoost",
    "Fusion",
    "FusionConfig",
    "HybridRetriever",
    "KeyedBackend",
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
    "TemporalBoost",
    "TimeDecay",
    "TimeWindow",
    "VectorLookup",
    "adjacent_rows",
    "filters_match",
    "forgetting_curve",
    "half_life_decay",
    "index_metadata",
    "linked",
    "parse_time_window",
    "query_entities",
    "rrf_fuse",
    "spread_context",
    "zscore_fuse",
]
