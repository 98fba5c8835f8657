"""MemoChat for LangChain (Lu et al., 2023, §3.2, Table 8): chat with memo as a runnable.

* :func:`create_memochat_chain`: an LCEL runnable ``{"input", "user_id"[, "session_id"]} ->
  str`` that retrieves memo evidences, asks the chat model with the Table 8 prompt (Related
  Evidences, Recent Dialogs, User Input) and saves the exchange (memo writing follows).
* :func:`memochat_retriever`: the generic :class:`~langchain_memories.MemoryRetriever` over a
  :class:`~memories_core.MemoChatMemory`: memo and turn records as documents (a memo's
  covered turns are ranked with it, since recall searches both kinds).

Through the other generic adapters (``MemoryMiddleware``, ``LegacyChainMemory``) the memo
context appears as the memory variable, rendered memo first, then its dialog lines.
"""

from __future__ import annotations

from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.runnables import Runnable, RunnableConfig, RunnableLambda

from langchain_memories.bridges import _to_langchain
from langchain_memories.retriever import MemoryRetriever
from memories_core.errors import InvalidInputError
from memories_core.mechanisms.memochat import MemoChatMemory
from memories_core.types import Scope

__all__ = ["create_memochat_chain", "memochat_retriever"]


def _scope(inputs: dict[str, Any]) -> Scope:
    if not isinstance(inputs, dict) or not isinstance(inputs.get("input"), str):
        raise InvalidInputError("the MemoChat chain takes {'input': str, 'user_id': str}")
    user = inputs.get("user_id")
    if not isinstance(user, str) or not user:
        raise InvalidInputError("the MemoChat chain needs a 'user_id'")
    return Scope(user, inputs.get("session_id"))


def create_memochat_chain(
    memory: MemoChatMemory, chat_model: BaseChatModel, *, recent: int = 10, save: bool = True
) -> Runnable[dict[str, Any], str]:
    """Chat with memo (Table 8) as an LCEL runnable.

    Args:
        memory: The user's MemoChat memory (retrieves evidences, keeps the buffer).
        chat_model: Writes the reply.
        recent: Recent dialog lines shown.
        save: Save each exchange (so the buffer fills and memos get written).

    Returns:
        A runnable from ``{"input": str, "user_id": str, "session_id": str | None}`` to the
        reply text.

    Example:
        .. code-block:: python

            chain = create_memochat_chain(memory, ChatOpenAI(model="gpt-4o-mini"))
            chain.invoke({"input": "Was it Korea?", "user_id": "ann"})
    """

    def prompt(inputs: dict[str, Any]) -> list[Any]:
        messages = memory.chat_messages(inputs["input"], _scope(inputs), recent=recent)
        return [_to_langchain(m) for m in messages]

    answer = RunnableLambda(prompt) | chat_model | StrOutputParser()

    def respond(inputs: dict[str, Any], config: RunnableConfig) -> str:
        if not save:
            return answer.invoke(inputs, config)
        # The user's turn is saved even when the model fails or answers nothing.
        return memory.answer_and_save(
            inputs["input"], _scope(inputs), lambda: answer.invoke(inputs, config)
        )

    async def arespond(inputs: dict[str, Any], config: RunnableConfig) -> str:
        if not save:
            return await answer.ainvoke(inputs, config)
        return await memory.aanswer_and_save(
            inputs["input"], _scope(inputs), lambda: answer.ainvoke(inputs, config)
        )

    return RunnableLambda(respond, afunc=arespond).with_config(run_name="MemoChat")


def memochat_retriever(
    memory: MemoChatMemory, user_id: str, *, k: int | None = None
) -> MemoryRetriever:
    """The generic retriever over a MemoChat memory: memo and turn records as documents."""
    return MemoryRetriever(memory=memory, user_id=user_id, k=k)
