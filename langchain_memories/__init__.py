"""LangChain adapters for llm-memories: long-term memory for agents, chains and retrievers.

* :class:`MemoryMiddleware`: memory for ``langchain.agents.create_agent`` agents.
* :class:`MemoryRetriever`: a retriever over one user's memories (LCEL chains, RAG).
* :class:`LegacyChainMemory`: ``memory=`` for legacy ``ConversationChain`` / ``LLMChain``.
* :class:`MemoryChatMessageHistory`: a stored session as the chat history of
  ``RunnableWithMessageHistory``.
* :class:`ConditionalMemoryChat`: conditional memory's single-call mode as a chat model.
* :class:`SelfReflectiveRetriever`: self-reflection around any LangChain retriever.
* :class:`LangChainLLM`, :class:`LangChainEmbedder`: LangChain models as core models.
* :class:`CoreEmbeddings`: a core embedder as LangChain ``Embeddings``.
* :class:`CoreChatModel`: a core chat model (by default the package's offline model) as a
  LangChain chat model.
* :class:`MemoryStore`: a LangGraph ``BaseStore`` on the memory engine (LangMem runs on it).
* :func:`create_memory_tools`: save / search / update / forget memory tools for agents.
* :func:`create_memochat_chain`, :func:`memochat_retriever`: MemoChat's chat with memo.
* :class:`PersonalizedChatModel`: a user's MaLP model (LoRA adapter + DPeM memory).
* :func:`dpem_retriever`: DPeM's STM and LTM knowledge items as documents.
* :func:`create_emg_tools`, :func:`emg_retriever`: EMG-RAG's applications as tools, and its
  selection as a retriever.
"""

try:
    import langchain.agents  # noqa: F401
    import langchain_classic  # noqa: F401
    import langchain_core  # noqa: F401
except ImportError as exc:
    from memories_core.errors import MissingExtraError

    missing = (exc.name or "langchain").split(".")[0].replace("_", "-")
    raise MissingExtraError(missing, "langchain") from exc

from langchain_memories.bridges import CoreEmbeddings, LangChainEmbedder, LangChainLLM
from langchain_memories.chat_model import CoreChatModel
from langchain_memories.conditional import ConditionalMemoryChat
from langchain_memories.emg import create_emg_tools, emg_retriever
from langchain_memories.forgetting import ForgettingCurveRetriever, MemoryBankRetriever
from langchain_memories.history import MemoryChatMessageHistory
from langchain_memories.legacy import LegacyChainMemory
from langchain_memories.memochat import create_memochat_chain, memochat_retriever
from langchain_memories.middleware import MemoryMiddleware
from langchain_memories.personalized import PersonalizedChatModel, dpem_retriever
from langchain_memories.reflective import SelfReflectiveRetriever
from langchain_memories.retriever import MemoryRetriever
from langchain_memories.store import MemoryStore
from langchain_memories.tools import create_memory_tools

__all__ = [
    "ConditionalMemoryChat",
    "CoreChatModel",
    "CoreEmbeddings",
    "ForgettingCurveRetriever",
    "LangChainEmbedder",
    "LangChainLLM",
    "LegacyChainMemory",
    "MemoryBankRetriever",
    "MemoryChatMessageHistory",
    "MemoryMiddleware",
    "MemoryRetriever",
    "MemoryStore",
    "PersonalizedChatModel",
    "SelfReflectiveRetriever",
    "create_emg_tools",
    "create_memochat_chain",
    "create_memory_tools",
    "dpem_retriever",
    "emg_retriever",
    "memochat_retriever",
]
