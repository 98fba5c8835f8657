"""Evaluation helpers: retrieval metrics and dataset loaders, for benchmarks and users.

* :mod:`memories_core.evaluation.metrics`: recall@k, precision@k, hit@k, MRR, nDCG, and
  :func:`leave_one_out` (choosing a setting by cross-validation over groups).
* :mod:`memories_core.evaluation.locomo`: the LoCoMo loader (evidence ids normalised).
"""

from __future__ import annotations

from memories_core.evaluation.locomo import (
    CATEGORY_NAMES,
    LocomoConversation,
    LocomoQA,
    LocomoTurn,
    load_locomo,
    normalise_evidence,
)
from memories_core.evaluation.metrics import (
    hit_at_k,
    leave_one_out,
    mean,
    mrr,
    ndcg_at_k,
    precision_at_k,
    recall_at_k,
)

__all__ = [
    "CATEGORY_NAMES",
    "LocomoConversation",
    "LocomoQA",
    "LocomoTurn",
    "hit_at_k",
    "leave_one_out",
    "load_locomo",
    "mean",
    "mrr",
    "ndcg_at_k",
    "normalise_evidence",
    "precision_at_k",
    "recall_at_k",
]
