"""MADial-Bench memory recall with the library's default retrieval pipeline.

MADial-Bench (hejunqing/MADial-Bench, English data) gives 160 memories (an event with a
date, scene and emotion) and 160 dialogues; in each dialogue the assistant should bring up
a memory at the ``test-turn``, and ``relevant-id`` lists the memories that fit there. Each
of the two users (``user-id``) gets an in-memory backend holding their memories (a memory
that no dialogue of either user marks relevant goes to the user its event names, or to
both), each saved alone and dated by its ``time``. The query is the dialogue before the
test turn: the last user turn, the last three turns, or all of it. Recall@k of the
relevant ids is averaged over dialogues.

Rows: dense only, BM25 only, the default :class:`~memories_core.retrieval.Pipeline`
(dense + BM25, z-score fusion, context spreading), the default without context spreading,
and the default plus the optional cross-encoder or late-interaction reranker (when the
``rerank`` extra is installed). Same code path and defaults as the LoCoMo benchmarks, so the
defaults are not fitted to one dataset.

    python benchmarks/madial_recall.py                  # table, JSON, PNG, Markdown
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from locomo_retrieval import CachedEmbedder
from machine_info import command_line, datasets_dir, machine_line, save_figure
from tqdm import tqdm

from memories_core.evaluation import recall_at_k
from memories_core.retrieval import (
    DenseSource,
    LexicalSource,
    Pipeline,
    RecallRequest,
)
from memories_core.retrieval.memory_backend import InMemoryBackend
from memories_core.types import MemoryRecord

DEFAULT_DATA = datasets_dir() / "madial"
OUT = Path(__file__).resolve().parent / "out"
KS = (1, 3, 5, 10)
QUERIES = ("last user turn", "last 3 turns", "whole context")
NOW = datetime(2025, 1, 1, tzinfo=timezone.utc)


def load(folder: Path) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Memories by id and dialogues (both files are JSON lines despite ``.json``)."""
    memories: dict[str, dict[str, Any]] = {}
    with (folder / "MADial-Bench-en-memory.json").open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                memories.update(json.loads(line))
    with (folder / "MADial-Bench-en-dialogue.json").open(encoding="utf-8") as handle:
        dialogues = [json.loads(line) for line in handle if line.strip()]
    return memories, dialogues


def owners(
    memories: dict[str, dict[str, Any]], dialogues: list[dict[str, Any]]
) -> dict[str, set[str]]:
    """Memory ids of each user (see the module docstring)."""
    marked: dict[str, set[str]] = {}
    for dialogue in dialogues:
        user = str(dialogue["user-id"])
        marked.setdefault(user, set()).update(str(i) for i in dialogue["relevant-id"])
    names: dict[str, str] = {}
    for user, ids in marked.items():
        firsts = [memories[i]["event"].split()[0].strip(",’'s") for i in ids]
        names[user] = max(set(firsts), key=firsts.count)
    result = {user: set(ids) for user, ids in marked.items()}
    for memory_id, memory in memories.items():
        if any(memory_id in ids for ids in marked.values()):
            continue
        named = [u for u, name in names.items() if name in memory["event"]]
        for user in named or list(marked):
            result[user].add(memory_id)
    return result


def speaker_line(raw: str) -> str:
    """``<Bart>: "text"`` -> ``Bart: text``."""
    line = raw.strip()
    if line.startswith("<") and ">:" in line:
        name, _, text = line[1:].partition(">:")
        return f"{name}: {text.strip().strip(chr(34))}"
    return line


def query_of(dialogue: dict[str, Any], variant: str) -> str:
    turn = min(dialogue["test-turn"])
    before = [speaker_line(x) for x in dialogue["dialogue"][1:turn] if x.strip() not in ("<BOD>",)]
    if variant == "last user turn":
        users = [line for line in before if not line.startswith("Assistant:")]
        return users[-1] if users else before[-1]
    if variant == "last 3 turns":
        return "\n".join(before[-3:])
    return "\n".join(before)


def backends(
    memories: dict[str, dict[str, Any]], owned: dict[str, set[str]], embedder: CachedEmbedder
) -> dict[str, InMemoryBackend]:
    result = {}
    for user, ids in owned.items():
        backend = InMemoryBackend(embedder)
        for memory_id in sorted(ids, key=lambda i: (memories[i]["time"], int(i))):
            memory = memories[memory_id]
            day = datetime.fromisoformat(memory["time"]).replace(hour=12, tzinfo=timezone.utc)
            record = MemoryRecord(
                id=memory_id,
                user_id=user,
                kind="memory",
                text=memory["event"],
                created_at=day,
                metadata={"scene": memory["scene"], "emotion": memory["emotion"]},
            )
            backend.add([record], embedder.embed_documents([record.text]), batch=False)
        result[user] = backend
    return result


def evaluate(
    dialogues: list[dict[str, Any]],
    stores: dict[str, InMemoryBackend],
    pipeline: Pipeline,
    variant: str,
) -> tuple[dict[str, float], float]:
    rows = []
    wall = []
    for dialogue in dialogues:
        user = str(dialogue["user-id"])
        request = RecallRequest(query_of(dialogue, variant), user_id=user, k=max(KS), now=NOW)
        started = time.perf_counter()
        ranked = [hit.record.id for hit in pipeline.run(request, stores[user])]
        wall.append(1000 * (time.perf_counter() - started))
        relevant = {str(i) for i in dialogue["relevant-id"]}
        rows.append({f"R@{k}": recall_at_k(ranked, relevant, k) for k in KS})
    return {key: statistics.fmean(r[key] for r in rows) for key in rows[0]}, statistics.median(wall)


def pipelines() -> dict[str, Pipeline]:
    base = Pipeline()
    rows = {
        "dense": Pipeline(sources=(DenseSource(weight=1.0),), rerankers=()),
        "BM25": Pipeline(sources=(LexicalSource(weight=1.0),), rerankers=()),
        "default pipeline": base,
        "default, no context spreading": replace(base, rerankers=()),
    }
    try:
        from memories_core.retrieval.cross_encoder import (
            DEFAULT_CANDIDATES,
            DEFAULT_MAX_LENGTH,
            DEFAULT_WEIGHT,
            cross_encoder_reranker,
        )

        label = (
            f"default + cross-encoder ({DEFAULT_CANDIDATES} x {DEFAULT_MAX_LENGTH}, "
            f"weight {DEFAULT_WEIGHT})"
        )
        rows[label] = replace(base, rerankers=(*base.rerankers, cross_encoder_reranker()))
    except Exception as exc:  # the rerank extra is optional
        print(f"cross-encoder row skipped: {exc}", flush=True)
    try:
        from memories_core.retrieval.late_interaction import (
            DEFAULT_LATE_CANDIDATES,
            DEFAULT_LATE_POOL,
            DEFAULT_LATE_WEIGHT,
            late_interaction_pipeline,
            late_interaction_reranker,
        )

        label = (
            f"default + late interaction ({DEFAULT_LATE_CANDIDATES} + pool {DEFAULT_LATE_POOL}, "
            f"weight {DEFAULT_LATE_WEIGHT})"
        )
        # Library default: a query longer than the encoder's 32 pieces keeps the first
        # stage's order; the second row reranks those too (the earlier default).
        rows[label] = late_interaction_pipeline(base)
        rows[f"{label}, long queries reranked too"] = late_interaction_pipeline(
            base, late_interaction_reranker(skip_long_queries=False)
        )
    except Exception as exc:  # the rerank extra is optional
        print(f"late-interaction row skipped: {exc}", flush=True)
    return rows


def plot(results: dict[str, dict[str, dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(QUERIES), figsize=(13, 4), sharey=True)
    for ax, variant in zip(axes, QUERIES, strict=True):
        for label, by_query in results.items():
            row = by_query[variant]
            ax.plot(KS, [row[f"R@{k}"] for k in KS], marker="o", label=label)
        ax.set_title(f"query: {variant}")
        ax.set_xlabel("k")
        ax.set_xticks(KS, [str(k) for k in KS])
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("recall@k of relevant memories")
    axes[0].set_ylim(0, 1)
    axes[-1].legend(fontsize=8)
    fig.suptitle("MADial-Bench (en) memory recall")
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="MADial folder")
    parser.add_argument("--out", type=Path, default=OUT, help="output folder")
    args = parser.parse_args(argv)
    if not (args.data / "MADial-Bench-en-memory.json").is_file():
        parser.error(f"no MADial-Bench files in {args.data}; pass --data")
    host = machine_line()
    memories, dialogues = load(args.data)
    owned = owners(memories, dialogues)
    from memories_core.embedders import SentenceTransformerEmbedder

    embedder = CachedEmbedder(SentenceTransformerEmbedder(), args.out / "cache")
    embedder.file = args.out / "cache" / "madial_minilm.npz"
    if embedder.file.exists() and not embedder.vectors:
        import numpy as np

        data = np.load(embedder.file)
        embedder.vectors = {key: data[key] for key in data.files}
    embedder.warm([m["event"] for m in memories.values()], query=False)
    embedder.warm([query_of(d, v) for d in dialogues for v in QUERIES], query=True)
    embedder.save()
    stores = backends(memories, owned, embedder)

    results: dict[str, dict[str, dict[str, float]]] = {}
    latency: dict[str, dict[str, float]] = {}
    for label, pipeline in tqdm(pipelines().items(), desc="pipelines"):
        results[label], latency[label] = {}, {}
        for variant in QUERIES:
            results[label][variant], latency[label][variant] = evaluate(
                dialogues, stores, pipeline, variant
            )
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "data": str(args.data.name),
        "memories": len(memories),
        "dialogues": len(dialogues),
        "memories_per_user": {u: len(ids) for u, ids in owned.items()},
        "machine": host,
        "embedder": embedder.name,
        "pipeline": repr(Pipeline()),
        "results": results,
        "median_ms": latency,
    }
    (args.out / "madial_recall.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    plot(results, args.out / "madial_recall.png")
    command = command_line(
        "benchmarks/madial_recall.py", list(argv if argv is not None else sys.argv[1:])
    )
    lines = [  # included under BENCHMARKS.md's own heading
        f"- data: MADial-Bench en, {len(memories)} memories, {len(dialogues)} dialogues; "
        f"memories per user {report['memories_per_user']}; embedder `{embedder.name}`",
        f"- machine: {host}",
        f"- command: `{command.strip()}`",
        "",
        "| pipeline | query | " + " | ".join(f"R@{k}" for k in KS) + " | median ms |",
        "|" + " --- |" * (len(KS) + 3),
    ]
    for label, by_query in results.items():
        for variant in QUERIES:
            row = by_query[variant]
            lines.append(
                f"| {label} | {variant} | "
                + " | ".join(f"{row[f'R@{k}']:.3f}" for k in KS)
                + f" | {latency[label][variant]:.1f} |"
            )
    lines.append("")
    (args.out / "madial_recall.md").write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines))
    embedder.save()
    for backend in stores.values():
        backend.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
