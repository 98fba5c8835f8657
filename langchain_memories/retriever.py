"""A LangChain retriever over any memory mechanism."""

from __future__ import annotations

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict, Field, field_validator

from memories_core.background import WorkStatus
from memories_core.interfaces import Mechanism
from memories_core.mechanisms.base import flush_memory, memory_status
from memories_core.types import Recall, Scope, ScoredRecord

__all__ = ["MemoryRetriever", "record_to_document"]


def record_to_document(scored: ScoredRecord) -> Document:
    """Convert one recalled record into a LangChain ``Document`` (id = record id).

    Metadata: :meth:`~memories_core.types.ScoredRecord.to_metadata` (the record's own, then
    ``record_id``, ``kind``, ``score``, timestamps, state), the same keys as LlamaIndex nodes.
    """
    return Document(
        page_content=scored.record.text, metadata=scored.to_metadata(), id=scored.record.id
    )


def _to_documents(recall: Recall) -> list[Document]:
    return [record_to_document(scored) for scored in recall.records]


class MemoryRetriever(BaseRetriever):
    r"""Retrieve one user's long-term memories as LangChain ``Document``s.

    Works with every mechanism of ``memories_core`` (anything that meets the ``Mechanism``
    protocol): the query goes to ``memory.recall(query, Scope(user_id, session_id), k=k)`` and
    each recalled record becomes a ``Document`` whose ``page_content`` is the record text and
    whose ``metadata`` holds ``record_id``, ``kind``, ``relevance`` (a similarity in
    ``[0, 1]``: the cosine of the query to the record when dense search found it, 1.0 for
    its own text, else the logistic map of the pipeline's score), ``score`` and
    ``fused_score`` (the pipeline's own, unbounded; the documents' order),
    ``created_at`` (ISO 8601, UTC), ``session_id``, ``user_id``, ``source_ids`` and the
    record's own metadata. Only ``user_id``'s memories are ever returned.

    Setup:
        Install the LangChain extra:

        ```bash
        pip install "llm-memories[langchain]"
        ```

    Key init args:
        memory: Mechanism
            The core memory to read from (``HistoryMemory``, ``SummaryMemory``, ...).
        user_id: str
            Whose memories to search. Required.
        session_id: str | None
            Optional session passed in the scope (mechanisms that use sessions read it).
        k: int | None
            How many memories to return; ``None`` uses the mechanism's default.

        An empty ``user_id`` or ``k < 1`` raises pydantic's ``ValidationError`` (a
        ``ValueError``) at construction.

    Instantiate:
        ```python
        from memories_core import HistoryMemory, Scope, Turn
        from memories_core.embedders import HashingEmbedder
        from langchain_memories import MemoryRetriever

        memory = HistoryMemory(embedder=HashingEmbedder(), path=None)
        memory.save([Turn("user", "I love Thai food")], Scope("alice"))
        retriever = MemoryRetriever(memory=memory, user_id="alice", k=3)
        ```

    Invoke:
        ```python
        docs = retriever.invoke("what food do I like?")
        docs = retriever.invoke("what food do I like?", k=1)  # override k per call
        print(docs[0].page_content, docs[0].metadata["relevance"])
        ```

    Async:
        ```python
        docs = await retriever.ainvoke("what food do I like?")  # uses memory.arecall
        ```

    Use in a chain/agent:
        ```python
        from langchain_core.prompts import ChatPromptTemplate
        from langchain_core.runnables import RunnablePassthrough

        def format_docs(docs):
            return "\n".join(d.page_content for d in docs)

        prompt = ChatPromptTemplate.from_template(
            "Memories:\n{context}\n\nQuestion: {question}"
        )
        chain = (
            {"context": retriever | format_docs, "question": RunnablePassthrough()}
            | prompt
            | llm
        )
        chain.invoke("what should I cook tonight?")
        ```
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: Mechanism = Field(description="The core memory mechanism to recall from.")
    user_id: str = Field(description="Whose memories to search; enforced by the core.")
    session_id: str | None = Field(default=None, description="Optional session of the scope.")
    k: int | None = Field(
        default=None, ge=1, description="Memories per query; None uses the mechanism default."
    )

    @field_validator("user_id")
    @classmethod
    def _check_user_id(cls, value: str) -> str:
        Scope(value)  # fail at construction, not at the first call, on an empty user id
        return value

    def _scope(self) -> Scope:
        return Scope(self.user_id, session_id=self.session_id)

    def flush(self, *, timeout: float | None = None) -> int:
        """Wait for the memory's pending derivations of ``user_id`` (see ``MemoryEngine.flush``).

        Saves return before the model derives notes, memos or summaries; call this when the
        next recall must see them (scripts, tests). Returns how many jobs are left.
        """
        return flush_memory(self.memory, self.user_id, timeout=timeout)

    def status(self) -> WorkStatus | None:
        """Pending, running and failed derivations of ``user_id`` (``None``: not reported)."""
        return memory_status(self.memory, self.user_id)

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
    ) -> list[Document]:
        recall = self.memory.recall(query, self._scope(), k=k if k is not None else self.k)
        return _to_documents(recall)

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
    ) -> list[Document]:
        recall = await self.memory.arecall(query, self._scope(), k=k if k is not None else self.k)
        return _to_documents(recall)
