"""Deprecated alias of :mod:`memories_core.mechanisms.emg.policy` (EMG-RAG's selection policy).

The policy moved into the ``emg`` package; import it from
``memories_core.mechanisms.emg.policy`` (or ``memories_core.mechanisms.emg``). This module
re-exports the same objects and warns once, at import.
"""

from __future__ import annotations

import warnings

from memories_core.mechanisms.emg.policy import (
    ALL_FEATURES,
    EXTRA_FEATURES,
    HIDDEN,
    PAPER_FEATURES,
    STATE_SIZE,
    Episode,
    SelectionPolicy,
    calibrate,
    expected_f1,
    expected_f1_size,
    reinforce,
    rouge_l,
    selection_f1,
    warm_start,
)

__all__ = [
    "ALL_FEATURES",
    "EXTRA_FEATURES",
    "HIDDEN",
    "PAPER_FEATURES",
    "STATE_SIZE",
    "Episode",
    "SelectionPolicy",
    "calibrate",
    "expected_f1",
    "expected_f1_size",
    "reinforce",
    "rouge_l",
    "selection_f1",
    "warm_start",
]

warnings.warn(
    "memories_core.mechanisms.emg_policy is deprecated; import from "
    "memories_core.mechanisms.emg.policy",
    DeprecationWarning,
    stacklevel=2,
)
