"""A LlamaIndex retriever over any llm-memories mechanism."""

from __future__ import annotations

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.callbacks import CallbackManager
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from llamaindex_memories.observability import recall_event
from memories_core.background import WorkStatus
from memories_core.errors import check_count
from memories_core.interfaces import Mechanism
from memories_core.mechanisms.base import flush_memory, memory_status
from memories_core.types import Recall, Scope, ScoredRecord

__all__ = ["MemoryRetriever"]

#: Bookkeeping metadata keys kept on each node but hidden from the LLM and the embedder:
#: the library's (``ScoredRecord.to_metadata``) and those the engine writes on turns.
_HIDDEN_KEYS = [
    "record_id",
    "kind",
    "created_at",
    "user_id",
    "session_id",
    "source_ids",
    "score",
    "fused_score",
    "relevance",
    "strength",
    "recall_count",
    "last_recalled_at",
    "valid_until",
    "role",
    "speaker",
    "batch_id",
]


def record_to_node(hit: ScoredRecord) -> NodeWithScore:
    """Convert a recalled record to a scored LlamaIndex node (node id = record id).

    Metadata: :meth:`~memories_core.types.ScoredRecord.to_metadata` (the record's own, then
    ``record_id``, ``kind``, ``score``, timestamps, state), the same keys as LangChain
    documents. Bookkeeping keys (ids, kind, times, state, a turn's role, speaker and batch)
    are hidden from the LLM and the embedder, so the text an LLM reads is the record's text
    plus only the metadata the application gave it. The node's score is the record's
    :attr:`~memories_core.types.ScoredRecord.relevance`, a similarity in ``[0, 1]``, since
    LlamaIndex treats node scores as similarities (e.g. ``SimilarityPostprocessor``'s
    cutoff): the cosine of the query to the record when dense search found it (1.0 for
    its own text), else the logistic map of the pipeline's score. The pipeline's own
    score stays in the metadata (``score`` and ``fused_score``).
    """
    record = hit.record
    metadata = hit.to_metadata()
    node = TextNode(
        id_=record.id,
        text=record.text,
        metadata=metadata,
        excluded_llm_metadata_keys=list(_HIDDEN_KEYS),
        excluded_embed_metadata_keys=list(_HIDDEN_KEYS),
    )
    return NodeWithScore(node=node, score=hit.relevance)


class MemoryRetriever(BaseRetriever):
    """Retrieve one user's memories as ``NodeWithScore``s, best first.

    Works wherever LlamaIndex takes a retriever: ``RetrieverQueryEngine``,
    ``ContextChatEngine``, ``CondensePlusContextChatEngine``, a ``QueryFusionRetriever``, ...
    Every query is scoped to ``user_id``; another user's memories are never returned.

    Setup:
        ``pip install 'llm-memories[llamaindex]'``

    Key init args:
        memory: Any mechanism (``HistoryMemory``, ``SummaryMemory``, ...).
        user_id: Whose memories to search.
        session_id: Current session, passed to the mechanism (which may ignore it).
        similarity_top_k: Nodes per query; default: the mechanism's own ``k``.

    Instantiate and use in a query engine:
        .. code-block:: python

            from llama_index.core.query_engine import RetrieverQueryEngine
            from memories_core import HistoryMemory
            from llamaindex_memories import MemoryRetriever

            retriever = MemoryRetriever(HistoryMemory(path="./memories"), "alice")
            nodes = retriever.retrieve("what food do I like?")
            engine = RetrieverQueryEngine.from_args(retriever, llm=llm)
            print(engine.query("What food do I like?"))

    Async:
        ``await retriever.aretrieve(...)`` uses the mechanism's ``arecall``.

    Raises:
        MissingUserError: if ``user_id`` is empty.
        ConfigurationError: (a ``ValueError``) if ``similarity_top_k`` is not a positive int.
        InvalidInputError: from ``retrieve`` on an empty query (raised by the mechanism).
    """

    def __init__(
        self,
        memory: Mechanism,
        user_id: str,
        *,
        session_id: str | None = None,
        similarity_top_k: int | None = None,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        if similarity_top_k is not None:
            similarity_top_k = check_count("similarity_top_k", similarity_top_k)
        self._memory = memory
        self._scope = Scope(user_id, session_id=session_id)
        self._similarity_top_k = similarity_top_k
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @classmethod
    def class_name(cls) -> str:
        """Name of the component, as LlamaIndex components report it."""
        return "MemoryRetriever"

    @property
    def similarity_top_k(self) -> int | None:
        """Nodes returned per query (``None``: the mechanism's default)."""
        return self._similarity_top_k

    @staticmethod
    def _nodes(recall: Recall) -> list[NodeWithScore]:
        return [record_to_node(hit) for hit in recall.records]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        recall = self._memory.recall(query_bundle.query_str, self._scope, k=self._similarity_top_k)
        recall_event(self._memory, self._scope.user_id, query_bundle.query_str, recall)
        return self._nodes(recall)

    def flush(self, *, timeout: float | None = None) -> int:
        """Wait for the memory's pending derivations of this retriever's user.

        Saves return before the model derives notes, memos or summaries; call this when the
        next retrieval must see them. Returns how many jobs are left.
        """
        return flush_memory(self._memory, self._scope.user_id, timeout=timeout)

    def status(self) -> WorkStatus | None:
        """Pending, running and failed derivations of this user (``None``: not reported)."""
        return memory_status(self._memory, self._scope.user_id)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        recall = await self._memory.arecall(
            query_bundle.query_str, self._scope, k=self._similarity_top_k
        )
        recall_event(self._memory, self._scope.user_id, query_bundle.query_str, recall)
        return self._nodes(recall)
