"""llm-memories core: long-term memory mechanisms with no framework dependency.

Importing this package is cheap: chromadb, sentence-transformers and torch load only when a
memory first needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from memories_core.clock import FixedClock, SystemClock
from memories_core.errors import (
    BackendError,
    ConfigurationError,
    EmbedderMismatchError,
    InvalidInputError,
    LLMError,
    MemoriesError,
    MissingExtraError,
    MissingUserError,
    ParseError,
    SearchKeyError,
)
from memories_core.types import (
    ChatMessage,
    MemoryRecord,
    Recall,
    RecordState,
    Scope,
    ScoredRecord,
    StateChange,
    Turn,
)
from memories_core.usage import MemoryUsage, Usage

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine
    from memories_core.mechanisms import (
        ConditionalMemory,
        ConditionalReply,
        DualProcessMemory,
        EMGMemory,
        HistoryMemory,
        MemoChatMemory,
        MemoEntry,
        MemoryBankMemory,
        MemoryBase,
        MultiViewMemory,
        SelfReflectiveMemory,
        SelfReflectiveRetrieval,
        SummaryMemory,
    )
    from memories_core.portable import export_user, import_user

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "ChatMessage",
    "ConditionalMemory",
    "ConditionalReply",
    "ConfigurationError",
    "DualProcessMemory",
    "EMGMemory",
    "EmbedderMismatchError",
    "FixedClock",
    "HistoryMemory",
    "InvalidInputError",
    "LLMError",
    "MemoChatMemory",
    "MemoEntry",
    "MemoriesError",
    "MemoryBankMemory",
    "MemoryBase",
    "MemoryEngine",
    "MemoryRecord",
    "MemoryUsage",
    "MissingExtraError",
    "MissingUserError",
    "MultiViewMemory",
    "ParseError",
    "Recall",
    "RecordState",
    "Scope",
    "ScoredRecord",
    "SearchKeyError",
    "SelfReflectiveMemory",
    "SelfReflectiveRetrieval",
    "StateChange",
    "SummaryMemory",
    "SystemClock",
    "Turn",
    "Usage",
    "export_user",
    "import_user",
]

_LAZY = {
    "MemoryEngine": "memories_core.engine",
    "export_user": "memories_core.portable",
    "import_user": "memories_core.portable",
    **{
        name: "memories_core.mechanisms"
        for name in (
            "ConditionalMemory",
            "ConditionalReply",
            "DualProcessMemory",
            "EMGMemory",
            "HistoryMemory",
            "MemoryBankMemory",
            "MemoChatMemory",
            "MemoEntry",
            "MemoryBase",
            "MultiViewMemory",
            "SelfReflectiveMemory",
            "SelfReflectiveRetrieval",
            "SummaryMemory",
        )
    },
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'memories_core' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
