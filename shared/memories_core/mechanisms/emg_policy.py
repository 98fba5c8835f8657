"""Deprecated alias of :mod:`memories_core.mechanisms.emg.policy` (EMG-RAG's selection policy).

The policy moved into the ``emg`` package; import it from
``memories_core.mechanisms.emg.policy`` (or ``memories_core.mechanisms.emg``). This module
re-exports the same objects and warns once, at import.
"""

from __future__ import annotations

import warnings

from memories_core.mechanisms.emg import policy as _policy
from memories_core.mechanisms.emg.policy import *  # noqa: F403 (the alias re-exports all)

__all__ = list(_policy.__all__)

warnings.warn(
    "memories_core.mechanisms.emg_policy is deprecated; import from "
    "memories_core.mechanisms.emg.policy",
    DeprecationWarning,
    stacklevel=2,
)
