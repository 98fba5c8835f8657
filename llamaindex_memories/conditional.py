"""Conditional memory (Yuan et al., §3.1, Tables 17-18) in LlamaIndex, in both of its modes.

* :class:`ConditionalMemoryLLM`, the paper's single-call mode: a LlamaIndex ``LLM`` around the
  app's own model. One call writes the answer and the hidden decision; a second call, only
  when the turn is worth remembering, writes the record. The user sees only the answer.
* :class:`ConditionalMemoryBlock`, the drop-in mode: a memory block for
  ``llama_index.core.memory.Memory``; the app's model answers as usual and every saved user
  turn gets a separate decision call.

Prompts, parsing, decisions and storage live in
:class:`memories_core.mechanisms.conditional.ConditionalMemory`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field, PrivateAttr, field_validator
from llama_index.core.llms import LLM
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback

from llamaindex_memories.bridges import LlamaIndexLLM
from llamaindex_memories.memory_block import MemoryBlock, _latest_user_text
from memories_core.mechanisms.conditional import ConditionalMemory, ConditionalReply
from memories_core.types import Scope

__all__ = ["ConditionalMemoryBlock", "ConditionalMemoryLLM"]


def _details(reply: ConditionalReply) -> dict[str, Any]:
    """What the user does not see: the decision, the record written and the records recalled."""
    return {
        "decision": reply.decision,
        "record_id": reply.record.id if reply.record is not None else None,
        "recalled_ids": [hit.record.id for hit in reply.recall.records],
    }


class ConditionalMemoryLLM(LLM):
    """The app's LlamaIndex LLM, answering with conditional memory in one call (§3.1, Table 17).

    For each message the latest user text goes to ``ConditionalMemory.respond``: it recalls the
    user's records, asks the wrapped model (through
    :class:`~llamaindex_memories.LlamaIndexLLM`) for the answer and the decision in one call,
    stores both turns and, only if the turn is worth remembering, writes a
    ``"Context: ... Knowledge: ..."`` record with the memory's own LLM: at most two calls per
    utterance. The reply's message holds only the answer; the decision, the id of the record
    written and the ids recalled are in ``additional_kwargs`` and the ``ConditionalReply`` in
    ``raw``.

    The paper's prompt carries the context: the app's system messages are forwarded as
    instructions, but the chat history in ``messages`` is not: the memory shows the model the
    turns it stored for ``session_id`` instead. Use one instance per user and session.
    ``complete`` treats the prompt as the user's message: do not use this LLM where
    LlamaIndex templates its own prompts (query engines). Streaming yields the whole answer once.

    A turn is never lost: the core stores the user's turn before the answering call; if that
    call fails or gives no answer, the turn stays pending for
    ``ConditionalMemory.retry_pending`` and the error is raised.

    Key init args:
        llm: The app's LlamaIndex chat model; default: the memory's own LLM answers too
            (e.g. the bundled offline model).
        memory: A core ``ConditionalMemory``; its own LLM writes the records.
        user_id: Whose memories to read and write.
        session_id: The current session (recommended: the model sees its earlier turns).
        k: Records recalled per message; default: the memory's own (paper: 3).

    Use in a chat engine:
        .. code-block:: python

            from llama_index.core.chat_engine import SimpleChatEngine
            from memories_core.mechanisms.conditional import ConditionalMemory
            from llamaindex_memories import ConditionalMemoryLLM, LlamaIndexLLM

            memory = ConditionalMemory(llm=LlamaIndexLLM(llm), path="./memories")
            chat_llm = ConditionalMemoryLLM(llm=llm, memory=memory, user_id="alice",
                                            session_id="s1")
            engine = SimpleChatEngine.from_defaults(llm=chat_llm)
            print(engine.chat("No, capitalize means ALL letters in upper case."))

    Async:
        ``achat``/``acomplete`` use ``ConditionalMemory.arespond``.

    Raises:
        ValueError: from ``chat`` when ``messages`` holds no user text.
        LLMError, ParseError: when the answering call fails or answers nothing.
    """

    llm: LLM | None = Field(
        default=None,
        exclude=True,
        description="The app's LlamaIndex chat model that answers; None: the memory's own LLM.",
    )
    memory: ConditionalMemory = Field(
        exclude=True, description="The core conditional memory that decides and stores."
    )
    user_id: str = Field(description="User whose memories are read and written.")
    session_id: str | None = Field(
        default=None, description="Session of the stored turns; the model sees its turns."
    )
    k: int | None = Field(
        default=None, ge=1, description="Records recalled per message; None: the memory's own."
    )
    _answerer: LlamaIndexLLM | None = PrivateAttr(default=None)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if self.llm is not None:
            self._answerer = LlamaIndexLLM(self.llm)  # one bridge, so its usage accumulates

    @field_validator("user_id")
    @classmethod
    def _check_user(cls, value: str) -> str:
        Scope(value)  # raises MissingUserError on an empty user id
        return value

    @classmethod
    def class_name(cls) -> str:
        """Name used by LlamaIndex serialization."""
        return "ConditionalMemoryLLM"

    @property
    def metadata(self) -> LLMMetadata:
        """The wrapped model's metadata (context window, roles, ...), or generic metadata."""
        if self.llm is not None:
            return self.llm.metadata
        return LLMMetadata(model_name="conditional-memory", is_chat_model=True)

    def _scope(self) -> Scope:
        return Scope(self.user_id, session_id=self.session_id)

    @staticmethod
    def _user_text(messages: Sequence[ChatMessage]) -> str:
        text = _latest_user_text(messages)
        if text is None:
            raise ValueError("ConditionalMemoryLLM needs a user message with text to answer")
        return text

    def _respond(self, text: str, instructions: str | None = None) -> ConditionalReply:
        # The core stores the user turn before answering, so a failure loses nothing.
        return self.memory.respond(
            text, self._scope(), llm=self._answerer, k=self.k, instructions=instructions
        )

    def _reply_to(self, messages: Sequence[ChatMessage]) -> ConditionalReply:
        return self._respond(self._user_text(messages), _system(messages))

    async def _areply_to(self, messages: Sequence[ChatMessage]) -> ConditionalReply:
        # The one implementation, in a worker thread (as the core's async twins do).
        return await asyncio.to_thread(self._reply_to, messages)

    async def _arespond(self, prompt: str) -> ConditionalReply:
        return await asyncio.to_thread(self._respond, prompt)

    @staticmethod
    def _chat(reply: ConditionalReply, *, stream: bool = False) -> ChatResponse:
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=reply.response),
            delta=reply.response if stream else None,
            raw=reply,
            additional_kwargs=_details(reply),
        )

    @staticmethod
    def _completion(reply: ConditionalReply, *, stream: bool = False) -> CompletionResponse:
        return CompletionResponse(
            text=reply.response,
            delta=reply.response if stream else None,
            raw=reply,
            additional_kwargs=_details(reply),
        )

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Answer the latest user message; only the answer is in the message."""
        return self._chat(self._reply_to(messages))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async twin of :meth:`chat`."""
        return self._chat(await self._areply_to(messages))

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Answer ``prompt`` as the user's message."""
        return self._completion(self._respond(prompt))

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """Async twin of :meth:`complete`."""
        return self._completion(await self._arespond(prompt))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """:meth:`chat`, yielded once (the answer is parsed out of the whole output)."""
        response = self._chat(self._reply_to(messages), stream=True)

        def gen() -> ChatResponseGen:
            yield response

        return gen()

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        """Async twin of :meth:`stream_chat`."""
        response = self._chat(await self._areply_to(messages), stream=True)

        async def gen() -> ChatResponseAsyncGen:
            yield response

        return gen()

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        """:meth:`complete`, yielded once."""
        response = self._completion(self._respond(prompt), stream=True)

        def gen() -> CompletionResponseGen:
            yield response

        return gen()

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        """Async twin of :meth:`stream_complete`."""
        response = self._completion(await self._arespond(prompt), stream=True)

        async def gen() -> CompletionResponseAsyncGen:
            yield response

        return gen()


class ConditionalMemoryBlock(MemoryBlock):
    """A :class:`~llamaindex_memories.MemoryBlock` for a core ``ConditionalMemory`` (drop-in mode).

    The app's model answers as usual; messages that ``Memory`` flushes (or
    :meth:`~llamaindex_memories.MemoryBlock.flush` at the end of a session) go to
    ``ConditionalMemory.save``, which stores every turn and makes one decision call per user
    turn, then one record call per turn worth remembering. Before each model call the block
    recalls the ``"Context: ... Knowledge: ..."`` records for the latest user message. For
    the cheaper single-call mode, use :class:`ConditionalMemoryLLM`.

    Instantiate and use in a chat engine:
        .. code-block:: python

            from llama_index.core.chat_engine import SimpleChatEngine
            from llama_index.core.memory import Memory
            from memories_core.mechanisms.conditional import ConditionalMemory
            from llamaindex_memories import ConditionalMemoryBlock, LlamaIndexLLM

            conditional = ConditionalMemory(llm=LlamaIndexLLM(llm), path="./memories")
            block = ConditionalMemoryBlock(memory=conditional, user_id="alice")
            memory = Memory.from_defaults(session_id="s1", memory_blocks=[block])
            engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
            engine.chat("No, capitalize means ALL letters in upper case.")
            block.flush(memory)  # session over: decide and write the records now
    """

    name: str = Field(default="conditional_memory", description="Name of the block in the prompt.")
    memory: ConditionalMemory = Field(
        exclude=True, description="The core conditional memory that decides, stores and recalls."
    )

    @classmethod
    def class_name(cls) -> str:
        """Name used by LlamaIndex serialization."""
        return "ConditionalMemoryBlock"


def _system(messages: Sequence[ChatMessage]) -> str | None:
    """The app's own system instructions, forwarded to the single-call prompt."""
    texts = [
        m.content for m in messages if m.role == MessageRole.SYSTEM and (m.content or "").strip()
    ]
    return "\n\n".join(t for t in texts if t) or None
