"""MemoChat for LlamaIndex (Lu et al., 2023, §3.2, Table 8): a chat engine with a memo.

* :class:`MemoChatEngine`: a LlamaIndex chat engine; each message retrieves memo evidences,
  asks the LLM with the Table 8 prompt (Related Evidences, Recent Dialogs, User Input) and
  saves the exchange, so the buffer fills and memos get written.
* :func:`memochat_retriever`: the generic :class:`~llamaindex_memories.MemoryRetriever` over a
  :class:`~memories_core.MemoChatMemory` (memo and turn records as nodes), for query engines.

Through ``MemoryBlock`` the memo context appears as memory block text (memo, then its
dialog lines).
"""

from __future__ import annotations

import asyncio
from typing import Any

from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.chat_engine.types import (
    AgentChatResponse,
    BaseChatEngine,
    StreamingAgentChatResponse,
)
from llama_index.core.llms import LLM

from llamaindex_memories.retriever import MemoryRetriever
from memories_core.mechanisms.memochat import MemoChatMemory
from memories_core.types import Scope

__all__ = ["MemoChatEngine", "memochat_retriever"]


class MemoChatEngine(BaseChatEngine):
    """Chat with memo (Table 8) as a LlamaIndex chat engine.

    Args:
        memory: The MemoChat memory.
        llm: The LlamaIndex LLM that replies.
        user_id: Whose memo.
        session_id: Session of the saved exchanges.
        recent: Recent dialog lines shown in the prompt.

    Example:
        .. code-block:: python

            engine = MemoChatEngine(memory, llm=OpenAI(model="gpt-4o-mini"), user_id="ann")
            engine.chat("The etiquette we discussed was Korean, right?").response
    """

    def __init__(
        self,
        memory: MemoChatMemory,
        llm: LLM,
        user_id: str,
        *,
        session_id: str | None = None,
        recent: int = 10,
    ) -> None:
        self.memory = memory
        self.llm = llm
        self.scope = Scope(user_id, session_id)
        self.recent = recent
        self._history: list[ChatMessage] = []

    def _reply(self, message: str) -> AgentChatResponse:
        prompt = self.memory.chat_messages(message, self.scope, recent=self.recent)
        li = [ChatMessage(role=MessageRole(m.role), content=m.content) for m in prompt]
        reply = self.memory.answer_and_save(
            message, self.scope, lambda: str(self.llm.chat(li).message.content or "")
        )
        self._history += [
            ChatMessage(role=MessageRole.USER, content=message),
            ChatMessage(role=MessageRole.ASSISTANT, content=reply),
        ]
        return AgentChatResponse(response=reply)

    def chat(
        self, message: str, chat_history: list[ChatMessage] | None = None, **kwargs: Any
    ) -> AgentChatResponse:
        """Reply to ``message`` with the memo's evidences; the exchange is saved."""
        return self._reply(message)

    async def achat(
        self, message: str, chat_history: list[ChatMessage] | None = None, **kwargs: Any
    ) -> AgentChatResponse:
        """Async twin of :meth:`chat` (runs in a worker thread)."""
        return await asyncio.to_thread(self._reply, message)

    def stream_chat(
        self, message: str, chat_history: list[ChatMessage] | None = None, **kwargs: Any
    ) -> StreamingAgentChatResponse:
        """The whole reply at once (the exchange must be saved as one)."""
        return StreamingAgentChatResponse(response=self._reply(message).response)

    async def astream_chat(
        self, message: str, chat_history: list[ChatMessage] | None = None, **kwargs: Any
    ) -> StreamingAgentChatResponse:
        """Async twin of :meth:`stream_chat`."""
        reply = await self.achat(message)
        return StreamingAgentChatResponse(response=reply.response)

    def reset(self) -> None:
        """Forget this engine's chat history (the memo is kept)."""
        self._history = []

    @property
    def chat_history(self) -> list[ChatMessage]:
        """The messages exchanged through this engine."""
        return list(self._history)


def memochat_retriever(
    memory: MemoChatMemory, user_id: str, *, k: int | None = None
) -> MemoryRetriever:
    """The generic retriever over a MemoChat memory: memo and turn records as nodes."""
    return MemoryRetriever(memory, user_id, similarity_top_k=k)
