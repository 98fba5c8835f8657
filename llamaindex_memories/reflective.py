"""Self-reflective retrieval (Yuan et al., §3.2, Table 19) for any LlamaIndex retriever.

* :class:`SelfReflectiveRetriever`: wraps a retriever; the model keeps the nodes that suffice
  or names keywords, and the wrapped retriever searches again with the extended query.
* :class:`SelfReflectiveFilter`: a node postprocessor doing one reflection step on nodes that
  are already retrieved, for query engines whose retriever you cannot swap.

The loop, its prompt and its parsing live in :mod:`memories_core.mechanisms.reflection`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.bridge.pydantic import Field, PrivateAttr, field_validator
from llama_index.core.callbacks import CallbackManager
from llama_index.core.llms import LLM as LIBaseLLM
from llama_index.core.postprocessor.types import BaseNodePostprocessor
from llama_index.core.prompts.mixin import PromptMixinType
from llama_index.core.schema import NodeWithScore, QueryBundle

from llamaindex_memories.bridges import LlamaIndexLLM
from memories_core.clock import dated_line, metadata_time
from memories_core.interfaces import LLM
from memories_core.mechanisms.reflection import ReflectionResult, SelfReflectiveRetrieval

__all__ = ["SelfReflectiveFilter", "SelfReflectiveRetriever"]

#: Node metadata written by the reflection, hidden from the LLM and the embedder.
REFLECTION_KEYS = ["reflection_queries", "reflection_memory"]


def as_core_llm(llm: LLM | LIBaseLLM) -> LLM:
    """A LlamaIndex ``LLM`` bridged with :class:`LlamaIndexLLM`; a core LLM as it is."""
    return LlamaIndexLLM(llm) if isinstance(llm, LIBaseLLM) else llm


def _text_of(node: NodeWithScore) -> str:
    return node.node.get_content()


def _dated(node: NodeWithScore) -> str:
    """A node as the model judges it: after its ``created_at``/``timestamp``, if any."""
    return dated_line(node.node.get_content(), metadata_time(node.node.metadata))


def _shown(show_dates: bool) -> Callable[[NodeWithScore], str]:
    return _dated if show_dates else _text_of


def _annotated(result: ReflectionResult[NodeWithScore]) -> list[NodeWithScore]:
    """Copies of the chosen nodes that record the reflection; the originals stay untouched."""
    out = []
    for hit in result.items:
        node = hit.node
        extra = {"reflection_queries": list(result.queries), "reflection_memory": result.memory}
        copy = node.model_copy(
            update={
                "metadata": {**node.metadata, **extra},
                "excluded_llm_metadata_keys": _hide(node.excluded_llm_metadata_keys),
                "excluded_embed_metadata_keys": _hide(node.excluded_embed_metadata_keys),
            }
        )
        out.append(NodeWithScore(node=copy, score=hit.score))
    return out


def _hide(keys: Sequence[str]) -> list[str]:
    return [*keys, *(k for k in REFLECTION_KEYS if k not in keys)]


class SelfReflectiveRetriever(BaseRetriever):
    """Any LlamaIndex retriever, with self-reflection on what it retrieves (§3.2, Table 19).

    The wrapped retriever searches; the model then either copies the sentences that suffice
    (``<Memory>``: the nodes they came from are returned) or names missing keywords
    (``<Query>``: the query is extended and the wrapped retriever searches again, at most
    ``max_rounds`` times; the last candidates are then returned as they are). An unusable
    reflection keeps the candidates as retrieved. Nodes are returned as copies whose metadata
    adds ``reflection_queries`` (every query searched) and ``reflection_memory`` (the copied
    sentences or ``None``), hidden from the LLM and embedding views. Whatever the wrapped
    retriever enforces (e.g. :class:`~llamaindex_memories.MemoryRetriever`'s user scope) holds
    for every round.

    The model sees each node's text after its date when the node's metadata has one
    (``created_at``, as :class:`~llamaindex_memories.MemoryRetriever` writes it, or
    ``timestamp``), as the core ``SelfReflectiveMemory`` shows records;
    ``show_dates=False`` shows the bare text.

    Setup:
        ``pip install 'llm-memories[llamaindex]'``

    Key init args:
        base_retriever: Any retriever (``index.as_retriever()``, ``MemoryRetriever``, ...).
        llm: A LlamaIndex LLM (bridged with :class:`~llamaindex_memories.LlamaIndexLLM`) or a
            core LLM.
        max_rounds: Query expansions allowed (paper: 1): one reflection call and at most two
            searches per query.
        prompts: Prompt overrides by name (``reflection``, ``reflection.json``), checked here
            (``PromptOverrideError``): an override must keep the output format.
        show_dates: Show the model each node's date from its metadata (default ``True``).

    Instantiate and use in a query engine:
        .. code-block:: python

            from llama_index.core import VectorStoreIndex
            from llama_index.core.query_engine import RetrieverQueryEngine
            from llamaindex_memories import SelfReflectiveRetriever

            index = VectorStoreIndex.from_documents(docs)
            retriever = SelfReflectiveRetriever(index.as_retriever(), llm=llm)
            nodes = retriever.retrieve("When does the office open?")
            engine = RetrieverQueryEngine.from_args(retriever, llm=llm)

    Async:
        ``await retriever.aretrieve(...)`` uses the wrapped retriever's ``aretrieve`` and the
        model's async call.

    Raises:
        ConfigurationError: if ``max_rounds`` is negative.
    """

    def __init__(
        self,
        base_retriever: BaseRetriever,
        llm: LLM | LIBaseLLM,
        *,
        max_rounds: int = 1,
        prompts: Mapping[str, str] | None = None,
        show_dates: bool = True,
        callback_manager: CallbackManager | None = None,
        verbose: bool = False,
    ) -> None:
        self._base = base_retriever
        self._shown = _shown(show_dates)
        self._reflection = SelfReflectiveRetrieval(
            as_core_llm(llm), max_rounds=max_rounds, prompts=prompts
        )
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    @classmethod
    def class_name(cls) -> str:
        """Name of the component, as LlamaIndex components report it."""
        return "SelfReflectiveRetriever"

    @property
    def base_retriever(self) -> BaseRetriever:
        """The wrapped retriever."""
        return self._base

    def _get_prompt_modules(self) -> PromptMixinType:
        return {"base_retriever": self._base}

    def _bundle(self, query_bundle: QueryBundle, query: str) -> QueryBundle:
        # The first round keeps the caller's bundle (its embedding, image, ...).
        return query_bundle if query == query_bundle.query_str else QueryBundle(query)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        result = self._reflection.run(
            query_bundle.query_str,
            lambda q: self._base.retrieve(self._bundle(query_bundle, q)),
            _text_of,
            shown=self._shown,
        )
        return _annotated(result)

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        async def search(query: str) -> list[NodeWithScore]:
            return await self._base.aretrieve(self._bundle(query_bundle, query))

        result = await self._reflection.arun(
            query_bundle.query_str, search, _text_of, shown=self._shown
        )
        return _annotated(result)


class SelfReflectiveFilter(BaseNodePostprocessor):
    """One self-reflection step (§3.2, Table 19) on already-retrieved nodes.

    For query engines whose retriever you cannot swap: the model keeps the nodes whose
    sentences it copies (``<Memory>``). A postprocessor cannot search again, so when the model
    asks for more (``<Query>: keywords``) every node is kept and the extended query is recorded
    in ``reflection_queries`` (original first, then the query with the keywords) for the app to
    act on; use :class:`SelfReflectiveRetriever` to have it searched. An unusable reflection
    keeps every node. Nodes are returned as copies annotated like the retriever's. The model
    sees each node after its date, as :class:`SelfReflectiveRetriever` shows them.

    Key init args:
        llm: A LlamaIndex LLM (bridged with :class:`~llamaindex_memories.LlamaIndexLLM`) or a
            core LLM.
        prompts: Prompt overrides by name (``reflection``, ``reflection.json``).
        show_dates: Show the model each node's date from its metadata (default ``True``).

    Use in a query engine:
        .. code-block:: python

            from llamaindex_memories import SelfReflectiveFilter

            engine = index.as_query_engine(
                llm=llm, node_postprocessors=[SelfReflectiveFilter(llm=llm)]
            )
            print(engine.query("When does the office open?"))

    Raises:
        ValueError: from ``postprocess_nodes`` without a query.
    """

    llm: LLM = Field(
        exclude=True,
        description="Judges the nodes: a core LLM, or a LlamaIndex LLM (bridged on input).",
    )
    show_dates: bool = Field(
        default=True, description="Show the model each node's date from its metadata."
    )
    _reflection: SelfReflectiveRetrieval = PrivateAttr()

    def __init__(
        self, llm: LLM | LIBaseLLM, *, prompts: Mapping[str, str] | None = None, **kwargs: Any
    ) -> None:
        fields: dict[str, Any] = {**kwargs, "llm": llm}
        super().__init__(**fields)
        self._reflection = SelfReflectiveRetrieval(self.llm, max_rounds=1, prompts=prompts)

    @field_validator("llm", mode="before")
    @classmethod
    def _bridge(cls, value: Any) -> LLM:
        if not isinstance(value, (LIBaseLLM, LLM)):
            raise ValueError(f"llm must be a LlamaIndex or core LLM, got {type(value).__name__}")
        return as_core_llm(value)

    @classmethod
    def class_name(cls) -> str:
        """Name used by LlamaIndex serialization."""
        return "SelfReflectiveFilter"

    @staticmethod
    def _query(query_bundle: QueryBundle | None) -> str:
        if query_bundle is None:
            raise ValueError("SelfReflectiveFilter needs the query (query_bundle or query_str)")
        return query_bundle.query_str

    def _postprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query = self._query(query_bundle)
        # max_rounds=1 and a search that returns the same nodes: exactly one reflection step.
        return _annotated(
            self._reflection.run(query, lambda _q: nodes, _text_of, shown=_shown(self.show_dates))
        )

    async def _apostprocess_nodes(
        self, nodes: list[NodeWithScore], query_bundle: QueryBundle | None = None
    ) -> list[NodeWithScore]:
        query = self._query(query_bundle)

        async def same_nodes(_q: str) -> list[NodeWithScore]:
            return nodes

        return _annotated(
            await self._reflection.arun(query, same_nodes, _text_of, shown=_shown(self.show_dates))
        )
