"""Memory mechanisms: one module per published mechanism."""

from memories_core.mechanisms.base import MemoryBase
from memories_core.mechanisms.history import HistoryMemory
from memories_core.mechanisms.summary import SummaryMemory

__all__ = ["HistoryMemory", "MemoryBase", "SummaryMemory"]
