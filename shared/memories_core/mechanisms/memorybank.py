"""MemoryBank (Zhong et al., 2024): hierarchical summaries, a user portrait and forgetting.

* **Storage** (§2.1 "In-Depth Memory Storage"): every turn is an engine turn record with its
  timestamp; its strength ``S`` (1 when formed) and ``last_recalled_at`` are record *state*,
  changed with ``engine.update_state`` and never re-embedded.
* **Hierarchical event summary and portrait** (§2.1): per user and UTC day, a daily event
  summary and a daily personality/emotion note; from all daily records, one global event
  summary and one global user portrait. They are engine jobs (one per day, key
  ``day:<YYYY-MM-DD>``), created in the transaction of the turns that close a day (a save
  whose turns are dated after the user's open day), of a session end (its days are
  refreshed; ``consolidate_on_session_end``) or by :meth:`MemoryBankMemory.consolidate`.
  A day job writes its day's two records and replaces the two global ones; it never
  re-summarises another day. Finished steps are kept in the job's payload, so a retry after a
  failure repeats only the failed model call; turns are written before any of this.
* **Retrieval** (§2.2): turns and daily summaries are searched together on one score scale;
  the rendered context holds the relevant memories, the global portrait and the global event
  summary, as SiliconFriend's prompt does (§3, "Integration with MemoryBank").
* **Forgetting** (§2.3): every memory, turn or summary, has a retention
  ``R = exp(-t / S)`` (:mod:`.forgetting`); what is recalled is reinforced (``S += 1``,
  ``t`` reset, in the ``on_recalled`` hook; the global summary and portrait when a recall's
  context shows them), and a rewritten daily or global record keeps its predecessor's
  strength. The paper forgets what falls low on the curve: :meth:`MemoryBankMemory.forget`
  archives memories by a stochastic (seeded) or threshold policy in one transaction,
  restorable with :meth:`MemoryBankMemory.restore`; with ``archive_below`` set, every
  consolidation also schedules a threshold forgetting job. Optionally
  (``forgetting_weight > 0``, off by default: leave-one-conversation-out cross-validation on
  LoCoMo chose 0) a :class:`~memories_core.retrieval.TimeDecay` reranker also multiplies
  relevance by ``R`` at query time, which the paper does not do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from memories_core.clock import memory_time, resolve_now
from memories_core.engine import Derivation, JobFailed, check_scope, default_llm
from memories_core.errors import ConfigurationError, InvalidInputError, LLMError, ParseError
from memories_core.grounding import find_ungrounded, log_rejection
from memories_core.interfaces import LLM
from memories_core.mechanisms.base import MemoryBase, fit_recent
from memories_core.mechanisms.forgetting import ForgetPolicy, ForgettingCurve, choose_forgotten
from memories_core.prompts.memorybank import (
    DAILY_PORTRAIT_PROMPT,
    DAILY_SUMMARY_PROMPT,
    GLOBAL_PORTRAIT_PROMPT,
    GLOBAL_SUMMARY_PROMPT,
    PROMPTS,
    DayInput,
    DaysInput,
)
from memories_core.prompts.spec import PromptSpec, run_spec
from memories_core.types import (
    Job,
    JobSpec,
    MemoryRecord,
    Recall,
    Scope,
    ScoredRecord,
    check_user_id,
    ensure_utc,
    new_id,
)

if TYPE_CHECKING:
    from memories_core.retrieval import Pipeline

__all__ = [
    "DAILY_PORTRAIT",
    "DAILY_SUMMARY",
    "GLOBAL_PORTRAIT",
    "GLOBAL_SUMMARY",
    "ForgetReport",
    "MemoryBankMemory",
]

#: Record kinds MemoryBank derives (§2.1).
DAILY_SUMMARY = "daily_summary"
DAILY_PORTRAIT = "daily_portrait"
GLOBAL_SUMMARY = "global_summary"
GLOBAL_PORTRAIT = "global_portrait"

In = TypeVar("In")


@dataclass(frozen=True)
class ForgetReport:
    """What one :meth:`MemoryBankMemory.forget` did.

    Attributes:
        considered: Live memories whose retention was computed.
        forgotten: Ids forgotten (archived, or deleted if ``hard_deleted``), in id order.
        hard_deleted: Whether they were deleted rather than archived.
        policy: The policy applied.
    """

    considered: int
    forgotten: tuple[str, ...]
    hard_deleted: bool
    policy: str


def _day(when: datetime) -> str:
    return ensure_utc(when).date().isoformat()


def _as_day(day: str | date | datetime) -> str:
    if isinstance(day, datetime):
        return _day(day)
    if isinstance(day, date):
        return day.isoformat()
    if isinstance(day, str):
        try:
            return date.fromisoformat(day.strip()).isoformat()
        except ValueError as exc:
            raise InvalidInputError(f"day must be YYYY-MM-DD, got {day!r}") from exc
    raise InvalidInputError(f"day must be a date, datetime or YYYY-MM-DD, got {day!r}")


def _stable_key(record: MemoryRecord) -> str:
    return f"{record.created_at.isoformat()}|{record.kind}|{record.text[:200]}|{record.id}"


class MemoryBankMemory(MemoryBase):
    """MemoryBank: see the module docstring (Zhong et al., §2.1-2.3, §3).

    Setup:
        Nothing to install. Give a real ``llm`` for real summaries; offline,
        ``ScriptedLLM(default=memorybank_reply)`` (:mod:`memories_core.prompts.memorybank`)
        answers the four prompts by rule.

    Key init args:
        llm: Writes summaries and portraits (default: the engine's, else the bundled model).
        k: Memories recalled by default.
        unit: One unit of ``t`` in ``R = exp(-t / (scale * S))`` (default: a day).
        scale: Curve stretch (1: the paper's curve).
        forgetting_weight: Strength of the query-time re-weighting
            ``score x ((1 - w) + w R)`` (1: ``score x R``; 0, the default: off). Not in the
            paper; 0 is the choice of leave-one-conversation-out cross-validation on LoCoMo.
        summaries_decay: Whether daily summaries fade and can be forgotten like turns
            (default), or keep ``R = 1``.
        archive_below: If set, every consolidation schedules a forgetting job that archives
            the user's memories with ``R`` below this threshold (§2.3; restorable with
            :meth:`restore`). ``None`` (default): forget only when :meth:`forget` is called.
        reinforce: Raise ``S`` and reset ``t`` of recalled memories (§2.3).
        consolidate_on_session_end: Refresh a day's summary and note when a session of that
            day ends (else only on day rollover or :meth:`consolidate`).
        max_dialogue_chars: Longest input of one summary call (most recent part kept).
        **kwargs: Engine or storage options of :class:`~memories_core.mechanisms.base.MemoryBase`.

    Instantiate, save, recall:
        .. code-block:: python

            from memories_core import FixedClock, MemoryBankMemory, Scope, Turn
            from memories_core.embedders import HashingEmbedder
            from memories_core.llms import ScriptedLLM
            from memories_core.prompts.memorybank import memorybank_reply

            memory = MemoryBankMemory(
                llm=ScriptedLLM(default=memorybank_reply), embedder=HashingEmbedder()
            )
            memory.save([Turn("user", "I feel stressed", timestamp=monday)], Scope("gary"))
            memory.consolidate("gary")             # or wait for the next day's first save
            print(memory.recall("stress", Scope("gary")).context)
            memory.forget("gary", policy="threshold", threshold=0.05)

    Raises:
        ConfigurationError: on a bad ``unit``, ``scale``, ``forgetting_weight`` or
            ``archive_below``.
    """

    mechanism_name: ClassVar[str] = "memorybank"
    prompt_specs: ClassVar[tuple[PromptSpec[Any, Any], ...]] = PROMPTS
    recall_kinds: ClassVar[tuple[str, ...]] = ("turn", DAILY_SUMMARY)
    index_turns: ClassVar[bool] = True

    def __init__(
        self,
        *,
        llm: LLM | None = None,
        k: int = 5,
        unit: timedelta = timedelta(days=1),
        scale: float = 1.0,
        forgetting_weight: float = 0.0,
        summaries_decay: bool = True,
        archive_below: float | None = None,
        reinforce: bool = True,
        consolidate_on_session_end: bool = True,
        max_dialogue_chars: int = 12_000,
        **kwargs: Any,
    ) -> None:
        if not 0 <= forgetting_weight <= 1:
            raise ConfigurationError("forgetting_weight must be in [0, 1]")
        if archive_below is not None and not 0 < archive_below <= 1:
            raise ConfigurationError("archive_below must be in (0, 1] or None")
        engine = kwargs.get("engine")
        if llm is None and (engine is None or engine.llm is None):
            llm = default_llm()
        decaying = None if summaries_decay else frozenset({"turn"})
        self.curve = ForgettingCurve(unit=unit, scale=scale, kinds=decaying)
        self.forgetting_weight = forgetting_weight
        self.summaries_decay = summaries_decay
        self.archive_below = archive_below
        self.reinforce = reinforce
        self.consolidate_on_session_end = consolidate_on_session_end
        self.max_dialogue_chars = max_dialogue_chars
        super().__init__(k=k, llm=llm, **kwargs)
        if self.pipeline is None:
            self.pipeline = self.recall_pipeline(forgetting=forgetting_weight > 0)

    # ------------------------------------------------------------------ configuration
    def recall_pipeline(self, *, forgetting: bool = True) -> Pipeline:
        """The retrieval pipeline of recalls, with or without the forgetting re-weighting.

        Dense + lexical fusion and context spreading (the engine's defaults), then
        ``TimeDecay(factor=self.curve, weight=forgetting_weight)`` if ``forgetting``.
        """
        from memories_core.retrieval import TimeDecay

        base = (self.fusion or self.engine.retriever.fusion).pipeline()
        if not forgetting or self.forgetting_weight == 0:
            return base
        decay = TimeDecay(factor=self.curve, weight=self.forgetting_weight)
        return dataclasses.replace(base, rerankers=(*base.rerankers, decay))

    @property
    def _open_day_key(self) -> str:
        return f"{self.name}.open_day"

    def open_day(self, user_id: str) -> str | None:
        """The user's day still being talked about (not consolidated by rollover yet)."""
        value = self.store.get_state(self._open_day_key, user_id=check_user_id(user_id))
        return None if value is None else str(value)

    # ------------------------------------------------------------------ recall (§2.2)
    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Recall turns and daily summaries; the context adds the portrait and global summary.

        Recalled memories are reinforced (``S += 1``, ``last_recalled_at = now``), and so are
        the global portrait and summary the context shows (they were recalled too, §2.3).

        Raises:
            InvalidInputError: on an empty query or a bad ``k``.
            MissingUserError: if ``scope`` has no user.
        """
        scope = _scope(scope)
        when = resolve_now(now, self.clock)  # one instant for the search, reinforcement, context
        hits = self._search(query, scope, k=self.default_k if k is None else k, now=when)
        shown = self._globals_of(scope.user_id, when)
        if self.reinforce and shown:
            self.reinforce_records(scope.user_id, [r.id for r in shown], when)
        return Recall(query=query, records=tuple(hits), context=self._context(hits, shown))

    def portrait(self, user_id: str, now: datetime | None = None) -> str | None:
        """The user's global portrait (§2.1) live at ``now`` (default: the clock's), or ``None``."""
        return self._latest(user_id, GLOBAL_PORTRAIT, now)

    def global_summary(self, user_id: str, now: datetime | None = None) -> str | None:
        """The user's global event summary (§2.1) live at ``now`` (default: the clock's)."""
        return self._latest(user_id, GLOBAL_SUMMARY, now)

    def _latest(self, user_id: str, kind: str, now: datetime | None) -> str | None:
        when = resolve_now(now, self.clock)
        found = [r for r in self._globals_of(user_id, when) if r.kind == kind]
        return found[0].text if found else None

    def _globals_of(self, user_id: str, now: datetime) -> list[MemoryRecord]:
        """The global portrait and summary live at ``now``, in that order (either may be absent)."""
        found = self.engine.records(
            check_user_id(user_id),
            where={"kind": {"$in": [GLOBAL_PORTRAIT, GLOBAL_SUMMARY]}, "archived": False},
        )
        live = [r for r in found if r.state.is_live(now)]
        latest = {r.kind: r for r in live}  # oldest first: the last of a kind wins
        return [latest[kind] for kind in (GLOBAL_PORTRAIT, GLOBAL_SUMMARY) if kind in latest]

    def _context(self, hits: Sequence[ScoredRecord], shown: Sequence[MemoryRecord]) -> str:
        text = {r.kind: r.text for r in shown if r.text}
        return self.compose_context(
            self._render(hits) if hits else "",
            text.get(GLOBAL_PORTRAIT),
            text.get(GLOBAL_SUMMARY),
        )

    @staticmethod
    def compose_context(memories: str, portrait: str | None, summary: str | None) -> str:
        """The prompt block of §3's three parts: the relevant memories, the portrait, the summary.

        ``recall``'s context and the LangChain retriever's ``render`` both use it, so a chain
        and a block prompt alike. Measured (BENCHMARKS.md, "Answer quality end to end (LoCoMo
        QA): does memory make the assistant answer better?"): with the portrait and summary
        first (a prefix every query of a user shares, which a runtime could read once) F1
        fell from 0.372 to 0.351 on the same memories, temporal questions from 0.590 to 0.515
        (the reader took dates from the summary), for 3 s less per answer; so the query's
        memories lead.
        """
        parts: list[str] = []
        if memories:
            parts.append("Relevant memories:\n" + memories)
        if portrait:
            parts.append(f"User portrait: {portrait}")
        if summary:
            parts.append(f"Summary of past events: {summary}")
        return "\n\n".join(parts)

    def _render(self, hits: Sequence[ScoredRecord]) -> str:
        lines = []
        for hit in hits:
            record = hit.record
            if record.kind == "turn":
                lines.append(f"[{memory_time(record.created_at)}] {record.text}")
            else:
                lines.append(f"[{_day_label(record)}, summary of the day] {record.text}")
        return "\n".join(lines)

    def _on_recalled(self, hits: list[ScoredRecord], now: datetime) -> None:
        """Reinforce what was recalled (§2.3), unless ``reinforce`` is off."""
        if self.reinforce and hits:
            self.reinforce_records(hits[0].record.user_id, [h.record.id for h in hits], now)

    def reinforce_records(
        self, user_id: str, ids: Sequence[str], now: datetime | None = None
    ) -> int:
        """Reinforce recalled memories (§2.3): ``S += 1``, ``t`` reset, recall count + 1.

        Recalls do this themselves; adapters call it for records that reached the app
        another way (e.g. the forgetting postprocessor over nodes from this store).

        Returns:
            How many of ``ids`` were found and reinforced.
        """
        check_user_id(user_id)
        when = ensure_utc(now) if now is not None else self.clock.now()
        with self.engine.user_lock(user_id), self.engine.transaction():
            # Read the state under the user's lock: concurrent recalls lose no increment.
            current = self.engine.get(user_id, list(dict.fromkeys(ids)))
            changes = {
                r.id: {
                    "strength": r.state.strength + 1,
                    "last_recalled_at": when,
                    "recall_count": r.state.recall_count + 1,
                }
                for r in current
            }
            if changes:
                self.engine.update_state(user_id, changes, reason="recalled", at=when)
        return len(changes)

    # ------------------------------------------------------------------ forgetting (§2.3)
    def retention(self, record: MemoryRecord, now: datetime | None = None) -> float:
        """Retention ``R`` of a record at ``now`` (whatever its kind)."""
        curve = dataclasses.replace(self.curve, kinds=None)
        return curve(record, ensure_utc(now) if now is not None else self.clock.now())

    def forget(
        self,
        user_id: str,
        now: datetime | None = None,
        *,
        policy: ForgetPolicy = "stochastic",
        seed: int | None = None,
        threshold: float = 0.1,
        hard_delete: bool = False,
        include_summaries: bool | None = None,
    ) -> ForgetReport:
        """Forget memories of ``user_id`` by the forgetting curve (§2.3).

        Each live turn (and daily summary and note, if ``include_summaries``; default:
        ``summaries_decay``) gets its retention at ``now``; ``policy`` picks what to forget
        (:func:`~memories_core.mechanisms.forgetting.choose_forgotten`: ``"stochastic"``
        draws from ``random.Random(seed)``, ``"threshold"`` forgets ``R < threshold``).
        Forgotten memories are archived (``reason="forgotten (<policy>)"``) in one
        transaction: never recalled, listed by :meth:`forgotten`, restorable with
        :meth:`restore`. ``hard_delete=True`` deletes them instead (kept in the history).
        Global summaries and portraits are never forgotten.

        Returns:
            A :class:`ForgetReport`.
        """
        check_user_id(user_id)
        when = ensure_utc(now) if now is not None else self.clock.now()
        include = self.summaries_decay if include_summaries is None else include_summaries
        kinds = ["turn", DAILY_SUMMARY, DAILY_PORTRAIT] if include else ["turn"]
        curve = dataclasses.replace(self.curve, kinds=None)
        where = {"kind": {"$in": kinds}, "archived": False}
        with self.engine.user_lock(user_id), self.engine.transaction():
            live = self.engine.records(user_id, where=where)
            # Draw in an order that does not depend on random record ids, so that a fixed
            # clock and seed forget the same memories in every replay.
            keys = {_stable_key(r): r.id for r in live}
            drawn = choose_forgotten(
                ((key, curve(r, when)) for r in live for key in [_stable_key(r)]),
                policy=policy,
                seed=seed,
                threshold=threshold,
            )
            chosen = sorted(keys[key] for key in drawn)
            if chosen and not hard_delete:
                self.engine.update_state(
                    user_id,
                    {item: {"archived": True} for item in chosen},
                    reason=f"forgotten ({policy})",
                    at=when,
                )
        if chosen and hard_delete:
            self.engine.delete_records(user_id, chosen, reason=f"forgotten ({policy})")
        return ForgetReport(len(live), tuple(chosen), hard_delete and bool(chosen), policy)

    def forgotten(self, user_id: str) -> list[MemoryRecord]:
        """The user's archived (forgotten) memories, oldest first."""
        return self.engine.records(check_user_id(user_id), where={"archived": True})

    def restore(self, user_id: str, ids: Sequence[str] | None = None) -> int:
        """Bring forgotten memories back (all of the user's, or ``ids``); returns how many.

        Restored memories keep their strength; ``t`` still counts from their last recall.
        """
        check_user_id(user_id)
        with self.engine.user_lock(user_id), self.engine.transaction():
            archived = {r.id for r in self.forgotten(user_id)}
            chosen = sorted(archived if ids is None else archived & set(ids))
            if chosen:
                self.engine.update_state(
                    user_id, {item: {"archived": False} for item in chosen}, reason="restored"
                )
        return len(chosen)

    async def aforget(self, user_id: str, now: datetime | None = None, **kwargs: Any) -> Any:
        """Async twin of :meth:`forget`."""
        return await asyncio.to_thread(self.forget, user_id, now, **kwargs)

    # ------------------------------------------------------------------ consolidation (§2.1)
    def consolidate(self, user_id: str | Scope, day: str | date | datetime | None = None) -> int:
        """Summarise ``day`` (default: the open day) now and refresh the global records.

        Returns:
            How many of this memory's jobs remain pending for the user (0 if all succeeded).
        """
        user = user_id.user_id if isinstance(user_id, Scope) else check_user_id(user_id)
        target = _as_day(day) if day is not None else self.open_day(user)
        if target is None:
            return len(self.pending(user))
        jobs = self._day_jobs([target])
        self.engine.enqueue(user, jobs)
        keys = {job.key for job in jobs}
        first = [j.id for j in self.pending(user) if j.key in keys]
        return self.engine.run_pending(user, first=first, mechanism=self.name)

    async def aconsolidate(
        self, user_id: str | Scope, day: str | date | datetime | None = None
    ) -> int:
        """Async twin of :meth:`consolidate`."""
        return await asyncio.to_thread(self.consolidate, user_id, day)

    def _day_jobs(self, days: Iterable[str]) -> list[JobSpec]:
        """Consolidation of ``days``, then (with ``archive_below``) the scheduled forgetting."""
        jobs = [JobSpec(self.name, "day", f"day:{day}", {"day": day}) for day in sorted(days)]
        if jobs and self.archive_below is not None:
            last = jobs[-1].payload["day"]
            jobs.append(JobSpec(self.name, "forget", f"forget:{last}", {"day": last}))
        return jobs

    def _turn_jobs(self, records: Sequence[MemoryRecord]) -> Iterable[JobSpec]:
        """Close the days these turns end (inside the save's transaction, no model calls).

        A turn dated after the user's open day closes it (and any day in between that these
        turns touch); a late turn of an already closed day refreshes that day.
        """
        if not records:
            return []
        user_id = records[0].user_id
        days = sorted({_day(r.created_at) for r in records})
        opened = self.open_day(user_id)
        newest = days[-1]
        if opened is None:
            closing = set(days[:-1])
            open_day = newest
        else:
            closing = {d for d in days if d != newest and d != opened}
            if newest > opened:
                closing.add(opened)
            open_day = max(opened, newest)
            if newest < opened:
                closing.add(newest)
        if open_day != opened:
            self.engine.set_user_state(user_id, self._open_day_key, open_day)
        return self._day_jobs(closing)

    def _session_jobs(self, user_id: str, session_id: str) -> Iterable[JobSpec]:
        if not self.consolidate_on_session_end:
            return []
        turns = self.engine.records(user_id, where={"kind": "turn", "session_id": session_id})
        return self._day_jobs({_day(r.created_at) for r in turns})

    def _run_job(self, job: Job) -> Derivation | None:
        if job.kind == "forget":
            return self._scheduled_forgetting(job.user_id)
        return self._consolidate_day(job)

    def _scheduled_forgetting(self, user_id: str) -> Derivation | None:
        """Archive what fell below ``archive_below`` now (§2.3), as part of consolidation.

        Committed with the job; no model call. Same kinds and curve as :meth:`forget` with
        ``policy="threshold"``; global records are never archived.
        """
        if self.archive_below is None:  # the option was turned off after scheduling
            return None
        now = self.clock.now()
        chosen = self._below(user_id, self.archive_below, now, self.summaries_decay)
        if not chosen:
            return None
        return Derivation(
            state={item: {"archived": True} for item in chosen},
            reason="forgotten (scheduled threshold)",
        )

    def _below(self, user_id: str, threshold: float, now: datetime, summaries: bool) -> list[str]:
        """Ids of live memories with ``R < threshold`` at ``now``, in id order."""
        kinds = ["turn", DAILY_SUMMARY, DAILY_PORTRAIT] if summaries else ["turn"]
        live = self.engine.records(user_id, where={"kind": {"$in": kinds}, "archived": False})
        return choose_forgotten(
            ((r.id, self._any_kind(r, now)) for r in live), policy="threshold", threshold=threshold
        )

    def _any_kind(self, record: MemoryRecord, now: datetime) -> float:
        return dataclasses.replace(self.curve, kinds=None)(record, now)

    def _consolidate_day(self, job: Job) -> Derivation | None:
        user_id = job.user_id
        day = str(job.payload["day"])
        start = datetime.fromisoformat(day).replace(tzinfo=timezone.utc)
        turns = self.engine.records(
            user_id, where={"kind": "turn"}, since=start, until=start + timedelta(days=1)
        )
        previous = self.engine.records(
            user_id, where={"kind": {"$in": [DAILY_SUMMARY, DAILY_PORTRAIT]}, "day": day}
        )
        old_daily = [r.id for r in previous]
        if not turns:
            return Derivation(replace=old_daily) if old_daily else None
        basis = _basis(turns)
        if _written_from(previous, basis):
            # The session end closed the day, then the next day's first turn closed it
            # again: §2.2 summarises a day's events once, so there is nothing to do until a
            # turn of the day is added or edited.
            return None
        llm = self._llm(Scope(user_id))
        dialogue = fit_recent([r.text[:2000] for r in turns], self.max_dialogue_chars)
        payload: dict[str, Any] = dict(job.payload)
        if payload.get("basis") != basis:  # turns added or edited since a failed attempt
            payload = {"day": day, "basis": basis}
        if "summary" not in payload:
            payload["summary"] = self._ask(
                llm, DAILY_SUMMARY_PROMPT, DayInput(day, tuple(dialogue)), f"daily summary of {day}"
            )
            self.engine.update_job(job, payload)
        if "portrait" not in payload:
            payload["portrait"] = self._ask(
                llm,
                DAILY_PORTRAIT_PROMPT,
                DayInput(day, tuple(dialogue)),
                f"personality note of {day}",
            )
            self.engine.update_job(job, payload)
        at = turns[-1].created_at
        meta = {"day": day, "turn_count": len(turns), "basis": basis}
        sources = tuple(r.id for r in turns)
        rejected: list[str] = []
        texts = {
            DAILY_SUMMARY: self._grounded(payload["summary"], dialogue, DAILY_SUMMARY, rejected),
            DAILY_PORTRAIT: self._grounded(payload["portrait"], dialogue, DAILY_PORTRAIT, rejected),
        }
        dailies = {
            kind: MemoryRecord(new_id(), user_id, kind, text, at, None, meta, sources)
            for kind, text in texts.items()
            if text is not None
        }
        globals_ = self._globals(llm, user_id, day, dailies, rejected)
        previous += self.engine.records(
            user_id, where={"kind": {"$in": [GLOBAL_SUMMARY, GLOBAL_PORTRAIT]}}
        )
        fresh = [*dailies.values(), *globals_]
        # A rejected rewrite keeps the record it would have replaced.
        written = {r.kind for r in fresh}
        replaced = [r for r in previous if r.kind in written]
        return Derivation(
            add=fresh,
            replace=[r.id for r in replaced],
            state=_carried_over(replaced, fresh),
            reason="; ".join(["rewritten (strength carried over)", *rejected]),
        )

    def _grounded(
        self, text: str, dialogue: Sequence[str], kind: str, rejected: list[str]
    ) -> str | None:
        """``text`` if grounded in ``dialogue`` (:mod:`memories_core.grounding`), else ``None``.

        A rejection is logged, counted in ``usage.failures["grounding"]`` and its reason
        appended to ``rejected``; the record is then not written and its predecessor kept.
        """
        rejection = find_ungrounded({kind: text}, dialogue)
        if rejection is None:
            return text
        rejected.append(log_rejection(self.name, kind.replace("_", " "), rejection))
        self.engine.count_failure("grounding")
        return None

    def _globals(
        self,
        llm: LLM,
        user_id: str,
        day: str,
        dailies: Mapping[str, MemoryRecord],
        rejected: list[str],
    ) -> list[MemoryRecord]:
        """The global summary and portrait from every day's records (this day's new ones).

        A global record is rewritten only when this day's daily record of its kind was
        written, and only if the rewrite is grounded in the daily records it reads.
        """
        out: list[MemoryRecord] = []
        steps = (
            (GLOBAL_SUMMARY, DAILY_SUMMARY, GLOBAL_SUMMARY_PROMPT),
            (GLOBAL_PORTRAIT, DAILY_PORTRAIT, GLOBAL_PORTRAIT_PROMPT),
        )
        for kind, daily_kind, spec in steps:
            fresh = dailies.get(daily_kind)
            if fresh is None:
                continue
            daily = [
                r
                for r in self.engine.records(user_id, where={"kind": fresh.kind})
                if r.metadata.get("day") != day
            ]
            daily = sorted([*daily, fresh], key=lambda r: (str(r.metadata.get("day")), r.id))
            lines = fit_recent([f"[{r.metadata.get('day')}] {r.text}" for r in daily], 12_000)
            text = self._ask(llm, spec, DaysInput(tuple(lines)), kind.replace("_", " "))
            if self._grounded(text, lines, kind, rejected) is None:
                continue
            out.append(
                MemoryRecord(
                    id=new_id(),
                    user_id=user_id,
                    kind=kind,
                    text=text,
                    created_at=max(r.created_at for r in daily),
                    metadata={"days": [str(r.metadata.get("day")) for r in daily]},
                    source_ids=tuple(r.id for r in daily),
                )
            )
        return out

    def _ask(self, llm: LLM, spec: PromptSpec[In, str], inputs: In, what: str) -> str:
        """Run one of the four prompts (with the caller's override, if any) for a job."""
        try:
            return run_spec(
                llm, self.prompt_spec(spec), inputs, max_tokens=OUTPUT_TOKENS.get(spec.name)
            )
        except (LLMError, ParseError) as exc:
            raise JobFailed(spec.name, f"{what} failed: {exc}") from exc


def _written_from(daily: Sequence[MemoryRecord], basis: str) -> bool:
    """Whether ``daily`` is a day's summary and note, both written from turns of ``basis``."""
    kinds = sorted(r.kind for r in daily)
    same = all(r.metadata.get("basis") == basis for r in daily)
    return kinds == sorted([DAILY_SUMMARY, DAILY_PORTRAIT]) and same


def _basis(turns: Sequence[MemoryRecord]) -> str:
    """A fingerprint of a day's turns (ids and texts).

    A half-done job and the daily records it writes carry it: both are current only while
    the day's turns are the ones they were made from.
    """
    digest = hashlib.sha256()
    for record in sorted(turns, key=lambda r: r.id):
        digest.update(f"{record.id}\0{record.text}\0".encode())
    return digest.hexdigest()[:32]


def _carried_over(
    previous: Sequence[MemoryRecord], fresh: Sequence[MemoryRecord]
) -> dict[str, dict[str, Any]]:
    """State that a rewritten record takes over from the record of its kind it replaces.

    A day's refreshed summary, or a rewritten global summary or portrait, is the same memory
    in new words: its strength, recall count and last recall stay on the curve (§2.3).
    An archived predecessor is not carried over (the rewrite starts live and fresh).
    """
    before = {(r.kind, r.metadata.get("day")): r for r in previous if not r.state.archived}
    changes: dict[str, dict[str, Any]] = {}
    for record in fresh:
        old = before.get((record.kind, record.metadata.get("day")))
        if old is None or (old.state.strength == 1 and old.state.recall_count == 0):
            continue
        change: dict[str, Any] = {
            "strength": old.state.strength,
            "recall_count": old.state.recall_count,
        }
        recalled = old.state.last_recalled_at
        if recalled is not None and recalled > record.created_at:  # else t runs from now on
            change["last_recalled_at"] = recalled
        changes[record.id] = change
    return changes


#: Output cap of each consolidation prompt (tokens). A summary is a few sentences (§2.1);
#: without a cap a slow local model can spend minutes on one rambling answer, and a cut-off
#: answer is still a usable (if truncated) summary.
OUTPUT_TOKENS: dict[str, int] = {
    "memorybank.daily_summary": 160,
    "memorybank.daily_portrait": 96,
    "memorybank.global_summary": 200,
    "memorybank.global_portrait": 96,
}


def _scope(scope: Any) -> Scope:
    return check_scope(scope)


def _day_label(record: MemoryRecord) -> str:
    """The day a daily record covers, shown as people write it (``"8 May 2023"``)."""
    day = record.metadata.get("day")
    try:
        when = datetime.fromisoformat(str(day)) if day else record.created_at
    except ValueError:
        return str(day)
    return memory_time(when, time_of_day=False)
