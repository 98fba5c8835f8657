"""Agent middleware that gives a ``create_agent`` agent long-term memory."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, SystemMessage
from langgraph.config import get_config
from langgraph.runtime import Runtime

from langchain_memories.observability import (
    atraced_recall,
    emit_memory_event,
    traced_recall,
    usage_data,
)
from memories_core.background import WorkStatus
from memories_core.errors import ConfigurationError, MissingUserError
from memories_core.interfaces import Mechanism
from memories_core.mechanisms.base import flush_memory, memory_status
from memories_core.types import Recall, Scope, Turn, turns_from_texts

__all__ = ["MemoryMiddleware"]

logger = logging.getLogger(__name__)

#: How the recalled context is introduced in the system message; ``{context}`` is replaced.
DEFAULT_TEMPLATE = "Relevant long-term memories of this user:\n{context}"
#: Human message ids a middleware remembers as saved after a failed model call.
_KEPT_IDS = 1024


def _run_value(runtime: Runtime[Any] | None, key: str) -> str | None:
    """Read ``key`` from the run's context (mapping or object), then ``configurable``."""
    context = runtime.context if runtime is not None else None
    value = context.get(key) if isinstance(context, Mapping) else getattr(context, key, None)
    if value is None:
        try:
            value = get_config().get("configurable", {}).get(key)
        except RuntimeError:  # not inside a runnable context
            value = None
    return value if isinstance(value, str) and value else None


def _last_human_index(messages: Sequence[AnyMessage]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        if isinstance(messages[i], HumanMessage):
            return i
    return None


def _with_context(system: SystemMessage | None, context: str) -> SystemMessage:
    """Return a new system message: the agent's own prompt, then ``context``."""
    if system is None:
        return SystemMessage(content=context)
    if isinstance(system.content, str):
        content: Any = f"{system.content}\n\n{context}" if system.content else context
    else:
        content = [*system.content, {"type": "text", "text": context}]
    return system.model_copy(update={"content": content})


class MemoryMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """Long-term memory for agents built with ``langchain.agents.create_agent``.

    Before every model call it recalls memories for the latest human message (one recall
    per model call) and appends the mechanism's rendered context to the system message of
    that model request only: the agent state and the caller's messages are left untouched,
    so memories never pile up in the conversation. After the agent finishes a run it saves
    the last human message and the final AI answer as two turns. Empty or whitespace-only
    messages are skipped rather than raised on, so a memory never breaks a running agent;
    a message over the turn limit is kept in parts (``turns_from_texts``). A model call that
    fails does not lose the user's message: it is saved alone, once per message, and the
    error goes up. A retry that then succeeds saves only the answer: a retry middleware's
    new call (the same message), or the user's next run of the same user and session that
    sends the same text again (a new message).

    The user is fixed at construction (``user_id=``) or read per run from the runtime
    context (``context={"user_id": ...}`` or any object with a ``user_id`` attribute) or from
    ``config={"configurable": {"user_id": ...}}``. The session works the same way through
    ``session_id`` and falls back to the ``thread_id`` of the run's config.

    Setup:
        ```bash
        pip install "llm-memories[langchain]"
        ```

    Key init args:
        memory: Mechanism
            The core memory (``HistoryMemory``, ``SummaryMemory``, ...).
        user_id: str | None
            A fixed user; ``None`` reads it from each run (see above).
        session_id: str | None
            A fixed session; ``None`` reads it from each run.
        k: int | None
            Memories recalled per model call; ``None`` uses the mechanism default.
        template: str
            How the memories are introduced; ``{context}`` is replaced by the mechanism's
            rendered context (default: :data:`DEFAULT_TEMPLATE`).

    Instantiate:
        ```python
        from memories_core import HistoryMemory
        from memories_core.embedders import HashingEmbedder
        from langchain_memories import MemoryMiddleware

        memory = HistoryMemory(embedder=HashingEmbedder(), path="./.memories")
        middleware = MemoryMiddleware(memory, k=3)  # user_id read from each run
        ```

    Invoke:
        ```python
        from langchain.agents import create_agent

        agent = create_agent(model=llm, tools=[], middleware=[middleware])
        agent.invoke(
            {"messages": [{"role": "user", "content": "I love Thai food"}]},
            context={"user_id": "alice"},
        )
        ```

    Async:
        ```python
        await agent.ainvoke(
            {"messages": [{"role": "user", "content": "What should I cook?"}]},
            config={"configurable": {"user_id": "alice"}},
        )
        ```

    Use in a chain/agent:
        ```python
        agent = create_agent(
            model=llm,
            tools=[search],
            system_prompt="You are a helpful assistant.",
            middleware=[MemoryMiddleware(memory, user_id="alice")],
        )
        ```

    Raises:
        ConfigurationError: if ``template`` lacks ``{context}``.
        MissingUserError: at construction if ``user_id`` is empty; at run time when no
            user id is fixed nor given by the run.
    """

    def __init__(
        self,
        memory: Mechanism,
        *,
        user_id: str | None = None,
        session_id: str | None = None,
        k: int | None = None,
        template: str = DEFAULT_TEMPLATE,
    ) -> None:
        super().__init__()
        if user_id is not None:
            Scope(user_id)  # reject an empty user id up front
        if "{context}" not in template:
            raise ConfigurationError("template must contain the placeholder {context}")
        self.template = template
        self.memory = memory
        self.user_id = user_id
        self.session_id = session_id
        self.k = k
        # Ids of human messages saved alone after a failed model call (bounded, oldest out),
        # and per (user, session) the text of the last one, for the next run to recognise.
        self._kept: OrderedDict[str, None] = OrderedDict()
        self._kept_texts: OrderedDict[tuple[str, str | None], str] = OrderedDict()
        self._kept_lock = threading.Lock()

    def flush(self, user_id: str | None = None, *, timeout: float | None = None) -> int:
        """Wait for the memory's pending derivations.

        Of ``user_id``, else this middleware's user, else everyone's. The save after a run
        returns before the model derives; returns how many jobs are left.
        """
        return flush_memory(self.memory, user_id or self.user_id, timeout=timeout)

    def status(self, user_id: str | None = None) -> WorkStatus | None:
        """Pending, running and failed derivations (same user rule as :meth:`flush`)."""
        return memory_status(self.memory, user_id or self.user_id)

    def _scope(self, runtime: Runtime[Any] | None) -> Scope:
        user_id = self.user_id or _run_value(runtime, "user_id")
        if user_id is None:
            raise MissingUserError(
                "MemoryMiddleware needs a user id: pass MemoryMiddleware(..., user_id=...), or "
                "invoke the agent with context={'user_id': ...} or "
                "config={'configurable': {'user_id': ...}}"
            )
        session_id = (
            self.session_id or _run_value(runtime, "session_id") or _run_value(None, "thread_id")
        )
        return Scope(user_id, session_id=session_id)

    @staticmethod
    def _query(request: ModelRequest[Any]) -> str | None:
        index = _last_human_index(request.messages)
        text = request.messages[index].text if index is not None else ""
        return text if text.strip() else None

    def _turns(self, state: AgentState[Any], scope: Scope) -> list[Turn]:
        messages = state["messages"]
        index = _last_human_index(messages)
        if index is None:
            return []
        # The final answer is the last AI message that calls no tool (intermediate steps are not).
        answers = [
            m for m in messages[index + 1 :] if isinstance(m, AIMessage) and not m.tool_calls
        ]
        texts = [("user", messages[index].text), ("assistant", answers[-1].text if answers else "")]
        if self._already_kept(messages, scope):
            texts = texts[1:]  # saved when a model call failed; a retry then answered
        return turns_from_texts(texts)

    def _with_recall(self, request: ModelRequest[Any], recall: Recall) -> ModelRequest[Any]:
        """A new request whose system message carries the recall (the input is not changed)."""
        if not recall.context.strip():
            return request
        context = self.template.replace("{context}", recall.context)
        return request.override(system_message=_with_context(request.system_message, context))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        """Recall for the latest human message and add the memories to this request."""
        query = self._query(request)
        if query is None:
            return handler(request)
        scope = self._scope(request.runtime)
        recall = traced_recall(
            "MemoryMiddleware", query, lambda: self.memory.recall(query, scope, k=self.k)
        )
        try:
            return handler(self._with_recall(request, recall))
        except Exception as exc:
            turns = self._question_to_keep(request.messages, exc, scope)
            if turns:
                try:
                    self.memory.save(turns, scope)
                    self._saved(scope, turns)
                except Exception:  # the model's error is the one the caller must see
                    logger.warning("could not keep the message of a failed run", exc_info=True)
            raise

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        """Async twin of :meth:`wrap_model_call` (uses ``memory.arecall``)."""
        query = self._query(request)
        if query is None:
            return await handler(request)
        scope = self._scope(request.runtime)
        recall = await atraced_recall(
            "MemoryMiddleware", query, lambda: self.memory.arecall(query, scope, k=self.k)
        )
        try:
            return await handler(self._with_recall(request, recall))
        except Exception as exc:
            turns = self._question_to_keep(request.messages, exc, scope)
            if turns:
                try:
                    await self.memory.asave(turns, scope)
                    self._saved(scope, turns)
                except Exception:  # the model's error is the one the caller must see
                    logger.warning("could not keep the message of a failed run", exc_info=True)
            raise

    def _question_to_keep(
        self, messages: Sequence[AnyMessage], exc: Exception, scope: Scope
    ) -> list[Turn]:
        """The latest human message's turns to save after a failed model call, once.

        Nothing for a graph's own control flow (an interrupt), or for a message already kept
        (a retry middleware outside this one calls it again). The message's id, and its text
        for the user's session, are remembered, so that :meth:`after_agent` then saves the
        answer alone.
        """
        from langgraph.errors import GraphBubbleUp

        index = _last_human_index(messages)
        if index is None or isinstance(exc, GraphBubbleUp):
            return []
        key = messages[index].id
        text = messages[index].text
        with self._kept_lock:
            if key is not None:
                if key in self._kept:
                    return []
                self._kept[key] = None
                while len(self._kept) > _KEPT_IDS:
                    self._kept.popitem(last=False)
            where = (scope.user_id, scope.session_id)
            self._kept_texts.pop(where, None)
            self._kept_texts[where] = text
            while len(self._kept_texts) > _KEPT_IDS:
                self._kept_texts.popitem(last=False)
        return turns_from_texts([("user", text)])

    def _already_kept(self, messages: Sequence[AnyMessage], scope: Scope) -> bool:
        """Whether the latest human message was saved after a failed model call.

        It was if its id was kept (a retry of the same call), or if the last message kept
        for this user and session has its text (the user sent it again in a new run). Either
        mark is used once: a run that ends forgets its session's kept text, so only the run
        right after a failure can match it.
        """
        index = _last_human_index(messages)
        if index is None:
            return False
        key = messages[index].id
        with self._kept_lock:
            text = self._kept_texts.pop((scope.user_id, scope.session_id), None)
            if key is not None and key in self._kept:
                del self._kept[key]
                return True
            return text is not None and text == messages[index].text

    def after_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        """Save the run's last human message and final answer."""
        if _last_human_index(state["messages"]) is None:
            return None
        scope = self._scope(runtime)
        turns = self._turns(state, scope)
        if turns:
            self.memory.save(turns, scope)
            self._saved(scope, turns)
        return None

    def _saved(self, scope: Scope, turns: list[Turn]) -> None:
        """Report the save as a ``memory_saved`` custom event of the run (tracing)."""
        emit_memory_event(
            "memory_saved",
            {
                "user_id": scope.user_id,
                "session_id": scope.session_id,
                "turns": len(turns),
                "source": "MemoryMiddleware",
                **usage_data(self.memory),
            },
        )

    async def aafter_agent(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        """Async twin of :meth:`after_agent` (uses ``memory.asave``)."""
        if _last_human_index(state["messages"]) is None:
            return None
        scope = self._scope(runtime)
        turns = self._turns(state, scope)
        if turns:
            await self.memory.asave(turns, scope)
            self._saved(scope, turns)
        return None
