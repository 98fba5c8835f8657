"""Bridges between LlamaIndex models and the core's model contracts.

* :class:`LlamaIndexLLM`: any LlamaIndex ``LLM`` as a core :class:`~memories_core.llms.BaseLLM`,
  so mechanisms that call a model (summaries, reflection, ...) use the one the app already has.
* :class:`LlamaIndexEmbedder`: any LlamaIndex ``BaseEmbedding`` as a core embedder.
* :class:`CoreEmbedding`: the reverse, a core embedder (the bundled MiniLM, the hashing test
  embedder) as a LlamaIndex ``BaseEmbedding`` for ``Settings.embed_model`` or an index.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import numpy.typing as npt
from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding
from llama_index.core.base.llms.types import ChatMessage as LIChatMessage
from llama_index.core.base.llms.types import ChatResponse
from llama_index.core.bridge.pydantic import Field
from llama_index.core.llms import LLM as LIBaseLLM

from memories_core.embedders import BaseEmbedder
from memories_core.embedders.base import l2_normalise
from memories_core.errors import InvalidInputError, check_count
from memories_core.interfaces import Embedder
from memories_core.llms import BaseLLM, LLMResult
from memories_core.llms.base import truncate_at_stop
from memories_core.types import ChatMessage
from memories_core.usage import estimate_tokens

__all__ = ["CoreEmbedding", "LlamaIndexEmbedder", "LlamaIndexLLM"]


def _token_count(response: ChatResponse, key: str) -> int | None:
    """Token count a LlamaIndex integration reported (OpenAI puts them in additional_kwargs)."""
    value = response.additional_kwargs.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class LlamaIndexLLM(BaseLLM):
    """A LlamaIndex ``LLM`` seen as a core chat model.

    Sampling options (``max_tokens``, ``temperature``) are those the LlamaIndex ``LLM`` was built
    with: they are not forwarded, because integrations disagree on which keyword arguments
    ``chat`` accepts. ``stop`` is applied to the reply. Token counts come from the integration
    when it reports them (OpenAI does), else they are estimated.

    Example:
        >>> from llama_index.core.llms import MockLLM
        >>> from memories_core.types import ChatMessage
        >>> llm = LlamaIndexLLM(MockLLM())
        >>> llm.generate([ChatMessage("user", "hi")]).startswith("user: hi")  # MockLLM echoes
        True

    Args:
        llm: The LlamaIndex chat model (``OpenAI(...)``, ``Ollama(...)``, ``MockLLM()``, ...).
    """

    def __init__(self, llm: LIBaseLLM) -> None:
        super().__init__()
        self._llm = llm

    @property
    def name(self) -> str:
        """``"llamaindex:<model name>"``."""
        return f"llamaindex:{self._llm.metadata.model_name}"

    @staticmethod
    def _to_llamaindex(messages: tuple[ChatMessage, ...]) -> list[LIChatMessage]:
        return [LIChatMessage(role=m.role, content=m.content) for m in messages]

    @staticmethod
    def _result(response: ChatResponse, stop: tuple[str, ...] | None) -> LLMResult:
        return LLMResult(
            text=truncate_at_stop(response.message.content or "", stop),
            prompt_tokens=_token_count(response, "prompt_tokens"),
            completion_tokens=_token_count(response, "completion_tokens"),
        )

    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        return self._result(self._llm.chat(self._to_llamaindex(messages)), stop)

    async def _agenerate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        return self._result(await self._llm.achat(self._to_llamaindex(messages)), stop)


class LlamaIndexEmbedder(BaseEmbedder):
    """A LlamaIndex ``BaseEmbedding`` seen as a core embedder.

    Documents go through ``get_text_embedding_batch`` and queries through
    ``get_query_embedding`` (instruction-tuned models embed the two differently); the core
    normalises every vector. If ``dimension`` is not given it is measured once, on first
    use, by embedding one short probe text.

    Example:
        >>> from memories_core.embedders import HashingEmbedder
        >>> embedder = LlamaIndexEmbedder(CoreEmbedding(HashingEmbedder(dimension=64)))
        >>> embedder.embed_documents(["hello"]).shape
        (1, 64)

    Args:
        embed_model: The LlamaIndex embedding model.
        dimension: Vector length, if known (saves the probe call).
        name: Identity stored with an index to detect a changed embedder; defaults to
            ``llamaindex:<model_name>`` (``llamaindex:<Class>`` when the model leaves
            ``model_name`` at LlamaIndex's ``"unknown"``). Pass a precise name for
            persistent memories.

    Raises:
        ValueError: if ``dimension`` is given and is not a positive int.
    """

    def __init__(
        self,
        embed_model: BaseEmbedding,
        *,
        dimension: int | None = None,
        name: str | None = None,
    ) -> None:
        super().__init__()
        if dimension is not None:
            dimension = check_count("dimension", dimension)
        self._embed_model = embed_model
        self._known_dimension = dimension
        self._name = name

    @property
    def name(self) -> str:
        """The name given, else ``"llamaindex:<model name>"`` (or ``<Class>``)."""
        if self._name:
            return self._name
        model = self._embed_model.model_name
        if not model or model == "unknown":
            model = type(self._embed_model).__name__
        return f"llamaindex:{model}"

    @property
    def dimension(self) -> int:
        """Vector length (measured with one probe embedding if not given)."""
        return self._probe_dimension(
            lambda: self._embed_model.get_text_embedding("dimension probe")
        )

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        return np.asarray(self._embed_model.get_text_embedding_batch(texts), dtype=np.float32)

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """Embed a query with ``get_query_embedding``; L2-normalised and counted."""
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        try:
            vector = np.asarray(self._embed_model.get_query_embedding(text), dtype=np.float32)
            if vector.shape != (self.dimension,):
                raise RuntimeError(
                    f"get_query_embedding returned shape {vector.shape}, "
                    f"expected ({self.dimension},)"
                )
        except BaseException:
            self._usage.record(failures=1)
            raise
        self._usage.record(calls=1, items=1, prompt_tokens=estimate_tokens(text))
        return l2_normalise(vector.reshape(1, -1))[0]


class CoreEmbedding(BaseEmbedding):
    """A core embedder seen as a LlamaIndex ``BaseEmbedding``.

    Example:
        >>> from memories_core.embedders import HashingEmbedder
        >>> embed_model = CoreEmbedding(HashingEmbedder())  # or: Settings.embed_model = ...
        >>> len(embed_model.get_query_embedding("hello"))
        256

    Args:
        embedder: Any core embedder, e.g. ``SentenceTransformerEmbedder()`` (all-MiniLM-L6-v2,
            offline) or ``HashingEmbedder()`` (deterministic, for tests).
        **kwargs: Other ``BaseEmbedding`` fields (``embed_batch_size``, ``callback_manager``).
    """

    embedder: Embedder = Field(
        exclude=True, description="The wrapped core embedder (memories_core Embedder protocol)."
    )

    def __init__(self, embedder: Embedder, **kwargs: Any) -> None:
        fields: dict[str, Any] = {"model_name": embedder.name, **kwargs, "embedder": embedder}
        super().__init__(**fields)

    @classmethod
    def class_name(cls) -> str:
        """Name used by LlamaIndex serialization."""
        return "CoreEmbedding"

    def _get_query_embedding(self, query: str) -> Embedding:
        return [float(x) for x in self.embedder.embed_query(query)]

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._get_text_embeddings([text])[0]

    def _get_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return self.embedder.embed_documents(texts).tolist()

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return await asyncio.to_thread(self._get_query_embedding, query)

    async def _aget_text_embedding(self, text: str) -> Embedding:
        return await asyncio.to_thread(self._get_text_embedding, text)

    async def _aget_text_embeddings(self, texts: list[str]) -> list[Embedding]:
        return await asyncio.to_thread(self._get_text_embeddings, texts)
