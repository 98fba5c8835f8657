"""Memo entries and how the model, or the fallback, chooses among them."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memories_core.errors import LLMError, LLMTimeoutError, ParseError
from memories_core.llms.base import run_with_timeout
from memories_core.mechanisms.reflection import DEFAULT_RECALL_BUDGET
from memories_core.prompts.memochat import (
    MEMO_RETRIEVAL,
    RetrievalInput,
    noto_position,
)
from memories_core.prompts.overrides import PromptOverrides
from memories_core.prompts.spec import PromptSpec, run_spec

if TYPE_CHECKING:
    from memories_core.interfaces import LLM
    from memories_core.retrieval import RecallBackend, RecallRequest
    from memories_core.retrieval.fusion import Ranking

__all__ = ["LLMOptionSource", "MemoEntry", "choose_memos"]

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------------------ entries
@dataclass(frozen=True)
class MemoEntry:
    """One memo entry ``{topic, summary, dialogs}`` (§3.2) as recalled.

    Attributes:
        id: The memo record's id.
        topic: Topic phrase.
        summary: One or two sentences.
        dialogs: The covered dialogue lines ``"speaker: content"``, oldest first.
        created_at: When the last covered line was said.
        score: Retrieval score (1.0 for an LLM's choice).
        dialog_times: When each of ``dialogs`` was said (same order; empty if unknown).
    """

    id: str
    topic: str
    summary: str
    dialogs: tuple[str, ...] = ()
    created_at: datetime | None = None
    score: float = 0.0
    dialog_times: tuple[datetime, ...] = ()

    @property
    def option(self) -> str:
        """The option text shown for retrieval: ``"topic. summary"`` (Table 7)."""
        return f"{self.topic}. {self.summary}".strip()


@dataclass(frozen=True)
class LLMOptionSource:
    """A candidate source where an LLM chooses among memo options (Table 7).

    For composing a custom :class:`~memories_core.retrieval.Pipeline` (fused with other
    sources); :class:`MemoChatMemory` itself returns the model's choice unfused. Memo
    candidates are pre-selected by the engine's dense and lexical rankings (at most
    ``max_options``, so a memo that grows without bound still fits one prompt); the LLM is
    shown them as ``(i) topic. summary`` with a NOTO option and its ``N#M`` answer is parsed
    tolerantly. Chosen memos come back with score 1.0, in option order. A failed model call,
    an unparseable answer or a choice that takes longer than ``budget`` yields no candidates
    (the dense and lexical sources still answer) and is reported to ``on_failure``.

    Attributes:
        llm: The model choosing.
        max_options: Options in one prompt.
        weight: Fusion weight.
        name: Label.
        kind: Record kind of the options.
        budget: Seconds a recall waits for the choice (``None``: no limit).
        on_failure: Called with ``"memo_choice"`` when the choice failed or timed out (the
            memory counts it in ``usage.failures``).
        prompts: System instructions instead of the defaults (``memochat.retrieval``,
            ``memochat.retrieval.json``), as for
            :class:`~memories_core.mechanisms.memochat.MemoChatMemory`; checked at
            construction.

    Raises:
        PromptOverrideError: on an override of another prompt, or one that drops the
            output format.
    """

    llm: LLM
    max_options: int = 20
    weight: float = 1.0
    name: str = "llm_options"
    kind: str = "memo"
    budget: float | None = DEFAULT_RECALL_BUDGET
    on_failure: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    calls: list[int] = field(default_factory=list, compare=False, repr=False)
    prompts: PromptOverrides | Mapping[str, str] | None = field(default=None, compare=False)
    #: The retrieval prompt as this source runs it (overrides applied once, at construction).
    spec: PromptSpec[RetrievalInput, list[int]] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        specs: tuple[PromptSpec[Any, Any], ...] = (MEMO_RETRIEVAL,)
        overrides = PromptOverrides.of(self.prompts).check(specs)
        object.__setattr__(self, "prompts", overrides)
        object.__setattr__(self, "spec", overrides.apply(MEMO_RETRIEVAL))

    def candidates(self, request: RecallRequest, backend: RecallBackend, depth: int) -> Ranking:
        """Ask the LLM which pre-selected memos the query relates to."""
        where: Any = {"kind": self.kind}
        if request.filter is not None:
            where = {"$and": [request.filter, where]}
        vector = backend.embed_query(request.query)
        dense = backend.dense(vector, user_id=request.user_id, depth=self.max_options, where=where)
        lexical = backend.lexical(
            request.query, user_id=request.user_id, depth=self.max_options, where=where
        )
        ids: list[str] = []
        for pair in zip(lexical, dense, strict=False):
            ids += [i for i, _ in pair if i not in ids]
        ids += [i for i, _ in [*lexical, *dense] if i not in ids]
        ids = ids[: self.max_options]
        if not ids:
            return []
        loaded = backend.load(ids, user_id=request.user_id)
        memos = [loaded[i] for i in ids if i in loaded]
        texts = [m.text for m in memos]
        chosen = choose_memos(self.llm, request.query, texts, budget=self.budget, spec=self.spec)
        self.calls.append(len(memos))
        if chosen is None:
            if self.on_failure is not None:
                self.on_failure("memo_choice")
            return []
        return [(memos[i].id, 1.0) for i in chosen]


def choose_memos(
    llm: LLM,
    query: str,
    options: Sequence[str],
    *,
    budget: float | None = None,
    spec: PromptSpec[RetrievalInput, list[int]] = MEMO_RETRIEVAL,
    noto_at: int | None = None,
) -> list[int] | None:
    """Ask ``llm`` which of ``options`` relate to ``query`` (0-based; ``None`` on failure).

    NOTO is shown at :func:`~memories_core.prompts.memochat.noto_position` (§3.2: a random
    place among the options, here reproducible); ``[]`` means the model chose NOTO.
    ``budget``: seconds to wait for the answer (a repair retry included); past it the
    choice has failed (``None``). ``spec``: the retrieval prompt as the caller runs it
    (e.g. with an override, ``MemoChatMemory.prompt_spec(MEMO_RETRIEVAL)``). ``noto_at``:
    NOTO's 1-based place instead (``len(options) + 1``: last); no place measured better
    with the offline model (BENCHMARKS.md, "Where NOTO is shown, with the offline model").
    """
    if not options:
        return []
    at = noto_position(query, options) if noto_at is None else noto_at
    inputs = RetrievalInput(query, tuple(options), noto_at=at)
    noto = inputs.noto()
    try:
        picked = run_with_timeout(
            lambda: run_spec(llm, spec, inputs), budget, label="memo retrieval"
        )
    except (LLMError, ParseError) as exc:
        hint = ""
        if isinstance(exc, LLMTimeoutError) and budget is not None:
            hint = (
                f" (past the {budget:g} s budget; a local CPU model needs about a minute per "
                "memo choice: budget=None waits for it)"
            )
        logger.warning("memo retrieval by the LLM failed: %s%s", exc, hint)
        return None
    return [(p - 1) if p < noto else (p - 2) for p in picked]
