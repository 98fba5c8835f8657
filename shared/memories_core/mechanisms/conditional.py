"""Conditional memory (Yuan et al., §3.1 "Conditional Memory", Table 1, appendix C.2).

Not every utterance is worth remembering, and a memory is only useful with its context. For
each user turn the LLM first decides whether to remember it (memorisation *timing*, Table 17,
second step); only on "yes" does a second call write the memory *content* (Table 18): why the
user said it (``context``) and a note for the future (``knowledge``), stored as one record
``"Context: ... Knowledge: ..."`` linked to its source turns. The raw turns stay in the record
store either way. Recall returns the top-k records (paper: k=3, §5).

Two ways to run the decision:

* drop-in (:meth:`ConditionalMemory.save`): a separate decision call per user turn, because
  the chain's own prompt is not ours;
* single-call (:meth:`ConditionalMemory.respond`): one call writes the response and the hidden
  ``<Decision>`` (Table 17) and a second call, only on "yes", writes the record: at most two
  calls per utterance. The user sees only ``<Respond>``.

Failures never lose a turn: turns are stored first; a failed or garbled decision or record call
is counted in ``usage.failures`` (``"decision"``, ``"record"``), the turn stays pending and
:meth:`ConditionalMemory.retry_pending` (or the next save) derives it later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

from memories_core.engine import Derivation, JobFailed, check_scope, default_llm
from memories_core.errors import LLMError, ParseError
from memories_core.grounding import find_ungrounded, log_rejection
from memories_core.interfaces import LLM
from memories_core.mechanisms.base import MemoryBase, turn_from_record
from memories_core.prompts.batch import by_model, run_spec_batch
from memories_core.prompts.conditional import (
    DECISION,
    RECORD,
    RESPOND_AND_DECIDE,
    ConditionalNote,
    DecisionInput,
    RecordInput,
    RespondInput,
    render_record,
)
from memories_core.prompts.spec import PromptSpec, run_spec
from memories_core.retrieval.keys import KEY_FOR, SEARCH_KEY_KIND
from memories_core.types import Job, JobSpec, MemoryRecord, Recall, Scope, Turn, new_id

__all__ = ["ConditionalMemory", "ConditionalReply"]

logger = logging.getLogger(__name__)

_LEGACY_PENDING = "conditional.pending"


@dataclass(frozen=True)
class ConditionalReply:
    """Result of one single-call exchange (:meth:`ConditionalMemory.respond`).

    Attributes:
        response: What the user sees (the ``<Respond>`` part only).
        decision: Whether the user input was judged worth remembering (``None``: the model
            gave no readable decision; a separate decision call is made instead).
        recall: The memory recalled before answering.
        record: The conditional record written for this turn, if any.
    """

    response: str
    decision: bool | None
    recall: Recall
    record: MemoryRecord | None


class ConditionalMemory(MemoryBase):
    """Remember only what matters, with the context that makes it useful.

    Example:
        >>> from memories_core import ConditionalMemory, Scope, Turn
        >>> from memories_core.embedders import HashingEmbedder
        >>> from memories_core.llms import ScriptedLLM
        >>> llm = ScriptedLLM([
        ...     "<Decision>: yes",
        ...     "<Context>: NaN <Summary>: The user corrected how to capitalize. "
        ...     "<Note>: Capitalize means every letter in upper case for this user.",
        ... ])
        >>> memory = ConditionalMemory(llm=llm, embedder=HashingEmbedder())
        >>> memory.save([Turn("user", "No, capitalize means ALL letters upper case")], Scope("u"))
        >>> memory.recall("capitalize these words", Scope("u")).context
        'Context: The user corrected how to capitalize. Knowledge: Capitalize means ...'

    Args:
        llm: Makes the decisions and writes the records. Default: the bundled local model.
        k: Records recalled by default (paper: 3).
        context_turns: Turns of the ongoing session shown to the record call (Table 18's
            dialogue context), the user turn included.
        **kwargs: Storage options of :class:`~memories_core.mechanisms.base.MemoryBase`.
    """

    mechanism_name: ClassVar[str] = "conditional"
    prompt_specs: ClassVar[tuple[PromptSpec[Any, Any], ...]] = (
        DECISION,
        RESPOND_AND_DECIDE,
        RECORD,
    )
    recall_kinds: ClassVar[tuple[str, ...]] = ("conditional",)
    index_turns: ClassVar[bool] = False

    def __init__(
        self, *, llm: LLM | None = None, k: int = 3, context_turns: int = 6, **kwargs: Any
    ) -> None:
        engine = kwargs.get("engine")
        if llm is None and (engine is None or engine.llm is None):
            llm = default_llm()
        super().__init__(k=k, llm=llm, **kwargs)
        self.context_turns = context_turns
        self._adopt_legacy_pending()

    @property
    def writer(self) -> LLM:
        """The model that decides and writes records."""
        llm = self.llm if self.llm is not None else self.engine.llm
        assert llm is not None  # ensured in __init__
        return llm

    @writer.setter
    def writer(self, llm: LLM) -> None:
        self.llm = llm

    # ------------------------------------------------------------------ mode (b)
    def respond(
        self,
        user_input: str,
        scope: Scope,
        *,
        llm: LLM | None = None,
        k: int | None = None,
        max_tokens: int | None = None,
        instructions: str | None = None,
    ) -> ConditionalReply:
        """Answer ``user_input`` and remember it if it matters, in at most two LLM calls.

        The user turn is stored first, with its pending decision job. The first call
        (Table 17) writes the response and the hidden decision; the response is stored; only
        on "yes" a second call writes the record. No repair retries happen here, to keep the
        bound: a garbled record, or an answer without a readable decision, leaves the job
        pending for :meth:`retry_pending` (or a later save).

        Args:
            user_input: The user's message.
            scope: Who is talking.
            llm: The chat model that answers (default: this memory's LLM).
            k: Records recalled for the answer.
            max_tokens: Passed to the answering model.
            instructions: The application's own instructions (e.g. a chain's system
                message), added to the prompt before the two steps.

        Raises:
            LLMError: if the answering call fails; the user turn is already stored and stays
                pending for a decision.
            ParseError: if the answer holds no response text at all (the user turn is kept).
        """
        scope = check_scope(scope)
        user_turn = Turn("user", user_input)
        recall = self.recall(user_turn.content, scope, k=k)
        history = [r.text for r in self._session_turns(scope, limit=self.context_turns)]
        (stored_user,) = self.engine.write_turns([user_turn], scope)
        parsed = run_spec(
            llm or self._llm(scope),
            self.prompt_spec(RESPOND_AND_DECIDE),
            RespondInput(
                user_turn.content,
                memory=recall.context,
                history=tuple(history),
                instructions=instructions,
            ),
            retries=0,
            max_tokens=max_tokens,
        )
        self.engine.write_turns([Turn("assistant", parsed.respond)], scope)
        record: MemoryRecord | None = None
        job = self._job_of(scope.user_id, stored_user.id)
        if parsed.decision is not None and job is not None:
            self.engine.update_job(
                job, {"turn_id": stored_user.id, "decision": parsed.decision, "retries": 0}
            )
            self.engine.run_pending(scope.user_id, first=[job.id], budget=0)
            record = next(
                iter(
                    self.engine.records(
                        scope.user_id, where={"kind": "conditional", "turn_id": stored_user.id}
                    )
                ),
                None,
            )
        return ConditionalReply(parsed.respond, parsed.decision, recall, record)

    async def arespond(
        self,
        user_input: str,
        scope: Scope,
        *,
        llm: LLM | None = None,
        k: int | None = None,
        max_tokens: int | None = None,
        instructions: str | None = None,
    ) -> ConditionalReply:
        """Async twin of :meth:`respond`."""
        return await asyncio.to_thread(
            self.respond,
            user_input,
            scope,
            llm=llm,
            k=k,
            max_tokens=max_tokens,
            instructions=instructions,
        )

    def pending_turns(self, user_id: str) -> list[str]:
        """Ids of ``user_id``'s user turns whose decision or record is still to be derived."""
        return [str(job.payload["turn_id"]) for job in self.pending(user_id)]

    # ------------------------------------------------------------------ engine hooks
    def _turn_jobs(self, records: Sequence[MemoryRecord]) -> Iterable[JobSpec]:
        return [
            JobSpec(self.name, "decision", f"turn:{r.id}", {"turn_id": r.id, "decision": None})
            for r in records
            if r.metadata.get("role") == "user"
        ]

    def _run_job(self, job: Job) -> Derivation | None:
        """Decide (Table 17, step 2) and, on "yes", write the record (Table 18)."""
        user_id = job.user_id
        turn_id = str(job.payload["turn_id"])
        decision = job.payload.get("decision")
        retries = int(job.payload.get("retries", 1))
        if retries == 0:
            # The no-repair budget applies to the respond() call only, not to later retries.
            self.engine.update_job(job, {"turn_id": turn_id, "decision": decision})
        found = self.engine.get(user_id, [turn_id])
        if not found:
            return None
        turn = found[0]
        scope = Scope(user_id, turn.session_id)
        writer = self._llm(scope)
        context = self._context_before(turn)
        content = _content(turn)
        if decision is None:
            try:
                decision = run_spec(
                    writer,
                    self.prompt_spec(DECISION),
                    DecisionInput(content, _previous_reply(context)),
                    retries=retries,
                )
            except (LLMError, ParseError) as exc:
                raise _failed("decision", turn_id, exc) from exc
            if decision:
                self.engine.update_job(job, {"turn_id": turn_id, "decision": True})
        if not decision:
            return None
        dialogue = [r.text for r in context] + [turn.text]
        kept = job.payload.get("note")
        if isinstance(kept, dict):  # written by a batch (_prepare_jobs)
            note = ConditionalNote(
                **{f.name: str(kept.get(f.name, "")) for f in fields(ConditionalNote)}
            )
        else:
            try:
                note = run_spec(
                    writer,
                    self.prompt_spec(RECORD),
                    RecordInput(tuple(dialogue), content),
                    retries=retries,
                )
            except (LLMError, ParseError) as exc:
                raise _failed("record", turn_id, exc) from exc
        rejection = find_ungrounded({"summary": note.summary, "note": note.note}, dialogue)
        if rejection is not None:
            # Not written; the turn itself stays stored and recalled (memories_core.grounding).
            log_rejection(self.name, "record", rejection)
            self.engine.count_failure("grounding")
            return None
        return Derivation(add=self.derive_records(note, turn, context))

    def _prepare_jobs(self, jobs: Sequence[Job]) -> dict[str, BaseException]:
        """Ask several turns' decisions together, then the records of those decided "yes".

        Each turn's two calls read only that turn and the turns before it (already stored),
        so the same step of several turns goes to the model as one batch, per writing
        model. The answers are kept in each job's payload (the decision, the parsed note),
        and :meth:`_run_job` then only checks and writes. A turn whose answer still does not
        parse is returned as failed, as its own run would have failed. ``respond()``'s own
        jobs (no repair budget) are left to their run.

        Raises:
            LLMError: if the model is down (the answers so far are kept).
        """
        work = []
        sessions: dict[tuple[str, str | None], list[MemoryRecord]] = {}
        for job in jobs:
            if int(job.payload.get("retries", 1)) == 0:
                continue
            found = self.engine.get(job.user_id, [str(job.payload["turn_id"])])
            if found:
                turn = found[0]
                writer = self._llm(Scope(job.user_id, turn.session_id))
                work.append(
                    _Pending(
                        job, dict(job.payload), turn, writer, self._context_before(turn, sessions)
                    )
                )
        failed: dict[str, BaseException] = {}
        undecided = [w for w in work if w.payload.get("decision") is None]
        for writer, group in by_model(undecided, _writer):
            inputs = [DecisionInput(_content(w.turn), _previous_reply(w.context)) for w in group]
            answers = run_spec_batch(writer, self.prompt_spec(DECISION), inputs)
            for w, answer in zip(group, answers, strict=True):
                if isinstance(answer, ParseError):
                    failed[w.job.id] = _failed("decision", w.turn.id, answer)
                else:
                    w.payload["decision"] = bool(answer)
                    self.engine.update_job(w.job, w.payload)
        to_write = [
            w
            for w in work
            if w.job.id not in failed and w.payload.get("decision") and "note" not in w.payload
        ]
        for writer, group in by_model(to_write, _writer):
            notes = run_spec_batch(
                writer,
                self.prompt_spec(RECORD),
                [RecordInput(tuple(w.dialogue), _content(w.turn)) for w in group],
            )
            for w, note in zip(group, notes, strict=True):
                if isinstance(note, ParseError):
                    failed[w.job.id] = _failed("record", w.turn.id, note)
                else:
                    w.payload["note"] = asdict(note)
                    self.engine.update_job(w.job, w.payload)
        return failed

    def derive_records(
        self, note: ConditionalNote, turn: MemoryRecord, context: Sequence[MemoryRecord] = ()
    ) -> list[MemoryRecord]:
        """The records one written note becomes (what the record job stores and indexes).

        * the conditional record: text ``"Context: ... Knowledge: ..."`` (Table 1), what a
          reader sees, linked to the turn and its context turns;
        * a search key of the *record* (``key_for`` = the record), text = the note alone: the
          session's context, shared by every note of a session, dominates the rendered text's
          vector, so notes of one session look alike to the dense search; the key lets the
          note rank on its own words, while the reader still gets the rendered record
          (BENCHMARKS.md, "Conditional memory: what is indexed");
        * a search key of the *turn* (``key_for`` = the turn), text = the note, so recall of
          raw turns (e.g. :class:`~memories_core.HistoryMemory` on the same engine) finds the
          turn by its meaning (:mod:`memories_core.retrieval.keys`).

        Args:
            note: The parsed record answer (Table 18).
            turn: The user turn it was written for.
            context: The turns before it that the record call was shown.
        """
        record = MemoryRecord(
            id=new_id(),
            user_id=turn.user_id,
            kind="conditional",
            text=render_record(note),
            created_at=turn.created_at,
            session_id=turn.session_id,
            metadata={"context": note.summary, "knowledge": note.note, "turn_id": turn.id},
            source_ids=(turn.id, *(r.id for r in context)),
        )
        if not note.note.strip():
            return [record]
        keys = [
            MemoryRecord(
                id=new_id(),
                user_id=turn.user_id,
                kind=SEARCH_KEY_KIND,
                text=note.note,
                created_at=turn.created_at,
                session_id=turn.session_id,
                metadata={KEY_FOR: target, "mechanism": self.name},
            )
            for target in (record.id, turn.id)
        ]
        return [record, *keys]

    # ------------------------------------------------------------------ internals
    def _job_of(self, user_id: str, turn_id: str) -> Job | None:
        jobs = self.engine.store.jobs(
            user_id=user_id, mechanisms=[self.name], key=f"turn:{turn_id}"
        )
        return jobs[0] if jobs else None

    def _session_turns(self, scope: Scope, *, limit: int) -> list[MemoryRecord]:
        where: dict[str, str] = {"kind": "turn"}
        session_id = scope.session_id or self.engine.open_session(scope.user_id)
        if session_id is not None:
            where["session_id"] = session_id
        turns = self.engine.records(scope.user_id, where=where)
        return turns[-limit:] if limit > 0 else []

    def _context_before(
        self,
        turn: MemoryRecord,
        sessions: dict[tuple[str, str | None], list[MemoryRecord]] | None = None,
    ) -> list[MemoryRecord]:
        """The turns of the same session said before ``turn`` (Table 18's dialogue context).

        ``sessions`` keeps each session's turns read once, for several turns of one batch.
        """
        if self.context_turns <= 1:
            return []
        key = (turn.user_id, turn.session_id)
        session = None if sessions is None else sessions.get(key)
        if session is None:
            where: dict[str, str] = {"kind": "turn"}
            if turn.session_id is not None:
                where["session_id"] = turn.session_id
            session = self.engine.records(turn.user_id, where=where)
            if sessions is not None:
                sessions[key] = session
        ids = [r.id for r in session]
        position = ids.index(turn.id) if turn.id in ids else len(session)
        return session[max(0, position - (self.context_turns - 1)) : position]

    def _adopt_legacy_pending(self) -> None:
        """Turn the 0.1 release's pending list (a state key) into jobs."""
        for user_id in self.engine.users():
            legacy = self.store.get_state(_LEGACY_PENDING, user_id=user_id)
            if legacy:
                specs = [
                    JobSpec(
                        self.name,
                        "decision",
                        f"turn:{item['turn_id']}",
                        {"turn_id": item["turn_id"], "decision": item.get("decision")},
                    )
                    for item in legacy
                ]
                with self.engine.transaction():
                    self.engine.enqueue(user_id, specs)
                    self.store.set_state(_LEGACY_PENDING, None, user_id=user_id)


def _content(record: MemoryRecord) -> str:
    return turn_from_record(record).content


@dataclass
class _Pending:
    """A decision job in a batch: its payload so far, its turn and who writes it."""

    job: Job
    payload: dict[str, Any]
    turn: MemoryRecord
    writer: LLM
    context: list[MemoryRecord]

    @property
    def dialogue(self) -> list[str]:
        return [r.text for r in self.context] + [self.turn.text]


def _previous_reply(context: Sequence[MemoryRecord]) -> str | None:
    """The last assistant turn before a user turn (the decision's context), if any."""
    previous = next((r for r in reversed(context) if r.metadata.get("role") == "assistant"), None)
    return _content(previous) if previous is not None else None


def _writer(item: _Pending) -> LLM:
    return item.writer


def _failed(label: str, turn_id: str, error: Exception) -> JobFailed:
    """A decision or record step's failure (its cause set, as ``raise ... from`` sets it)."""
    failure = JobFailed(label, f"{label} for turn {turn_id} failed: {error}")
    failure.__cause__ = error
    return failure
