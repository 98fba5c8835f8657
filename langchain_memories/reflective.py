"""Self-reflective retrieval around any LangChain retriever (Yuan et al., §3.2, Table 19)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from pydantic import ConfigDict, Field, PrivateAttr, model_validator

from langchain_memories.bridges import LangChainLLM
from memories_core.clock import dated_line, metadata_time
from memories_core.interfaces import LLM
from memories_core.mechanisms.reflection import ReflectionResult, SelfReflectiveRetrieval

__all__ = ["SelfReflectiveRetriever", "as_core_llm"]


def as_core_llm(llm: BaseChatModel | LLM) -> LLM:
    """A LangChain chat model bridged with ``LangChainLLM``; a core ``LLM`` as it is."""
    return LangChainLLM(llm) if isinstance(llm, BaseChatModel) else llm


def _text(doc: Document) -> str:
    return doc.page_content


def _dated(doc: Document) -> str:
    """A document as the model judges it: after its ``created_at``/``timestamp``, if any."""
    return dated_line(doc.page_content, metadata_time(doc.metadata))


def _annotated(result: ReflectionResult[Document]) -> list[Document]:
    """Copies of the selected documents with the reflection's outcome in their metadata."""
    return [
        doc.model_copy(
            update={
                "metadata": {
                    **doc.metadata,
                    "reflection_queries": list(result.queries),
                    "reflection_memory": result.memory,
                    "reflection_failed": result.failed,
                }
            }
        )
        for doc in result.items
    ]


class SelfReflectiveRetriever(BaseRetriever):
    r"""Let the model judge what a retriever found, and search again when it is not enough.

    The self-reflection of Yuan et al. (§3.2, Table 19), around ANY LangChain retriever (a
    vector store's ``as_retriever()``, a ``MemoryRetriever``, an ensemble, ...). The base
    retriever is searched with the query; ``llm`` then either copies the sentences that answer
    it (``<Memory>``: the documents they came from are returned) or names missing keywords
    (``<Query>``: the query is extended and the base retriever searched again, at most
    ``max_rounds`` times; the last candidates are then returned as they are). With
    ``max_rounds=1`` (the paper's setting) a query costs one LLM call and at most two
    searches. An unusable reflection (model error or garbled answer after one repair retry)
    returns the candidates as retrieved: retrieval never fails because of the reflection.

    The model sees each document after its date when its metadata has one (``created_at``,
    as :class:`MemoryRetriever` writes it, or ``timestamp``), as the core
    ``SelfReflectiveMemory`` shows records, so "when ...?" questions can be judged
    answerable; ``show_dates=False`` shows the bare ``page_content``.

    Returned documents are copies of the base retriever's (never mutated) whose metadata adds
    ``reflection_queries`` (every query searched, the original first), ``reflection_memory``
    (the sentences the model copied, or ``None``) and ``reflection_failed``. Whose memories
    are searched is the base retriever's business: this class never changes the scope.

    Setup:
        ```bash
        pip install "llm-memories[langchain]"
        ```

    Key init args:
        base_retriever: BaseRetriever
            Any LangChain retriever; extra ``invoke`` kwargs (e.g. ``k=``) are passed to it.
        llm: BaseChatModel | memories_core LLM
            Judges the candidates; a LangChain chat model is bridged with ``LangChainLLM``.
        max_rounds: int
            Query expansions allowed (default 1, as in the paper; 0 disables reflection).
        show_dates: bool
            Show the model each document's date from its metadata (default ``True``).
        prompts: dict[str, str] | None
            Prompt overrides by name (``reflection``, ``reflection.json``), checked at
            construction (a refused one raises pydantic's ``ValidationError``).

    Instantiate:
        ```python
        from langchain_core.vectorstores import InMemoryVectorStore
        from memories_core.embedders import HashingEmbedder
        from langchain_memories import CoreEmbeddings, SelfReflectiveRetriever

        store = InMemoryVectorStore(CoreEmbeddings(HashingEmbedder()))
        store.add_texts(["I am allergic to peanuts", "My sister lives in Lisbon"])
        retriever = SelfReflectiveRetriever(base_retriever=store.as_retriever(), llm=llm)
        ```

    Invoke:
        ```python
        docs = retriever.invoke("what am I allergic to?")
        print(docs[0].page_content, docs[0].metadata["reflection_queries"])
        print(retriever.reflection.llm.usage.calls)  # reflection calls so far
        ```

    Async:
        ```python
        docs = await retriever.ainvoke("what am I allergic to?")  # base_retriever.ainvoke
        ```

    Use in a chain/agent:
        ```python
        from langchain_memories import MemoryRetriever

        memories = MemoryRetriever(memory=memory, user_id="alice", k=5)
        reflective = SelfReflectiveRetriever(base_retriever=memories, llm=llm)
        chain = (
            {"context": reflective | format_docs, "question": RunnablePassthrough()}
            | prompt
            | llm
        )
        ```
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    base_retriever: BaseRetriever = Field(description="The retriever whose results are judged.")
    llm: BaseChatModel | LLM = Field(description="Judges the candidates (chat model or core LLM).")
    max_rounds: int = Field(default=1, ge=0, description="Query expansions allowed (paper: 1).")
    show_dates: bool = Field(
        default=True, description="Show the model each document's date from its metadata."
    )
    prompts: dict[str, str] | None = Field(
        default=None,
        description="Prompt overrides by name (`reflection`, `reflection.json`), checked at "
        "construction (a refused one raises ValidationError).",
    )

    _reflection: SelfReflectiveRetrieval = PrivateAttr()

    @model_validator(mode="after")
    def _build_reflection_loop(self) -> SelfReflectiveRetriever:
        # Built once, so its usage counters accumulate across queries. A refused prompt
        # override comes out as pydantic's ValidationError, like every invalid field.
        self._reflection = SelfReflectiveRetrieval(
            as_core_llm(self.llm), max_rounds=self.max_rounds, prompts=self.prompts
        )
        return self

    @property
    def reflection(self) -> SelfReflectiveRetrieval:
        """The core loop: ``reflection.llm.usage`` (calls, tokens), ``reflection.failures``."""
        return self._reflection

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        config = RunnableConfig(callbacks=run_manager.get_child())  # searches nest in this run
        result = self._reflection.run(
            query,
            lambda q: self.base_retriever.invoke(q, config=config, **kwargs),
            _text,
            shown=self._shown,
        )
        return _annotated(result)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, **kwargs: Any
    ) -> list[Document]:
        config = RunnableConfig(callbacks=run_manager.get_child())

        async def search(q: str) -> list[Document]:
            return await self.base_retriever.ainvoke(q, config=config, **kwargs)

        return _annotated(await self._reflection.arun(query, search, _text, shown=self._shown))

    @property
    def _shown(self) -> Callable[[Document], str]:
        return _dated if self.show_dates else _text
