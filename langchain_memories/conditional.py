"""Conditional memory's single-call mode as a LangChain chat model (Yuan et al., §3.1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.caches import BaseCache
from langchain_core.callbacks import (
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator

from langchain_memories.chat_parts import PROVIDER, WholeReplyChatModel, ls_params, model_name_of
from langchain_memories.reflective import as_core_llm
from memories_core.errors import InvalidInputError
from memories_core.interfaces import LLM
from memories_core.mechanisms.conditional import ConditionalMemory, ConditionalReply
from memories_core.types import Scope

__all__ = ["ConditionalMemoryChat"]


def _result(reply: ConditionalReply, model_name: str) -> ChatResult:
    """Only the ``<Respond>`` text is shown; the decision travels in ``response_metadata``."""
    metadata = {
        "model_name": model_name,
        "model_provider": PROVIDER,
        "memory_decision": reply.decision,
        "memory_record_id": reply.record.id if reply.record is not None else None,
        "memory_recalled_ids": [hit.record.id for hit in reply.recall.records],
    }
    message = AIMessage(content=reply.response, response_metadata=metadata)
    return ChatResult(generations=[ChatGeneration(message=message)])


class ConditionalMemoryChat(WholeReplyChatModel):
    """A chat model that answers and remembers what matters, in at most two LLM calls.

    The paper's single-call mode of conditional memory (Yuan et al., §3.1, Tables 17-18):
    each call reads the last human message, recalls this user's conditional memories, and
    lets ``chat_model`` write the response and a hidden ``<Decision>`` in one call
    (``ConditionalMemory.respond``); only on "yes" a second call writes the record
    ("Context: ... Knowledge: ..."). The returned ``AIMessage`` holds ONLY the response; the
    decision, the record id and the recalled ids are in ``response_metadata``
    (``memory_decision``, ``memory_record_id``, ``memory_recalled_ids``). Both turns are
    stored whatever the decision. An answer without a readable decision is shown as it is and
    the memory's LLM decides with a separate call; a failed decision or record call leaves
    the turn pending for ``memory.retry_pending()``; a failed answering call raises
    ``LLMError`` and stores nothing (the caller still holds the message).

    The prompt is the core's (Table 17): earlier messages of the chain's prompt are not sent,
    because the session so far comes from the memory (set ``session_id``), and system
    messages are not forwarded either. Streaming yields the whole answer at once (the
    decision must be parsed out first); ``stop`` and tool binding are not supported.

    For the drop-in mode (your own prompt and model, a separate decision call after each
    turn), use the generic adapters over the core class instead: ``MemoryMiddleware``,
    ``LegacyChainMemory`` or ``MemoryRetriever`` with ``ConditionalMemory`` (or
    ``MultiViewMemory``) from ``memories_core``.

    Setup:
        ```bash
        pip install "llm-memories[langchain]"
        ```

    Key init args:
        memory: ConditionalMemory
            The core memory; its own LLM writes the records.
        user_id: str
            Whose memories to use. Required (per run: see "Use in a chain").
        session_id: str | None
            Session of the stored turns; its earlier turns are shown to the model.
        chat_model: BaseChatModel | memories_core LLM | None
            The model that answers (bridged with ``LangChainLLM``); ``None`` uses the
            memory's own LLM.
        k: int | None
            Memories recalled per message; ``None`` uses the memory's default (paper: 3).

    Instantiate:
        ```python
        from langchain_openai import ChatOpenAI
        from memories_core.embedders import HashingEmbedder
        from memories_core.mechanisms.conditional import ConditionalMemory
        from langchain_memories import ConditionalMemoryChat, LangChainLLM

        llm = ChatOpenAI(model="gpt-4o-mini", temperature=0)
        memory = ConditionalMemory(llm=LangChainLLM(llm), embedder=HashingEmbedder())
        chat = ConditionalMemoryChat(memory=memory, chat_model=llm, user_id="alice")
        ```

    Invoke:
        ```python
        reply = chat.invoke("Capitalize means every letter in upper case for me.")
        reply.content  # the response only
        reply.response_metadata["memory_decision"]  # True: worth remembering
        ```

    Async:
        ```python
        reply = await chat.ainvoke("Capitalize: cherry, grape")
        ```

    Use in a chain/agent:
        ```python
        from langchain_core.output_parsers import StrOutputParser
        from langchain_core.prompts import ChatPromptTemplate
        from langchain_core.runnables import ConfigurableField

        per_run = chat.configurable_fields(
            user_id=ConfigurableField(id="user_id"),
            session_id=ConfigurableField(id="session_id"),
        )
        chain = ChatPromptTemplate.from_template("{input}") | per_run | StrOutputParser()
        chain.invoke(
            {"input": "Capitalize: cherry, grape"},
            config={"configurable": {"user_id": "bob", "session_id": "s2"}},
        )
        ```
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: ConditionalMemory = Field(description="The core conditional memory.")
    user_id: str = Field(description="Whose memories to read and write.")
    session_id: str | None = Field(default=None, description="Session of the stored turns.")
    chat_model: BaseChatModel | LLM | None = Field(
        default=None, description="The answering model; None uses the memory's LLM."
    )
    k: int | None = Field(default=None, ge=1, description="Memories per message; None: default.")
    # A cached answer would skip the memory entirely: never cache this stateful model.
    cache: BaseCache | bool | None = Field(default=False, exclude=True)

    _answerer: LLM | None = PrivateAttr(default=None)

    @field_validator("user_id")
    @classmethod
    def _check_user_id(cls, value: str) -> str:
        Scope(value)  # fail at construction, not at the first call, on an empty user id
        return value

    @model_validator(mode="after")
    def _bridge_conditional_chat_model(self) -> ConditionalMemoryChat:
        # Bridged once, so its usage counters accumulate (LangChain asks subclasses to use a
        # uniquely named validator rather than override model_post_init).
        self._answerer = as_core_llm(self.chat_model) if self.chat_model is not None else None
        return self

    @property
    def _llm_type(self) -> str:
        return "conditional-memory-chat"

    @property
    def model_name(self) -> str:
        """The answering model's name (the memory's own LLM when ``chat_model`` is ``None``)."""
        return model_name_of(self._answerer or self.memory.writer)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"chat_model": self.model_name, "k": self.k}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        return ls_params(self.model_name, kwargs, stop=stop)

    def _scope(self) -> Scope:
        return Scope(self.user_id, session_id=self.session_id)

    @staticmethod
    def _user_input(messages: Sequence[BaseMessage], stop: list[str] | None) -> str:
        if stop:
            raise InvalidInputError("ConditionalMemoryChat does not support stop sequences")
        human = [m for m in messages if isinstance(m, HumanMessage)]
        if not human or not human[-1].text.strip():
            raise InvalidInputError("ConditionalMemoryChat needs a non-empty human message")
        return human[-1].text

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        text = self._user_input(messages, stop)
        reply = self.memory.respond(
            text, self._scope(), llm=self._answerer, k=self.k, instructions=_system(messages)
        )
        return _result(reply, self.model_name)

    # No _agenerate: BaseChatModel runs _generate in a worker thread for ainvoke, which is
    # exactly what ConditionalMemory.arespond would do (one implementation, not two).


def _system(messages: Sequence[BaseMessage]) -> str | None:
    """The chain's own system instructions, forwarded to the single-call prompt."""
    texts = [m.text for m in messages if isinstance(m, SystemMessage) and m.text.strip()]
    return "\n\n".join(texts) or None
