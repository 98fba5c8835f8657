"""Summary-based memory (Yuan et al., §3.1 "Summary-Based Memory", Table 1, appendix C.1).

One LLM summary is written for each dialogue session ("multiple utterances that are continuous
in time and content") and stored as a memory record; recall returns the top-k summaries (the
paper uses k=1, §5).

A session ends on an explicit :meth:`SummaryMemory.end_session`, when turns arrive under a new
``session_id``, or when the gap since the session's last turn exceeds ``idle_gap``. Raw turns
are always stored first; if the summary call fails or its answer is garbage, the session stays
*pending*, the failure is counted in ``usage.failures["summary"]``, and the summary is retried on
the next save, on :meth:`SummaryMemory.end_session` or on :meth:`SummaryMemory.retry_pending`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar

from memories_core.errors import LLMError, ParseError
from memories_core.interfaces import LLM
from memories_core.mechanisms.base import MemoryBase, _check_scope, _check_turns
from memories_core.parsing import generate_parsed
from memories_core.prompts.summary import (
    build_session_summary_messages,
    parse_session_summary,
)
from memories_core.types import MemoryRecord, Scope, ScoredRecord, Turn, new_id

__all__ = ["SummaryMemory"]

logger = logging.getLogger(__name__)

_OPEN = "summary.open"
_PENDING = "summary.pending"


class SummaryMemory(MemoryBase):
    """One LLM-written summary per dialogue session; recall the most relevant summaries.

    Example:
        >>> from memories_core import Scope, SummaryMemory, Turn
        >>> from memories_core.embedders import HashingEmbedder
        >>> from memories_core.llms import ScriptedLLM
        >>> llm = ScriptedLLM(["The user is vegetarian and asked for dinner ideas."])
        >>> memory = SummaryMemory(llm=llm, embedder=HashingEmbedder())
        >>> memory.save([Turn("user", "I'm vegetarian, any dinner ideas?")], Scope("bo", "s1"))
        >>> memory.end_session(Scope("bo", "s1"))
        >>> memory.recall("what does bo eat?", Scope("bo")).context
        '[...] The user is vegetarian and asked for dinner ideas.'

    Args:
        llm: Writes the summaries. Default: the bundled offline model (extra ``local``).
        k: Summaries recalled by default (paper: 1).
        idle_gap: A gap longer than this between two turns of a user ends the session
            (``None``: sessions end only explicitly or on a new ``session_id``).
        max_dialogue_chars: Longest dialogue sent to the LLM; longer sessions keep their
            most recent part (each turn is cut to 2,000 characters first).
        **kwargs: Storage options of :class:`~memories_core.mechanisms.base.MemoryBase`.
    """

    recall_kinds: ClassVar[tuple[str, ...]] = ("summary",)
    index_turns: ClassVar[bool] = False

    def __init__(
        self,
        *,
        llm: LLM | None = None,
        k: int = 1,
        idle_gap: timedelta | None = timedelta(minutes=30),
        max_dialogue_chars: int = 12_000,
        **kwargs: Any,
    ) -> None:
        if llm is None:
            from memories_core.llms import LocalLLM

            llm = LocalLLM()
        super().__init__(k=k, llm=llm, **kwargs)
        self.summarizer: LLM = llm
        self.idle_gap = idle_gap
        self.max_dialogue_chars = max_dialogue_chars

    def save(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Store ``turns`` in the user's current session; summarise sessions that ended.

        A new ``scope.session_id`` or an idle gap closes the open session first. Turns saved
        without a ``session_id`` join the open session (or start an automatic one).
        """
        scope = _check_scope(scope)
        checked = _check_turns(turns)
        if not checked:
            return
        with self._lock:
            start = checked[0].timestamp or self.clock.now()
            session_id = self._route(scope, start)
            records = self._store_turns(checked, Scope(scope.user_id, session_id))
            last = max(r.created_at for r in records)
            self.store.set_state(
                _OPEN,
                {"session_id": session_id, "last_at": last.isoformat()},
                user_id=scope.user_id,
            )
            self._summarize_pending(scope.user_id)

    def end_session(self, scope: Scope) -> None:
        """End the user's open session (or ``scope.session_id``) and summarise it now."""
        scope = _check_scope(scope)
        with self._lock:
            opened = self.store.get_state(_OPEN, user_id=scope.user_id)
            if opened and scope.session_id in (None, opened["session_id"]):
                self._mark_pending(scope.user_id, opened["session_id"])
                self.store.set_state(_OPEN, None, user_id=scope.user_id)
            elif scope.session_id is not None:
                self._mark_pending(scope.user_id, scope.session_id)
            self._summarize_pending(scope.user_id)

    def retry_pending(self, user_id: str | None = None) -> int:
        """Retry every pending summary (of one user, or of all); returns how many remain."""
        users = [_check_scope(Scope(user_id)).user_id] if user_id else self.store.users()
        with self._lock:
            return sum(self._summarize_pending(user) for user in users)

    def pending_sessions(self, user_id: str) -> list[str]:
        """Sessions of ``user_id`` that ended but have no summary yet."""
        return list(
            self.store.get_state(_PENDING, user_id=_check_scope(Scope(user_id)).user_id) or []
        )

    # ------------------------------------------------------------------ internals
    def _route(self, scope: Scope, at: datetime) -> str:
        """Return the session the new turns belong to, closing the open one if it ended."""
        opened = self.store.get_state(_OPEN, user_id=scope.user_id)
        if opened:
            last_at = datetime.fromisoformat(opened["last_at"])
            same_id = scope.session_id in (None, opened["session_id"])
            idle = self.idle_gap is not None and at - last_at > self.idle_gap
            if same_id and not idle:
                return str(opened["session_id"])
            self._mark_pending(scope.user_id, opened["session_id"])
            self.store.set_state(_OPEN, None, user_id=scope.user_id)
        return scope.session_id or f"auto-{new_id()[:12]}"

    def _mark_pending(self, user_id: str, session_id: str) -> None:
        pending = list(self.store.get_state(_PENDING, user_id=user_id) or [])
        if session_id not in pending:
            pending.append(session_id)
            self.store.set_state(_PENDING, pending, user_id=user_id)

    def _summarize_pending(self, user_id: str) -> int:
        pending = list(self.store.get_state(_PENDING, user_id=user_id) or [])
        remaining = [sid for sid in pending if not self._summarize(user_id, sid)]
        self.store.set_state(_PENDING, remaining or None, user_id=user_id)
        return len(remaining)

    def _summarize(self, user_id: str, session_id: str) -> bool:
        turns = self.store.list(user_id=user_id, where={"kind": "turn", "session_id": session_id})
        if not turns:
            return True
        dialogue = _fit([r.text[:2000] for r in turns], self.max_dialogue_chars)
        messages = build_session_summary_messages(dialogue)
        try:
            text = generate_parsed(
                self.summarizer, messages, lambda out: parse_session_summary(out, dialogue)
            )
        except (LLMError, ParseError):
            self._count_failure("summary")
            logger.warning(
                "summary of session %s failed; its turns are kept and it stays pending",
                session_id,
                exc_info=True,
            )
            return False
        old = self.store.list(user_id=user_id, where={"kind": "summary", "session_id": session_id})
        summary = MemoryRecord(
            id=new_id(),
            user_id=user_id,
            kind="summary",
            text=text,
            created_at=turns[-1].created_at,
            session_id=session_id,
            metadata={"turn_count": len(turns), "started_at": turns[0].created_at.isoformat()},
            source_ids=tuple(r.id for r in turns),
        )
        self._add_derived([summary])
        if old:
            ids = [r.id for r in old]
            self.index.delete(ids, user_id=user_id)
            self.store.delete(ids, user_id=user_id)
        return True

    def _render(self, hits: Sequence[ScoredRecord]) -> str:
        return "\n".join(f"[{hit.record.created_at:%Y-%m-%d}] {hit.record.text}" for hit in hits)


def _fit(lines: list[str], limit: int) -> list[str]:
    """Keep the most recent lines whose total length fits ``limit``."""
    kept: list[str] = []
    total = 0
    for line in reversed(lines):
        total += len(line) + 1
        if kept and total > limit:
            break
        kept.append(line)
    return list(reversed(kept))
