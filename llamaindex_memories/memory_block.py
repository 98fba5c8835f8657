"""A LlamaIndex memory block backed by any llm-memories mechanism."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from llama_index.core.async_utils import asyncio_run
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.bridge.pydantic import Field, field_validator
from llama_index.core.memory import Memory
from llama_index.core.memory.memory import BaseMemoryBlock
from llama_index.core.storage.chat_store.sql import MessageStatus

from llamaindex_memories.observability import dispatcher, recall_event, save_event
from memories_core.background import WorkStatus
from memories_core.interfaces import Mechanism
from memories_core.mechanisms.base import flush_memory, memory_status
from memories_core.types import Scope, Turn, turns_from_texts

__all__ = ["MemoryBlock"]

_TURN_ROLES = {
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
}


def messages_to_turns(messages: Sequence[ChatMessage]) -> list[Turn]:
    """Convert LlamaIndex messages to core turns.

    Only user and assistant text is kept: system, developer, tool and function messages, and
    messages without text (an assistant message that only calls tools), are skipped. A text
    over the turn limit is kept in parts (:func:`~memories_core.types.turns_from_texts`).
    """
    texts = []
    for message in messages:
        role = _TURN_ROLES.get(message.role)
        if role is not None and message.content:
            texts.append((role, message.content))
    return turns_from_texts(texts)


def _token_counter() -> Callable[[str], int]:
    """LlamaIndex's global tokenizer as a counter; ``len // 4`` if it cannot be loaded."""
    try:
        from llama_index.core.utils import get_tokenizer

        tokenize = get_tokenizer()
        tokenize("probe")
    except Exception:  # an encoding that is not cached offline: estimate instead
        return lambda text: (len(text) + 3) // 4
    return lambda text: len(tokenize(text))


def _latest_user_text(messages: Sequence[ChatMessage]) -> str | None:
    for message in reversed(messages):
        if message.role == MessageRole.USER and message.content and message.content.strip():
            return message.content
    return None


class MemoryBlock(BaseMemoryBlock[str]):
    """Long-term memory for ``llama_index.core.memory.Memory``, over any llm-memories mechanism.

    Reading: before each model call, the block recalls with the text of the latest user
    message and returns the mechanism's rendered context (``""`` when there is no user message
    or nothing is recalled); ``Memory`` puts it into the system message.

    Writing: ``Memory`` hands a block the messages it flushes out of its short-term queue, i.e.
    only once the chat history exceeds ``token_limit * chat_history_token_ratio``. Those are
    saved as turns: user and assistant text only; system, tool and empty messages are skipped.
    So that the *next* session remembers a short one, call :meth:`flush` / :meth:`aflush` when a
    session ends: it flushes what is still in short-term memory, as ``Memory`` would, and ends
    the session of the mechanisms (``end_session``: e.g. ``SummaryMemory`` summarises now).

    Setup:
        ``pip install 'llm-memories[llamaindex]'``

    Key init args:
        memory: Any mechanism (``HistoryMemory``, ``SummaryMemory``, ...).
        user_id: Whose memories to read and write.
        session_id: Session the saved turns belong to; default: the ``Memory``'s session id.
        k: Records recalled per message; default: the mechanism's own.

    Instantiate and use in a chat engine:
        .. code-block:: python

            from llama_index.core.chat_engine import SimpleChatEngine
            from llama_index.core.memory import Memory
            from memories_core import HistoryMemory
            from llamaindex_memories import MemoryBlock

            block = MemoryBlock(memory=HistoryMemory(path="./memories"), user_id="alice")
            memory = Memory.from_defaults(session_id="s1", memory_blocks=[block])
            engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
            engine.chat("I love Thai food")
            block.flush(memory)  # session over: remember it in the next one

    Async:
        ``Memory`` only calls the async hooks; the block uses ``arecall``/``asave``.
        ``await block.aflush(memory)`` is the async twin of :meth:`flush`.
    """

    name: str = Field(default="long_term_memory", description="Name of the block in the prompt.")
    memory: Mechanism = Field(
        exclude=True, description="The llm-memories mechanism that stores and recalls."
    )
    user_id: str = Field(description="User whose memories are read and written.")
    session_id: str | None = Field(
        default=None,
        description="Session id of saved turns; None uses the id LlamaIndex's Memory passes.",
    )
    k: int | None = Field(
        default=None, ge=1, description="Records recalled per query; None: the mechanism's default."
    )

    @field_validator("user_id")
    @classmethod
    def _check_user(cls, value: str) -> str:
        Scope(value)  # raises MissingUserError on an empty user id
        return value

    @classmethod
    def class_name(cls) -> str:
        """Name used by LlamaIndex serialization."""
        return "MemoryBlock"

    def _scope(self, session_id: Any = None) -> Scope:
        session = self.session_id or (session_id if isinstance(session_id, str) else None)
        return Scope(self.user_id, session_id=session)

    @dispatcher.span
    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        query = _latest_user_text(messages or [])
        if query is None:
            return ""
        scope = self._scope(block_kwargs.get("session_id"))
        recall = await self.memory.arecall(query, scope, k=self.k)
        recall_event(self.memory, scope.user_id, query, recall)
        return recall.context

    async def atruncate(self, content: str, tokens_to_truncate: int) -> str | None:
        """Shorten the recalled context by about ``tokens_to_truncate`` tokens.

        ``Memory`` calls this when its blocks and chat history exceed ``token_limit`` (for
        blocks with ``priority`` above 0). The context lists the recalled records best first,
        so whole lines are dropped from the end, the least relevant first, and the last line
        left is cut word by word only if it alone is still over budget. Tokens are counted
        with LlamaIndex's global tokenizer (``Memory``'s default), or as a quarter of the
        characters when it cannot be loaded.

        Returns:
            The shortened context, or ``None`` when nothing of it fits.
        """
        if tokens_to_truncate <= 0:
            return content
        count = _token_counter()
        budget = count(content) - tokens_to_truncate
        if budget <= 0:
            return None
        lines = content.splitlines()
        while len(lines) > 1 and count("\n".join(lines)) > budget:
            lines.pop()
        words = lines[0].split(" ") if lines else []
        if len(lines) == 1:
            while words and count(" ".join(words)) > budget:
                words.pop()
            lines = [" ".join(words)] if words else []
        text = "\n".join(lines).strip()
        return text or None

    async def _aput(self, messages: list[ChatMessage]) -> None:
        # Memory.aput tags flushed messages with its session id; use it unless one is set.
        session = next((m.additional_kwargs.get("session_id") for m in messages), None)
        await self.asave_messages(messages, session_id=session)

    async def asave_messages(
        self, messages: Sequence[ChatMessage], *, session_id: str | None = None
    ) -> int:
        """Save a chat history (e.g. a finished session) as turns.

        Args:
            messages: The messages, oldest first; system, tool and empty ones are skipped.
            session_id: Session of the turns, used when the block has no ``session_id``.

        Returns:
            The number of turns saved.
        """
        turns = messages_to_turns(messages)
        if turns:
            await self.memory.asave(turns, self._scope(session_id))
            save_event(self.memory, self.user_id, "save_turns", count=len(turns))
        return len(turns)

    async def aflush(self, memory: Memory) -> int:
        """End a session: flush ``memory``'s short-term queue into its blocks, this one included.

        ``Memory`` itself flushes only past its token limit; call this when a session ends so
        the next session can recall it. The messages go to every block of ``memory`` through
        the same ``aput`` call ``Memory`` uses, and are archived as ``Memory`` archives them,
        so nothing is saved twice. Then every :class:`MemoryBlock` of ``memory`` ends the
        session in its mechanism (``aend_session``/``end_session`` when it has one), so that
        e.g. a ``SummaryMemory`` writes the session's summary now. Ending a session again is
        harmless, but a summarising mechanism then rewrites its summary (one more LLM call).

        Args:
            memory: The ``Memory`` this block belongs to.

        Returns:
            The number of messages flushed (tool and system messages included).

        Raises:
            ValueError: if this block is not one of ``memory``'s blocks.
        """
        if not any(block is self for block in memory.memory_blocks):
            raise ValueError("this MemoryBlock is not one of memory.memory_blocks")
        active = await memory.aget_all(status=MessageStatus.ACTIVE)
        if active:
            await asyncio.gather(
                *(
                    block.aput(active, from_short_term_memory=True, session_id=memory.session_id)
                    for block in memory.memory_blocks
                )
            )
            # Archive only once every block has the messages: if a save fails they stay
            # active, so a retry loses nothing (a user's turn is never lost).
            await memory.sql_store.archive_oldest_messages(memory.session_id, n=len(active))
        for block in memory.memory_blocks:
            if isinstance(block, MemoryBlock):
                await block._aend_session(memory.session_id)
        return len(active)

    async def _aend_session(self, session_id: str) -> None:
        scope = self._scope(session_id)
        aend = getattr(self.memory, "aend_session", None)
        end = getattr(self.memory, "end_session", None)
        if callable(aend):
            await aend(scope)
        elif callable(end):
            await asyncio.to_thread(end, scope)

    def wait(self, *, timeout: float | None = None) -> int:
        """Wait for the mechanism's pending derivations of ``user_id``.

        Saves (and :meth:`flush`) return before the model derives notes, memos or summaries
        (``MemoryEngine.flush``); call this when the next ``aget`` must see them. Named
        ``wait`` because :meth:`flush` already means "end the session". Returns how many
        jobs are left.
        """
        return flush_memory(self.memory, self.user_id, timeout=timeout)

    def status(self) -> WorkStatus | None:
        """Pending, running and failed derivations of ``user_id`` (``None``: not reported)."""
        return memory_status(self.memory, self.user_id)

    def flush(self, memory: Memory) -> int:
        """Sync twin of :meth:`aflush`, for sync chat engines (runs it like ``Memory.put``)."""
        flushed: int = asyncio_run(self.aflush(memory))
        return flushed
