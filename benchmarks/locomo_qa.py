"""Answer quality end to end on LoCoMo: does each memory make the assistant answer better?

Each LoCoMo conversation is saved into a memory through its public path, session by session,
with each session's date driving the engine's clock (``memories_core.evaluation.harness``);
then every sampled question is answered by a reader model from what ``recall`` returns,
rendered as the adapters render it, and scored with LoCoMo's token F1 (per category),
BLEU-1 and, when a judge model is configured, an LLM judge. Cost is counted beside quality:
model calls and tokens spent writing memory per turn, reader prompt tokens per question,
save / recall latency p50 and p95, and the memory's size on disk.

Baselines: ``none`` (no memory), ``full`` (the whole conversation with session dates where it
fits the reader's window, else its most recent part that fits; ``--full-tokens`` sets another
budget) and ``gold`` (the evidence turns: the ceiling).

Runs are resumable: ``--out DIR`` keeps each finished ingest (the memory folder and its cost),
every answer as it is made, and, while a conversation is being ingested, a checkpoint after
each of its sessions (``checkpoint.json`` and the user's memory file,
``checkpoint-s<N>.memories.zip``, written with ``export_user``); ``--resume`` reuses them, so
an interrupted run loses at most the session being ingested: a fresh memory folder gets the
checkpoint (``import_user``) and the next session is saved into it. The checkpoint files are
small (text, vectors, state), so an ingest longer than a machine's session can be carried to
the next one by copying them. A finished ingest keeps its last checkpoint as
``memory.memories.zip``: where the memory folder is missing (another machine), the memory is
restored from it to answer the questions left, instead of ingesting again.
A conversation whose answers are all kept needs only ``answers.jsonl`` and ``ingest.json``
under ``DIR/state/<mechanism>/<conversation>/``: those small files can be copied to another
machine (or committed) and the table rebuilt there without the memory folders; a kept
ingest record whose memory folder is missing is ingested again.
A judge given on ``--resume`` judges the kept answers that have no label yet, without
answering them again.

Examples::

    # the 40-minute check (offline default model as reader and writer)
    python benchmarks/locomo_qa.py --conversations 1 --sessions 6 --questions 30 \
        --mechanisms none,history,memorybank

    # any OpenAI-compatible server as reader, writer and judge
    python benchmarks/locomo_qa.py --llm openai --model gpt-4o-mini --judge-model gpt-4o-mini

The last line printed is always
``best memory F1 0.xxx (<mechanism>) vs no memory F1 0.yyy vs full context F1 0.zzz``
(``n/a`` for a figure whose row was not run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_info import command_line, datasets_dir, save_figure
from tqdm import tqdm

from memories_core import FixedClock, MemoryEngine, Scope
from memories_core.evaluation import load_locomo
from memories_core.evaluation.harness import (
    IngestStats,
    QAItem,
    QAResult,
    answer_questions,
    evidence_context,
    full_context,
    ingest_conversation,
    judge_answer,
    percentile,
    question_time,
    read_jsonl,
    score_answer,
    select_questions,
    write_json_atomic,
)
from memories_core.evaluation.locomo import CATEGORY_NAMES, LocomoConversation
from memories_core.mechanisms.reflection import DEFAULT_RECALL_BUDGET
from memories_core.portable import export_user, import_user

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = datasets_dir() / "locomo" / "locomo_dev.json"
DEFAULT_OUT = HERE / "out" / "locomo_qa"

BASELINES = ("none", "full", "gold")
MECHANISMS = (
    "history",
    "summary",
    "conditional",
    "multiview",
    "reflective",
    "memorybank",
    "memochat",
    "dpem",
    "emg",
    "late",
)
#: Tokens the ``full`` row leaves free in the reader's window: instructions, question, answer.
#: The ``none`` row's whole prompt is about 121 tokens (the 150-question table) and answers are
#: capped at ``--max-tokens`` (32); a local reader cuts an overlong prompt from the left, so
#: the reserve keeps the instructions in it with room for long questions.
FULL_RESERVE_TOKENS = 1024
#: The ``full`` row's budget for a reader that does not say its window (an OpenAI model): the
#: harness's earlier fixed budget, which every such model's window holds; ``--full-tokens``
#: gives a server model its whole window.
FULL_DEFAULT_TOKENS = 6000


def full_budget(llm: Any, asked: int | None) -> int:
    """Tokens of conversation the ``full`` row gives: ``asked``, else what the window holds.

    The baseline is the whole conversation where it fits the reader's window, else its most
    recent part that fits; a reader with ``context_tokens`` (the local models) says its window.
    """
    if asked is not None:
        return asked
    window = getattr(llm, "context_tokens", None)
    if (
        isinstance(window, int)
        and not isinstance(window, bool)
        and window > 2 * FULL_RESERVE_TOKENS
    ):
        return window - FULL_RESERVE_TOKENS
    return FULL_DEFAULT_TOKENS


#: Mechanisms whose memories a model writes (the rest store raw turns).
LLM_WRITTEN = {"summary", "conditional", "multiview", "memorybank", "memochat", "dpem", "emg"}

#: The second speaker's role per mechanism (default ``"assistant"``). LoCoMo's second speaker
#: is a person, not an assistant: EMG-RAG reads a phone's messages, received ones included
#: (Wang et al., appendix A.1), and skips an assistant's replies, so it gets the second
#: speaker's turns as received messages. With them as assistant replies, 62 of the 150
#: questions of the full table rest on turns it never read.
SECOND_SPEAKER_ROLE = {"emg": "message"}


# ----------------------------------------------------------------------------- models
def make_llm(
    kind: str,
    model: str | None,
    base_url: str | None,
    threads: int | None,
    quantize: str = "auto",
) -> Any:
    """A core LLM: ``local`` (an offline GGUF by name or path) or ``openai`` (any server)."""
    if kind == "openai":
        from memories_core.llms import OpenAIChatLLM

        options: dict[str, Any] = {
            "model": model or os.environ.get("OPENAI_MODEL", "gpt-4o-mini"),
            # As the local rows: a reply that loops is cut, not decoded to its cap.
            "stop_loops": True,
        }
        if base_url:
            options["base_url"] = base_url
        return OpenAIChatLLM(**options)
    if kind == "local":
        from memories_core.llms import LocalLLM
        from memories_core.llms.models import MODELS, default_model_name

        name = model or default_model_name()
        if name in MODELS:
            return LocalLLM(model=name, n_threads=threads, quantize=quantize)  # type: ignore[arg-type]
        return LocalLLM(gguf_path=name, n_threads=threads, quantize=quantize)  # type: ignore[arg-type]
    raise SystemExit(f"--llm must be local or openai, got {kind!r}")


def token_counter(llm: Any) -> Callable[[str], int]:
    """Count tokens with the reader's tokenizer when it has one, else ~4 characters a token."""
    count = getattr(llm, "count_tokens", None)
    if callable(count):
        return lambda text: int(count(text))
    return lambda text: max(1, len(text) // 4)


# ----------------------------------------------------------------------------- memories
class MemoryFactory(Protocol):
    """Builds a mechanism row's memory on its folder (the signature of :func:`make_memory`)."""

    def __call__(
        self,
        name: str,
        folder: Path,
        clock: FixedClock,
        llm: Any,
        embedder: Any,
        *,
        recall_budget: float | None = ...,
    ) -> Any: ...


def make_memory(
    name: str,
    folder: Path,
    clock: FixedClock,
    llm: Any,
    embedder: Any,
    *,
    recall_budget: float | None = DEFAULT_RECALL_BUDGET,
) -> Any:
    """The mechanism ``name`` with the library defaults, on a memory folder of its own.

    ``recall_budget`` is the seconds a recall may wait on its own model calls (MemoChat's
    memo choice, self-reflection; ``None``: no limit). Past it those mechanisms fall back to
    their documented first answer, so a slow model measures the fallback, not the paper.
    """
    import memories_core as mc
    from memories_core.retrieval import Pipeline

    common: dict[str, Any] = {"path": folder, "clock": clock, "embedder": embedder}
    # Raw turns with the first stage alone, whatever is installed: HistoryMemory reranks
    # with late interaction by default where the rerank extra is, which is the "late" row.
    first_stage = {**common, "pipeline": Pipeline()}
    if name == "history":
        return mc.HistoryMemory(**first_stage)
    if name == "late":
        from memories_core.retrieval.late_interaction import late_interaction_pipeline

        return mc.HistoryMemory(**common, pipeline=late_interaction_pipeline())
    if name == "summary":
        return mc.SummaryMemory(**common, llm=llm)
    if name == "conditional":
        return mc.ConditionalMemory(**common, llm=llm)
    if name == "multiview":
        # One shared engine, which the memory owns (its close closes it).
        return mc.MultiViewMemory.from_defaults(
            llm=llm, embedder=embedder, path=folder, views=("conditional", "summary"), clock=clock
        )
    if name == "reflective":
        return mc.SelfReflectiveMemory(mc.HistoryMemory(**first_stage), llm, budget=recall_budget)
    if name == "memorybank":
        return mc.MemoryBankMemory(**common, llm=llm)
    if name == "memochat":
        return mc.MemoChatMemory(**common, llm=llm, budget=recall_budget)
    if name == "dpem":
        return mc.DualProcessMemory(**common, llm=llm)
    if name == "emg":
        return mc.EMGMemory(**common, llm=llm)
    raise SystemExit(f"unknown mechanism {name!r}; known: {', '.join(BASELINES + MECHANISMS)}")


def close(memory: Any) -> None:
    closer = getattr(memory, "close", None)
    if callable(closer):
        closer()


# ----------------------------------------------------------------------------- one row
def run_row(
    name: str,
    conversations: Sequence[LocomoConversation],
    items: Sequence[QAItem],
    args: argparse.Namespace,
    llm: Any,
    judge: Any,
    embedder: Any,
    factory: MemoryFactory = make_memory,
) -> dict[str, Any]:
    """Ingest (unless a baseline) and answer every item for one mechanism; resumable.

    ``factory`` builds the mechanism on its memory folder (default :func:`make_memory`); a
    variant of one mechanism's recall passes its own (``benchmarks/variant_qa.py``).
    """
    # The full row's answers depend on its budget: each budget keeps its own.
    state = Path(args.out) / "state" / (f"full-{args.full_tokens}" if name == "full" else name)
    ingests: list[IngestStats] = []
    results: list[QAResult] = []
    count = token_counter(llm)
    for conversation in conversations:
        mine = [item for item in items if item.conversation == conversation.sample_id]
        if not mine:
            continue
        folder = state / conversation.sample_id
        answers_path = folder / "answers.jsonl"
        if not args.resume and folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True, exist_ok=True)
        by_id = {item.id: item for item in mine}
        done = {}
        for row in read_jsonl(answers_path):
            if row.get("id") in by_id:  # re-scored: scoring is deterministic and may improve
                old = QAResult.from_json(row)
                old.f1, old.bleu1 = score_answer(by_id[old.id], old.prediction, seed=args.seed)
                done[old.id] = old
        asked_at = question_time(conversation, args.sessions)
        clock = FixedClock(asked_at)
        memory = None
        todo = [item for item in mine if item.id not in done]
        if name not in BASELINES:
            # Every answer kept: the row needs its ingest's cost, not the memory itself (kept
            # answers and ingest records travel without the memory folders).
            kept = None if todo else kept_ingest(folder)
            if kept is None:
                memory, kept = _ingested(
                    name, conversation, folder, clock, llm, embedder, args, factory
                )
            ingests.append(kept)
        clock.set(asked_at)
        user = conversation.sample_id
        fallbacks: dict[str, int] = {}
        # Built only when something is left to answer: the full row's context counts tokens
        # with the reader's tokenizer, which would load the model for nothing.
        recall = (
            _recaller(name, memory, conversation, user, count, args, fallbacks) if todo else None
        )
        unjudged = (
            [] if judge is None else [i for i in mine if i.id in done and done[i.id].judge is None]
        )
        bar = tqdm(total=len(todo), desc=f"{name} {user} answers", unit="q", disable=args.quiet)
        with answers_path.open("a", encoding="utf-8") as log:
            # Answers kept from a run without a judge are judged now (not answered again);
            # the appended row supersedes the old one when the file is read back.
            for item in tqdm(unjudged, desc=f"{name} {user} judge", unit="q", disable=args.quiet):
                old = done[item.id]
                old.judge = judge_answer(judge, item, old.prediction, old.f1)
                log.write(json.dumps(old.to_json()) + "\n")
                log.flush()
                os.fsync(log.fileno())
            for start in range(0, len(todo), args.answer_batch):
                assert recall is not None  # todo is not empty
                part = todo[start : start + args.answer_batch]
                answered = answer_questions(
                    part,
                    reader=llm,
                    recalls=[recall(item) for item in part],
                    now=asked_at,
                    writer=llm if name in LLM_WRITTEN | {"reflective"} else None,
                    judge=judge,
                    seed=args.seed,
                    max_tokens=args.max_tokens,
                )
                for item, result in zip(part, answered, strict=True):
                    result.recall_fallbacks = fallbacks.get(item.id, 0)
                    done[item.id] = result
                    log.write(json.dumps(result.to_json()) + "\n")
                log.flush()
                os.fsync(log.fileno())
                bar.update(len(part))
            bar.close()
        if memory is not None:
            close(memory)
        results += [done[item.id] for item in mine]
    return summarise(name, results, ingests, judged=judge is not None)


def copy_ingest(
    source: Path,
    out: Path,
    name: str,
    *,
    on_copy: Callable[[Path], None] | None = None,
    embedder: Any = None,
) -> list[Path]:
    """Copy the finished ``name`` ingests of the run ``source`` into ``out``, without answers.

    Each conversation's memory folder and ``ingest.json`` (its cost) are copied, and the
    reader label, so ``main([... "--resume", "--out", out])`` answers the same memories
    again (a before/after on the same records). Where ``source`` kept no memory folder (the
    committed copies, or another machine) the finished ingest's memory file
    (:data:`MEMORY_FILE`) is restored into the copy's folder instead (``import_user`` into a
    :class:`~memories_core.MemoryEngine` with ``embedder``, the run's own, so the file's
    vectors are kept). A conversation already copied into ``out`` is kept as it is, with its
    answers (an interrupted re-answer resumes). ``on_copy`` runs on each new copy's folder
    before its ``ingest.json`` is written, which marks the copy finished (an interrupted copy
    is made again).

    Raises:
        SystemExit: when a finished ingest has neither a memory folder nor a memory file, or
            only the file and no ``embedder`` was given.
    """
    folders = []
    for marker in sorted((source / "state" / name).glob("*/ingest.json")):
        folder = marker.parent
        kept_file = folder / MEMORY_FILE
        if not (folder / "memory").is_dir() and not kept_file.is_file():
            raise SystemExit(f"{folder} has no memory folder or memory file")
        if not (folder / "memory").is_dir() and embedder is None:
            raise SystemExit(f"{folder} has only a memory file: restoring it needs the embedder")
        target = out / "state" / name / folder.name
        if (target / "ingest.json").is_file() and (target / "memory").is_dir():
            folders.append(target)
            continue
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        if (folder / "memory").is_dir():
            shutil.copytree(folder / "memory", target / "memory")
        else:
            shutil.copy2(kept_file, target / MEMORY_FILE)
            engine = MemoryEngine(path=target / "memory", embedder=embedder)
            try:
                import_user(engine, kept_file, user_id=folder.name)
            finally:
                engine.close()
        if on_copy is not None:
            on_copy(target)
        shutil.copy2(marker, target / "ingest.json")
        folders.append(target)
    reader = source / "state" / "reader.json"
    if reader.is_file() and folders:
        shutil.copy2(reader, out / "state" / "reader.json")
    return folders


def kept_answers(out: Path, mechanism: str) -> dict[str, dict[str, Any]]:
    """Every kept answer of ``mechanism`` in a run's ``--out``, by question id, as written.

    A later line for the same question supersedes an earlier one.
    """
    rows: dict[str, dict[str, Any]] = {}
    for path in sorted((Path(out) / "state" / mechanism).glob("*/answers.jsonl")):
        for row in read_jsonl(path):
            rows[str(row["id"])] = row
    return rows


def kept_ingest(folder: Path) -> IngestStats | None:
    """The finished ingest's record in ``folder`` (``None``: not finished)."""
    marker = folder / "ingest.json"
    if not marker.is_file():
        return None
    return IngestStats.from_json(json.loads(marker.read_text(encoding="utf-8")))


#: An unfinished ingest's last checkpoint: ``{"file": <memory file>, "stats": IngestStats}``.
CHECKPOINT = "checkpoint.json"


def kept_checkpoint(folder: Path) -> tuple[Path, IngestStats] | None:
    """The last session checkpoint of an unfinished ingest in ``folder``, if any.

    The memory file is written before the record that names it, so a checkpoint record
    always names a complete file (an interrupted write leaves the previous checkpoint).
    """
    record = folder / CHECKPOINT
    if not record.is_file():
        return None
    data = json.loads(record.read_text(encoding="utf-8"))
    file = folder / Path(str(data["file"])).name
    if not file.is_file():
        return None
    return file, IngestStats.from_json(data["stats"])


def _checkpointer(memory: Any, folder: Path, user: str) -> Callable[[IngestStats], None]:
    """After each session: the user's whole memory to a file (``export_user``), then its record.

    So an ingest interrupted in a later session resumes from the last finished one
    (``--resume``), in this process's memory folder or, with the checkpoint files copied
    (they are small: text, vectors, state), on another machine.
    """

    def write(stats: IngestStats) -> None:
        file = folder / f"checkpoint-s{stats.sessions}.memories.zip"
        export_user(memory, user, file)
        write_json_atomic(folder / CHECKPOINT, {"file": file.name, "stats": stats.to_json()})
        for old in folder.glob("checkpoint-s*.memories.zip"):
            if old != file:
                old.unlink(missing_ok=True)

    return write


#: A finished ingest's memory as one file (its last checkpoint), kept beside ``ingest.json``.
MEMORY_FILE = "memory.memories.zip"


def _keep_memory_file(folder: Path) -> None:
    """The last checkpoint becomes the finished ingest's memory file; the rest go."""
    kept = kept_checkpoint(folder)
    if kept is not None:
        kept[0].replace(folder / MEMORY_FILE)
    (folder / CHECKPOINT).unlink(missing_ok=True)
    for file in folder.glob("checkpoint-s*.memories.zip"):
        file.unlink(missing_ok=True)


def _ingested(
    name: str,
    conversation: LocomoConversation,
    folder: Path,
    clock: FixedClock,
    llm: Any,
    embedder: Any,
    args: argparse.Namespace,
    factory: MemoryFactory,
) -> tuple[Any, IngestStats]:
    """Open a finished ingest, or ingest the conversation (from its last checkpoint, if any).

    An ingest interrupted after some sessions resumes from the last session checkpoint
    (:func:`kept_checkpoint`): a fresh memory folder gets the checkpoint's memory file
    (``import_user``, which restores records, vectors, state, jobs and graph), and the
    remaining sessions are saved into it. Without a checkpoint a torn ingest is redone.
    """
    marker = folder / "ingest.json"
    memory_dir = folder / "memory"
    budget = args.recall_budget or None  # 0: no limit
    stats = kept_ingest(folder)
    if stats is not None and memory_dir.is_dir():
        return factory(name, memory_dir, clock, llm, embedder, recall_budget=budget), stats
    shutil.rmtree(memory_dir, ignore_errors=True)
    memory = factory(name, memory_dir, clock, llm, embedder, recall_budget=budget)
    user = conversation.sample_id
    if stats is not None and (folder / MEMORY_FILE).is_file():
        # A finished ingest whose folder is gone (another machine): its memory file.
        import_user(memory, folder / MEMORY_FILE, user_id=user)
        return memory, stats
    kept = kept_checkpoint(folder)
    resume = None
    if kept is not None:
        file, resume = kept
        import_user(memory, file, user_id=user)
    total = sum(
        1 for turn in conversation.turns if args.sessions is None or turn.session <= args.sessions
    )
    with tqdm(total=total, desc=f"{name} {user} ingest", unit="turn", disable=args.quiet) as bar:
        stats = ingest_conversation(
            memory,
            conversation,
            clock,
            user_id=user,
            sessions=args.sessions,
            writer=llm if name in LLM_WRITTEN else None,
            progress=bar.update,
            resume=resume,
            on_session=_checkpointer(memory, folder, user),
            second_role=SECOND_SPEAKER_ROLE.get(name, "assistant"),
        )
    write_json_atomic(marker, stats.to_json())
    _keep_memory_file(folder)
    return memory, stats


#: Failure counters of a recall's own model step (MemoChat's memo choice, self-reflection).
RECALL_FALLBACKS = ("memo_choice", "reflection", "reflection_timeout")


def recall_fallbacks(memory: Any) -> int:
    """Recalls so far whose own model step failed or ran out of time (0 without one)."""
    usage = getattr(memory, "usage", None)
    failures = getattr(usage, "failures", None) or {}
    return sum(int(failures.get(name, 0)) for name in RECALL_FALLBACKS)


def _recaller(
    name: str,
    memory: Any,
    conversation: LocomoConversation,
    user: str,
    count: Callable[[str], int],
    args: argparse.Namespace,
    fallbacks: dict[str, int],
) -> Callable[[QAItem], Callable[[str], tuple[str, int]]]:
    """``item -> (question -> (context, records))`` for a mechanism or a baseline.

    A mechanism's recall writes into ``fallbacks[item.id]`` how many of its own model steps
    failed or ran out of time for that question.
    """
    if name == "none":
        return lambda item: lambda question: ("", 0)
    if name == "full":
        text = full_context(
            conversation, sessions=args.sessions, budget_tokens=args.full_tokens, count_tokens=count
        )
        return lambda item: lambda question: (text, text.count("\n") + 1)
    if name == "gold":

        def gold(item: QAItem) -> Callable[[str], tuple[str, int]]:
            text = evidence_context(conversation, item.qa)
            return lambda question: (text, len(item.qa.evidence))

        return gold

    def through_memory(item: QAItem) -> Callable[[str], tuple[str, int]]:
        def recall(question: str) -> tuple[str, int]:
            options = {} if args.k is None else {"k": args.k}
            before = recall_fallbacks(memory)
            found = memory.recall(question, Scope(user), **options)
            fallbacks[item.id] = recall_fallbacks(memory) - before
            return found.context, len(found.records)

        return recall

    return through_memory


# ----------------------------------------------------------------------------- tables
def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summarise(
    name: str, results: Sequence[QAResult], ingests: Sequence[IngestStats], *, judged: bool
) -> dict[str, Any]:
    """One table row: quality overall and per category, and the cost columns."""
    turns = sum(s.turns for s in ingests)
    row: dict[str, Any] = {
        "mechanism": name,
        "questions": len(results),
        "f1": _mean([r.f1 for r in results]),
        "bleu1": _mean([r.bleu1 for r in results if r.category != 5]),
        "judge": _mean([1.0 if r.judge else 0.0 for r in results if r.judge is not None])
        if judged
        else None,
        "by_category": {
            CATEGORY_NAMES[c]: {
                "n": len([r for r in results if r.category == c]),
                "f1": _mean([r.f1 for r in results if r.category == c]),
            }
            for c in sorted({r.category for r in results})
        },
        "write_llm_calls_per_turn": sum(s.llm_calls for s in ingests) / turns if turns else 0.0,
        "write_tokens_per_turn": (
            sum(s.prompt_tokens + s.completion_tokens for s in ingests) / turns if turns else 0.0
        ),
        "write_llm_failures": sum(s.llm_failures for s in ingests),
        # Writer replies that reached their output cap (None: an ingest kept before they were
        # counted).
        "write_capped": None
        if any(s.llm_capped is None for s in ingests)
        else sum(s.llm_capped or 0 for s in ingests),
        "pending_jobs_after_ingest": sum(s.pending_jobs for s in ingests),
        "reader_prompt_tokens": _mean([float(r.reader_prompt_tokens) for r in results]),
        "context_chars": _mean([float(r.context_chars) for r in results]),
        "recall_llm_calls_per_question": _mean([float(r.recall_llm_calls) for r in results]),
        "recall_fallbacks": sum(r.recall_fallbacks for r in results),
        "save_ms_p50": percentile([ms for s in ingests for ms in s.save_ms], 50),
        "save_ms_p95": percentile([ms for s in ingests for ms in s.save_ms], 95),
        "session_end_ms_p50": percentile([ms for s in ingests for ms in s.flush_ms], 50),
        "recall_ms_p50": percentile([r.recall_ms for r in results], 50),
        "recall_ms_p95": percentile([r.recall_ms for r in results], 95),
        "answer_ms_p50": percentile([r.answer_ms for r in results], 50),
        "ingest_s": sum(s.wall_s for s in ingests),
        # Recall + answer time of every kept answer: with ingest_s, what the row cost however
        # many resumed invocations made it.
        "answer_s": sum(r.recall_ms + r.answer_ms for r in results) / 1000,
        "store_bytes": sum(s.store_bytes for s in ingests),
        "turns": turns,
    }
    return row


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The results as a Markdown table (quality, then cost)."""
    categories = [CATEGORY_NAMES[c] for c in sorted(CATEGORY_NAMES)]
    judged = any(row["judge"] is not None for row in rows)
    head = ["mechanism", "n", "F1", *[f"F1 {c}" for c in categories], "BLEU-1"]
    if judged:
        head.append("judge")
    head += [
        "write calls/turn",
        "write tok/turn",
        "reader prompt tok/q",
        "recall calls/q (fallbacks)",
        "save p50/p95 ms",
        "recall p50/p95 ms",
        "ingest s",
        "store MB",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["mechanism"], str(row["questions"]), _fmt(row["f1"])]
        for c in categories:
            cat = row["by_category"].get(c)
            cells.append(f"{_fmt(cat['f1'])} ({cat['n']})" if cat else "-")
        cells.append(_fmt(row["bleu1"]))
        if judged:
            cells.append(_fmt(row["judge"]))
        cells += [
            _fmt(row["write_llm_calls_per_turn"], 2),
            _fmt(row["write_tokens_per_turn"], 0),
            _fmt(row["reader_prompt_tokens"], 0),
            f"{_fmt(row['recall_llm_calls_per_question'], 2)} ({row.get('recall_fallbacks', 0)})",
            f"{_fmt(row['save_ms_p50'], 1)} / {_fmt(row['save_ms_p95'], 1)}",
            f"{_fmt(row['recall_ms_p50'], 1)} / {_fmt(row['recall_ms_p95'], 1)}",
            _fmt(row["ingest_s"], 0),
            _fmt(row["store_bytes"] / 1e6, 1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _tokens_per_question(row: dict[str, Any]) -> float:
    """Model tokens per question: the reader's prompt plus memory writing, amortised."""
    spent = float(row["reader_prompt_tokens"])
    if row["questions"]:
        spent += row["write_tokens_per_turn"] * row["turns"] / row["questions"]
    return spent


def versus_raw_turns(rows: Sequence[dict[str, Any]], raw: str = "history") -> str:
    """Where each LLM-written memory beats or loses to raw turns, per category, at what cost.

    One line per LLM-written row: its F1 minus the raw-turn row's (``history``), overall and
    per category, and the ratio of model tokens per question (reader prompt plus writing,
    amortised over the questions). Empty when either side was not run.
    """
    by_name = {row["mechanism"]: row for row in rows}
    base = by_name.get(raw)
    written = [row for row in rows if row["mechanism"] in LLM_WRITTEN]
    if base is None or not written:
        return ""
    categories = [CATEGORY_NAMES[c] for c in sorted(CATEGORY_NAMES)]
    head = ["mechanism", "dF1", *[f"dF1 {c}" for c in categories], "tokens/q ratio"]
    lines = [
        f"LLM-written memory minus raw turns (`{raw}`):",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for row in written:
        cells = [row["mechanism"], f"{row['f1'] - base['f1']:+.3f}"]
        for c in categories:
            mine, theirs = row["by_category"].get(c), base["by_category"].get(c)
            cells.append(f"{mine['f1'] - theirs['f1']:+.3f}" if mine and theirs else "-")
        base_cost = _tokens_per_question(base)
        ratio = _tokens_per_question(row) / base_cost if base_cost else math.nan
        cells.append(f"{ratio:.1f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def last_line(rows: Sequence[dict[str, Any]]) -> str:
    """``best memory F1 0.xxx (<mechanism>) vs no memory F1 0.yyy vs full context F1 0.zzz``."""
    by_name = {row["mechanism"]: row for row in rows}
    memories = [row for row in rows if row["mechanism"] not in BASELINES]
    best = max(memories, key=lambda row: row["f1"], default=None)
    best_text = f"{best['f1']:.3f} ({best['mechanism']})" if best else "n/a (none run)"

    def figure(name: str) -> str:
        row = by_name.get(name)
        return f"{row['f1']:.3f}" if row else "n/a"

    return (
        f"best memory F1 {best_text} vs no memory F1 {figure('none')} "
        f"vs full context F1 {figure('full')}"
    )


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Quality vs cost: F1 against model tokens spent per question (writing + reading)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in rows:
        per_question = _tokens_per_question(row)
        ax.scatter(per_question, row["f1"], s=40)
        ax.annotate(
            row["mechanism"],
            (per_question, row["f1"]),
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=9,
        )
    ax.set_xscale("log")
    from matplotlib.ticker import NullFormatter

    ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on a short log axis
    ax.set_xlabel("model tokens per question (reader prompt + memory writing, amortised)")
    ax.set_ylabel("LoCoMo F1")
    ax.set_title("Answer quality vs cost")
    ax.grid(True, alpha=0.3)
    save_figure(fig, path)


# ----------------------------------------------------------------------------- main
def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="LoCoMo JSON file")
    parser.add_argument(
        "--mechanisms",
        default=",".join(BASELINES + MECHANISMS),
        help="comma-separated rows: " + ", ".join(BASELINES + MECHANISMS),
    )
    parser.add_argument("--conversations", type=int, default=None, help="first N conversations")
    parser.add_argument("--sessions", type=int, default=None, help="first N sessions of each")
    parser.add_argument("--questions", type=int, default=None, help="N questions in all (sampled)")
    parser.add_argument("--seed", type=int, default=0, help="sampling and option-order seed")
    parser.add_argument("--llm", default="local", choices=("local", "openai"))
    parser.add_argument(
        "--model",
        default=None,
        help="local: a model name (qwen2.5-1.5b, smollm2-135m) or a GGUF path; openai: a model",
    )
    parser.add_argument("--base-url", default=None, help="OpenAI-compatible server URL")
    parser.add_argument("--judge-llm", default=None, choices=("local", "openai"))
    parser.add_argument("--judge-model", default=None, help="judge model (implies a judge)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="local model threads")
    parser.add_argument(
        "--quantize",
        default="auto",
        choices=("auto", "none", "int8", "int8-decode"),
        help="local model's int8 weights (LocalLLM quantize=; auto: quantize.AUTO_QUANTIZE)",
    )
    parser.add_argument("--k", type=int, default=None, help="records recalled (default: each's)")
    parser.add_argument(
        "--full-tokens",
        type=int,
        default=None,
        help="'full' row's token budget (default: the reader's window less "
        f"{FULL_RESERVE_TOKENS} tokens, or {FULL_DEFAULT_TOKENS} if it does not say)",
    )
    parser.add_argument("--max-tokens", type=int, default=32, help="reader answer cap")
    parser.add_argument(
        "--answer-batch",
        type=_positive,
        default=1,
        help="questions recalled in turn, then answered by the reader in one batch "
        "(generate_batch; each answer's time is its share); 1: one at a time, as the "
        "table's rows were made (a batch does not reuse the reader's prompt cache)",
    )
    parser.add_argument(
        "--recall-budget",
        type=float,
        default=DEFAULT_RECALL_BUDGET,
        help="seconds a recall may wait on its own model calls (memo choice, reflection); "
        "past it the mechanism falls back to its first answer (0: no limit)",
    )
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="results and resumable state")
    parser.add_argument("--resume", action="store_true", help="reuse finished ingests/answers")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    return parser.parse_args(argv)


def _weights_label(quantized: str) -> str:
    """How the reader/writer's weights were converted, as a suffix of its name."""
    labels = {"int8": " (int8 weights)", "int8-decode": " (int8 weights for decoding)"}
    return labels.get(quantized, "")


def reader_label(llm: Any, out: Path) -> str:
    """The reader/writer's name and weights, as the kept answers were made.

    A local model's int8 conversion is known once it is loaded; the label is then kept in
    ``state/reader.json``, so a table rebuilt from kept answers (nothing loaded) names the
    model as it ran.
    """
    name = getattr(llm, "name", type(llm).__name__)
    label = name + _weights_label(getattr(llm, "quantized", "none"))
    kept = out / "state" / "reader.json"
    if getattr(llm, "loaded", True):
        write_json_atomic(kept, {"reader_writer": label})
        return label
    with contextlib.suppress(OSError, ValueError, AttributeError):
        stored = json.loads(kept.read_text(encoding="utf-8")).get("reader_writer")
        if isinstance(stored, str) and stored.startswith(name):  # the same model
            return stored
    return label


def main(
    argv: Sequence[str] | None = None,
    *,
    factory: MemoryFactory = make_memory,
    embedder: Any = None,
    llm: Any = None,
) -> int:
    """Run the harness.

    ``factory`` replaces :func:`make_memory` for every mechanism row; ``embedder`` is the
    one already loaded by a caller (default: the bundled MiniLM, loaded here), and ``llm``
    the reader/writer already loaded by a caller (default: :func:`make_llm` of the
    arguments).
    """
    args = parse_args(argv)
    names = [n.strip() for n in args.mechanisms.split(",") if n.strip()]
    unknown = [n for n in names if n not in BASELINES + MECHANISMS]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; known: {', '.join(BASELINES + MECHANISMS)}")
    conversations = load_locomo(args.data)[: args.conversations]
    items = select_questions(
        conversations, sessions=args.sessions, limit=args.questions, seed=args.seed
    )
    started = time.perf_counter()
    if llm is None:
        llm = make_llm(args.llm, args.model, args.base_url, args.threads, args.quantize)
    args.full_tokens = full_budget(llm, args.full_tokens)
    judge = None
    if args.judge_llm or args.judge_model:
        same = (args.judge_llm or args.llm) == args.llm and args.judge_model in (None, args.model)
        # The reader judging itself is loaded once (a local model costs GBs); the table and
        # ``judge_is_reader`` say so.
        judge = (
            llm
            if same
            else make_llm(
                args.judge_llm or args.llm,
                args.judge_model,
                args.base_url,
                args.threads,
                args.quantize,
            )
        )
    if embedder is None:
        from memories_core.embedders import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder()
    rows = []
    for name in names:
        row = run_row(name, conversations, items, args, llm, judge, embedder, factory)
        rows.append(row)
        if not args.quiet:
            print(f"{name}: F1 {row['f1']:.3f} over {row['questions']} questions", flush=True)
    wall = time.perf_counter() - started
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    judge_name = getattr(judge, "name", None)
    reader = reader_label(llm, out)
    meta = {
        "command": command_line(
            "benchmarks/locomo_qa.py", list(sys.argv[1:] if argv is None else argv)
        ),
        "reader_writer": reader,
        "judge": judge_name,
        "judge_is_reader": judge is not None and judge_name == getattr(llm, "name", None),
        "conversations": [c.sample_id for c in conversations],
        "questions": len(items),
        "sessions": args.sessions,
        "seed": args.seed,
        "full_tokens": args.full_tokens,
        "wall_s": wall,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_1m": os.getloadavg()[0],
        },
    }
    write_json_atomic(out / "locomo_qa.json", {"meta": meta, "rows": rows})
    text = table(rows)
    versus = versus_raw_turns(rows)
    if versus:
        text = f"{text}\n\n{versus}"
    judge_label = (judge_name or "none") + (
        " (the reader itself)" if meta["judge_is_reader"] else ""
    )
    work = sum(row["ingest_s"] + row["answer_s"] for row in rows)
    (out / "locomo_qa.md").write_text(
        f"Command: `{meta['command']}`\n\nReader and writer: {meta['reader_writer']}; judge: "
        f"{judge_label}; {len(items)} questions; wall {wall / 60:.1f} min (this invocation); "
        f"ingests and answers, kept ones included, {work / 3600:.1f} h.\n\n{text}\n",
        encoding="utf-8",
    )
    with contextlib.suppress(ImportError):  # matplotlib is optional (extra graph/dev)
        plot(rows, out / "locomo_qa.png")
    print(text)
    if judge is not None:
        print(f"judge: {judge_label}")
    print(f"wall time {wall / 60:.1f} min, load {os.getloadavg()[0]:.1f}")
    print(last_line(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
