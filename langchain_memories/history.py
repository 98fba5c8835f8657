"""A memory's stored session as a LangChain chat history (``RunnableWithMessageHistory``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage

from langchain_memories.bridges import _to_langchain, core_role
from memories_core.errors import ConfigurationError, check_count
from memories_core.types import ChatMessage, Scope, Turn, texts_from_turns, turns_from_texts

__all__ = ["MemoryChatMessageHistory"]

#: The speakers of a conversation: other roles (tools, functions, ...) are not saved.
_SPEAKERS = frozenset({"user", "assistant", "system"})


class MemoryChatMessageHistory(BaseChatMessageHistory):
    """One user's session, stored by a memory, as a LangChain ``BaseChatMessageHistory``.

    The drop-in for an LCEL chain that already keeps its conversation with
    ``RunnableWithMessageHistory``: swap the history class for this one and each exchange is
    saved as turns of the memory (one save per exchange, as the wrapper adds the input and
    the answer together), so the mechanism derives from it what its paper does (summaries,
    memos, conditional records, knowledge items, ...). ``messages`` reads the session's
    stored turns back, oldest first. Long-term recall across sessions is the job of a
    :class:`~langchain_memories.MemoryRetriever` in the same chain.

    Human, AI and system messages are saved (a ``ChatMessage`` by its role: ``user``,
    ``assistant``, ``system``); tool calls, tool results, other roles and messages without
    text are not. A text over the turn limit is saved in parts and read back whole.
    ``clear()`` deletes the session's turns (each deletion is kept in the memory's update
    history); what the mechanism derived from them stays, as long-term memory does.

    Like any history of ``RunnableWithMessageHistory``, nothing is saved for a run whose
    model call fails: the wrapper adds messages only after the chain succeeds
    (``MemoryMiddleware`` keeps the message of a failed run).

    Setup:
        ```bash
        pip install "llm-memories[langchain]"
        ```

    Key init args:
        memory: A mechanism of ``memories_core`` (it needs ``turns`` and ``engine``).
        user_id: Whose turns.
        session_id: The conversation; ``None`` reads every session of the user.
        max_messages: Only the last this many messages are read (``None``: all).

    Use in a chain:
        ```python
        from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
        from langchain_core.runnables.history import RunnableWithMessageHistory
        from langchain_memories import MemoryChatMessageHistory

        prompt = ChatPromptTemplate.from_messages(
            [MessagesPlaceholder("history"), ("human", "{question}")]
        )
        chain = RunnableWithMessageHistory(
            prompt | llm,
            lambda session_id: MemoryChatMessageHistory(memory, "alice", session_id),
            input_messages_key="question",
            history_messages_key="history",
        )
        chain.invoke({"question": "I am vegetarian"}, config={"configurable": {"session_id": "s1"}})
        ```

    Raises:
        InvalidInputError: on an empty ``user_id`` (``MissingUserError``) or ``session_id``.
        ConfigurationError: if ``memory`` keeps no turns, or ``max_messages`` is not a
            positive int.
    """

    def __init__(
        self,
        memory: Any,
        user_id: str,
        session_id: str | None = None,
        *,
        max_messages: int | None = None,
    ) -> None:
        self.scope = Scope(user_id, session_id=session_id)
        if not callable(getattr(memory, "turns", None)) or getattr(memory, "engine", None) is None:
            raise ConfigurationError(
                f"{type(memory).__name__} keeps no turns: give a mechanism of memories_core"
            )
        self.memory = memory
        self.max_messages = (
            None if max_messages is None else check_count("max_messages", max_messages)
        )

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The session's stored turns as messages, oldest first (the last ``max_messages``)."""
        pairs = texts_from_turns(self.memory.turns(self.scope))
        found = [_to_langchain(ChatMessage(role, text)) for role, text in pairs]
        return found if self.max_messages is None else found[-self.max_messages :]

    async def aget_messages(self) -> list[BaseMessage]:
        """Async twin of :attr:`messages` (runs in a worker thread)."""
        return await asyncio.to_thread(lambda: self.messages)

    def _turns(self, messages: Sequence[BaseMessage]) -> list[Turn]:
        pairs = [(core_role(m), m.text) for m in messages]
        return turns_from_texts([(role, text) for role, text in pairs if role in _SPEAKERS])

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Save the messages' texts as turns of the session, in one save."""
        turns = self._turns(messages)
        if turns:
            self.memory.save(turns, self.scope)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Async twin of :meth:`add_messages` (the memory's ``asave``)."""
        turns = self._turns(messages)
        if turns:
            await self.memory.asave(turns, self.scope)

    def clear(self) -> None:
        """Delete the session's turns (every turn of the user when no session is set)."""
        where: dict[str, str] = {"kind": "turn"}
        if self.scope.session_id is not None:
            where["session_id"] = self.scope.session_id
        engine = self.memory.engine
        ids = [r.id for r in engine.records(self.scope.user_id, where=where)]
        if ids:
            engine.delete_records(self.scope.user_id, ids, reason="chat history cleared")

    async def aclear(self) -> None:
        """Async twin of :meth:`clear`."""
        await asyncio.to_thread(self.clear)
