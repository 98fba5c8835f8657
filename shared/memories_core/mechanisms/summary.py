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
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any, ClassVar

from memories_core.clock import memory_time
from memories_core.engine import Derivation, JobFailed, default_llm
from memories_core.errors import LLMError, ParseError
from memories_core.interfaces import LLM
from memories_core.mechanisms.base import MemoryBase, fit_recent
from memories_core.prompts.spec import PromptSpec, run_spec
from memories_core.prompts.summary import SESSION_SUMMARY, SummaryInput
from memories_core.types import Job, JobSpec, MemoryRecord, Scope, ScoredRecord, new_id

__all__ = ["SummaryMemory"]

logger = logging.getLogger(__name__)

_LEGACY_PENDING = "summary.pending"


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

    Sessions are the engine's (explicit end, a new ``session_id``, or an idle gap). A session
    end creates a ``summary`` job in the same transaction; the job writes the summary and
    replaces an older summary of the same session in one transaction.

    Args:
        llm: Writes the summaries. Default: the engine's model, else the bundled offline model
            (extra ``local``).
        k: Summaries recalled by default (paper: 1).
        idle_gap: A gap longer than this between two turns of a user ends the session
            (``None``: sessions end only explicitly or on a new ``session_id``). An engine
            option: give it only when this memory builds its own engine.
        max_dialogue_chars: Longest dialogue sent to the LLM; longer sessions keep their
            most recent part (each turn is cut to 2,000 characters first).
        **kwargs: Engine or storage options of :class:`~memories_core.mechanisms.base.MemoryBase`.
    """

    mechanism_name: ClassVar[str] = "summary"
    prompt_specs: ClassVar[tuple[PromptSpec[Any, Any], ...]] = (SESSION_SUMMARY,)
    recall_kinds: ClassVar[tuple[str, ...]] = ("summary",)
    index_turns: ClassVar[bool] = False

    def __init__(
        self,
        *,
        llm: LLM | None = None,
        k: int = 1,
        idle_gap: timedelta | Any | None = ...,
        max_dialogue_chars: int = 12_000,
        **kwargs: Any,
    ) -> None:
        engine = kwargs.get("engine")
        if llm is None and (engine is None or engine.llm is None):
            llm = default_llm()
        if idle_gap is not ...:
            kwargs["session_gap"] = idle_gap
        super().__init__(k=k, llm=llm, **kwargs)
        self.max_dialogue_chars = max_dialogue_chars
        self._adopt_legacy_pending()

    @property
    def summarizer(self) -> LLM:
        """The model writing summaries."""
        llm = self.llm if self.llm is not None else self.engine.llm
        assert llm is not None  # ensured in __init__
        return llm

    @summarizer.setter
    def summarizer(self, llm: LLM) -> None:
        self.llm = llm

    def pending_sessions(self, user_id: str) -> list[str]:
        """Sessions of ``user_id`` that ended but have no summary yet."""
        return [str(job.payload["session_id"]) for job in self.pending(user_id)]

    # ------------------------------------------------------------------ engine hooks
    def _session_jobs(self, user_id: str, session_id: str) -> Iterable[JobSpec]:
        return [JobSpec(self.name, "summary", f"session:{session_id}", {"session_id": session_id})]

    def _run_job(self, job: Job) -> Derivation | None:
        user_id = job.user_id
        session_id = str(job.payload["session_id"])
        turns = self.engine.records(user_id, where={"kind": "turn", "session_id": session_id})
        if not turns:
            return None
        dialogue = fit_recent([r.text[:2000] for r in turns], self.max_dialogue_chars)
        try:
            text = run_spec(
                self._llm(Scope(user_id, session_id)),
                self.prompt_spec(SESSION_SUMMARY),
                SummaryInput(tuple(dialogue)),
            )
        except (LLMError, ParseError) as exc:
            raise JobFailed("summary", f"summary of session {session_id} failed: {exc}") from exc
        old = self.engine.records(user_id, where={"kind": "summary", "session_id": session_id})
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
        return Derivation(add=[summary], replace=[r.id for r in old])

    def _adopt_legacy_pending(self) -> None:
        """Turn the 0.1 release's pending-summary lists (a state key) into jobs."""
        for user_id in self.engine.users():
            legacy = self.store.get_state(_LEGACY_PENDING, user_id=user_id)
            if legacy:
                with self.engine.transaction():
                    self.engine.enqueue(
                        user_id, [s for sid in legacy for s in self._session_jobs(user_id, sid)]
                    )
                    self.store.set_state(_LEGACY_PENDING, None, user_id=user_id)

    def _render(self, hits: Sequence[ScoredRecord]) -> str:
        return "\n".join(
            f"[{memory_time(hit.record.created_at, time_of_day=False)}] {hit.record.text}"
            for hit in hits
        )
