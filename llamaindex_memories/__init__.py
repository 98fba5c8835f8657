"""LlamaIndex adapters for llm-memories: long-term memory for chat engines, agents and queries.

* :class:`MemoryBlock`: a block for ``llama_index.core.memory.Memory`` (chat engines, agents).
* :class:`MemoryRetriever`: a retriever over one user's memories (query engines, RAG).
* :class:`ConditionalMemoryLLM`: the app's LLM answering with conditional memory in one call.
* :class:`ConditionalMemoryBlock`: a memory block for conditional memory (drop-in mode).
* :class:`SelfReflectiveRetriever`, :class:`SelfReflectiveFilter`: self-reflection on what any
  retriever finds, as a retriever or as a node postprocessor.
* :class:`LlamaIndexLLM`, :class:`LlamaIndexEmbedder`: LlamaIndex models as core models.
* :class:`CoreEmbedding`: a core embedder as a LlamaIndex embedding model.
* :class:`CoreLLM`: a core chat model (by default the package's offline model) as a
  LlamaIndex ``LLM``.
* :class:`MemoryToolSpec`: save / search / update / forget memory tools for agents.
* :class:`MemoryRecallEvent`, :class:`MemorySaveEvent`: instrumentation events of memory.
* :class:`MemoChatEngine`, :func:`memochat_retriever`: MemoChat's chat with memo.
* :class:`PersonalizedLlamaLLM`: a user's MaLP model (LoRA adapter + DPeM memory).
* :func:`dpem_retriever`: DPeM's STM and LTM knowledge items as nodes.
* :class:`EMGToolSpec`, :func:`emg_retriever`: EMG-RAG's applications as tools, and its
  selection as a retriever.
"""

try:
    import llama_index.core  # noqa: F401
except ImportError as exc:
    from memories_core.errors import MissingExtraError

    raise MissingExtraError("llama-index-core", "llamaindex") from exc

from llamaindex_memories.bridges import CoreEmbedding, LlamaIndexEmbedder, LlamaIndexLLM
from llamaindex_memories.conditional import ConditionalMemoryBlock, ConditionalMemoryLLM
from llamaindex_memories.emg import EMGToolSpec, emg_retriever
from llamaindex_memories.forgetting import ForgettingCurvePostprocessor, MemoryBankBlock
from llamaindex_memories.llm import CoreLLM
from llamaindex_memories.memochat import MemoChatEngine, memochat_retriever
from llamaindex_memories.memory_block import MemoryBlock
from llamaindex_memories.observability import MemoryRecallEvent, MemorySaveEvent
from llamaindex_memories.personalized import PersonalizedLlamaLLM, dpem_retriever
from llamaindex_memories.reflective import SelfReflectiveFilter, SelfReflectiveRetriever
from llamaindex_memories.retriever import MemoryRetriever
from llamaindex_memories.tools import MemoryToolSpec

__all__ = [
    "ConditionalMemoryBlock",
    "ConditionalMemoryLLM",
    "CoreEmbedding",
    "CoreLLM",
    "EMGToolSpec",
    "ForgettingCurvePostprocessor",
    "LlamaIndexEmbedder",
    "LlamaIndexLLM",
    "MemoChatEngine",
    "MemoryBankBlock",
    "MemoryBlock",
    "MemoryRecallEvent",
    "MemoryRetriever",
    "MemorySaveEvent",
    "MemoryToolSpec",
    "PersonalizedLlamaLLM",
    "SelfReflectiveFilter",
    "SelfReflectiveRetriever",
    "dpem_retriever",
    "emg_retriever",
    "memochat_retriever",
]
