"""End-to-end answer-quality runs on LoCoMo: ingest through a memory's public path, then answer.

The steps a user's application takes, timed and counted:

1. :func:`ingest_conversation` saves each session's turns in exchanges (two consecutive
   turns, the way a chat app saves a user/assistant round) under ``Scope(user, session)``,
   with an injected :class:`~memories_core.clock.FixedClock` set to each exchange's time, so
   day boundaries (MemoryBank), rounds (DPeM), session ends and validity windows happen as
   they would for a user. The session is ended explicitly and its derivations are waited for
   (``flush`` when the memory has one) before the next session starts.
2. :func:`answer_question` recalls with the memory's public ``recall`` (the adapters' path),
   puts the rendered ``context`` into the reader's prompt (:func:`~.qa.reader_messages`) and
   scores the answer (:func:`~.qa.locomo_f1`, :func:`~.qa.bleu1`, an optional judge).

Speakers: LoCoMo's two people are mapped to the ``user`` (first speaker) and ``assistant``
(second speaker) roles, each turn keeping its speaker's name, so exchange-based mechanisms see
rounds. Sampling (:func:`select_questions`) is deterministic for a seed.
"""

from __future__ import annotations

import copy
import json
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

from memories_core.clock import FixedClock
from memories_core.evaluation.locomo import LocomoConversation, LocomoQA, LocomoTurn
from memories_core.evaluation.qa import (
    adversarial_options,
    bleu1,
    judge_messages,
    locomo_f1,
    parse_judge,
    reader_messages,
    resolve_option,
)
from memories_core.files import write_json_atomic
from memories_core.types import ChatMessage, RecordState, Scope, Turn, ensure_utc
from memories_core.usage import Usage

__all__ = [
    "TURN_SECONDS",
    "IngestStats",
    "QAItem",
    "QAResult",
    "answer_question",
    "answer_questions",
    "dated_sessions",
    "evidence_context",
    "full_context",
    "ingest_conversation",
    "judge_answer",
    "percentile",
    "question_time",
    "read_jsonl",
    "score_answer",
    "select_questions",
    "write_json_atomic",
]

#: Seconds between two turns of a session (LoCoMo gives one date per session).
TURN_SECONDS = 30
_FALLBACK_START = datetime(2023, 1, 1, tzinfo=timezone.utc)


def dated_sessions(
    conversation: LocomoConversation, sessions: int | None = None
) -> dict[int, list[tuple[LocomoTurn, datetime]]]:
    """Each session's non-empty turns with a time (the session's date plus 30 s per turn).

    Args:
        conversation: The conversation.
        sessions: Keep only the first ``sessions`` sessions (``None``: all).
    """
    out: dict[int, list[tuple[LocomoTurn, datetime]]] = {}
    numbers = sorted({turn.session for turn in conversation.turns})
    if sessions is not None:
        numbers = numbers[:sessions]
    keep = set(numbers)
    for turn in conversation.turns:
        if turn.session not in keep or not turn.text.strip():
            continue
        start = conversation.session_datetime(turn.session)
        begin = ensure_utc(start) if start else _FALLBACK_START + timedelta(days=turn.session)
        day = out.setdefault(turn.session, [])
        day.append((turn, begin + timedelta(seconds=TURN_SECONDS * len(day))))
    return dict(sorted(out.items()))


def question_time(conversation: LocomoConversation, sessions: int | None = None) -> datetime:
    """When the questions are asked: a day after the last kept turn."""
    dated = dated_sessions(conversation, sessions)
    last = max(when for turns in dated.values() for _, when in turns)
    return last + timedelta(days=1)


@dataclass(frozen=True)
class QAItem:
    """A question to ask, with a stable id (``<sample>:<index in the file>``)."""

    id: str
    conversation: str
    qa: LocomoQA


def select_questions(
    conversations: Sequence[LocomoConversation],
    *,
    sessions: int | None = None,
    limit: int | None = None,
    seed: int = 0,
) -> list[QAItem]:
    """The questions a run asks: answerable from the kept sessions, sampled with ``seed``.

    With ``sessions`` set, a question is kept only if it has evidence and all of it lies in
    the first ``sessions`` sessions. ``limit`` draws that many questions in all, spread as
    evenly as possible over the conversations; the draw depends only on ``seed`` and the data.
    """
    per_conversation: list[list[QAItem]] = []
    for conversation in conversations:
        kept_sessions = set(dated_sessions(conversation, sessions))
        items = []
        for index, qa in enumerate(conversation.qa):
            if sessions is not None:
                where = {_session_of(dia) for dia in qa.evidence}
                if not where or not where <= kept_sessions:
                    continue
            items.append(QAItem(f"{conversation.sample_id}:{index}", conversation.sample_id, qa))
        per_conversation.append(items)
    if limit is None:
        return [item for items in per_conversation for item in items]
    rng = random.Random(seed)
    chosen: list[QAItem] = []
    remaining = limit
    pools = [list(items) for items in per_conversation]
    for pool in pools:
        rng.shuffle(pool)
    while remaining > 0 and any(pools):
        for pool in pools:
            if remaining and pool:
                chosen.append(pool.pop())
                remaining -= 1
    order = {item.id: n for n, items in enumerate(per_conversation) for item in items}
    ranks = {item.id: i for items in per_conversation for i, item in enumerate(items)}
    return sorted(chosen, key=lambda item: (order[item.id], ranks[item.id]))


def _session_of(dia_id: str) -> int:
    return int(dia_id[1:].split(":")[0])


def _render_turns(dated: Mapping[int, list[tuple[LocomoTurn, datetime]]]) -> list[str]:
    blocks = []
    for number, turns in dated.items():
        if not turns:
            continue
        day = turns[0][1].strftime("%d %B %Y")
        lines = [f"[Session {number}, {day}]"]
        lines += [turn.render() for turn, _ in turns]
        blocks.append("\n".join(lines))
    return blocks


def full_context(
    conversation: LocomoConversation,
    *,
    sessions: int | None = None,
    budget_tokens: int,
    count_tokens: Callable[[str], int],
) -> str:
    """The whole conversation with session dates, or its most recent part that fits.

    Whole sessions are kept from the end while they fit ``budget_tokens``; the session that
    crosses the budget is cut from its start, so the most recent turns are always present.
    """
    blocks = _render_turns(dated_sessions(conversation, sessions))
    kept: list[str] = []
    used = 0
    for block in reversed(blocks):
        cost = count_tokens(block) + 1
        if used + cost <= budget_tokens:
            kept.append(block)
            used += cost
            continue
        lines = block.split("\n")
        tail: list[str] = []
        for line in reversed(lines[1:]):
            line_cost = count_tokens(line) + 1
            if used + line_cost > budget_tokens:
                break
            tail.append(line)
            used += line_cost
        if tail:
            kept.append("\n".join([lines[0], *reversed(tail)]))
        break
    return "\n\n".join(reversed(kept))


def evidence_context(conversation: LocomoConversation, qa: LocomoQA) -> str:
    """The gold evidence turns with their session dates (the ceiling of any memory)."""
    wanted = set(qa.evidence)
    dated = {
        number: [(turn, when) for turn, when in turns if turn.dia_id in wanted]
        for number, turns in dated_sessions(conversation).items()
    }
    return "\n\n".join(_render_turns(dated))


_Row = TypeVar("_Row", bound="_JsonRow")


class _JsonRow:
    """JSON round trip of a flat dataclass (unknown keys are ignored when reading back)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_json(cls: type[_Row], data: Mapping[str, Any]) -> _Row:
        """Read back :meth:`to_json`'s output."""
        names = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]
        return cls(**{key: value for key, value in data.items() if key in names})


@dataclass
class IngestStats(_JsonRow):
    """What writing one conversation into a memory cost.

    Attributes:
        turns: Turns saved.
        saves: ``save`` calls (one per exchange).
        sessions: Sessions ingested.
        save_ms: Wall time of each ``save`` call (ms).
        flush_ms: Wall time waiting for each session's derivations after it ended (ms).
        wall_s: Wall time of the whole ingest (s).
        llm_calls, prompt_tokens, completion_tokens, llm_failures: The writer model's usage.
        llm_capped: The writer's replies that reached their output cap or were stopped in a
            loop (``None``: an ingest resumed from stats that did not count them).
        store_bytes: Size of the memory's folder on disk after the ingest.
        pending_jobs: Jobs still pending at the end, or after the last session a checkpoint
            holds (failed derivations in backoff).
        failures: The memory's failure counters at the same point (of this process: a
            resumed ingest starts them at zero).
        finished_after: Jobs that finished, by the run that succeeded (``"1"``: the first;
            the resumed part's included), so a row shows whether a failed job's retries ever
            succeed.
    """

    turns: int = 0
    saves: int = 0
    sessions: int = 0
    save_ms: list[float] = field(default_factory=list)
    flush_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    llm_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    llm_failures: int = 0
    llm_capped: int | None = 0
    store_bytes: int = 0
    pending_jobs: int = 0
    failures: dict[str, int] = field(default_factory=dict)
    finished_after: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> IngestStats:
        """Read back :meth:`to_json`'s output; stats from before ``llm_capped`` leave it unknown."""
        stats = super().from_json(data)
        if "llm_capped" not in data and stats.llm_calls:
            stats.llm_capped = None
        return stats


def _usage(llm: Any) -> Usage:
    usage = getattr(llm, "usage", None)
    return usage if isinstance(usage, Usage) else Usage()


def folder_bytes(path: str | Path | None) -> int:
    """Bytes of the files under ``path`` (0 for ``None`` or a missing folder)."""
    if path is None or not Path(path).exists():
        return 0
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def _wait(memory: Any) -> None:
    flush = getattr(memory, "flush", None)
    if callable(flush):
        flush()
        return
    # Memories without a background worker ran their jobs inside save/end_session; retry
    # anything left in backoff once, as a script would.
    retry = getattr(memory, "retry_pending", None)
    if callable(retry):
        retry()


def _add_spent(stats: IngestStats, base: IngestStats, spent: Usage, seconds: float) -> None:
    """``stats``' model usage and wall time: the resumed part's plus this run's so far."""
    stats.wall_s = base.wall_s + seconds
    stats.llm_calls = base.llm_calls + spent.calls
    stats.prompt_tokens = base.prompt_tokens + spent.prompt_tokens
    stats.completion_tokens = base.completion_tokens + spent.completion_tokens
    stats.llm_failures = base.llm_failures + spent.failures
    # Stats kept before replies at the cap were counted leave the count unknown.
    stats.llm_capped = None if base.llm_capped is None else base.llm_capped + spent.capped


def ingest_conversation(
    memory: Any,
    conversation: LocomoConversation,
    clock: FixedClock,
    *,
    user_id: str,
    sessions: int | None = None,
    writer: Any = None,
    progress: Callable[[int], None] | None = None,
    resume: IngestStats | None = None,
    on_session: Callable[[IngestStats], None] | None = None,
    second_role: str = "assistant",
) -> IngestStats:
    """Save a conversation into ``memory`` session by session, as a chat app would.

    Args:
        memory: A mechanism (``save``, ``end_session``; ``flush`` if it has a worker).
        conversation: The LoCoMo conversation.
        clock: The memory engine's clock; set to each exchange's time before its save.
        user_id: Whose memory.
        sessions: Only the first ``sessions`` sessions.
        writer: The model that writes memories (its usage is counted), if any.
        progress: Called with the number of turns saved after each save (and once with the
            turns of the sessions ``resume`` covers).
        resume: What an earlier, interrupted ingest of the same conversation cost for its
            first ``resume.sessions`` sessions, whose memories ``memory`` already holds
            (restored from a checkpoint): those sessions are skipped and their cost is
            carried into the result.
        on_session: Called after each session's derivations are done, with the cost so
            far (e.g. to write a checkpoint that a later ``resume`` starts from); its own
            time is not counted in ``wall_s``.
        second_role: The role of the second speaker's turns. ``"assistant"`` (default)
            makes each pair of turns an exchange for the mechanisms that work in rounds; a
            mechanism that reads the user's received messages and skips an assistant's
            replies (EMG-RAG, appendix A.1) gets them as what they are in LoCoMo, another
            person's messages (``"message"``, each keeping its sender's name).

    Returns:
        What the ingest cost (the resumed part included).
    """
    stats = IngestStats() if resume is None else copy.deepcopy(resume)
    base = replace(stats)  # the resumed part's totals (its lists are not read)
    before = _usage(writer)
    started = time.perf_counter()
    outside = 0.0  # seconds spent in on_session, which is not the memory's cost
    first_speaker = conversation.speakers[0] if conversation.speakers else ""
    todo = list(dated_sessions(conversation, sessions).items())
    skipped, todo = todo[: base.sessions], todo[base.sessions :]
    if skipped and progress is not None:
        progress(sum(len(dated) for _, dated in skipped))
    for number, dated in todo:
        scope = Scope(user_id, f"session_{number}")
        for start in range(0, len(dated), 2):
            pair = dated[start : start + 2]
            turns = [
                Turn(
                    "user" if turn.speaker == first_speaker else second_role,
                    turn.text,
                    speaker=turn.speaker,
                    timestamp=when,
                    metadata={"dia_id": turn.dia_id},
                )
                for turn, when in pair
            ]
            clock.set(pair[-1][1])
            tick = time.perf_counter()
            memory.save(turns, scope)
            stats.save_ms.append((time.perf_counter() - tick) * 1000)
            stats.saves += 1
            stats.turns += len(turns)
            if progress is not None:
                progress(len(turns))
        clock.set(dated[-1][1] + timedelta(seconds=TURN_SECONDS))
        tick = time.perf_counter()
        memory.end_session(scope)
        _wait(memory)
        stats.flush_ms.append((time.perf_counter() - tick) * 1000)
        stats.sessions += 1
        _add_spent(stats, base, _usage(writer) - before, time.perf_counter() - started - outside)
        _count_left(stats, base, memory, user_id)
        if on_session is not None:
            tick = time.perf_counter()
            on_session(stats)
            outside += time.perf_counter() - tick
    _add_spent(stats, base, _usage(writer) - before, time.perf_counter() - started - outside)
    stats.store_bytes = folder_bytes(getattr(memory, "path", None))
    _count_left(stats, base, memory, user_id)
    return stats


def _count_left(stats: IngestStats, base: IngestStats, memory: Any, user_id: str) -> None:
    """Set the jobs still pending, the failures and the finished jobs so far.

    A checkpoint's stats show them; finished jobs add to the resumed part's (``base``).
    """
    pending = getattr(memory, "pending", None)
    stats.pending_jobs = len(pending(user_id)) if callable(pending) else 0
    usage = getattr(memory, "usage", None)
    stats.failures = dict(getattr(usage, "failures", {}) or {})
    finished = Counter(base.finished_after)
    for attempt, count in (getattr(usage, "finished_after", {}) or {}).items():
        finished[str(attempt)] += count
    stats.finished_after = dict(sorted(finished.items(), key=lambda item: int(item[0])))


#: The mutable fields of a record's state, as its update history writes them.
_STATE_KEYS = frozenset(RecordState().to_json())


def rewind_state(engine: Any, user_id: str, since: datetime) -> int:
    """Undo every change to ``user_id``'s record state made at or after ``since``.

    Answering questions can change a memory (MemoryBank reinforces what it recalls, §2.3 of
    its paper), so the memory left by one set of answers is not the one the ingest made.
    This puts each record's state back as it was before ``since`` (the question time),
    from the update history, so another recall setting answers the same questions from the
    same memory. The rewind is itself one history entry per record, dated just before
    ``since``, so rewinding again undoes nothing more. Records written at or after ``since``
    are kept.

    Args:
        engine: The memory's :class:`~memories_core.engine.MemoryEngine`.
        user_id: Whose records.
        since: The first instant to undo.

    Returns:
        How many records' state changed.

    Raises:
        ValueError: if a text edit or deletion was made at or after ``since`` (only state
            can be rewound; nothing is changed then).
    """
    since = ensure_utc(since)
    later = [c for c in engine.history(user_id) if c.at >= since]
    other = [c for c in later if not set(c.old) <= _STATE_KEYS]
    if other:
        raise ValueError(
            f"{len(other)} changes after {since.isoformat()} are not state changes "
            f"(first: {other[0].reason!r}); only state can be rewound"
        )
    if not later:
        return 0
    ids = list(dict.fromkeys(c.record_id for c in later))
    states = {r.id: r.state for r in engine.get(user_id, ids)}
    target = {record_id: state.to_json() for record_id, state in states.items()}
    for change in sorted(later, key=lambda c: c.seq, reverse=True):  # newest first
        if change.record_id in target:
            target[change.record_id].update(change.old)
    changes: dict[str, dict[str, Any]] = {}
    for record_id, saved in target.items():
        before = RecordState.from_json(saved)
        # attrs merge on update; a key added since ``since`` is deleted with None.
        dropped = {key: None for key in states[record_id].attrs if key not in before.attrs}
        changes[record_id] = {
            **{f.name: getattr(before, f.name) for f in fields(before) if f.name != "attrs"},
            "attrs": {**dropped, **before.attrs},
        }
    written = engine.update_state(
        user_id,
        changes,
        reason=f"rewound to before {since.isoformat()}",
        at=since - timedelta(microseconds=1),
    )
    return len(written)


@dataclass
class QAResult(_JsonRow):
    """One answered question, scored.

    Attributes:
        id: Question id. category: LoCoMo category. question / gold / prediction: texts.
        f1: LoCoMo's per-category score. bleu1: BLEU-1 (0 for adversarial questions).
        judge: The judge's label (``None``: no judge ran, or it answered neither label).
        records: Records recalled. context_chars: Length of the rendered context.
        reader_prompt_tokens: Tokens of the reader's whole prompt.
        recall_ms / answer_ms: Wall time of the recall and of the reader's answer.
        recall_llm_calls: Model calls the recall itself made (reflection, memo choice).
        recall_fallbacks: Those of the recall's own model steps that failed or ran out of
            time, so the mechanism answered with its documented fallback (set by the caller,
            which knows the memory).
    """

    id: str
    category: int
    question: str
    gold: str
    prediction: str
    f1: float
    bleu1: float
    judge: bool | None = None
    records: int = 0
    context_chars: int = 0
    reader_prompt_tokens: int = 0
    recall_ms: float = 0.0
    answer_ms: float = 0.0
    recall_llm_calls: int = 0
    recall_fallbacks: int = 0


@dataclass
class _Asked:
    """A question whose memory was recalled: what the reader is shown, before it answers."""

    item: QAItem
    context: str
    count: int
    recall_ms: float
    recall_calls: int
    messages: list[ChatMessage]


def _ask(
    item: QAItem,
    recall: Callable[[str], tuple[str, int]],
    now: datetime,
    writer: Any,
    seed: int,
) -> _Asked:
    qa = item.qa
    before = _usage(writer)
    tick = time.perf_counter()
    context, count = recall(qa.question)
    recall_ms = (time.perf_counter() - tick) * 1000
    recall_calls = (_usage(writer) - before).calls if writer is not None else 0
    options = adversarial_options(item.id, qa.answer, seed=seed) if qa.category == 5 else None
    messages = reader_messages(qa.question, context, now=now, options=options)
    return _Asked(item, context, count, recall_ms, recall_calls, list(messages))


def _scored(
    asked: _Asked,
    prediction: str,
    *,
    prompt_tokens: int,
    answer_ms: float,
    judge: Any,
    seed: int,
) -> QAResult:
    item, qa = asked.item, asked.item.qa
    f1, bleu = score_answer(item, prediction, seed=seed)
    label = judge_answer(judge, item, prediction, f1) if judge is not None else None
    return QAResult(
        id=item.id,
        category=qa.category,
        question=qa.question,
        gold=qa.answer,
        prediction=prediction,
        f1=f1,
        bleu1=bleu,
        judge=label,
        records=asked.count,
        context_chars=len(asked.context),
        reader_prompt_tokens=prompt_tokens,
        recall_ms=asked.recall_ms,
        answer_ms=answer_ms,
        recall_llm_calls=asked.recall_calls,
    )


def answer_question(
    item: QAItem,
    *,
    reader: Any,
    recall: Callable[[str], tuple[str, int]],
    now: datetime,
    writer: Any = None,
    judge: Any = None,
    seed: int = 0,
    max_tokens: int = 32,
) -> QAResult:
    """Recall for one question, let the reader answer from it, and score the answer.

    Args:
        item: The question.
        reader: The model that answers (``generate(messages, max_tokens=, temperature=)``).
        recall: ``question -> (rendered context, records recalled)``: the memory's recall.
        now: When the question is asked (shown to the reader).
        writer: The memory's own model, to count calls the recall makes (may be ``reader``).
        judge: A judge model, or ``None`` (no judge label).
        seed: Fixes the order of an adversarial question's options.
        max_tokens: Cap on the reader's answer.
    """
    asked = _ask(item, recall, now, writer, seed)
    reader_before = _usage(reader)
    tick = time.perf_counter()
    prediction = reader.generate(asked.messages, max_tokens=max_tokens, temperature=0.0).strip()
    answer_ms = (time.perf_counter() - tick) * 1000
    prompt_tokens = (_usage(reader) - reader_before).prompt_tokens
    return _scored(
        asked, prediction, prompt_tokens=prompt_tokens, answer_ms=answer_ms, judge=judge, seed=seed
    )


def answer_questions(
    items: Sequence[QAItem],
    *,
    reader: Any,
    recalls: Sequence[Callable[[str], tuple[str, int]]],
    now: datetime,
    writer: Any = None,
    judge: Any = None,
    seed: int = 0,
    max_tokens: int = 32,
) -> list[QAResult]:
    """:func:`answer_question` for several questions, the reader answering them in one batch.

    Recall runs for each question in order first (a memory whose recall changes its state,
    such as MemoryBank's reinforcement, sees the same sequence of recalls as one question at
    a time: answering changes no memory), then the reader answers every question with one
    ``generate_batch`` (a reader without it answers one question after another). Each
    answer's ``answer_ms`` is its share of the batch's time (the batch's time divided by its
    questions), and its ``reader_prompt_tokens`` its own prompt.

    Args:
        items: The questions.
        reader: The model that answers (``generate_batch``, else ``generate``).
        recalls: One recall per question (as ``recall`` of :func:`answer_question`).
        now: When the questions are asked (shown to the reader).
        writer: The memory's own model, to count calls the recalls make.
        judge: A judge model, or ``None``.
        seed: Fixes the order of an adversarial question's options.
        max_tokens: Cap on each answer.

    Raises:
        ValueError: if there are not as many recalls as questions.
    """
    if len(items) != len(recalls):
        raise ValueError(f"{len(items)} questions but {len(recalls)} recalls")
    batch = getattr(reader, "generate_batch", None)
    if batch is None or len(items) < 2:
        return [
            answer_question(
                item,
                reader=reader,
                recall=recall,
                now=now,
                writer=writer,
                judge=judge,
                seed=seed,
                max_tokens=max_tokens,
            )
            for item, recall in zip(items, recalls, strict=True)
        ]
    asked = [
        _ask(item, recall, now, writer, seed) for item, recall in zip(items, recalls, strict=True)
    ]
    tick = time.perf_counter()
    replies = batch([a.messages for a in asked], max_tokens=max_tokens, temperature=0.0)
    share = (time.perf_counter() - tick) * 1000 / len(asked)
    return [
        _scored(
            one,
            reply.text.strip(),
            prompt_tokens=int(reply.prompt_tokens or 0),
            answer_ms=share,
            judge=judge,
            seed=seed,
        )
        for one, reply in zip(asked, replies, strict=True)
    ]


def judge_answer(judge: Any, item: QAItem, prediction: str, f1: float) -> bool | None:
    """The judge's label for ``prediction`` (``None`` if its verdict cannot be read).

    An adversarial question (category 5) is not judged: its label is whether the reader
    abstained (``f1 == 1``), as LoCoMo scores it. A resumed run judges answers written
    before a judge was configured with this same call.
    """
    qa = item.qa
    if qa.category == 5:
        return f1 == 1.0
    verdict = judge.generate(
        judge_messages(qa.question, qa.answer, prediction), max_tokens=8, temperature=0.0
    )
    return parse_judge(verdict)


def score_answer(item: QAItem, prediction: str, *, seed: int = 0) -> tuple[float, float]:
    """LoCoMo F1 and BLEU-1 of a reader's reply (an adversarial letter choice resolved first).

    Deterministic, so stored replies can be re-scored (a resumed run re-scores them).
    """
    qa = item.qa
    if qa.category == 5:
        chosen = resolve_option(prediction, adversarial_options(item.id, qa.answer, seed=seed))
        return locomo_f1(chosen, qa.answer, 5), 0.0
    return locomo_f1(prediction, qa.answer, qa.category), bleu1(prediction, qa.answer)


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; ``nan`` for no values."""
    data = sorted(values)
    if not data:
        return math.nan
    if len(data) == 1:
        return float(data[0])
    position = (len(data) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(data) - 1)
    return float(data[low] + (data[high] - data[low]) * (position - low))


def median(values: Iterable[float]) -> float:
    """Median, ``nan`` for no values."""
    data = list(values)
    return float(statistics.median(data)) if data else math.nan


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The complete JSON lines of ``path`` (a torn last line from a kill is skipped)."""
    target = Path(path)
    if not target.is_file():
        return []
    rows = []
    for line in target.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows
