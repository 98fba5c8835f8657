"""A thin convenience every mechanism builds on: the public contract over a :class:`MemoryEngine`.

A mechanism is written against an engine: it attaches with a name and hooks
(:class:`~memories_core.engine.MechanismHooks`) and writes only its own rules: which jobs a
save or a session end creates (:meth:`MemoryBase._turn_jobs`, :meth:`MemoryBase._session_jobs`),
how one job runs (:meth:`MemoryBase._run_job`), which record kinds it recalls and how a recall
is rendered (:meth:`MemoryBase._render`). Storage, indexing, scoping, pending work, sessions,
deletion and cost accounting are the engine's.

Give ``engine=`` to share one engine (and one copy of the raw turns) between mechanisms, or
the storage options (``path``, ``embedder``, ...) to let the mechanism build its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from memories_core.clock import dated_line
from memories_core.engine import (
    CLOSE_TIMEOUT,
    Derivation,
    DeriveMode,
    MechanismHooks,
    MemoryEngine,
    check_k,
    check_scope,
    check_turns,
    turn_from_record,
)
from memories_core.errors import ConfigurationError
from memories_core.prompts.overrides import PromptOverrides
from memories_core.prompts.spec import PromptSpec
from memories_core.types import (
    Job,
    JobSpec,
    MemoryRecord,
    Recall,
    Scope,
    ScoredRecord,
    Turn,
    turns_from_texts,
)

if TYPE_CHECKING:
    from memories_core.background import WorkStatus
    from memories_core.interfaces import LLM, Clock, Embedder, RecordStore, VectorIndex
    from memories_core.retrieval import FusionConfig, HybridRetriever, Pipeline
    from memories_core.usage import MemoryUsage

__all__ = [
    "MemoryBase",
    "fit_recent",
    "flush_memory",
    "memory_status",
    "render_hits",
    "turn_from_record",
]

_UNSET: Any = object()

In = TypeVar("In")
Out = TypeVar("Out")


class MemoryBase:
    """Base of the built-in mechanisms: see the module docstring.

    Args:
        engine: The engine to attach to (shared with other mechanisms). Exclusive with the
            storage options below.
        path: Directory of this memory (SQLite records, embedded Chroma index, artifacts);
            ``None`` keeps everything in memory.
        embedder: Embeds records and queries. Default: all-MiniLM-L6-v2, bundled, offline.
        store: A record store instead of the one ``path`` would build.
        index: A vector index instead of the one ``path`` would build (e.g. a Chroma server).
        fusion: How dense and lexical rankings are fused for this mechanism's recalls.
        pipeline: A whole retrieval pipeline (sources, fusion, rerankers) for its recalls,
            instead of the one ``fusion`` describes.
        k: Records a recall returns when the caller does not say.
        clock: Source of "now".
        llm: This mechanism's model (``engine.llm_for(scope)`` may serve a user another one).
        session_gap: Idle gap that ends a session (engine option).
        allow_embedder_change: Re-embed everything if ``embedder`` differs from the store's.
        name: Name on the engine (default: the mechanism's :attr:`mechanism_name`).
        derive: Where derivations run (engine option): ``"background"`` (default; call
            :meth:`flush` to wait for them) or ``"inline"`` (inside ``save``).
        show_dates: Prefix each memory in a recall's rendered context with when it was said
            or formed (``[8 May 2023, 13:56] ...``), so the model can answer "when" questions
            and resolve "yesterday" in a remembered turn. Default on: measured on LoCoMo QA
            (BENCHMARKS.md, answer quality); ``False`` renders the bare texts.
        prompts: System instructions to use instead of the defaults, ``{prompt name:
            text}`` or a :class:`~memories_core.prompts.overrides.PromptOverrides`; the names
            are those of :attr:`prompt_specs`, and an override must keep the output format
            its parser reads (checked here, before anything is opened).

    Raises:
        ConfigurationError: on contradictory arguments or ``k`` out of range.
        PromptOverrideError: on an override of no prompt of the mechanism, or one that
            drops its output format (a ``ConfigurationError``).
        EmbedderMismatchError: if ``embedder`` differs from the store's.
    """

    #: The prompts this mechanism runs (their names are the keys of ``prompts=``).
    prompt_specs: ClassVar[tuple[PromptSpec[Any, Any], ...]] = ()
    #: Default name on the engine; pending jobs are stored under it.
    mechanism_name: ClassVar[str] = "memory"
    #: Record kinds this mechanism recalls (searched together, on one score scale).
    recall_kinds: ClassVar[tuple[str, ...]] = ()
    #: Whether raw turn records need vectors.
    index_turns: ClassVar[bool] = False

    def __init__(
        self,
        *,
        engine: MemoryEngine | None = None,
        path: str | Path | None = None,
        embedder: Embedder | None = None,
        store: RecordStore | None = None,
        index: VectorIndex | None = None,
        fusion: FusionConfig | None = None,
        pipeline: Pipeline | None = None,
        k: int = 3,
        clock: Clock | None = None,
        llm: LLM | None = None,
        session_gap: timedelta | None = _UNSET,
        allow_embedder_change: bool = False,
        name: str | None = None,
        derive: DeriveMode | None = None,
        show_dates: bool = True,
        prompts: PromptOverrides | Mapping[str, str] | None = None,
    ) -> None:
        try:
            k = check_k(k)
        except Exception as exc:
            raise ConfigurationError(f"k must be a positive int, got {k!r}") from exc
        self.prompt_overrides = PromptOverrides.of(prompts).check(self.prompt_specs)
        own: dict[str, Any] = {
            "path": path,
            "embedder": embedder,
            "store": store,
            "index": index,
            "clock": clock,
        }
        if engine is not None:
            given = [key for key, value in own.items() if value is not None]
            if given or allow_embedder_change or session_gap is not _UNSET or derive is not None:
                named = ", ".join(given) or ("derive" if derive is not None else "session_gap")
                raise ConfigurationError(
                    f"give engine= or storage options ({named}), not both: the engine owns "
                    "storage and its pending work"
                )
        else:
            options: dict[str, Any] = {"llm": llm, "allow_embedder_change": allow_embedder_change}
            if session_gap is not _UNSET:
                options["session_gap"] = session_gap
            if derive is not None:
                options["derive"] = derive
            engine = MemoryEngine(**own, **options)
            self._owns_engine = True
        self.engine: MemoryEngine = engine
        self._owns_engine = getattr(self, "_owns_engine", False)
        self.default_k = k
        self.show_dates = bool(show_dates)
        self.fusion = fusion
        self.pipeline = pipeline
        self.llm = llm
        self.name = name or self.mechanism_name
        engine.attach(
            MechanismHooks(
                name=self.name,
                index_turns=self.index_turns,
                on_turns=self._turn_jobs,
                on_session_end=self._session_jobs,
                run_job=self._run_job,
                on_delete_user=self._delete_user_data,
                prepare=self._prepare_jobs if self._batches_jobs() else None,
                batch_size=self._job_batch_size,
            )
        )
        # A late-interaction stage: the turns' token vectors are encoded by a pending job.
        from memories_core.retrieval.late_vectors import attach_token_vectors

        attach_token_vectors(engine, self.name, pipeline, self.recall_kinds)

    def prompt_spec(self, spec: PromptSpec[In, Out]) -> PromptSpec[In, Out]:
        """``spec`` as this mechanism runs it: with the caller's override, if any."""
        return self.prompt_overrides.apply(spec)

    # ------------------------------------------------------------------ parts (read-only)
    @property
    def path(self) -> Path | None:
        """The engine's directory (``None`` in memory)."""
        return self.engine.path

    @property
    def store(self) -> Any:
        """The engine's record store."""
        return self.engine.store

    @property
    def index(self) -> VectorIndex:
        """The engine's vector index."""
        return self.engine.index

    @property
    def embedder(self) -> Embedder:
        """The engine's embedder."""
        return self.engine.embedder

    @property
    def clock(self) -> Clock:
        """The engine's clock."""
        return self.engine.clock

    @property
    def retriever(self) -> HybridRetriever:
        """The engine's dense + lexical retriever."""
        return self.engine.retriever

    # ------------------------------------------------------------------ public contract
    def save(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Store ``turns`` for ``scope``, then derive this memory's records from them.

        The turns (and the jobs that derive from them) are written first, in one
        transaction, and the turns are indexed before ``save`` returns; the derivations run
        in the engine's background worker (:meth:`flush` waits for them) unless the engine
        was built with ``derive="inline"``. A failure of anything derived (vector index,
        LLM) is counted in :attr:`usage`, kept as pending work and retried, and never loses
        a turn.

        Raises:
            InvalidInputError: if ``turns`` is not a sequence of :class:`Turn` (nothing stored).
            MissingUserError: if ``scope`` has no user.
        """
        self.engine.save(turns, scope)

    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Return the ``k`` records most relevant to ``query`` for ``scope.user_id``.

        Args:
            query: Free text.
            scope: Whose memories.
            k: Records wanted (default: this memory's ``k``).
            now: The time of the recall (validity, decay); default: the clock's.

        Raises:
            InvalidInputError: on an empty query or a bad ``k``.
            MissingUserError: if ``scope`` has no user.
        """
        scope = check_scope(scope)
        hits = self._search(query, scope, k=self.default_k if k is None else k, now=now)
        return Recall(query=query, records=tuple(hits), context=self._render(hits))

    def clear(self, scope: Scope) -> None:
        """Forget ``scope.user_id``'s memories: one session's if ``scope.session_id`` is set."""
        self.engine.clear(scope)
        self._forget_pipeline_caches(scope.user_id)

    def end_session(self, scope: Scope) -> None:
        """End the user's session: mechanisms that summarise sessions derive their records now.

        Adapters call it when a conversation is over (e.g. LlamaIndex ``MemoryBlock.flush``).
        """
        self.engine.end_session(scope)

    def delete_user(self, user_id: str) -> None:
        """Erase everything of ``user_id`` (see :meth:`MemoryEngine.delete_user`)."""
        self.engine.delete_user(user_id)

    def retry_pending(self, user_id: str | None = None) -> int:
        """Retry this memory's pending derivations now, ignoring backoff.

        Returns:
            How many remain pending.
        """
        if user_id is not None:
            check_scope(Scope(user_id))
        return self.engine.run_pending(user_id, force=True, mechanism=self.name)

    def pending(self, user_id: str) -> list[Job]:
        """This memory's pending jobs for ``user_id``."""
        return self.engine.pending(user_id, mechanism=self.name)

    def flush(
        self, user_id: str | None = None, *, timeout: float | None = None, progress: bool = False
    ) -> int:
        """Wait for the pending derivations of ``user_id`` (default: everyone's).

        See :meth:`MemoryEngine.flush`: returns how many jobs are left (in backoff after a
        failure, or not reached within ``timeout`` seconds).
        """
        return self.engine.flush(user_id, timeout=timeout, progress=progress)

    def wait(
        self, user_id: str | None = None, *, timeout: float | None = None, progress: bool = False
    ) -> int:
        """Alias of :meth:`flush`."""
        return self.flush(user_id, timeout=timeout, progress=progress)

    async def aflush(self, user_id: str | None = None, *, timeout: float | None = None) -> int:
        """Async twin of :meth:`flush`."""
        return await self.engine.aflush(user_id, timeout=timeout)

    def status(self, user_id: str | None = None) -> WorkStatus:
        """This memory's pending, running and failed derivations (see ``MemoryEngine.status``)."""
        return self.engine.status(user_id, mechanism=self.name)

    async def asave(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Async twin of :meth:`save` (runs in a worker thread)."""
        await asyncio.to_thread(self.save, turns, scope)

    def answer_and_save(self, user_input: str, scope: Scope, answer: Callable[[], str]) -> str:
        """Call ``answer()`` for ``user_input`` and save the exchange as one save.

        The chat loops' rule (MemoChat's ``respond`` and the adapters' chat engines): the
        user's turn is never lost to the model. If ``answer`` raises, the input is saved alone
        and the error goes up; an empty answer is not saved, the input is; an input or answer
        over the turn limit is kept in parts (:func:`~memories_core.types.turns_from_texts`).
        An interrupt (``KeyboardInterrupt``, a cancelled task) saves nothing.

        Returns:
            The answer, stripped.
        """
        try:
            reply = answer().strip()
        except Exception:
            self.save(turns_from_texts([("user", user_input)]), scope)
            raise
        self.save(turns_from_texts([("user", user_input), ("assistant", reply)]), scope)
        return reply

    async def aanswer_and_save(
        self, user_input: str, scope: Scope, answer: Callable[[], Awaitable[str]]
    ) -> str:
        """Async twin of :meth:`answer_and_save` (``answer`` is awaited; saves with ``asave``)."""
        try:
            reply = (await answer()).strip()
        except Exception:
            await self.asave(turns_from_texts([("user", user_input)]), scope)
            raise
        await self.asave(turns_from_texts([("user", user_input), ("assistant", reply)]), scope)
        return reply

    async def arecall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Async twin of :meth:`recall` (runs in a worker thread)."""
        return await asyncio.to_thread(self.recall, query, scope, k=k, now=now)

    async def aclear(self, scope: Scope) -> None:
        """Async twin of :meth:`clear`."""
        await asyncio.to_thread(self.clear, scope)

    async def aend_session(self, scope: Scope) -> None:
        """Async twin of :meth:`end_session`."""
        await asyncio.to_thread(self.end_session, scope)

    async def adelete_user(self, user_id: str) -> None:
        """Async twin of :meth:`delete_user`."""
        await asyncio.to_thread(self.delete_user, user_id)

    def turns(self, scope: Scope) -> list[Turn]:
        """Every stored turn of ``scope.user_id`` (of one session if set), oldest first."""
        scope = check_scope(scope)
        where: dict[str, str] = {"kind": "turn"}
        if scope.session_id is not None:
            where["session_id"] = scope.session_id
        return [turn_from_record(r) for r in self.engine.records(scope.user_id, where=where)]

    def records(self, scope: Scope, *, kind: str | None = None) -> list[MemoryRecord]:
        """``scope.user_id``'s records of this memory's kinds (or ``kind``), oldest first."""
        scope = check_scope(scope)
        kinds = [kind] if kind is not None else list(self.recall_kinds)
        out: list[MemoryRecord] = []
        for name in kinds:
            where: dict[str, str] = {"kind": name}
            if scope.session_id is not None:
                where["session_id"] = scope.session_id
            out += self.engine.records(scope.user_id, where=where)
        return sorted(out, key=lambda r: r.created_at)

    def reindex(self, *, progress: bool = True) -> int:
        """Rebuild the vector index from the record store; returns the records indexed."""
        return self.engine.reindex(progress=progress)

    def prefetch(self, user_id: str, *, progress: bool = True) -> int:
        """Prepare ``user_id``'s first recall ahead of time (e.g. when the user signs in).

        The vector index loads the user's part now where it loads lazily (the embedded
        Chroma index reads a collection's graph on its first query in a process:
        :meth:`MemoryEngine.warm <memories_core.engine.MemoryEngine.warm>`). With the
        optional late-interaction reranker, every record also gets token vectors of the
        current encoder (stored with the record when the store keeps them; save jobs do this
        for new turns already), else its in-process cache is filled. Returns how many records
        got reranker data now (0 without such a reranker, or when all had theirs).
        """
        self.engine.warm(user_id)
        if self.pipeline is None:
            return 0
        return self.engine.prefetch(user_id, self.pipeline, progress=progress)

    @property
    def usage(self) -> MemoryUsage:
        """LLM and embedder usage, and failed derivations, of this memory so far."""
        from memories_core.usage import MemoryUsage

        llm = self.llm if self.llm is not None else self.engine.llm
        return MemoryUsage(
            llm=llm.usage if llm is not None else None,
            embedder=self.embedder.usage,
            failures=self.engine.failures,
            finished_after=self.engine.finished_after,
        )

    def close(self, *, timeout: float | None = CLOSE_TIMEOUT) -> None:
        """Close the engine (if this memory built it); see :meth:`MemoryEngine.close`.

        Args:
            timeout: Seconds to wait for a derivation in hand; the others stay pending and
                run after a reopen.
        """
        if self._owns_engine:
            self.engine.close(timeout=timeout)

    def __enter__(self) -> MemoryBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ hooks
    def _turn_jobs(self, records: Sequence[MemoryRecord]) -> Iterable[JobSpec]:
        """Jobs for freshly written turns (hook; inside the write transaction, no model calls)."""
        return ()

    def _session_jobs(self, user_id: str, session_id: str) -> Iterable[JobSpec]:
        """Jobs for an ended session (hook; inside the transaction, no model calls)."""
        return ()

    def _run_job(self, job: Job) -> Derivation | None:
        """Run one of this memory's jobs (hook; model calls happen here)."""
        return None

    def _prepare_jobs(self, jobs: Sequence[Job]) -> Mapping[str, BaseException]:
        """Make several jobs' model calls together, answers kept in their payloads (hook).

        A mechanism whose jobs' calls are independent of one another overrides it (see
        :attr:`~memories_core.interfaces.MechanismHooks.prepare`); returns the failed jobs.
        """
        return {}

    def _batches_jobs(self) -> bool:
        return type(self)._prepare_jobs is not MemoryBase._prepare_jobs

    def _job_batch_size(self) -> int:
        """Jobs prepared at once: what this memory's model decodes in one pass."""
        from memories_core.prompts.batch import batch_capacity

        return batch_capacity(self.llm if self.llm is not None else self.engine.llm)

    def _on_delete_user(self, user_id: str) -> None:
        """Remove what this memory keeps of ``user_id`` outside the engine (hook)."""

    def _forget_pipeline_caches(self, user_id: str) -> None:
        """Drop what this memory's pipeline stages cache of ``user_id``."""
        if self.pipeline is not None:
            self.pipeline.forget_user(user_id)

    def _delete_user_data(self, user_id: str) -> None:
        self._forget_pipeline_caches(user_id)
        self._on_delete_user(user_id)

    def render(self, hits: Sequence[ScoredRecord]) -> str:
        """``hits`` as this memory's recall renders them for a reader (its ``context``).

        For wrappers that choose records themselves (e.g. self-reflection) and must hand the
        reader the same block the memory would: dates, group headings and all.
        """
        return self._render(hits)

    def dated(self, text: str, when: datetime) -> str:
        """One memory line as this memory shows it: with :attr:`show_dates`, after its time."""
        return self._dated(text, when)

    def _render(self, hits: Sequence[ScoredRecord]) -> str:
        """Render recalled records as one prompt block (hook); one record a line.

        With :attr:`show_dates`, each line starts with the record's time, in the format
        MemoryBank's timestamped memory uses (Zhong et al. §2.1), so every mechanism's
        context carries the dates a reader needs for temporal questions.
        """
        return "\n".join(self._dated(hit.record.text, hit.record.created_at) for hit in hits)

    def _dated(self, text: str, when: datetime) -> str:
        """``text`` as one rendered line: with :attr:`show_dates`, after when it was said."""
        return dated_line(text, when if self.show_dates else None)

    def _llm(self, scope: Scope) -> LLM:
        """The model serving ``scope`` (``engine.llm_for`` hook, else this memory's)."""
        llm = self.engine.llm_for(scope, self.llm)
        if llm is None:
            raise ConfigurationError(f"{type(self).__name__} needs an llm")
        return llm

    # ------------------------------------------------------------------ helpers
    def _search(
        self, query: str, scope: Scope, *, k: int, now: datetime | None = None
    ) -> list[ScoredRecord]:
        return self.engine.search(
            query,
            scope.user_id,
            k=k,
            kinds=self.recall_kinds or None,
            now=now,
            fusion=self.fusion,
            pipeline=self.pipeline,
            on_recalled=self._on_recalled,
        )

    def _on_recalled(self, hits: list[ScoredRecord], now: datetime) -> None:
        """Called with what a recall returned (hook; e.g. reinforcement, MemoryBank §2.3)."""


def flush_memory(memory: Any, user_id: str | None = None, *, timeout: float | None = None) -> int:
    """Wait for ``memory``'s pending derivations of ``user_id`` (its ``flush``).

    For adapters, which hold any mechanism: one without ``flush`` (a third-party memory that
    derives nothing in the background) has nothing to wait for, and 0 is returned.
    """
    flush = getattr(memory, "flush", None)
    if not callable(flush):
        return 0
    return int(flush(user_id, timeout=timeout))


def render_hits(memory: Any, hits: Sequence[ScoredRecord]) -> str:
    """``hits`` as ``memory``'s recall renders them for a reader (its ``context``).

    For callers that hold any mechanism and pick records themselves (self-reflection's final
    records, MaLP's training prompts): a memory without ``render`` (a third-party one; the
    :class:`~memories_core.interfaces.Mechanism` protocol does not ask for it) gets one
    dated line per record, the built-in default.
    """
    render = getattr(memory, "render", None)
    if callable(render):
        return str(render(hits))
    return "\n".join(dated_line(hit.record.text, hit.record.created_at) for hit in hits)


def memory_status(memory: Any, user_id: str | None = None) -> WorkStatus | None:
    """``memory``'s pending, running and failed derivations (``None`` if it has no ``status``)."""
    status = getattr(memory, "status", None)
    if not callable(status):
        return None
    result: WorkStatus = status(user_id)
    return result


# Kept for callers of the 0.1 helpers.
_check_scope = check_scope
_check_turns = check_turns


def fit_recent(lines: list[str], limit: int) -> list[str]:
    """The most recent ``lines`` whose total length (a newline each) fits ``limit``.

    The newest line is always kept; the dialogue a model reads is cut from the oldest end.
    """
    kept: list[str] = []
    total = 0
    for line in reversed(lines):
        total += len(line) + 1
        if kept and total > limit:
            break
        kept.append(line)
    return list(reversed(kept))
