"""Bridges between LangChain models and the core's ``LLM`` / ``Embedder`` contracts."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from langchain_core.embeddings import Embeddings
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.messages import ChatMessage as LCChatMessage

from memories_core.embedders.base import BaseEmbedder, l2_normalise
from memories_core.errors import InvalidInputError
from memories_core.interfaces import Embedder
from memories_core.llms.base import BaseLLM, LLMResult, truncate_at_stop
from memories_core.types import ChatMessage
from memories_core.usage import estimate_tokens

__all__ = ["CoreEmbeddings", "LangChainEmbedder", "LangChainLLM", "to_core_message"]


def _model_label(obj: object) -> str:
    """``langchain:<Class>[:<model>]``, from the usual ``model`` / ``model_name`` fields."""
    model = getattr(obj, "model_name", None) or getattr(obj, "model", None)
    suffix = f":{model}" if isinstance(model, str) and model else ""
    return f"langchain:{type(obj).__name__}{suffix}"


def _to_langchain(message: ChatMessage) -> BaseMessage:
    if message.role == "system":
        return SystemMessage(content=message.content)
    if message.role in ("user", "human"):
        return HumanMessage(content=message.content)
    if message.role in ("assistant", "ai"):
        return AIMessage(content=message.content)
    return LCChatMessage(role=message.role, content=message.content)


_CORE_ROLES = {"system": "system", "human": "user", "ai": "assistant"}


def core_role(message: BaseMessage) -> str:
    """The core role of a LangChain message (a ``ChatMessage`` by its own role; others kept)."""
    role = message.role if isinstance(message, LCChatMessage) else message.type
    return _CORE_ROLES.get(role, role)


def to_core_message(message: BaseMessage) -> ChatMessage:
    """A LangChain message as a core one (system, user, assistant; other roles kept).

    Raises:
        InvalidInputError: if the message carries no text (e.g. only an image).
    """
    role = core_role(message)
    text = message.text
    if not text and message.content and not isinstance(message.content, str):
        raise InvalidInputError(f"a {type(message).__name__} without text cannot be sent")
    return ChatMessage(role, text)


def _result(reply: BaseMessage, stop: tuple[str, ...] | None) -> LLMResult:
    usage = reply.usage_metadata if isinstance(reply, AIMessage) else None
    return LLMResult(
        text=truncate_at_stop(reply.text, stop),  # fakes and some providers ignore `stop`
        prompt_tokens=usage["input_tokens"] if usage else None,
        completion_tokens=usage["output_tokens"] if usage else None,
    )


class LangChainLLM(BaseLLM):
    """Use any LangChain chat model wherever the core expects an ``LLM``.

    Calls go through ``chat_model.invoke`` / ``ainvoke`` (natively async), with ``stop``
    forwarded. ``max_tokens`` and ``temperature`` are not forwarded, because chat models do not
    share one way to set them per call: configure them on the chat model itself. Token counts
    come from the reply's ``usage_metadata`` when the provider reports it, else are estimated.

    Example:
        ```python
        from langchain_openai import ChatOpenAI
        from memories_core import SummaryMemory
        from langchain_memories import LangChainLLM

        llm = LangChainLLM(ChatOpenAI(model="gpt-4o-mini", temperature=0))
        memory = SummaryMemory(llm=llm, path="./.memories")
        print(llm.usage.calls, llm.usage.total_tokens)
        ```
    """

    def __init__(self, chat_model: BaseChatModel) -> None:
        super().__init__()
        self.chat_model = chat_model

    @property
    def name(self) -> str:
        """``langchain:<ChatModelClass>[:<model>]``."""
        return _model_label(self.chat_model)

    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        lc_messages = [_to_langchain(m) for m in messages]
        reply = self.chat_model.invoke(lc_messages, stop=list(stop) if stop else None)
        return _result(reply, stop)

    async def _agenerate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        lc_messages = [_to_langchain(m) for m in messages]
        reply = await self.chat_model.ainvoke(lc_messages, stop=list(stop) if stop else None)
        return _result(reply, stop)


class LangChainEmbedder(BaseEmbedder):
    """Use any LangChain ``Embeddings`` wherever the core expects an ``Embedder``.

    Documents go through ``embeddings.embed_documents`` and queries through
    ``embeddings.embed_query`` (some models embed the two differently). Vectors are
    L2-normalised and counted like every core embedder. The vector length is probed with one
    ``embed_query`` call the first time it is needed, unless ``dimension`` is given.

    Args:
        embeddings: The LangChain embeddings object.
        name: Identity stored with an index to detect a changed embedder; defaults to
            ``langchain:<Class>[:<model>]``. Pass a precise name for persistent memories.
        dimension: Vector length, if known (saves the probe call).

    Example:
        ```python
        from langchain_openai import OpenAIEmbeddings
        from memories_core import HistoryMemory
        from langchain_memories import LangChainEmbedder

        embedder = LangChainEmbedder(OpenAIEmbeddings(), name="openai:text-embedding-3-small")
        memory = HistoryMemory(embedder=embedder, path="./.memories")
        ```
    """

    def __init__(
        self, embeddings: Embeddings, name: str | None = None, *, dimension: int | None = None
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self._name = name or _model_label(embeddings)
        self._known_dimension = dimension

    @property
    def name(self) -> str:
        """The name given, or ``langchain:<Class>[:<model>]``."""
        return self._name

    @property
    def dimension(self) -> int:
        """Vector length (probed once when not given)."""
        return self._probe_dimension(lambda: self.embeddings.embed_query("dimension probe"))

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        return np.asarray(self.embeddings.embed_documents(texts), dtype=np.float32)

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """Embed a query with ``embeddings.embed_query``; L2-normalised and counted."""
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        try:
            vector = np.asarray(self.embeddings.embed_query(text), dtype=np.float32)
            if vector.shape != (self.dimension,):
                raise RuntimeError(
                    f"embed_query returned shape {vector.shape}, expected ({self.dimension},)"
                )
        except BaseException:
            self._usage.record(failures=1)
            raise
        self._usage.record(calls=1, items=1, prompt_tokens=estimate_tokens(text))
        return l2_normalise(vector.reshape(1, -1))[0]


class CoreEmbeddings(Embeddings):
    """A LangChain ``Embeddings`` backed by a core embedder (the reverse bridge).

    Lets LangChain components (e.g. ``InMemoryVectorStore``) use exactly the embedder a memory
    uses, for side-by-side benchmarks and tests.

    Example:
        ```python
        from langchain_core.vectorstores import InMemoryVectorStore
        from memories_core.embedders import HashingEmbedder
        from langchain_memories import CoreEmbeddings

        store = InMemoryVectorStore(CoreEmbeddings(HashingEmbedder()))
        store.add_texts(["I love Thai food"])
        ```
    """

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        """Embed texts with the core embedder."""
        return self.embedder.embed_documents(list(texts)).tolist()

    def embed_query(self, text: str) -> list[float]:
        """Embed a query with the core embedder."""
        return self.embedder.embed_query(text).tolist()
