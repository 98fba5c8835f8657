"""Memory mechanisms: one module per published mechanism."""

from memories_core.mechanisms.base import MemoryBase
from memories_core.mechanisms.conditional import ConditionalMemory, ConditionalReply
from memories_core.mechanisms.dpem import DPeMStats, DualProcessMemory, KnowledgeItem
from memories_core.mechanisms.emg import EMGMemory
from memories_core.mechanisms.history import HistoryMemory
from memories_core.mechanisms.memochat import LLMOptionSource, MemoChatMemory, MemoEntry
from memories_core.mechanisms.memorybank import ForgetReport, MemoryBankMemory
from memories_core.mechanisms.multiview import MultiViewMemory
from memories_core.mechanisms.reflection import (
    ReflectionResult,
    SelfReflectiveMemory,
    SelfReflectiveRetrieval,
)
from memories_core.mechanisms.summary import SummaryMemory

__all__ = [
    "ConditionalMemory",
    "ConditionalReply",
    "DPeMStats",
    "DualProcessMemory",
    "EMGMemory",
    "ForgetReport",
    "HistoryMemory",
    "KnowledgeItem",
    "LLMOptionSource",
    "MemoChatMemory",
    "MemoEntry",
    "MemoryBankMemory",
    "MemoryBase",
    "MultiViewMemory",
    "ReflectionResult",
    "SelfReflectiveMemory",
    "SelfReflectiveRetrieval",
    "SummaryMemory",
]
