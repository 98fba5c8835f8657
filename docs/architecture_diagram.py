"""Draw docs/architecture.png: save and recall through the memory engine.

python docs/architecture_diagram.py
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

BOXES = {
    # name: (x, y, w, h, text, colour)
    "adapters": (
        0.2,
        8.6,
        11.6,
        0.9,
        "Adapters (convert types, forward calls)\nLangChain: MemoryRetriever, "
        "MemoryMiddleware, LegacyChainMemory | LlamaIndex: MemoryBlock, MemoryRetriever",
        "#dbe9f6",
    ),
    "mechanisms": (
        0.2,
        6.8,
        11.6,
        1.35,
        "Mechanisms (one module or package each): History, Summary, Conditional, MultiView,\n"
        "SelfReflective, MemoChat, MemoryBank, DPeM, EMG-RAG, MaLP. Each attaches "
        "MechanismHooks (on_turns -> jobs,\non_session_end -> jobs, run_job -> "
        "Derivation, on_delete_user); sets recall kinds, pipeline, render, prompts=",
        "#e8f3e1",
    ),
    "write": (
        0.2,
        4.2,
        5.5,
        2.2,
        "save(turns, scope)\n1. one transaction: session tracker (explicit end,\n"
        "   new session_id, idle gap) + turn records\n   + jobs of every attached mechanism\n"
        "2. embed pending records -> vector index\n3. run jobs (model calls, no locks held;\n"
        "   claimed, budgeted, backed off)\n4. commit Derivation + finish job: one transaction",
        "#fdf0d5",
    ),
    "read": (
        6.3,
        4.2,
        5.5,
        2.2,
        "recall(query, scope, k, now)\ncandidate sources: dense | lexical (BM25) | pluggable\n"
        "  (graph walk, LLM option choice)\n-> fusion (z-score / RRF)\n"
        "-> rerankers: context spreading, time decay,\n   recency, MMR, cross-encoder\n"
        "-> load (state: archived / validity) -> on_recalled",
        "#fdf0d5",
    ),
    "store": (
        0.2,
        0.4,
        3.7,
        3.2,
        "Record store (SQLite; EngineStore)\nrecords + FTS5 (BM25)\nrecord_state (strength, "
        "tier,\n  validity, archived, attrs)\nrecord_history (old, new, why)\njobs (pending work)\n"
        "graph_nodes / graph_edges\nartifacts registry, tombstones",
        "#f3e1f0",
    ),
    "index": (
        4.2,
        0.4,
        3.6,
        3.2,
        "Vector index (derived,\nrebuildable)\nChroma (embedded / server)\nor numpy\n"
        "one collection per user\nverify(): missing, orphan,\nunreachable vectors",
        "#f3e1f0",
    ),
    "other": (
        8.1,
        0.4,
        3.7,
        3.2,
        "Embedder (MiniLM, offline)\nClock (injected)\nLLMs + llm_for(scope)\nUsage + failures\n"
        "Artifact files (adapters,\n  policies; atomic)\nGraphStore -> networkx view",
        "#f3e1f0",
    ),
}

ARROWS = [
    ((6.0, 8.6), (6.0, 8.1)),
    ((3.0, 6.9), (3.0, 6.4)),
    ((9.0, 6.9), (9.0, 6.4)),
    ((2.0, 4.2), (2.0, 3.6)),
    ((4.5, 4.2), (6.0, 3.6)),
    ((8.0, 4.2), (6.0, 3.6)),
    ((7.5, 4.2), (2.8, 3.6)),
    ((10.0, 4.2), (10.0, 3.6)),
]


def main() -> None:
    fig, ax = plt.subplots(figsize=(12, 9.8))
    ax.set_xlim(0, 12)
    ax.set_ylim(-0.6, 9.7)
    ax.axis("off")
    for x, y, w, h, text, colour in BOXES.values():
        ax.add_patch(
            FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.05", fc=colour, ec="#444444")
        )
        ax.text(x + 0.15, y + h - 0.15, text, va="top", ha="left", fontsize=8.6, family="monospace")
    for start, end in ARROWS:
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, color="#333"))
    ax.text(0.2, 3.75, "MemoryEngine", fontsize=11, weight="bold")
    ax.text(
        0.2,
        -0.35,
        "MemoryEngine = engine.py (constructor, hooks, locks, close) on the layers of "
        "engine_parts/: rules < reads < indexing < deletion < search < jobs < writes",
        fontsize=8.6,
        family="monospace",
    )
    ax.add_patch(
        FancyBboxPatch(
            (0.05, 0.25),
            11.9,
            6.35,
            boxstyle="round,pad=0.05",
            fc="none",
            ec="#1f4e79",
            lw=2,
            ls="--",
        )
    )
    out = Path(__file__).with_name("architecture.png")
    fig.savefig(out, dpi=110, bbox_inches="tight")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
