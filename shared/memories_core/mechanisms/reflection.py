"""Self-reflective retrieval around any recall.

Yuan et al., §3.2 "Self-Reflection on Memory", appendix C.3, Table 19 and Table 5.

After retrieval the LLM judges whether the candidates suffice to respond. If they do, it copies
the relevant sentences (``<Memory>``) and the candidates they came from become the recall. If
not, it names keywords (``<Query>``); the query is extended with them and retrieval repeats, at
most ``max_rounds`` times (the paper allows one round, Table 5).

:class:`SelfReflectiveMemory` shows the model each candidate after its date, as the wrapped
memory dates its lines, and gives the reader the selected records as the wrapped memory renders
them. The paper's reader reads the copied sentences; here the copy selects, and the records
themselves are read, because the local model's copies dropped the dates that temporal
questions need (see ``BENCHMARKS.md``, "Answer quality").

:class:`SelfReflectiveRetrieval` is the loop, generic over what a search returns, so the
LangChain and LlamaIndex adapters reuse it around their own retrievers;
:class:`SelfReflectiveMemory` wraps any mechanism's ``recall`` with it. The loop is written
once, as a generator that yields the searches and reflection calls it needs;
:meth:`SelfReflectiveRetrieval.run` and :meth:`SelfReflectiveRetrieval.arun` only perform
them, blocking or async. Each reflection call goes through
:func:`~memories_core.prompts.spec.run_spec` with the :data:`~memories_core.prompts.
reflection.REFLECTION` spec, so models with structured output answer in JSON.

A recall never waits on the model past its ``budget`` (seconds for all reflection calls of
one recall): past it the recall returns the first search's candidates as they are, the same
documented fallback as a failed reflection, counted in ``usage.failures["reflection_timeout"]``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, ClassVar, Generic, TypeAlias, TypeVar

from memories_core.clock import dated_line
from memories_core.errors import ConfigurationError, LLMError, LLMTimeoutError, ParseError
from memories_core.interfaces import LLM, LLMRouter, Mechanism
from memories_core.llms.base import llm_for_scope, run_with_timeout
from memories_core.mechanisms.base import render_hits
from memories_core.prompts.overrides import PromptOverrides
from memories_core.prompts.reflection import REFLECTION, ReflectionInput, ReflectionVerdict
from memories_core.prompts.spec import PromptSpec, arun_spec, run_spec
from memories_core.types import Recall, Scope, ScoredRecord, Turn
from memories_core.usage import MemoryUsage, UsageCounter

__all__ = [
    "DEFAULT_RECALL_BUDGET",
    "ReflectionResult",
    "SelfReflectiveMemory",
    "SelfReflectiveRetrieval",
]

#: Seconds a recall may spend waiting on reflection calls before it falls back to the first
#: search's candidates.
DEFAULT_RECALL_BUDGET = 30.0

logger = logging.getLogger(__name__)

T = TypeVar("T")
_WORD = re.compile(r"\w{3,}", re.UNICODE)


@dataclass(frozen=True)
class ReflectionResult(Generic[T]):
    """What one reflective retrieval found.

    Attributes:
        items: The final candidates: those the model selected when it judged them enough,
            otherwise the last retrieval's candidates.
        memory: The sentences the model copied (``None`` if it never judged them enough or
            the reflection failed).
        queries: Every query that was searched, the original first.
        keywords: The keywords the model asked for, over all rounds.
        llm_calls: Reflection rounds that called the model (a repair retry inside a round is
            not counted here; the model's own ``usage`` counts every call).
        failed: Whether a reflection call failed (the candidates are then used as they are).
        timed_out: Whether the time budget ran out (the first search's candidates are used).
    """

    items: list[T]
    memory: str | None
    queries: list[str] = field(default_factory=list)
    keywords: tuple[str, ...] = ()
    llm_calls: int = 0
    failed: bool = False
    timed_out: bool = False

    @property
    def rounds(self) -> int:
        """Retrieval rounds performed (1 = no query expansion)."""
        return len(self.queries)


@dataclass(frozen=True)
class _Search:
    query: str


@dataclass(frozen=True)
class _Reflect:
    inputs: ReflectionInput


_Steps: TypeAlias = Generator["_Search | _Reflect", Any, ReflectionResult[T]]


class SelfReflectiveRetrieval:
    """The reflect-then-maybe-search-again loop, generic over the search function.

    Args:
        llm: Judges the candidates.
        max_rounds: Reflection rounds, hence query expansions, allowed (paper: 1).
        budget: Seconds one retrieval may wait on reflection calls in all (``None``: no
            limit). Past it the first search's candidates are returned.
        prompts: System instructions instead of the defaults: ``reflection`` (Table 19's
            tagged prompt; must keep ``<Memory>`` and ``<Query>``) and ``reflection.json``
            (its JSON twin, for models with structured output; must keep the field names
            ``enough``, ``memory``, ``keywords``). Both the "is it enough?" judgement and
            the query expansion are this one prompt's two outcomes.

    Raises:
        ConfigurationError: if ``max_rounds`` is negative or ``budget`` not positive.
        PromptOverrideError: on an override of another prompt, or one that drops the
            output format (a ``ConfigurationError``).
    """

    #: The prompts this loop runs (their names are the keys of ``prompts=``).
    prompt_specs: ClassVar[tuple[PromptSpec[Any, Any], ...]] = (REFLECTION,)

    def __init__(
        self,
        llm: LLM,
        *,
        max_rounds: int = 1,
        budget: float | None = DEFAULT_RECALL_BUDGET,
        prompts: PromptOverrides | Mapping[str, str] | None = None,
    ) -> None:
        self.prompt_overrides = PromptOverrides.of(prompts).check(self.prompt_specs)
        #: The reflection prompt as this loop runs it (with the caller's overrides).
        self.spec = self.prompt_overrides.apply(REFLECTION)
        if max_rounds < 0:
            raise ConfigurationError("max_rounds must be >= 0")
        if budget is not None and (
            isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget <= 0
        ):
            raise ConfigurationError(f"budget must be a positive number or None, got {budget!r}")
        self.llm = llm
        self.max_rounds = max_rounds
        self.budget = None if budget is None else float(budget)
        self.failures = UsageCounter()
        self.timeouts = UsageCounter()

    def run(
        self,
        query: str,
        search: Callable[[str], Sequence[T]],
        text_of: Callable[[T], str],
        *,
        llm: LLM | None = None,
        shown: Callable[[T], str] | None = None,
    ) -> ReflectionResult[T]:
        """Search, reflect, and search again with an extended query while allowed.

        Each round is one reflection call; on ``<Query>`` the query is extended and searched
        again. After the last allowed round the latest candidates are returned as they are,
        so ``max_rounds=1`` costs one LLM call and at most two searches (``0``: no call).

        Args:
            query: The user input.
            search: Query -> candidates.
            text_of: Candidate -> its text: shown to the model, and what the copied
                sentences are matched against to select candidates.
            llm: The model for this call (e.g. a per-user model); default :attr:`llm`.
            shown: Candidate -> what the model is shown instead of ``text_of`` (e.g. the
                text with its date); the selection still matches ``text_of``.
        """
        model = llm or self.llm
        deadline = self._deadline()
        steps = self._steps(query, text_of, shown or text_of)
        step = next(steps)
        while True:
            reply: Any
            if isinstance(step, _Search):
                reply = search(step.query)
            else:
                try:
                    reply = run_with_timeout(
                        partial(run_spec, model, self.spec, step.inputs),
                        _left(deadline),
                        label="self-reflection",
                    )
                except (LLMError, ParseError) as exc:
                    reply = exc
            try:
                step = steps.send(reply)
            except StopIteration as done:
                return done.value

    async def arun(
        self,
        query: str,
        search: Callable[[str], Awaitable[Sequence[T]]],
        text_of: Callable[[T], str],
        *,
        llm: LLM | None = None,
        shown: Callable[[T], str] | None = None,
    ) -> ReflectionResult[T]:
        """Async twin of :meth:`run` with an async search function (the same loop)."""
        model = llm or self.llm
        deadline = self._deadline()
        steps = self._steps(query, text_of, shown or text_of)
        step = next(steps)
        while True:
            reply: Any
            if isinstance(step, _Search):
                reply = await search(step.query)
            else:
                left = _left(deadline)
                try:
                    if left is not None and left <= 0:
                        raise LLMTimeoutError("self-reflection: no time left", timeout=0.0)
                    reply = await asyncio.wait_for(arun_spec(model, self.spec, step.inputs), left)
                except TimeoutError as exc:
                    reply = (
                        exc
                        if isinstance(exc, LLMTimeoutError)
                        else LLMTimeoutError(
                            f"self-reflection gave no answer within {left:g} s",
                            timeout=left or 0.0,
                        )
                    )
                except (LLMError, ParseError) as exc:
                    reply = exc
            try:
                step = steps.send(reply)
            except StopIteration as done:
                return done.value

    def _deadline(self) -> float | None:
        return None if self.budget is None else time.monotonic() + self.budget

    def _steps(
        self, query: str, text_of: Callable[[T], str], shown: Callable[[T], str]
    ) -> _Steps[T]:
        """The loop itself: yields searches and reflections, receives their results.

        A reflection's result is a :class:`ReflectionVerdict`, or the ``LLMError`` /
        ``ParseError`` it raised (then the candidates are used as retrieved).
        """
        queries = [query]
        keywords: list[str] = []
        items: list[T] = list((yield _Search(query)))
        first = items
        calls = 0
        for _ in range(self.max_rounds):
            calls += 1
            verdict = yield _Reflect(ReflectionInput(query, tuple(shown(i) for i in items)))
            if isinstance(verdict, LLMTimeoutError):
                return self._timed_out(first, queries, calls, keywords, verdict)
            if isinstance(verdict, Exception):
                return self._failed(items, queries, calls, keywords, verdict)
            done = self._settle(verdict, items, queries, calls, text_of, keywords)
            if done is not None:
                return done
            keywords.extend(verdict.keywords)
            queries.append(_extend(queries[-1], verdict.keywords))
            items = list((yield _Search(queries[-1])))
        return ReflectionResult(
            items=items, memory=None, queries=queries, keywords=tuple(keywords), llm_calls=calls
        )

    def _settle(
        self,
        verdict: ReflectionVerdict,
        items: list[T],
        queries: list[str],
        calls: int,
        text_of: Callable[[T], str],
        keywords: list[str],
    ) -> ReflectionResult[T] | None:
        if verdict.memory is None:
            return None
        chosen = [i for i in items if _supports(verdict.memory, text_of(i))] or items
        return ReflectionResult(
            items=chosen,
            memory=verdict.memory,
            queries=queries,
            keywords=tuple(keywords),
            llm_calls=calls,
        )

    def _timed_out(
        self,
        first: list[T],
        queries: list[str],
        calls: int,
        keywords: list[str],
        error: LLMTimeoutError,
    ) -> ReflectionResult[T]:
        # Documented fallback: past the budget the recall returns the first search's result.
        self.timeouts.record(failures=1)
        logger.warning(
            "self-reflection ran out of its %s s time budget; using the first search "
            "(a local CPU model needs about a minute or more per reflection: pass "
            "budget=None to wait for it)",
            f"{self.budget:g}" if self.budget is not None else "?",
        )
        return ReflectionResult(
            items=first,
            memory=None,
            queries=queries,
            keywords=tuple(keywords),
            llm_calls=calls,
            failed=True,
            timed_out=True,
        )

    def _failed(
        self,
        items: list[T],
        queries: list[str],
        calls: int,
        keywords: list[str],
        error: Exception,
    ) -> ReflectionResult[T]:
        # Documented fallback: an unusable reflection keeps the candidates as retrieved.
        self.failures.record(failures=1)
        logger.warning(
            "self-reflection failed; using the candidates as retrieved: %s",
            type(error).__name__,
            exc_info=error,
        )
        return ReflectionResult(
            items=items,
            memory=None,
            queries=queries,
            keywords=tuple(keywords),
            llm_calls=calls,
            failed=True,
        )


class SelfReflectiveMemory:
    """Any mechanism, with self-reflective retrieval on its ``recall``.

    ``save`` and ``clear`` pass straight through; ``recall`` returns the records the model
    selected (or the last search's when it never judged them enough) and, as ``context``,
    those records rendered as ``base`` renders them, dates included. The model sees each
    candidate after its date; the sentences it copied are in :meth:`reflect`'s result
    (``memory``).

    Args:
        base: The mechanism to wrap (history, summary, conditional, multi-view, ...).
        llm: Judges the candidates.
        max_rounds: Query expansions allowed (paper: 1).
        llm_for: Optional ``llm_for`` hook: the model that reflects for a scope (e.g. a
            per-user model); ``None`` from the hook means ``llm``.
        budget: Seconds a recall may wait on the reflection calls; past it the recall
            returns the first search's records (``None``: no limit).
        prompts: Reflection instructions instead of the defaults (``reflection``,
            ``reflection.json``), as for :class:`SelfReflectiveRetrieval`.

    Raises:
        PromptOverrideError: on a bad override (see :class:`SelfReflectiveRetrieval`).
    """

    def __init__(
        self,
        base: Mechanism,
        llm: LLM,
        *,
        max_rounds: int = 1,
        llm_for: LLMRouter | None = None,
        budget: float | None = DEFAULT_RECALL_BUDGET,
        prompts: PromptOverrides | Mapping[str, str] | None = None,
    ) -> None:
        self.base = base
        self.reflection = SelfReflectiveRetrieval(
            llm, max_rounds=max_rounds, budget=budget, prompts=prompts
        )
        self.llm_for = llm_for
        # Every model that reflected (the default and routed ones), for usage.
        self._models: dict[int, LLM] = {id(llm): llm}
        self._models_lock = threading.Lock()

    def _model(self, scope: Scope) -> LLM:
        model = llm_for_scope(self.reflection.llm, self.llm_for, scope)
        with self._models_lock:
            self._models.setdefault(id(model), model)
        return model

    @property
    def usage(self) -> MemoryUsage:
        """The wrapped memory's usage plus the reflection's.

        ``llm`` adds the reflection models' calls and tokens to the wrapped memory's LLM
        (counted once when it is the same model); ``failures["reflection"]`` counts failed
        reflections (the candidates were then used as retrieved), and
        ``failures["reflection_timeout"]`` recalls that ran out of their time budget.
        """
        base: MemoryUsage = self.base.usage  # type: ignore[attr-defined]
        base_llm = getattr(self.base, "llm", None)
        with self._models_lock:
            models = [m for m in self._models.values() if m is not base_llm]
        total = base.llm
        for model in models:
            total = model.usage if total is None else total + model.usage
        failures = dict(base.failures)
        failures["reflection"] = (
            failures.get("reflection", 0) + self.reflection.failures.snapshot().failures
        )
        timeouts = self.reflection.timeouts.snapshot().failures
        if timeouts:
            failures["reflection_timeout"] = failures.get("reflection_timeout", 0) + timeouts
        return MemoryUsage(
            llm=total,
            embedder=base.embedder,
            failures=failures,
            finished_after=base.finished_after,
        )

    def save(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Save through the wrapped mechanism."""
        self.base.save(turns, scope)

    def reflect(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> ReflectionResult[ScoredRecord]:
        """Run the reflective retrieval and return its whole result.

        The result holds the queries, keywords, model calls and whether the reflection
        failed; :meth:`recall` returns the same as a ``Recall``.

        Returned per call, never kept on the instance: concurrent recalls of several users
        cannot see each other's results.
        """
        return self.reflection.run(
            query,
            lambda q: self.base.recall(q, scope, k=k, now=now).records,
            _text,
            llm=self._model(scope),
            shown=self._shown,
        )

    async def areflect(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> ReflectionResult[ScoredRecord]:
        """Async twin of :meth:`reflect`."""

        async def search(q: str) -> Sequence[ScoredRecord]:
            return (await self.base.arecall(q, scope, k=k, now=now)).records

        return await self.reflection.arun(
            query, search, _text, llm=self._model(scope), shown=self._shown
        )

    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Recall through the wrapped mechanism, reflecting on the candidates."""
        return _to_recall(query, self.reflect(query, scope, k=k, now=now), self.base)

    def _shown(self, hit: ScoredRecord) -> str:
        """A candidate as the model sees it: its text after its date, as the base dates lines.

        (The base's whole rendering would repeat group headings, e.g. DPeM's, per candidate.)
        """
        dated = getattr(self.base, "dated", None)
        if callable(dated):
            return str(dated(hit.record.text, hit.record.created_at))
        return dated_line(hit.record.text, hit.record.created_at)

    def clear(self, scope: Scope) -> None:
        """Clear through the wrapped mechanism."""
        self.base.clear(scope)

    def flush(
        self, user_id: str | None = None, *, timeout: float | None = None, progress: bool = False
    ) -> int:
        """Wait for the wrapped memory's pending derivations (its ``flush``; 0 if it has none)."""
        flush = getattr(self.base, "flush", None)
        return int(flush(user_id, timeout=timeout, progress=progress)) if flush else 0

    async def aclear(self, scope: Scope) -> None:
        """Async twin of :meth:`clear`."""
        await self.base.aclear(scope)

    async def asave(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Async twin of :meth:`save`."""
        await self.base.asave(turns, scope)

    async def arecall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Async twin of :meth:`recall`."""
        return _to_recall(query, await self.areflect(query, scope, k=k, now=now), self.base)

    def __getattr__(self, name: str) -> Any:
        # Mechanism-specific operations (end_session, retry_pending, usage, ...) stay reachable.
        return getattr(self.base, name)


def _text(hit: ScoredRecord) -> str:
    return hit.record.text


def _to_recall(query: str, result: ReflectionResult[ScoredRecord], base: Any = None) -> Recall:
    """The reflection's answer as a recall: the final records, rendered as the base renders them.

    When the model judged the candidates enough, the records are those its copied sentences
    came from (:attr:`ReflectionResult.memory` keeps the copy). The reader gets the records
    themselves, with their dates, rather than the copy: on LoCoMo the local model's copies
    dropped the dates and the reader answered "when" questions with the question's date.
    """
    return Recall(query=query, records=tuple(result.items), context=render_hits(base, result.items))


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


def _extend(query: str, keywords: Sequence[str]) -> str:
    """Append the keywords that the query does not already contain."""
    lowered = query.lower()
    new = [k for k in keywords if k.lower() not in lowered]
    return " ".join([query, *new]) if new else query


def _supports(memory: str, text: str) -> bool:
    """Whether the copied ``memory`` sentences came from candidate ``text``.

    A candidate is selected when half or more of its words (three letters or more) appear in
    the copied sentences: models copy, trim and rephrase slightly.
    """
    words = {w.lower() for w in _WORD.findall(text)}
    if not words:
        return False
    copied = {w.lower() for w in _WORD.findall(memory)}
    return len(words & copied) * 2 >= len(words)
