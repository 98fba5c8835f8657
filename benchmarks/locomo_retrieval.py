"""LoCoMo retrieval benchmark: recall@k of evidence turns, dense vs lexical vs hybrid.

Per conversation, every raw turn is stored as one record ``"speaker: text"`` (metadata
``dia_id``) in an in-memory SQLiteRecordStore + NumpyIndex and searched through the library's
HybridRetriever with each QA question. Recall@k is the fraction of a question's evidence turns
found in the top k, averaged over questions that have evidence; reported overall and per
LoCoMo category, for the three search modes.

Embeddings (all-MiniLM-L6-v2 by default) are computed once per text and cached on disk under
benchmarks/out/cache, so the three modes, the fusion sweep and reruns reuse them.

The "pipeline" rows run :class:`memories_core.retrieval.Pipeline` (library defaults) over the
in-memory reference backend, with every turn timestamped at its session's date plus 30 s
per turn: once with session ids, and twice without (each session saved in one call, so one
``batch_id`` per session; and turn by turn, so neighbours come from the time gap only), plus
a sweep of that gap.

    python benchmarks/locomo_retrieval.py                       # table, JSON, PNG, Markdown
    python benchmarks/locomo_retrieval.py --sweep               # + fusion parameter grid
    python benchmarks/locomo_retrieval.py --latency-rows 110000 # + search_text latency
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import random
import shlex
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from memories_core.backends import NumpyIndex, SQLiteRecordStore
from memories_core.embedders.base import BaseEmbedder
from memories_core.evaluation import CATEGORY_NAMES, LocomoConversation, load_locomo, recall_at_k
from memories_core.evaluation.locomo import LocomoTurn
from memories_core.interfaces import Embedder
from memories_core.retrieval import (
    DEFAULT_CONTEXT_GAP,
    ContextSpreading,
    FusionConfig,
    HybridRetriever,
    Pipeline,
    RecallRequest,
    SearchMode,
)
from memories_core.retrieval.memory_backend import InMemoryBackend
from memories_core.types import MemoryRecord, ensure_utc

#: The shared datasets folder next to the repository (see shared/datasets/README.md).
DEFAULT_DATA = (
    Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "datasets"
    / "locomo"
    / "locomo_dev.json"
)
OUT = Path(__file__).resolve().parent / "out"
KS = (1, 5, 10, 25)
#: Rows of the table: a label, the search mode and the fusion (None = the library default).
VARIANTS: dict[str, tuple[SearchMode, FusionConfig | None]] = {
    "dense": ("dense", None),
    "lexical": ("lexical", None),
    "hybrid, no context": (
        "hybrid",
        FusionConfig(previous_context_weight=0.0, next_context_weight=0.0),
    ),
    "hybrid": ("hybrid", None),
}
MODES = tuple(VARIANTS)


class CachedEmbedder(BaseEmbedder):
    """Memoises another embedder's vectors in memory and in an ``.npz`` file per model."""

    def __init__(self, inner: Embedder, cache_dir: Path) -> None:
        super().__init__()
        self.inner = inner
        safe = "".join(c if c.isalnum() else "_" for c in inner.name)
        self.file = cache_dir / f"{safe}.npz"
        self.vectors: dict[str, npt.NDArray[np.float32]] = {}
        if self.file.exists():
            data = np.load(self.file)
            self.vectors = {key: data[key] for key in data.files}
        self.dirty = False

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dimension(self) -> int:
        return self.inner.dimension

    @staticmethod
    def key(kind: str, text: str) -> str:
        return kind + hashlib.sha1(text.encode("utf-8")).hexdigest()

    def warm(self, texts: Sequence[str], *, query: bool) -> None:
        kind = "q" if query else "d"
        missing = sorted({t for t in texts if self.key(kind, t) not in self.vectors})
        if not missing:
            return
        if query:
            vectors = np.stack([self.inner.embed_query(t) for t in missing])
        else:
            vectors = self.inner.embed_documents(missing)
        for text, vector in zip(missing, vectors, strict=True):
            self.vectors[self.key(kind, text)] = vector
        self.dirty = True

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        self.warm(texts, query=False)
        return np.stack([self.vectors[self.key("d", t)] for t in texts])

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        self.warm([text], query=True)
        return self.vectors[self.key("q", text)]

    def save(self) -> None:
        if self.dirty:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            np.savez(self.file, **self.vectors)  # type: ignore[arg-type]
            self.dirty = False


def build(conversation: LocomoConversation, embedder: Embedder) -> HybridRetriever:
    """One store + index per conversation, every turn a record whose id is its dia_id."""
    store = SQLiteRecordStore(None)
    base = datetime(2023, 1, 1, tzinfo=timezone.utc)
    store.add(
        [
            MemoryRecord(
                id=turn.dia_id,
                user_id=conversation.sample_id,
                kind="turn",
                text=turn.render(),
                created_at=base + timedelta(minutes=i),
                session_id=f"session_{turn.session}",
                metadata={"dia_id": turn.dia_id, "speaker": turn.speaker},
            )
            for i, turn in enumerate(conversation.turns)
            if turn.text.strip()
        ]
    )
    retriever = HybridRetriever(store, NumpyIndex(), embedder)
    retriever.index_pending(batch_size=512)
    return retriever


def evaluate(
    conversations: Sequence[LocomoConversation],
    retrievers: dict[str, HybridRetriever],
    *,
    mode: SearchMode,
    fusion: FusionConfig | None = None,
) -> dict[str, Any]:
    """Recall@k overall and per category for one mode (and fusion config)."""
    per_category: dict[int, list[dict[int, float]]] = defaultdict(list)
    for conversation in conversations:
        retriever = retrievers[conversation.sample_id]
        if fusion is not None:
            retriever = HybridRetriever(
                retriever.store, retriever.index, retriever.embedder, fusion=fusion
            )
        for qa in conversation.qa:
            if not qa.evidence:
                continue
            hits = retriever.search(
                qa.question, user_id=conversation.sample_id, k=max(KS), mode=mode
            )
            ranked = [hit.record.id for hit in hits]
            per_category[qa.category].append({k: recall_at_k(ranked, qa.evidence, k) for k in KS})
    return summarise_categories(per_category)


def summarise_categories(per_category: dict[int, list[dict[int, float]]]) -> dict[str, Any]:
    everything = [row for rows in per_category.values() for row in rows]

    def summarise(rows: list[dict[int, float]]) -> dict[str, float]:
        return {f"R@{k}": statistics.fmean(r[k] for r in rows) for k in KS} | {"n": len(rows)}

    return {
        "overall": summarise(everything),
        "categories": {
            CATEGORY_NAMES.get(c, str(c)): summarise(rows)
            for c, rows in sorted(per_category.items())
        },
    }


#: Seconds between two turns of a session in the pipeline rows.
TURN_SECONDS = 30
#: How the pipeline rows store a conversation: with session ids, or without them, saving
#: each session in one call (one batch) or each turn in its own call.
STORAGE = ("session ids", "no session ids, one save per session", "no session ids, turn by turn")
#: Context gaps swept for the turn-by-turn storage (None: no gap, neighbours by batch only).
GAPS: tuple[timedelta | None, ...] = (
    None,
    timedelta(seconds=10),
    timedelta(minutes=1),
    DEFAULT_CONTEXT_GAP,
    timedelta(hours=6),
    timedelta(days=2),
)


def dated_sessions(
    conversation: LocomoConversation,
) -> dict[int, list[tuple[LocomoTurn, datetime]]]:
    """Each session's non-empty turns with a time: the session's date plus 30 s per turn."""
    fallback = datetime(2023, 1, 1, tzinfo=timezone.utc)
    sessions: dict[int, list[tuple[LocomoTurn, datetime]]] = defaultdict(list)
    for turn in conversation.turns:
        if not turn.text.strip():
            continue
        start = conversation.session_datetime(turn.session)
        start = ensure_utc(start) if start else fallback + timedelta(days=turn.session)
        position = len(sessions[turn.session])
        sessions[turn.session].append((turn, start + timedelta(seconds=TURN_SECONDS * position)))
    return sessions


def pipeline_backend(
    conversation: LocomoConversation, embedder: CachedEmbedder, storage: str
) -> InMemoryBackend:
    """One in-memory backend per conversation; turns dated by their session."""
    backend = InMemoryBackend(embedder)
    for dated in dated_sessions(conversation).values():
        records = [
            MemoryRecord(
                id=turn.dia_id,
                user_id=conversation.sample_id,
                kind="turn",
                text=turn.render(),
                created_at=when,
                session_id=f"session_{turn.session}" if storage == "session ids" else None,
                metadata={"dia_id": turn.dia_id, "speaker": turn.speaker},
            )
            for turn, when in dated
        ]
        vectors = embedder.embed_documents([r.text for r in records])
        if storage == "no session ids, turn by turn":
            for record, vector in zip(records, vectors, strict=True):
                backend.add([record], vector[None, :])
        else:
            backend.add(records, vectors)
    return backend


def evaluate_pipeline(
    conversations: Sequence[LocomoConversation],
    backends: dict[str, InMemoryBackend],
    pipeline: Pipeline,
) -> dict[str, Any]:
    """Recall@k overall and per category of a pipeline over per-conversation backends."""
    per_category: dict[int, list[dict[int, float]]] = defaultdict(list)
    for conversation in conversations:
        backend = backends[conversation.sample_id]
        for qa in conversation.qa:
            if not qa.evidence:
                continue
            request = RecallRequest(qa.question, user_id=conversation.sample_id, k=max(KS))
            ranked = [hit.record.id for hit in pipeline.run(request, backend)]
            per_category[qa.category].append({k: recall_at_k(ranked, qa.evidence, k) for k in KS})
    return summarise_categories(per_category)


def pipeline_rows(
    conversations: Sequence[LocomoConversation], embedder: CachedEmbedder
) -> dict[str, Any]:
    """The pipeline with and without session ids, and the gap sweep without them."""
    results: dict[str, Any] = {}
    for storage in STORAGE:
        backends = {c.sample_id: pipeline_backend(c, embedder, storage) for c in conversations}
        results[f"pipeline, {storage}"] = evaluate_pipeline(conversations, backends, Pipeline())
        if storage == "no session ids, turn by turn":
            for gap in GAPS:
                pipeline = Pipeline(rerankers=(ContextSpreading(gap=gap),))
                label = f"pipeline, turn by turn, gap {gap_label(gap)}"
                results[label] = evaluate_pipeline(conversations, backends, pipeline)
        for backend in backends.values():
            backend.close()
    return results


PUBLIC_STORAGE = ("session ids", "no session ids, turn by turn")


def public_rows(
    conversations: Sequence[LocomoConversation], embedder: CachedEmbedder
) -> dict[str, Any]:
    """What users get: ``HistoryMemory.save`` / ``recall`` (engine defaults, in memory).

    With session ids every session is saved under its own ``Scope(user, session_id)``;
    without, every turn is saved alone under ``Scope(user)`` with its timestamp, and the
    engine's session tracker (idle gap) supplies the sessions.
    """
    from memories_core import FixedClock, HistoryMemory, Scope, Turn

    results: dict[str, Any] = {}
    fallback = datetime(2023, 1, 1, tzinfo=timezone.utc)
    for storage in PUBLIC_STORAGE:
        per_category: dict[int, list[dict[int, float]]] = defaultdict(list)
        for conversation in conversations:
            memory = HistoryMemory(embedder=embedder, clock=FixedClock(fallback))
            user = conversation.sample_id
            for number, dated in dated_sessions(conversation).items():
                turns = [
                    Turn(
                        "user",
                        t.text,
                        speaker=t.speaker,
                        timestamp=when,
                        metadata={"dia_id": t.dia_id},
                    )
                    for t, when in dated
                ]
                if storage == "session ids":
                    memory.save(turns, Scope(user, f"session_{number}"))
                else:
                    for one in turns:
                        memory.save([one], Scope(user))
            for qa in conversation.qa:
                if not qa.evidence:
                    continue
                hits = memory.recall(qa.question, Scope(user), k=max(KS)).records
                ranked = [str(hit.record.metadata["dia_id"]) for hit in hits]
                per_category[qa.category].append(
                    {k: recall_at_k(ranked, qa.evidence, k) for k in KS}
                )
            memory.close()
        results[f"HistoryMemory.recall, {storage}"] = summarise_categories(per_category)
    return results


def gap_label(gap: timedelta | None) -> str:
    if gap is None:
        return "none"
    seconds = int(gap.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def pipeline_table(rows: dict[str, Any]) -> str:
    base = rows["pipeline, session ids"]["overall"]
    lines = [
        "| pipeline row | R@5 | R@10 | R@25 | R@5 vs session ids |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, result in rows.items():
        overall = result["overall"]
        lines.append(
            f"| {label} | {overall['R@5']:.3f} | {overall['R@10']:.3f} | {overall['R@25']:.3f} "
            f"| {overall['R@5'] - base['R@5']:+.3f} |"
        )
    return "\n".join(lines)


def sweep(
    conversations: Sequence[LocomoConversation], retrievers: dict[str, HybridRetriever]
) -> list[dict[str, Any]]:
    """Score a grid of fusion settings (how the library defaults were chosen)."""
    configs: list[FusionConfig] = []
    for method in ("zscore", "rrf"):
        for lexical in (0.5, 0.65, 0.8):
            for previous, following in ((0.0, 0.0), (0.3, 0.1), (0.4, 0.3), (0.5, 0.3)):
                configs.append(
                    FusionConfig(
                        method=method,
                        dense_weight=round(1 - lexical, 2),
                        lexical_weight=lexical,
                        previous_context_weight=previous,
                        next_context_weight=following,
                    )
                )
    rows = []
    for config in configs:
        result = evaluate(conversations, retrievers, mode="hybrid", fusion=config)
        rows.append({"fusion": asdict(config), **result["overall"]})
        print(
            f"  {config.method:6} dense={config.dense_weight:.2f} "
            f"lexical={config.lexical_weight:.2f} context={config.previous_context_weight:.1f}/"
            f"{config.next_context_weight:.1f}  "
            + "  ".join(f"R@{k} {result['overall'][f'R@{k}']:.3f}" for k in KS),
            flush=True,
        )
    return rows


def latency(conversations: Sequence[LocomoConversation], rows: int) -> dict[str, Any]:
    """Median/p95 ``search_text`` time on a store of ``rows`` records (90% one user)."""
    rng = random.Random(0)
    texts = [turn.render() for c in conversations for turn in c.turns if turn.text.strip()]
    questions = [qa.question for c in conversations for qa in c.qa]
    store = SQLiteRecordStore(None)
    now = datetime.now(timezone.utc)
    big = int(rows * 0.9)
    small_users = 10
    started = time.perf_counter()
    for user, count in [("big", big)] + [
        (f"small{i}", (rows - big) // small_users) for i in range(small_users)
    ]:
        for start in range(0, count, 10_000):
            store.add(
                [
                    MemoryRecord(
                        id=f"{user}-{start + i}",
                        user_id=user,
                        kind=rng.choice(("turn", "note")),
                        text=rng.choice(texts),
                        created_at=now,
                    )
                    for i in range(min(10_000, count - start))
                ],
                indexed=False,
            )
    build_s = time.perf_counter() - started
    queries = rng.sample(questions, 300)
    result: dict[str, Any] = {"rows": store.count(), "build_seconds": round(build_s, 1)}
    for user in ("big", "small0"):
        for where in (None, {"kind": "turn"}):
            wall, cpu = [], []
            for query in queries:
                t0, c0 = time.perf_counter(), time.thread_time()
                store.search_text(query, user_id=user, k=50, where=where)
                cpu.append(1000 * (time.thread_time() - c0))
                wall.append(1000 * (time.perf_counter() - t0))
            wall.sort()
            cpu.sort()
            label = f"{user}{'+kind' if where else ''}"
            # CPU time of this thread is reported next to wall time: on a shared machine the
            # wall time mostly measures the other processes.
            result[label] = {
                "median_ms": round(statistics.median(wall), 2),
                "p95_ms": round(wall[int(0.95 * len(wall))], 2),
                "cpu_median_ms": round(statistics.median(cpu), 2),
                "cpu_p95_ms": round(cpu[int(0.95 * len(cpu))], 2),
                "records_of_user": store.count(user),
            }
    store.close()
    return result


def table(results: dict[str, Any]) -> str:
    header = "| mode | " + " | ".join(f"R@{k}" for k in KS) + " |"
    lines = [header, "|" + " --- |" * (len(KS) + 1)]
    for mode in MODES:
        overall = results[mode]["overall"]
        lines.append(f"| {mode} | " + " | ".join(f"{overall[f'R@{k}']:.3f}" for k in KS) + " |")
    lines.append("")
    lines.append("| category (n) | " + " | ".join(f"{m}: R@5 / R@10" for m in MODES) + " |")
    lines.append("|" + " --- |" * (len(MODES) + 1))
    for category, row in results["hybrid"]["categories"].items():
        cells = [
            f"{results[m]['categories'][category]['R@5']:.3f} / "
            f"{results[m]['categories'][category]['R@10']:.3f}"
            for m in MODES
        ]
        lines.append(f"| {category} ({row['n']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in MODES:
        overall = results[mode]["overall"]
        ax.plot(KS, [overall[f"R@{k}"] for k in KS], marker="o", label=mode)
    ax.set_xlabel("k")
    ax.set_ylabel("recall@k of evidence turns")
    ax.set_xscale("log")
    ax.set_xticks(KS, [str(k) for k in KS])
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title("LoCoMo retrieval: recall of evidence turns")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine() -> str:
    import os

    cpu = platform.processor() or platform.machine()
    # The load average tells a reader how much the wall-clock timings were shared.
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{platform.system()} {platform.release()}, {cpu}, {os.cpu_count()} logical CPUs "
        f"(shared; load average {load} at start), Python {platform.python_version()}, "
        f"SQLite {__import__('sqlite3').sqlite_version}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help="LoCoMo JSON file (default: ../shared/datasets/locomo/locomo_dev.json next to the "
        "repository)",
    )
    parser.add_argument("--out", type=Path, default=OUT, help="output folder")
    parser.add_argument("--embedder", choices=("minilm", "hashing"), default="minilm")
    parser.add_argument("--sweep", action="store_true", help="also score a fusion grid")
    parser.add_argument(
        "--latency-rows", type=int, default=0, help="also time search_text on N records"
    )
    args = parser.parse_args(argv)

    if not args.data.is_file():
        parser.error(f"no LoCoMo file at {args.data}; pass --data")
    host = machine()
    conversations = load_locomo(args.data)
    inner: Embedder
    if args.embedder == "minilm":
        from memories_core.embedders import SentenceTransformerEmbedder

        inner = SentenceTransformerEmbedder()
    else:
        from memories_core.embedders import HashingEmbedder

        inner = HashingEmbedder()
    embedder = CachedEmbedder(inner, args.out / "cache")
    started = time.perf_counter()
    embedder.warm(
        [t.render() for c in conversations for t in c.turns if t.text.strip()], query=False
    )
    embedder.warm([qa.question for c in conversations for qa in c.qa], query=True)
    embedder.save()
    embed_s = time.perf_counter() - started
    print(f"embedded with {inner.name} in {embed_s:.1f}s", flush=True)

    retrievers = {c.sample_id: build(c, embedder) for c in conversations}
    started = time.perf_counter()
    results: dict[str, Any] = {
        label: evaluate(conversations, retrievers, mode=mode, fusion=fusion)
        for label, (mode, fusion) in VARIANTS.items()
    }
    search_s = time.perf_counter() - started
    questions = results["hybrid"]["overall"]["n"]
    print(table(results))
    started = time.perf_counter()
    pipelines = pipeline_rows(conversations, embedder)
    pipelines.update(public_rows(conversations, embedder))
    pipeline_s = time.perf_counter() - started
    print(pipeline_table(pipelines))
    report: dict[str, Any] = {
        "data": args.data.name,
        "conversations": [c.sample_id for c in conversations],
        "turns": sum(len(c.turns) for c in conversations),
        "questions_with_evidence": questions,
        "embedder": inner.name,
        "fusion": asdict(FusionConfig()),
        "machine": host,
        "embed_seconds": round(embed_s, 1),
        "search_seconds_all_variants": round(search_s, 1),
        "results": results,
        "pipeline": {
            "turn_seconds": TURN_SECONDS,
            "default": repr(Pipeline()),
            "seconds": round(pipeline_s, 1),
            "results": pipelines,
        },
    }
    if args.sweep:
        print("fusion sweep (hybrid):", flush=True)
        report["sweep"] = sweep(conversations, retrievers)
    if args.latency_rows:
        print(f"search_text latency at {args.latency_rows} records:", flush=True)
        report["latency"] = latency(conversations, args.latency_rows)
        print(json.dumps(report["latency"], indent=2))

    args.out.mkdir(parents=True, exist_ok=True)
    stem = "locomo_retrieval" if args.embedder == "minilm" else f"locomo_retrieval_{args.embedder}"
    (args.out / f"{stem}.json").write_text(
        json.dumps(report, indent=2, default=str), encoding="utf-8"
    )
    plot(results, args.out / f"{stem}.png")
    command = "python benchmarks/locomo_retrieval.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    markdown = [
        "## LoCoMo retrieval (recall@k of evidence turns)",
        "",
        f"- data: `{args.data.name}` ({len(conversations)} conversations, {report['turns']} turns, "
        f"{questions} questions with evidence)",
        f"- records: raw turns `speaker: text`; embedder `{inner.name}`; fusion `{FusionConfig()}`",
        f"- machine: {report['machine']}",
        f"- command: `{command.strip()}`",
        f"- time: embedding {embed_s:.1f}s (vectors are cached under benchmarks/out/cache; "
        f"a cold run embeds every turn and question once), {len(VARIANTS)} x {questions} "
        f"searches {search_s:.1f}s",
        "",
        table(results),
        "",
        "Pipeline (library defaults: dense + BM25, z-score fusion, context spreading; "
        f"in-memory reference backend; turns {TURN_SECONDS} s apart from their session's date; "
        f"k=25 searches, {pipeline_s:.1f}s for all rows). Without session ids, neighbours come "
        "from the save call (one per session) or, turn by turn, from the time gap "
        f"(default {gap_label(DEFAULT_CONTEXT_GAP)}). The `HistoryMemory.recall` rows go "
        "through the public API and the engine (SQLite in memory + numpy index); without "
        "session ids, the engine's session tracker (idle gap 30 min) supplies the sessions:",
        "",
        pipeline_table(pipelines),
        "",
    ]
    if "latency" in report:
        lat = report["latency"]
        markdown += [
            f"`search_text` latency, {lat['rows']} records (one user holds 90%), k=50:",
            "",
            "| user (records) | wall median ms | wall p95 ms | CPU median ms | CPU p95 ms |",
            "| --- | --- | --- | --- | --- |",
        ]
        for key, value in lat.items():
            if isinstance(value, dict):
                markdown.append(
                    f"| {key} ({value['records_of_user']}) | {value['median_ms']} | "
                    f"{value['p95_ms']} | {value['cpu_median_ms']} | {value['cpu_p95_ms']} |"
                )
        markdown.append("")
    (args.out / f"{stem}.md").write_text("\n".join(markdown), encoding="utf-8")
    embedder.save()
    print(f"wrote {args.out / stem}.json/.png/.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
