"""MemoryBank's forgetting curve (Zhong et al., §2.3) around any LangChain retriever.

The curve and the re-weighting rule live in :mod:`memories_core.mechanisms.forgetting`; this
module only converts documents.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from pydantic import ConfigDict, Field

from langchain_memories.retriever import MemoryRetriever, _to_documents
from memories_core.clock import resolve_now
from memories_core.mechanisms.forgetting import ForgettingCurve, apply_forgetting
from memories_core.mechanisms.memorybank import MemoryBankMemory

__all__ = ["ForgettingCurveRetriever", "MemoryBankRetriever"]


class ForgettingCurveRetriever(BaseRetriever):
    """Any retriever, its documents re-weighted (``score x R``) or dropped by ``R = exp(-t/S)``.

    The wrapped retriever searches; each document's retention comes from its metadata:
    ``created_at`` or ``timestamp`` (ISO 8601, datetime or Unix seconds), optionally
    ``strength`` (default 1) and ``last_recalled_at``. Documents without a timestamp pass
    unchanged. The score is ``metadata["score"]`` when present, else ``1 - position / n``.
    Returned documents are copies whose metadata adds ``retention`` and the new ``score``.

    Reinforcement (§2.3) is written back for documents from our store (metadata
    ``record_id`` and ``user_id``) when ``memory`` (a ``MemoryBankMemory``) is given; leave it
    out for documents that came through ``memory.recall``, which reinforces by itself.

    Key init args:
        base_retriever: Any LangChain retriever (``vectorstore.as_retriever()``, ...); extra
            ``invoke`` kwargs (e.g. ``k=``) are passed to it.
        unit: One unit of ``t`` (default: a day).
        scale: Curve stretch (1: the paper's curve).
        reweight: Multiply scores by ``R`` and re-sort (``False``: only drop).
        min_retention: Drop documents with ``R`` below this.
        memory: A ``MemoryBankMemory`` to write reinforcement back to.
        now: Fixed time of the evaluation (default: the memory's clock, else the wall clock).

    Use in a chain:
        .. code-block:: python

            from langchain_memories import ForgettingCurveRetriever

            retriever = ForgettingCurveRetriever(
                base_retriever=vectorstore.as_retriever(), min_retention=0.05
            )
            chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | ...
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    base_retriever: BaseRetriever = Field(description="The retriever whose documents fade.")
    unit: timedelta = Field(default=timedelta(days=1), description="One unit of t.")
    scale: float = Field(default=1.0, gt=0, description="Stretch of the curve exp(-t/(scale*S)).")
    reweight: bool = Field(default=True, description="Multiply scores by the retention.")
    min_retention: float = Field(
        default=0.0, ge=0, le=1, description="Drop documents whose retention is below this."
    )
    memory: Any = Field(default=None, description="MemoryBankMemory to write reinforcement to.")
    now: datetime | None = Field(default=None, description="Fixed evaluation time.")

    def _forget(self, docs: list[Document]) -> list[Document]:
        now = resolve_now(self.now, getattr(self.memory, "clock", None))
        kept = apply_forgetting(
            [(_score(d), d.metadata) for d in docs],
            curve=ForgettingCurve(unit=self.unit, scale=self.scale),
            now=now,
            reweight=self.reweight,
            min_retention=self.min_retention,
        )
        out: list[Document] = []
        recalled: dict[str, list[str]] = defaultdict(list)
        for item in kept:
            doc = docs[item.index]
            extra: dict[str, Any] = {}
            if item.retention is not None:
                extra["retention"] = item.retention
            if self.reweight and item.score is not None:
                extra["score"] = item.score
            out.append(
                Document(
                    page_content=doc.page_content, metadata={**doc.metadata, **extra}, id=doc.id
                )
            )
            meta = doc.metadata
            if isinstance(meta.get("record_id"), str) and isinstance(meta.get("user_id"), str):
                recalled[meta["user_id"]].append(meta["record_id"])
        if self.memory is not None:
            for user_id, ids in recalled.items():
                self.memory.reinforce_records(user_id, ids, now)
        return out

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        # Extra invoke kwargs (``k=``) are the wrapped retriever's.
        config = RunnableConfig(callbacks=run_manager.get_child())
        docs = self.base_retriever.invoke(query, config=config, **kwargs)
        return self._forget(docs)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        config = RunnableConfig(callbacks=run_manager.get_child())
        docs = await self.base_retriever.ainvoke(query, config=config, **kwargs)
        return self._forget(docs)


def _score(doc: Document) -> float | None:
    value = doc.metadata.get("score")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class MemoryBankRetriever(MemoryRetriever):
    """:class:`~langchain_memories.MemoryRetriever` for a core ``MemoryBankMemory``.

    Returns at most ``k`` recalled memories (turns and daily summaries, reinforced on recall
    and re-weighted by the forgetting curve if the memory's ``forgetting_weight`` > 0; archived
    ones only after ``memory.restore(...)``; Zhong et al. §2.2-2.3). The user's global
    portrait and global event summary, which SiliconFriend's prompt holds beside them (§3),
    ride in every document's metadata (``"global_portrait"``, ``"global_summary"``; absent
    until written) rather than as extra documents; :meth:`render` puts all of it in one
    prompt block.

    Instantiate:
        .. code-block:: python

            from langchain_memories import MemoryBankRetriever
            from memories_core import MemoryBankMemory

            bank = MemoryBankMemory(path="./memories")
            retriever = MemoryBankRetriever(memory=bank, user_id="gary", k=3)
            chain = {"context": retriever | MemoryBankRetriever.render, ...} | prompt | model
    """

    memory: MemoryBankMemory = Field(description="The core MemoryBank memory.")

    def _get_relevant_documents(
        self,
        query: str,
        *,
        run_manager: CallbackManagerForRetrieverRun,
        k: int | None = None,
    ) -> list[Document]:
        now = self.memory.clock.now()  # one instant for the recall and the global records
        recall = self.memory.recall(query, self._scope(), k=k if k is not None else self.k, now=now)
        return self._with_globals(_to_documents(recall), now)

    async def _aget_relevant_documents(
        self,
        query: str,
        *,
        run_manager: AsyncCallbackManagerForRetrieverRun,
        k: int | None = None,
    ) -> list[Document]:
        now = self.memory.clock.now()
        recall = await self.memory.arecall(
            query, self._scope(), k=k if k is not None else self.k, now=now
        )
        return self._with_globals(_to_documents(recall), now)

    def _with_globals(self, docs: list[Document], now: datetime) -> list[Document]:
        parts = {
            "global_portrait": self.memory.portrait(self.user_id, now),
            "global_summary": self.memory.global_summary(self.user_id, now),
        }
        known = {key: text for key, text in parts.items() if text}
        return [
            Document(page_content=d.page_content, metadata={**d.metadata, **known}, id=d.id)
            for d in docs
        ]

    @staticmethod
    def render(docs: list[Document]) -> str:
        """The memories, the portrait and the global summary as one prompt block.

        The core's :meth:`~memories_core.MemoryBankMemory.compose_context`, as ``recall``
        renders it, so a chain and a block give the model the same prompt.
        """
        head = docs[0].metadata if docs else {}
        return MemoryBankMemory.compose_context(
            "\n".join(d.page_content for d in docs),
            head.get("global_portrait"),
            head.get("global_summary"),
        )
