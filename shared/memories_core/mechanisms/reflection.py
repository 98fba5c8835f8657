"""Self-reflective retrieval around any recall.

Yuan et al., §3.2 "Self-Reflection on Memory", appendix C.3, Table 19 and Table 5.

After retrieval the LLM judges whether the candidates suffice to respond. If they do, it copies
the relevant sentences (``<Memory>``) and those become the recall. If not, it names keywords
(``<Query>``); the query is extended with them and retrieval repeats, at most ``max_rounds``
times (the paper allows one round, Table 5).

:class:`SelfReflectiveRetrieval` is the loop, generic over what a search returns, so the
LangChain and LlamaIndex adapters reuse it around their own retrievers;
:class:`SelfReflectiveMemory` wraps any mechanism's ``recall`` with it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from memories_core.errors import ConfigurationError, LLMError, ParseError
from memories_core.interfaces import LLM, Mechanism
from memories_core.parsing import agenerate_parsed, generate_parsed
from memories_core.prompts.reflection import (
    ReflectionVerdict,
    build_reflection_messages,
    parse_reflection,
)
from memories_core.types import Recall, Scope, ScoredRecord, Turn
from memories_core.usage import UsageCounter

__all__ = ["ReflectionResult", "SelfReflectiveMemory", "SelfReflectiveRetrieval"]

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
    """

    items: list[T]
    memory: str | None
    queries: list[str] = field(default_factory=list)
    keywords: tuple[str, ...] = ()
    llm_calls: int = 0
    failed: bool = False

    @property
    def rounds(self) -> int:
        """Retrieval rounds performed (1 = no query expansion)."""
        return len(self.queries)


class SelfReflectiveRetrieval:
    """The reflect-then-maybe-search-again loop, generic over the search function.

    Args:
        llm: Judges the candidates.
        max_rounds: Reflection rounds, hence query expansions, allowed (paper: 1).

    Raises:
        ConfigurationError: if ``max_rounds`` is negative.
    """

    def __init__(self, llm: LLM, *, max_rounds: int = 1) -> None:
        if max_rounds < 0:
            raise ConfigurationError("max_rounds must be >= 0")
        self.llm = llm
        self.max_rounds = max_rounds
        self.failures = UsageCounter()

    def run(
        self, query: str, search: Callable[[str], Sequence[T]], text_of: Callable[[T], str]
    ) -> ReflectionResult[T]:
        """Search, reflect, and search again with an extended query while allowed.

        Each round is one reflection call; on ``<Query>`` the query is extended and searched
        again. After the last allowed round the latest candidates are returned as they are,
        so ``max_rounds=1`` costs one LLM call and at most two searches (``0``: no call).
        """
        queries = [query]
        keywords: list[str] = []
        items = list(search(query))
        calls = 0
        for _ in range(self.max_rounds):
            calls += 1
            try:
                verdict = generate_parsed(
                    self.llm,
                    build_reflection_messages(query, [text_of(i) for i in items]),
                    lambda out: parse_reflection(out, query),
                )
            except (LLMError, ParseError):
                return self._failed(items, queries, calls, keywords)
            done = self._settle(verdict, items, queries, calls, text_of, keywords)
            if done is not None:
                return done
            keywords.extend(verdict.keywords)
            queries.append(_extend(queries[-1], verdict.keywords))
            items = list(search(queries[-1]))
        return ReflectionResult(
            items=items, memory=None, queries=queries, keywords=tuple(keywords), llm_calls=calls
        )

    async def arun(
        self,
        query: str,
        search: Callable[[str], Awaitable[Sequence[T]]],
        text_of: Callable[[T], str],
    ) -> ReflectionResult[T]:
        """Async twin of :meth:`run` with an async search function."""
        queries = [query]
        keywords: list[str] = []
        items = list(await search(query))
        calls = 0
        for _ in range(self.max_rounds):
            calls += 1
            try:
                verdict = await agenerate_parsed(
                    self.llm,
                    build_reflection_messages(query, [text_of(i) for i in items]),
                    lambda out: parse_reflection(out, query),
                )
            except (LLMError, ParseError):
                return self._failed(items, queries, calls, keywords)
            done = self._settle(verdict, items, queries, calls, text_of, keywords)
            if done is not None:
                return done
            keywords.extend(verdict.keywords)
            queries.append(_extend(queries[-1], verdict.keywords))
            items = list(await search(queries[-1]))
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

    def _failed(
        self, items: list[T], queries: list[str], calls: int, keywords: list[str]
    ) -> ReflectionResult[T]:
        # Documented fallback: an unusable reflection keeps the candidates as retrieved.
        self.failures.record(failures=1)
        logger.warning("self-reflection failed; using the candidates as retrieved", exc_info=True)
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
    selected and, as ``context``, the sentences it copied (or the rendered records when it
    never judged them enough).

    Args:
        base: The mechanism to wrap (history, summary, conditional, multi-view, ...).
        llm: Judges the candidates.
        max_rounds: Query expansions allowed (paper: 1).
    """

    def __init__(self, base: Mechanism, llm: LLM, *, max_rounds: int = 1) -> None:
        self.base = base
        self.reflection = SelfReflectiveRetrieval(llm, max_rounds=max_rounds)
        self.last_result: ReflectionResult[ScoredRecord] | None = None

    def save(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Save through the wrapped mechanism."""
        self.base.save(turns, scope)

    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Recall through the wrapped mechanism, reflecting on the candidates."""
        result = self.reflection.run(
            query,
            lambda q: self.base.recall(q, scope, k=k, now=now).records,
            lambda hit: hit.record.text,
        )
        self.last_result = result
        return _to_recall(query, result)

    def clear(self, scope: Scope) -> None:
        """Clear through the wrapped mechanism."""
        self.base.clear(scope)

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

        async def search(q: str) -> Sequence[ScoredRecord]:
            return (await self.base.arecall(q, scope, k=k, now=now)).records

        result = await self.reflection.arun(query, search, lambda hit: hit.record.text)
        self.last_result = result
        return _to_recall(query, result)

    def __getattr__(self, name: str) -> Any:
        # Mechanism-specific operations (end_session, retry_pending, usage, ...) stay reachable.
        return getattr(self.base, name)


def _to_recall(query: str, result: ReflectionResult[ScoredRecord]) -> Recall:
    context = result.memory or "\n".join(hit.record.text for hit in result.items)
    return Recall(query=query, records=tuple(result.items), context=context)


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
