"""The state every layer of the engine reads: what ``MemoryEngine.__init__`` sets up."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memories_core.artifacts import ArtifactStore
    from memories_core.background import DerivationWorker
    from memories_core.engine_parts.rules import DeriveMode, JobPolicy, MechanismHooks
    from memories_core.graph import GraphStore
    from memories_core.interfaces import LLM, Clock, Embedder, EngineStore, VectorIndex
    from memories_core.retrieval import HybridRetriever
    from memories_core.retrieval.store_backend import StoreBackend
    from memories_core.types import Scope

__all__ = ["EngineBase"]


class EngineBase:
    """The attributes of :class:`~memories_core.engine.MemoryEngine`, declared for its layers.

    The engine is written as a stack of layers, one module per concern (reads, indexing,
    deletion, search, jobs, writes); each layer may call the layers below it. This base
    only declares the state that ``MemoryEngine.__init__`` creates, so every layer is
    type-checked against the same attributes.
    """

    path: Path | None
    clock: Clock
    llm: LLM | None
    _llm_for: Callable[[Scope], LLM | None] | None
    session_gap: timedelta | None
    policy: JobPolicy
    embedder: Embedder
    store: EngineStore
    index: VectorIndex
    graph: GraphStore
    artifacts: ArtifactStore
    retriever: HybridRetriever
    _backend: StoreBackend
    _hooks: dict[str, MechanismHooks]
    _failures: Counter[str]
    _failures_lock: threading.Lock
    _finished_after: Counter[int]
    _index_lock: threading.Lock
    _user_locks: dict[str, threading.RLock]
    _user_locks_guard: threading.Lock
    _index_turns: bool
    _closed: bool
    derive: DeriveMode
    _running: dict[str, str]
    _running_lock: threading.Lock
    _worker: DerivationWorker | None
