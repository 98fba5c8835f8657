"""The :class:`MemoChatMemory` front: memos written at session ends, retrieved per question."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

from memories_core.engine import Derivation, JobFailed, check_k, check_query, check_scope
from memories_core.errors import ConfigurationError, LLMError, ParseError, check_count
from memories_core.grounding import find_ungrounded, log_rejection
from memories_core.mechanisms.base import MemoryBase
from memories_core.mechanisms.memochat.options import MemoEntry, choose_memos
from memories_core.mechanisms.memochat.segmenting import extractive_memo, segment_lines
from memories_core.mechanisms.memochat.signals import DEFAULT_THRESHOLD, _tokens, select_options
from memories_core.mechanisms.reflection import DEFAULT_RECALL_BUDGET
from memories_core.prompts.memochat import (
    MEMO_CHAT,
    MEMO_RETRIEVAL,
    MEMO_WRITING,
    PROMPTS,
    ChatInput,
    MemoSpan,
    WritingInput,
)
from memories_core.prompts.spec import PromptSpec, run_spec
from memories_core.types import Job, JobSpec, MemoryRecord, Recall, Scope, ScoredRecord, new_id

if TYPE_CHECKING:
    from memories_core.interfaces import LLM

__all__ = ["SEARCH_KEY_KIND", "MemoChatMemory"]


#: Record kind of the extra search keys a memo gives the raw turns it covers.
SEARCH_KEY_KIND = "search_key"


# ------------------------------------------------------------------------------ memory
class MemoChatMemory(MemoryBase):
    """MemoChat's memo (Lu et al., 2023, §3.2): topic memos written from a buffer of lines.

    Example:
        >>> from memories_core import MemoChatMemory, Scope, Turn
        >>> from memories_core.embedders import HashingEmbedder
        >>> memory = MemoChatMemory(embedder=HashingEmbedder(), max_lines=4)
        >>> memory.save([Turn("user", "I study quantum entanglement."),
        ...              Turn("assistant", "Entangled particles share one state."),
        ...              Turn("user", "Bowing is polite in Japan."),
        ...              Turn("assistant", "Yes, business cards are given with two hands.")],
        ...             Scope("ann"))
        >>> len(memory.memos(Scope("ann"))) >= 1
        True

    Args:
        llm: Writes memos and chooses among them. ``None`` (and no engine model): the
            LLM-free mode.
        mode: ``"llm"``, ``"llm_free"`` or ``None`` (``"llm"`` if a model is available).
        max_lines: Buffer size (lines) that triggers memo writing (released code: 10).
        max_words: Buffer size (words) that triggers memo writing (released code: 1,024).
        keep_lines: Lines kept in the buffer after a memo is written (paper: 2).
        k: Records a recall returns by default.
        threshold: Threshold of the LLM-free selector (:func:`select_options`).
        max_options: Memo options shown to the LLM in one retrieval prompt.
        budget: Seconds a recall or :meth:`retrieve` waits for the LLM's memo choice
            (``None``: no limit). Past it, or when the choice fails, a recall keeps the dense
            and lexical candidates and :meth:`retrieve` chooses LLM-free; counted in
            ``usage.failures["memo_choice"]``.
        prompts: System instructions instead of the defaults, by prompt name:
            ``memochat.writing`` (Table 6), ``memochat.retrieval`` and its JSON twin
            ``memochat.retrieval.json`` (Table 7), ``memochat.chat`` (Table 8). Checked at
            construction (:class:`~memories_core.prompts.overrides.PromptOverrides`); the
            task text with the output format stays the package's.
        **kwargs: Engine or storage options of :class:`~memories_core.mechanisms.base.MemoryBase`.
    """

    mechanism_name: ClassVar[str] = "memochat"
    prompt_specs: ClassVar[tuple[PromptSpec[Any, Any], ...]] = PROMPTS
    recall_kinds: ClassVar[tuple[str, ...]] = ("memo", "turn")
    index_turns: ClassVar[bool] = True

    def __init__(
        self,
        *,
        llm: LLM | None = None,
        mode: str | None = None,
        max_lines: int = 10,
        max_words: int = 1024,
        keep_lines: int = 2,
        k: int = 3,
        threshold: float = DEFAULT_THRESHOLD,
        max_options: int = 20,
        budget: float | None = DEFAULT_RECALL_BUDGET,
        **kwargs: Any,
    ) -> None:
        if mode not in (None, "llm", "llm_free"):
            raise ConfigurationError(f"mode must be 'llm' or 'llm_free', got {mode!r}")
        if not (isinstance(max_lines, int) and max_lines >= 2 and 0 <= keep_lines < max_lines):
            raise ConfigurationError("need max_lines >= 2 and 0 <= keep_lines < max_lines")
        max_words = check_count("max_words", max_words)
        super().__init__(k=k, llm=llm, **kwargs)
        if mode is None:
            mode = "llm" if (llm is not None or self.engine.llm is not None) else "llm_free"
        if mode == "llm" and llm is None and self.engine.llm is None:
            raise ConfigurationError("mode='llm' needs an llm")
        self.mode = mode
        self.max_lines = max_lines
        self.max_words = max_words
        self.keep_lines = keep_lines
        self.threshold = threshold
        self.max_options = max_options
        self.budget = budget

    @property
    def _covered_key(self) -> str:
        return f"{self.name}_memo"

    @property
    def _kept_key(self) -> str:
        return f"{self.name}_kept"

    # ------------------------------------------------------------------ reading
    def buffer(self, scope: Scope) -> list[MemoryRecord]:
        """``scope.user_id``'s turns not covered by a memo yet, oldest first."""
        scope = check_scope(scope)
        return self._buffer(scope.user_id)

    def _buffer(self, user_id: str) -> list[MemoryRecord]:
        where = {"kind": "turn", f"attrs.{self._covered_key}": {"$exists": False}}
        return self.engine.records(user_id, where=where)

    def memos(self, scope: Scope) -> list[MemoEntry]:
        """Every memo entry of ``scope.user_id``, oldest first, with its dialogs."""
        scope = check_scope(scope)
        records = self.engine.records(scope.user_id, where={"kind": "memo"})
        return self._entries(scope.user_id, [(r, 0.0) for r in records])

    def _entries(
        self, user_id: str, pairs: Sequence[tuple[MemoryRecord, float]]
    ) -> list[MemoEntry]:
        wanted = [i for record, _ in pairs for i in record.source_ids]
        turns = {r.id: r for r in self.engine.get(user_id, wanted)} if wanted else {}
        out = []
        for record, score in pairs:
            meta = record.metadata
            covered = [turns[i] for i in record.source_ids if i in turns]
            out.append(
                MemoEntry(
                    record.id,
                    str(meta.get("topic", record.text)),
                    str(meta.get("summary", "")),
                    tuple(r.text for r in covered),
                    record.created_at,
                    score,
                    tuple(r.created_at for r in covered),
                )
            )
        return out

    def retrieve(self, query: str, scope: Scope, *, now: datetime | None = None) -> list[MemoEntry]:
        """Memo retrieval (§3.2, Table 7): the memo entries ``query`` relates to.

        With an LLM, memo candidates are pre-selected by the fused ranking and the LLM
        chooses among them (a NOTO answer returns ``[]``). LLM-free, or when the model call
        fails, cannot be read or misses its ``budget`` seconds, the fused selector
        :func:`select_options` chooses with this memory's threshold.

        Raises:
            InvalidInputError: on an empty query.
            MissingUserError: if ``scope`` has no user.
        """
        scope = check_scope(scope)
        query = check_query(query)
        chosen = self._chosen(query, scope, now)
        return self._entries(scope.user_id, [(h.record, h.score) for h in chosen])

    def _chosen(self, query: str, scope: Scope, now: datetime | None) -> list[ScoredRecord]:
        """The memos chosen for ``query``, in the pre-selection's order (best first).

        The fused search pre-selects up to ``max_options`` memos; the model (or, LLM-free or
        when the model fails, :func:`select_options`) chooses among them.
        """
        hits = self.engine.search(
            query,
            scope.user_id,
            k=self.max_options,
            kinds=("memo",),
            now=now,
            fusion=self.fusion,
            pipeline=self.pipeline,
        )
        if not hits:
            return []
        texts = [h.record.text for h in hits]
        chosen: list[int] | None = None
        if self.mode == "llm":
            chosen = choose_memos(
                self._llm(scope),
                query,
                texts,
                budget=self.budget,
                spec=self.prompt_spec(MEMO_RETRIEVAL),
            )
            if chosen is None:
                # Documented fallback: a failed or late choice is made LLM-free.
                self.engine.count_failure("memo_choice")
        if chosen is None:
            chosen = select_options(query, texts, self.embedder, threshold=self.threshold)
        return [hits[i] for i in sorted(chosen)]

    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Up to ``k`` records for ``query``: with an LLM, the memos it chose (§3.2, Table 7).

        With an LLM: the memos :meth:`retrieve` chooses (possibly none: NOTO), then buffered
        lines (no memo covers them yet) that share a content word with the query, newest
        first among equals; the context shows each memo with its dialog lines. LLM-free: the
        engine's fused search over memos and turns.

        Raises:
            InvalidInputError: on an empty query or a bad ``k``.
            MissingUserError: if ``scope`` has no user.
        """
        if self.mode != "llm":
            return super().recall(query, scope, k=k, now=now)
        scope = check_scope(scope)
        query = check_query(query)
        want = check_k(self.default_k if k is None else k)
        hits = self._chosen(query, scope, now)[:want]
        if len(hits) < want:
            hits += self._buffered_hits(query, scope.user_id)[: want - len(hits)]
        return Recall(query=query, records=tuple(hits), context=self._render(hits))

    def _buffered_hits(self, query: str, user_id: str) -> list[ScoredRecord]:
        """Buffered lines sharing a content word with ``query``; score = share of its words."""
        wanted = set(_tokens(query))
        if not wanted:
            return []
        scored = []
        for age, record in enumerate(reversed(self._buffer(user_id))):
            shared = len(wanted & set(_tokens(record.text.split(": ", 1)[-1])))
            if shared:
                scored.append((shared / len(wanted), age, record))
        scored.sort(key=lambda item: (-item[0], item[1]))
        return [ScoredRecord(record, score) for score, _, record in scored]

    def respond(
        self,
        user_input: str,
        scope: Scope,
        *,
        llm: LLM | None = None,
        recent: int = 10,
        save: bool = True,
    ) -> str:
        """Chat with memo (§3.2, Table 8): retrieve evidences, reply, and save the exchange.

        Args:
            user_input: What the user says.
            scope: Whose memo.
            llm: The model replying (default: this memory's).
            recent: Recent dialog lines shown (from the end of the buffer).
            save: Save the user input and the reply as turns afterwards.

        Raises:
            ConfigurationError: without any model.
            LLMError: if the model call fails (the user input is saved all the same).
        """
        scope = check_scope(scope)
        model = llm or self._llm(scope)
        messages = self.chat_messages(user_input, scope, recent=recent)
        if not save:
            return model.generate(messages).strip()
        return self.answer_and_save(user_input, scope, lambda: model.generate(messages))

    def chat_messages(self, user_input: str, scope: Scope, *, recent: int = 10) -> list[Any]:
        """The Table 8 prompt for ``user_input``: related evidences, recent dialogs, input.

        With :attr:`show_dates`, evidence dialogs and recent lines carry when they were said,
        as recall's context does (Table 8 shows none; our reader needs them for "when").

        Built by :data:`~memories_core.prompts.memochat.MEMO_CHAT`, with the
        ``memochat.chat`` override if one was given.
        """
        scope = check_scope(scope)
        evidences = [self._dated_entry(e) for e in self.retrieve(user_input, scope)]
        buffer = self._buffer(scope.user_id)[-recent:] if recent else []
        lines = [self._dated(r.text, r.created_at) for r in buffer]
        inputs = ChatInput(user_input, tuple(evidences), tuple(lines))
        return self.prompt_spec(MEMO_CHAT).build(inputs)

    # ------------------------------------------------------------------ engine hooks
    def _turn_jobs(self, records: Sequence[MemoryRecord]) -> Iterable[JobSpec]:
        if not records:
            return ()
        user_id = records[0].user_id
        buffered = {r.id: r for r in self._buffer(user_id)}
        buffered.update({r.id: r for r in records})
        words = sum(len(r.text.split()) for r in buffered.values())
        if len(buffered) >= self.max_lines or words >= self.max_words:
            return [JobSpec(self.name, "write_memo", "buffer", {})]
        return ()

    def _session_jobs(self, user_id: str, session_id: str) -> Iterable[JobSpec]:
        """A session end writes the whole buffer into the memo (no line kept: the talk is over)."""
        return [JobSpec(self.name, "write_memo", f"flush:{session_id}", {"final": True})]

    def _chunk(self, buffer: Sequence[MemoryRecord]) -> list[MemoryRecord]:
        """The oldest lines that fit one writing prompt (a long outage grows the buffer)."""
        chunk: list[MemoryRecord] = []
        words = 0
        for record in buffer:
            size = len(record.text.split())
            if chunk and (len(chunk) >= 2 * self.max_lines or words + size > 2 * self.max_words):
                break
            chunk.append(record)
            words += size
        return chunk

    def _run_job(self, job: Job) -> Derivation | None:
        if job.kind != "write_memo":
            return None
        user_id = job.user_id
        keep = 0 if job.payload.get("final") else self.keep_lines
        buffer = self._buffer(user_id)
        chunk = self._chunk(buffer)
        if len(chunk) < len(buffer):
            keep = 0  # more lines follow this chunk: they give the next memo its context
        if len(chunk) <= keep:
            return None
        lines = [r.text for r in chunk]
        if self.mode == "llm":
            try:
                spans = run_spec(
                    self._llm(Scope(user_id)),
                    self.prompt_spec(MEMO_WRITING),
                    WritingInput(tuple(lines)),
                )
            except (LLMError, ParseError) as exc:
                raise JobFailed("memochat", f"memo writing failed: {exc}") from exc
        else:
            spans = []
            for start, end in segment_lines(lines, self.embedder):
                seen = [
                    i - start
                    for i in range(start, end + 1)
                    if chunk[i - 1].state.attrs.get(self._kept_key)
                ]
                topic, summary = extractive_memo(lines[start - 1 : end], self.embedder, skip=seen)
                spans.append(MemoSpan(topic, summary, start, end))
        memos = []
        owner: dict[str, str] = {}
        rejected: list[str] = []
        for span in spans:
            covered = chunk[span.start - 1 : span.end]
            earlier = [r.state.attrs.get(self._kept_key) for r in covered]
            if all(earlier):
                # Only lines kept from the previous memo: they are in it already.
                owner.update({r.id: str(m) for r, m in zip(covered, earlier, strict=True)})
                continue
            rejection = (
                find_ungrounded({"topic": span.topic, "summary": span.summary}, lines)
                if self.mode == "llm"
                else None
            )
            if rejection is not None:
                # No memo for these lines; they leave the buffer as turns (still recalled).
                rejected.append(log_rejection(self.name, "memo", rejection))
                self.engine.count_failure("grounding")
                owner.update({r.id: "" for r in covered})
                continue
            memos.append(
                MemoryRecord(
                    id=new_id(),
                    user_id=user_id,
                    kind="memo",
                    text=f"{span.topic}. {span.summary}".strip(),
                    created_at=covered[-1].created_at,
                    session_id=covered[-1].session_id,
                    metadata={
                        "topic": span.topic,
                        "summary": span.summary,
                        "start": span.start,
                        "end": span.end,
                        "mode": self.mode,
                    },
                    source_ids=tuple(r.id for r in covered),
                )
            )
        keys = [
            MemoryRecord(
                id=new_id(),
                user_id=user_id,
                kind=SEARCH_KEY_KIND,
                text=memo.text,
                created_at=turn.created_at,
                session_id=turn.session_id,
                metadata={"key_for": turn.id, "memo_id": memo.id, "mechanism": self.name},
                source_ids=(turn.id,),
            )
            for memo in memos
            for turn in chunk
            if turn.id in memo.source_ids
        ]
        settled = chunk[: len(chunk) - keep] if keep else chunk
        kept = chunk[len(settled) :]
        owner.update({r.id: m.id for m in memos for r in chunk if r.id in m.source_ids})
        state: dict[str, dict[str, Any]] = {
            r.id: {"attrs": {self._covered_key: owner[r.id]}} for r in settled
        }
        state.update({r.id: {"attrs": {self._kept_key: owner[r.id]}} for r in kept})
        reason = "; ".join(["memochat: written into a memo", *rejected])
        return Derivation(add=[*memos, *keys], state=state, reason=reason)

    # ------------------------------------------------------------------ recall
    def _dated_entry(self, entry: MemoEntry) -> MemoEntry:
        """``entry`` with each dialog line after when it was said (with :attr:`show_dates`).

        As every other memory renders turns: without the dates a reader cannot place "last
        week" (LoCoMo temporal questions, F1 0.421 vs raw turns' 0.577 before the dates were
        shown). Recall's context and the chat-with-memo prompt both show memos this way.
        """
        if not self.show_dates or len(entry.dialog_times) != len(entry.dialogs):
            return entry
        dated = tuple(
            self._dated(line, when)
            for when, line in zip(entry.dialog_times, entry.dialogs, strict=True)
        )
        return dataclasses.replace(entry, dialogs=dated)

    def _render(self, hits: Sequence[ScoredRecord]) -> str:
        """Memos with their dialogs, then turns no shown memo covers (one block)."""
        memos = [h for h in hits if h.record.kind == "memo"]
        if not memos:
            return super()._render(hits)
        user_id = memos[0].record.user_id
        entries = self._entries(user_id, [(h.record, h.score) for h in memos])
        shown = {i for h in memos for i in h.record.source_ids}
        blocks = []
        for entry in map(self._dated_entry, entries):
            dialogs = "\n".join(f"  {d}" for d in entry.dialogs)
            blocks.append(f"[memo] {entry.option}" + (f"\n{dialogs}" if dialogs else ""))
        loose = [h for h in hits if h.record.kind != "memo" and h.record.id not in shown]
        if loose:
            blocks.append(super()._render(loose))
        return "\n".join(blocks)
