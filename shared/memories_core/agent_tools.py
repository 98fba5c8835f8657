"""Memory as agent tools, framework-free: save, search, update and forget one user's memories.

Agents manage memory with tools (mem0, LangMem and Letta all offer create / search / update /
delete memory tools). :class:`MemoryToolbox` holds the four operations over the engine of any
mechanism; the LangChain (``langchain_memories.create_memory_tools``) and LlamaIndex
(``llamaindex_memories.MemoryToolSpec``) adapters only convert types.

Rules every adapter keeps:

* the **user** is never a tool argument: adapters take it from the run (context or config)
  or from their constructor, so a model cannot read or change another user's memory;
* bad input (empty text, an unknown memory id, an id of another user) raises
  :class:`ToolInputError` with a message meant for the model, and nothing changes; another
  user's id is reported exactly like an unknown one (existence is not revealed);
* an update keeps the old text in the update history (``engine.history``), a forget is a
  deletion with its reason in the history;
* a search is the mechanism's own ``recall`` (MemoChat's memo choice, EMG's policy, a
  MemoryBank's reinforcement all apply) plus the memories the agent saved through the tools,
  merged by relevance, ``k`` results at most; given a bare engine, the engine's search.
  Each hit's ``score`` is a similarity in ``[0, 1]``
  (:attr:`~memories_core.types.ScoredRecord.relevance`), ``fused_score`` the pipeline's own.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memories_core.errors import InvalidInputError, as_whole
from memories_core.types import MemoryRecord, Scope, ScoredRecord, check_user_id, new_id

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine

__all__ = ["AGENT_KIND", "MemoryToolbox", "ToolInputError", "engine_of"]

#: Record kind of memories an agent saved through the tools.
AGENT_KIND = "memory"

#: Longest memory text a tool accepts.
MAX_TEXT = 4000


class ToolInputError(InvalidInputError):
    """Bad input from the model to a memory tool; the message is returned to the model."""


def engine_of(memory: Any) -> MemoryEngine:
    """The engine of a memory mechanism (``memory.engine``) or the engine itself.

    Raises:
        InvalidInputError: if ``memory`` is neither.
    """
    from memories_core.engine import MemoryEngine

    engine = getattr(memory, "engine", memory)
    if not isinstance(engine, MemoryEngine):
        raise InvalidInputError(
            f"expected a memory mechanism or a MemoryEngine, got {type(memory).__name__}"
        )
    return engine


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ToolInputError(f"{what} is empty: give the text of the memory")
    if len(value) > MAX_TEXT:
        raise ToolInputError(f"{what} is too long ({len(value)} characters, at most {MAX_TEXT})")
    return value.strip()


class MemoryToolbox:
    """The four memory operations behind the agent tools, for one engine.

    Args:
        memory: Any mechanism of this package (its ``.engine`` is used) or a ``MemoryEngine``.
        k: Memories a search returns by default.
        kinds: Record kinds a search covers (``None``: every kind, turns included).
    """

    def __init__(self, memory: Any, *, k: int = 5, kinds: tuple[str, ...] | None = None) -> None:
        self.engine = engine_of(memory)
        self.memory = memory
        self.k = k
        self.kinds = kinds

    def _owned(self, user_id: str, memory_id: Any) -> MemoryRecord:
        if not isinstance(memory_id, str) or not memory_id.strip():
            raise ToolInputError("memory_id is empty: give the id returned by search_memory")
        found = self.engine.get(check_user_id(user_id), [memory_id.strip()])
        if not found:
            raise ToolInputError(
                f"no memory with id {memory_id!r}: search_memory lists the ids of the memories"
            )
        return found[0]

    def save(self, user_id: str, text: Any, *, at: datetime | None = None) -> MemoryRecord:
        """Store one memory the agent decided to keep (kind :data:`AGENT_KIND`).

        Raises:
            ToolInputError: on empty or overlong text.
        """
        check_user_id(user_id)
        record = MemoryRecord(
            id=new_id(),
            user_id=user_id,
            kind=AGENT_KIND,
            text=_text(text, "text"),
            created_at=at or self.engine.clock.now(),
            metadata={"source": "agent_tool"},
        )
        self.engine.add_records([record])
        return record

    def _hits(self, user_id: str, query: str, k: int) -> list[ScoredRecord]:
        recall = getattr(self.memory, "recall", None)
        if not callable(recall) or self.memory is self.engine:
            return self.engine.search(query, user_id, k=k, kinds=self.kinds)
        found = list(recall(query, Scope(user_id), k=k).records)
        # What the agent saved itself (kind AGENT_KIND) is the tools' own memory, which a
        # mechanism's recall may not cover (HistoryMemory recalls turns): search it too.
        if self.kinds is None or AGENT_KIND in self.kinds:
            found += self.engine.search(query, user_id, k=k, kinds=[AGENT_KIND])
        best: dict[str, ScoredRecord] = {}
        for hit in sorted(found, key=lambda h: -h.relevance):
            if self.kinds is None or hit.record.kind in self.kinds:
                best.setdefault(hit.record.id, hit)
        return list(best.values())[:k]

    def search(self, user_id: str, query: Any, *, k: int | None = None) -> list[dict[str, Any]]:
        """The user's memories for ``query`` as the mechanism recalls them, best first.

        Each hit: ``id``, ``text``, ``kind``, ``created_at``, ``score`` (in ``[0, 1]``) and
        ``fused_score`` (the retrieval pipeline's unbounded score).

        Raises:
            ToolInputError: on an empty query or a bad ``k``.
        """
        if not isinstance(query, str) or not query.strip():
            raise ToolInputError("query is empty: say what to look for")
        wanted = as_whole(self.k if k is None else k)
        if wanted is None or not 1 <= wanted <= 50:
            raise ToolInputError("k must be a whole number from 1 to 50")
        hits = self._hits(check_user_id(user_id), query, wanted)
        return [
            {
                "id": hit.record.id,
                "text": hit.record.text,
                "kind": hit.record.kind,
                "created_at": hit.record.created_at.isoformat(),
                "score": round(hit.relevance, 4),
                "fused_score": round(hit.score, 4),
            }
            for hit in hits
        ]

    def update(self, user_id: str, memory_id: Any, text: Any) -> MemoryRecord:
        """Replace a memory's text; the old text stays in the update history.

        Raises:
            ToolInputError: on empty text or an id that is not one of the user's memories.
        """
        new_text = _text(text, "text")
        record = self._owned(user_id, memory_id)
        self.engine.edit_text(user_id, record.id, new_text, reason="agent tool update_memory")
        return self.engine.get(user_id, [record.id])[0]

    def forget(self, user_id: str, memory_id: Any, *, reason: str | None = None) -> MemoryRecord:
        """Delete a memory (text and vector); the deletion and its reason stay in the history.

        Raises:
            ToolInputError: on an id that is not one of the user's memories.
        """
        record = self._owned(user_id, memory_id)
        why = "agent tool forget_memory" + (f": {reason.strip()}" if reason else "")
        self.engine.delete_records(user_id, [record.id], reason=why)
        return record

    @staticmethod
    def render(hits: list[dict[str, Any]]) -> str:
        """Search results as the text a model reads (one JSON object per line)."""
        if not hits:
            return "No memories found."
        return "\n".join(json.dumps(hit, ensure_ascii=False) for hit in hits)
