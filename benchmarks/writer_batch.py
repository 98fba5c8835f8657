"""Batched memory writing: a mechanism's model steps for several waiting jobs in one pass.

DPeM makes three model calls per round of dialogue (notes, knowledge items, their types),
conditional memory two per user turn (worth remembering? then the record) and EMG-RAG one
extraction per user turn; each call reads only its own round or turn. When several wait (a
chat app saves faster than the model writes), the engine hands them to the mechanism
together and each step is asked for all of them in one ``generate_batch``: with the int8
decoding weights (``LocalLLM(quantize="auto")``) a CPU pass over eight sequences costs about
what a pass over one costs. This script saves the first ``--exchanges`` exchanges of a
LoCoMo conversation's first session into a fresh memory (one save per exchange, the
background worker writing, as the answer-quality harness saves), once per batch size, and
reports the ingest's wall time per exchange, model calls and tokens, and whether the memory
written is the same as one job at a time.

    python benchmarks/writer_batch.py --mechanism dpem --exchanges 8 --sizes 1,8 \
        --out benchmarks/out/writer_batch_dpem

Sizes already measured in ``--out`` are kept (delete its ``b<N>.json`` to measure one again);
the model is loaded once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_qa
from machine_info import command_line, machine, run_header, save_figure

from memories_core import Scope
from memories_core.evaluation.harness import ingest_conversation
from memories_core.evaluation.locomo import LocomoConversation, load_locomo

LLMFactory = Callable[[int], Any]


def first_exchanges(conversation: LocomoConversation, exchanges: int) -> LocomoConversation:
    """The conversation cut to the first ``exchanges`` pairs of turns of its first session."""
    first = min(turn.session for turn in conversation.turns)
    turns = [t for t in conversation.turns if t.session == first and t.text.strip()]
    return dataclasses.replace(conversation, turns=tuple(turns[: 2 * exchanges]), qa=())


#: What each mechanism wrote, per part: the texts compared between batch sizes.
VIEWS: dict[str, Callable[[Any, str], dict[str, list[str]]]] = {
    "dpem": lambda memory, user: {
        "working": sorted(i.text for i in memory.working(user)),
        "stm": sorted(i.text for i in memory.stm(user)),
        "ltm": sorted(i.text for i in memory.ltm(user)),
    },
    "conditional": lambda memory, user: {
        "records": sorted(r.text for r in memory.records(Scope(user), kind="conditional")),
    },
    "emg": lambda memory, user: {
        "memories": sorted(r.text for r in memory.memories(user, include_expired=True)),
    },
}


def measure_size(
    mechanism: str, conversation: LocomoConversation, llm: Any, embedder: Any, folder: Path
) -> dict[str, Any]:
    """Ingest ``conversation`` into a new memory written by ``llm``; cost and memory written."""
    from memories_core import FixedClock

    sizes: list[int] = []
    batch = getattr(llm, "generate_batch", None)
    if batch is not None:

        def recorded(conversations: Any, **options: Any) -> Any:
            sizes.append(len(conversations))
            return batch(conversations, **options)

        llm.generate_batch = recorded  # instrument: how many jobs each batch held
    clock = FixedClock(datetime(2023, 1, 1, tzinfo=timezone.utc))  # each save sets it
    memory = locomo_qa.make_memory(mechanism, folder, clock, llm, embedder)  # the harness's
    try:
        started = time.perf_counter()
        stats = ingest_conversation(memory, conversation, clock, user_id="user", writer=llm)
        wall = time.perf_counter() - started
        view = VIEWS[mechanism](memory, "user")
    finally:
        memory.close()
        if batch is not None:
            del llm.generate_batch
    return {
        "exchanges": stats.saves,
        "wall_s": wall,
        "s_per_exchange": wall / max(1, stats.saves),
        "llm_calls": stats.llm_calls,
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "failures": stats.failures,
        "pending_jobs": stats.pending_jobs,
        "batches": sizes,
        "memory": view,
    }


def _same(a: dict[str, list[str]], b: dict[str, list[str]]) -> dict[str, float]:
    """Per part, the share of texts in both (Jaccard; 1.0 when both are empty)."""
    out = {}
    for part in a:
        x, y = set(a[part]), set(b.get(part, []))
        out[part] = 1.0 if not (x or y) else len(x & y) / len(x | y)
    return out


def table(rows: list[dict[str, Any]]) -> str:
    parts = list(rows[0]["memory"])
    names = "/".join(parts)
    lines = [
        f"| batch | exchanges | s/exchange | speed-up | model calls | written tokens | failed "
        f"| items ({names}) | same items as batch {rows[0]['batch']} ({names}) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        counts = "/".join(str(len(row["memory"][p])) for p in parts)
        same = ", ".join(f"{row['same_as_first'][p]:.2f}" for p in parts)
        lines.append(
            f"| {row['batch']} | {row['exchanges']} | {row['s_per_exchange']:.1f} "
            f"| {row['speedup']:.2f}x | {row['llm_calls']} | {row['completion_tokens']:,} "
            f"| {sum(row['failures'].values())} | {counts} | {same} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], mechanism: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    bars = ax.bar([str(r["batch"]) for r in rows], [r["s_per_exchange"] for r in rows])
    for bar, row in zip(bars, rows, strict=True):
        ax.annotate(
            f"{row['speedup']:.2f}x",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_xlabel("jobs written per batch (LocalLLM batch_size)")
    ax.set_ylabel("ingest seconds per exchange")
    ax.set_title(f"{mechanism} memory writing, offline model")
    save_figure(fig, path)


def local_factory(model: str | None, threads: int | None, quantize: str) -> LLMFactory:
    """One offline model, loaded once, whose ``batch_size`` is set for each size."""
    llm = locomo_qa.make_llm("local", model, None, threads, quantize)

    def at(size: int) -> Any:
        llm.batch_size = size
        return llm

    return at


def main(
    argv: list[str] | None = None,
    *,
    llm_factory: LLMFactory | None = None,
    embedder: Any = None,
) -> int:
    """Run the measurement; ``llm_factory`` (size -> model) and ``embedder`` for tests."""
    given = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mechanism", choices=sorted(VIEWS), default="dpem")
    parser.add_argument("--data", type=Path, default=locomo_qa.DEFAULT_DATA)
    parser.add_argument("--conversation", type=int, default=0, help="index in --data")
    parser.add_argument("--exchanges", type=int, default=8)
    parser.add_argument("--sizes", default="1,8", help="batch sizes; the first is the baseline")
    parser.add_argument("--model", default=None, help="offline model (default: the default)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quantize", default="auto")
    parser.add_argument("--out", type=Path, default=locomo_qa.DEFAULT_OUT.parent / "writer_batch")
    args = parser.parse_args(given)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    if not sizes or min(sizes) < 1 or args.exchanges < 1:
        raise SystemExit("--sizes: positive batch sizes, the baseline first; --exchanges >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    conversation = first_exchanges(load_locomo(args.data)[args.conversation], args.exchanges)
    factory = llm_factory or local_factory(args.model, args.threads, args.quantize)
    if embedder is None:
        from memories_core.embedders import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder()  # the harness's
    rows = []
    for size in sizes:
        kept = args.out / f"b{size}.json"
        if kept.is_file():
            row = json.loads(kept.read_text(encoding="utf-8"))
        else:
            with tempfile.TemporaryDirectory() as folder:
                measured = measure_size(
                    args.mechanism, conversation, factory(size), embedder, Path(folder)
                )
            row = {"batch": size, **measured}
            kept.write_text(json.dumps(row, indent=2), encoding="utf-8")
        rows.append(row)
    for row in rows:
        row["speedup"] = rows[0]["s_per_exchange"] / max(1e-9, row["s_per_exchange"])
        row["same_as_first"] = _same(rows[0]["memory"], row["memory"])
    text = table(rows)
    print(text)
    plot(rows, args.mechanism, args.out / "writer_batch.png")
    report: dict[str, Any] = {
        "command": command_line("benchmarks/writer_batch.py", given),
        "machine": machine(),
        "mechanism": args.mechanism,
        "conversation": conversation.sample_id,
        "rows": rows,
    }
    (args.out / "writer_batch.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    info = report["machine"]
    header = (
        f"{run_header(info, report['command'])} {conversation.sample_id}, first session, "
        f"{args.exchanges} exchanges, one save each; `{args.mechanism}` memory."
    )
    (args.out / "writer_batch.md").write_text(f"{header}\n\n{text}\n", encoding="utf-8")
    best = max(rows, key=lambda r: r["speedup"])
    print(f"batch {best['batch']}: {best['speedup']:.2f}x faster {args.mechanism} writing")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
