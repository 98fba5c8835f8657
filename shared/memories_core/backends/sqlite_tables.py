"""Deprecated: the engine's tables moved to :mod:`memories_core.backends.sql`.

The SQL store is written once for every dialect, split by table family
(:mod:`~memories_core.backends.sql.state`, :mod:`~memories_core.backends.sql.jobs`,
:mod:`~memories_core.backends.sql.graph`, :mod:`~memories_core.backends.sql.artifacts`,
:mod:`~memories_core.backends.sql.tombstones`); their schema is in
:mod:`memories_core.backends.sql.schema`. The names below still import from here, with a
:class:`DeprecationWarning`, and will be removed in a later release.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__: list[str] = []  # every name here is a deprecated alias (module __getattr__)

_MOVED = {
    "ENGINE_SCHEMA": ("memories_core.backends.sql.schema", "ENGINE_SCHEMA"),
    "EngineTablesMixin": ("memories_core.backends.sql.store", "EngineTables"),
    "STATE_COLUMNS": ("memories_core.backends.sql.rows", "STATE_COLUMNS"),
    "from_micros": ("memories_core.backends.sql.rows", "from_micros"),
    "state_from_row": ("memories_core.backends.sql.rows", "state_from_row"),
    "to_micros": ("memories_core.backends.sql.rows", "to_micros"),
    "unclaimed_jobs": ("memories_core.backends.sql.rows", "unclaimed_jobs"),
}


def __getattr__(name: str) -> Any:
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, attribute = _MOVED[name]
    warnings.warn(
        f"memories_core.backends.sqlite_tables.{name} moved to {module_name}.{attribute}",
        DeprecationWarning,
        stacklevel=2,
    )
    import importlib

    return getattr(importlib.import_module(module_name), attribute)
