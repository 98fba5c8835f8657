"""LoCoMo: recall@k of evidence turns for fact-style record sets (conditional / multi-view shapes).

The raw-turn benchmark (``benchmarks/locomo_retrieval.py``) indexes one record per dialogue
turn. LoCoMo also ships, per session, LLM-written ``observation`` facts (each citing the
``dia_id`` of the turn(s) it comes from) and a ``session_summary``. These stand in for the
records a conditional or multi-view memory would write (Yuan et al., §3.1, Table 1, Table 3),
without running an LLM. Per conversation this script builds one in-memory store + index per
record set and queries it with every QA question:

(i)   ``raw``: raw turns ``"speaker: text"``, one per dia_id (baseline; same records as the
      colleague's benchmark);
(ii)  ``obs``: each observation fact, citing its dia_id(s);
(iii) ``obs+ctx``: ``"Context: <session summary> Knowledge: <observation>"``, the conditional
      record shape, citing the observation's dia_id(s); ``obs+ctx (knowledge first)`` is the same
      text with the two parts swapped (a diagnostic: the embedder reads only its first 256 word
      pieces);
(iv)  ``multi-view``: the top-k observations plus the top-1 session summary (the paper's
      per-view k: k records of the fine view + 1 summary); a summary cites every dia_id of its
      session. ``summaries`` alone (top-k) is shown for reference;
(v)   ``raw, key+obs``: raw turns whose *index key* is ``turn + its observations`` (text shown =
      the raw turn); ``raw, dense key+obs`` augments only the vector key and keeps BM25 on the
      raw turn. The library indexes ``record.text`` in both the vector index and the FTS table,
      so (v) is built with the store/index API directly (see ``build``).

Counting. A record maps to the dia_ids it cites; the retrieved records, best first, map to an
ordered, de-duplicated list of dia_ids. recall@k = |evidence ∩ ids of the first k records| /
|evidence|, averaged over questions with evidence. k counts *records*: a record citing several
turns brings all of them (an observation usually cites one turn, a summary a whole session), so
the mean number of distinct dia_ids the first k records cover is reported next to recall.
For multi-view, "k" is k observations + 1 summary (k+1 records). ``ceiling`` is the recall of
a perfect ranking of all observations (evidence turns cited by no observation cannot be found).

    python benchmarks/locomo_views.py                      # table, JSON, PNG, Markdown
    python benchmarks/locomo_views.py --modes hybrid       # hybrid only (faster)
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

from memories_core.backends import NumpyIndex, SQLiteRecordStore
from memories_core.evaluation import (
    CATEGORY_NAMES,
    LocomoConversation,
    load_locomo,
    normalise_evidence,
)
from memories_core.interfaces import Embedder
from memories_core.retrieval import FusionConfig, HybridRetriever, SearchMode, index_metadata
from memories_core.types import MemoryRecord

sys.path.insert(0, str(Path(__file__).resolve().parent))
from locomo_retrieval import CachedEmbedder
from machine_info import datasets_dir, machine, portable_path, save_figure

DEFAULT_DATA = datasets_dir() / "locomo" / "locomo_dev.json"
OUT = Path(__file__).resolve().parent / "out"
STEM = "locomo_views"
KS = (1, 5, 10, 25)
MODES: dict[str, tuple[SearchMode, FusionConfig | None]] = {
    "hybrid": ("hybrid", None),
    "hybrid (no context)": (
        "hybrid",
        FusionConfig(previous_context_weight=0.0, next_context_weight=0.0),
    ),
    "dense": ("dense", None),
    "lexical": ("lexical", None),
}
#: Record sets searched on their own (multi-view is assembled from "obs" + "summaries").
SETS = (
    "raw",
    "obs",
    "obs+ctx",
    "obs+ctx (knowledge first)",
    "summaries",
    "raw, key+obs",
    "raw, dense key+obs",
)
ROWS = (
    "raw",
    "obs",
    "obs+ctx",
    "obs+ctx (knowledge first)",
    "multi-view (k obs + 1 summary)",
    "summaries",
    "raw, key+obs",
    "raw, dense key+obs",
)
LABELS = {
    "raw": "(i) raw turns",
    "obs": "(ii) observations",
    "obs+ctx": "(iii) Context: summary Knowledge: obs",
    "obs+ctx (knowledge first)": "(iii') Knowledge: obs Context: summary",
    "multi-view (k obs + 1 summary)": "(iv) multi-view: k obs + 1 summary",
    "summaries": "(ref) session summaries alone",
    "raw, key+obs": "(v) raw turn, key = turn + obs",
    "raw, dense key+obs": "(v') raw turn, dense key = turn + obs",
}


@dataclass
class Item:
    """One record of a set: its id, the text shown, the text indexed and the turns it cites."""

    id: str
    shown: str
    key: str
    dia_ids: tuple[str, ...]
    session: int
    order: int
    lexical_key: str | None = None  # text for BM25 when it differs from ``key``


@dataclass
class Conversation:
    base: LocomoConversation
    observations: list[tuple[int, str, tuple[str, ...]]] = field(default_factory=list)
    summaries: dict[int, str] = field(default_factory=dict)


# --------------------------------------------------------------------------- data
def load(path: Path) -> list[Conversation]:
    """The library loader for turns and QA; observations and summaries from the raw JSON."""
    conversations = load_locomo(path)
    raw = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(raw, dict):
        raw = [raw]
    out = []
    for sample, conv in zip(raw, conversations, strict=True):
        item = Conversation(conv)
        for key, per_speaker in (sample.get("observation") or {}).items():
            session = int(key.split("_")[1])
            for facts in per_speaker.values():
                for fact in facts:
                    text, cited = fact[0], fact[1]
                    cited_list = cited if isinstance(cited, list) else [cited]
                    ids: list[str] = []
                    for c in cited_list:
                        for d in normalise_evidence(str(c)):
                            if d not in ids:
                                ids.append(d)
                    if ids and str(text).strip():
                        item.observations.append((session, str(text), tuple(ids)))
        for key, text in (sample.get("session_summary") or {}).items():
            item.summaries[int(key.split("_")[1])] = str(text)
        out.append(item)
    return out


def turn_position(dia_id: str) -> tuple[int, int]:
    s, t = dia_id[1:].split(":")
    return int(s), int(t)


def record_sets(conv: Conversation) -> dict[str, list[Item]]:
    turns = [t for t in conv.base.turns if t.text.strip()]
    obs_by_turn: dict[str, list[str]] = defaultdict(list)
    for _s, text, ids in conv.observations:
        for d in ids:
            obs_by_turn[d].append(text)
    session_ids: dict[int, list[str]] = defaultdict(list)
    for t in turns:
        session_ids[t.session].append(t.dia_id)
    sets: dict[str, list[Item]] = {name: [] for name in SETS}
    for i, t in enumerate(turns):
        shown = t.render()
        augmented = " ".join([shown, *obs_by_turn.get(t.dia_id, [])])
        sets["raw"].append(Item(t.dia_id, shown, shown, (t.dia_id,), t.session, i))
        sets["raw, key+obs"].append(Item(t.dia_id, shown, augmented, (t.dia_id,), t.session, i))
        sets["raw, dense key+obs"].append(
            Item(t.dia_id, shown, augmented, (t.dia_id,), t.session, i, lexical_key=shown)
        )
    ordered = sorted(enumerate(conv.observations), key=lambda p: (turn_position(p[1][2][0]), p[0]))
    for n, (_orig, (session, text, ids)) in enumerate(ordered):
        summary = conv.summaries.get(session, "")
        sets["obs"].append(Item(f"obs{n}", text, text, ids, session, n))
        ctx = f"Context: {summary} Knowledge: {text}" if summary else f"Knowledge: {text}"
        sets["obs+ctx"].append(Item(f"obs{n}", ctx, ctx, ids, session, n))
        kf = f"Knowledge: {text} Context: {summary}" if summary else f"Knowledge: {text}"
        sets["obs+ctx (knowledge first)"].append(Item(f"obs{n}", kf, kf, ids, session, n))
    for session, text in sorted(conv.summaries.items()):
        ids = tuple(session_ids.get(session, ()))
        if ids:
            sets["summaries"].append(Item(f"sum{session}", text, text, ids, session, session))
    return sets


# --------------------------------------------------------------------------- build
def build(
    user: str, items: Sequence[Item], embedder: CachedEmbedder
) -> tuple[HybridRetriever, dict[str, tuple[str, ...]]]:
    """One in-memory store + numpy index for one record set of one conversation.

    The record's ``text`` is what the store's FTS (BM25) indexes; the vector is added to the
    index directly (``NumpyIndex.add``) from ``Item.key`` and the record is stored as not
    pending (``indexed=False``), so the dense key can differ from the stored text. For the
    "key+obs" sets the stored text *is* the augmented key (BM25 must see it) and the raw turn is
    kept in ``metadata["shown"]``; for "dense key+obs" the stored text is the raw turn.
    """
    base = datetime(2023, 1, 1, tzinfo=timezone.utc)
    store = SQLiteRecordStore(None)
    records = [
        MemoryRecord(
            id=it.id,
            user_id=user,
            kind="record",
            text=it.lexical_key if it.lexical_key is not None else it.key,
            created_at=base + timedelta(days=it.session, minutes=it.order),
            session_id=f"session_{it.session}",
            metadata={"shown": it.shown, "dia_ids": list(it.dia_ids)},
        )
        for it in items
    ]
    store.add(records, indexed=False)
    index = NumpyIndex()
    vectors = embedder.embed_documents([it.key for it in items])
    index.add([r.id for r in records], vectors, [index_metadata(r) for r in records])
    retriever = HybridRetriever(store, index, embedder)
    return retriever, {it.id: it.dia_ids for it in items}


# --------------------------------------------------------------------------- evaluate
def ids_at(ranked: Sequence[str], cites: dict[str, tuple[str, ...]], k: int) -> list[str]:
    out: list[str] = []
    for rid in ranked[:k]:
        for d in cites[rid]:
            if d not in out:
                out.append(d)
    return out


def recall(ids: Sequence[str], evidence: Sequence[str]) -> float:
    wanted = set(evidence)
    return len(wanted.intersection(ids)) / len(wanted)


def evaluate(
    convs: Sequence[Conversation],
    built: dict[str, dict[str, tuple[HybridRetriever, dict[str, tuple[str, ...]]]]],
    mode: SearchMode,
    fusion: FusionConfig | None,
) -> dict[str, Any]:
    """Per row: recall@k and ids covered@k, overall and per category."""
    rows: dict[str, dict[int, list[tuple[float, ...]]]] = {r: defaultdict(list) for r in ROWS}
    kmax = max(KS)
    for conv in convs:
        user = conv.base.sample_id
        ranked: dict[str, list[str]] = {}
        retrievers: dict[str, HybridRetriever] = {}
        cites_of: dict[str, dict[str, tuple[str, ...]]] = {}
        for name in SETS:
            retriever, cites_of[name] = built[user][name]
            if fusion is not None:
                retriever = HybridRetriever(
                    retriever.store, retriever.index, retriever.embedder, fusion=fusion
                )
            retrievers[name] = retriever
        for qa in conv.base.qa:
            if not qa.evidence:
                continue
            for name in SETS:
                hits = retrievers[name].search(qa.question, user_id=user, k=kmax, mode=mode)
                ranked[name] = [h.record.id for h in hits]
            for name in SETS:
                values = []
                for k in KS:
                    ids = ids_at(ranked[name], cites_of[name], k)
                    values += [recall(ids, qa.evidence), len(ids)]
                rows[name][qa.category].append(tuple(values))
            values = []
            for k in KS:
                ids = ids_at(ranked["obs"], cites_of["obs"], k)
                for d in ids_at(ranked["summaries"], cites_of["summaries"], 1):
                    if d not in ids:
                        ids.append(d)
                values += [recall(ids, qa.evidence), len(ids)]
            rows["multi-view (k obs + 1 summary)"][qa.category].append(tuple(values))
    return {name: summarise(per_cat) for name, per_cat in rows.items()}


def summarise(per_category: dict[int, list[tuple[float, ...]]]) -> dict[str, Any]:
    def agg(values: list[tuple[float, ...]]) -> dict[str, float]:
        out: dict[str, float] = {"n": len(values)}
        for j, k in enumerate(KS):
            out[f"R@{k}"] = statistics.fmean(v[2 * j] for v in values)
            out[f"ids@{k}"] = statistics.fmean(v[2 * j + 1] for v in values)
        return out

    everything = [v for vs in per_category.values() for v in vs]
    return {
        "overall": agg(everything),
        "categories": {
            CATEGORY_NAMES.get(c, str(c)): agg(vs) for c, vs in sorted(per_category.items())
        },
    }


def ceiling(convs: Sequence[Conversation]) -> dict[str, Any]:
    """Recall of a perfect ranking of all observations (evidence cited by some observation)."""
    per_cat: dict[int, list[float]] = defaultdict(list)
    for conv in convs:
        cited = {d for _s, _t, ids in conv.observations for d in ids}
        for qa in conv.base.qa:
            if qa.evidence:
                per_cat[qa.category].append(recall(list(cited), qa.evidence))
    return {
        "overall": statistics.fmean(v for vs in per_cat.values() for v in vs),
        "categories": {
            CATEGORY_NAMES.get(c, str(c)): statistics.fmean(vs) for c, vs in sorted(per_cat.items())
        },
    }


def truncation(convs: Sequence[Conversation]) -> dict[str, Any] | None:
    """Share of obs+ctx texts longer than the embedder's 256 word pieces."""
    try:
        from transformers import AutoTokenizer

        from memories_core.embedders.sentence_transformer import default_model_path

        tokenizer = AutoTokenizer.from_pretrained(str(default_model_path()), local_files_only=True)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    lengths = []
    for conv in convs:
        for session, text, _ids in conv.observations:
            summary = conv.summaries.get(session, "")
            ctx = f"Context: {summary} Knowledge: {text}"
            lengths.append(len(tokenizer(ctx)["input_ids"]))
    over = sum(1 for n in lengths if n > 256)
    return {
        "texts": len(lengths),
        "over_256_word_pieces": over,
        "share": over / len(lengths),
        "median_word_pieces": statistics.median(lengths),
    }


# --------------------------------------------------------------------------- report
def overall_table(results: dict[str, Any], mode: str, ceil: dict[str, Any]) -> str:
    lines = [
        f"**{mode}** (ids = mean distinct dia_ids covered by the first k records)",
        "",
        "| record set | records | "
        + " | ".join(f"R@{k}" for k in KS)
        + " | "
        + " | ".join(f"ids@{k}" for k in KS)
        + " |",
        "|" + " --- |" * (2 + 2 * len(KS)),
    ]
    for row in ROWS:
        o = results[mode][row]["overall"]
        lines.append(
            f"| {LABELS[row]} | {results['sizes'][row]} | "
            + " | ".join(f"{o[f'R@{k}']:.3f}" for k in KS)
            + " | "
            + " | ".join(f"{o[f'ids@{k}']:.1f}" for k in KS)
            + " |"
        )
    lines.append(
        f"| ceiling of observation sets (all observations) | | {ceil['overall']:.3f} | | | "
        "| | | | |"
    )
    return "\n".join(lines)


def category_table(results: dict[str, Any], mode: str, ceil: dict[str, Any]) -> str:
    cats = list(results[mode]["raw"]["categories"])
    lines = [
        f"**{mode}, per category: R@5 / R@10**",
        "",
        "| record set | "
        + " | ".join(f"{c} ({results[mode]['raw']['categories'][c]['n']})" for c in cats)
        + " |",
        "|" + " --- |" * (1 + len(cats)),
    ]
    for row in ROWS:
        cells = [
            f"{results[mode][row]['categories'][c]['R@5']:.3f} / "
            f"{results[mode][row]['categories'][c]['R@10']:.3f}"
            for c in cats
        ]
        lines.append(f"| {LABELS[row]} | " + " | ".join(cells) + " |")
    lines.append(
        "| ceiling of observation sets | "
        + " | ".join(f"{ceil['categories'][c]:.3f}" for c in cats)
        + " |"
    )
    return "\n".join(lines)


def plot(results: dict[str, Any], modes: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1, len(modes) + 1, figsize=(5.5 * (len(modes) + 1), 4.5), squeeze=False
    )
    for ax, mode in zip(axes[0], modes, strict=False):
        for row in ROWS:
            o = results[mode][row]["overall"]
            style = "--" if row in ("summaries", "obs+ctx (knowledge first)") else "-"
            ax.plot(KS, [o[f"R@{k}"] for k in KS], style, marker="o", label=LABELS[row])
        ax.set_xscale("log")
        ax.set_xticks(KS, [str(k) for k in KS])
        ax.set_ylim(0, 1)
        ax.set_xlabel("k (records; multi-view: k obs + 1 summary)")
        ax.set_ylabel("recall@k of evidence dia_ids")
        ax.set_title(f"LoCoMo dev, {mode}")
        ax.grid(alpha=0.3)
    ax = axes[0][len(modes)]
    for row in ROWS:
        o = results[modes[0]][row]["overall"]
        style = "--" if row in ("summaries", "obs+ctx (knowledge first)") else "-"
        ax.plot(
            [o[f"ids@{k}"] for k in KS],
            [o[f"R@{k}"] for k in KS],
            style,
            marker="o",
            label=LABELS[row],
        )
    ax.set_xscale("log")
    ax.set_ylim(0, 1)
    ax.set_xlabel("distinct dia_ids covered by the retrieved records (k = 1, 5, 10, 25)")
    ax.set_ylabel("recall of evidence dia_ids")
    ax.set_title(f"{modes[0]}: recall per dia_id budget")
    ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="lower right")
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="LoCoMo JSON file")
    parser.add_argument("--out", type=Path, default=OUT, help="output folder")
    parser.add_argument(
        "--modes", default=",".join(MODES), help=f"comma-separated subset of {list(MODES)}"
    )
    parser.add_argument("--embedder", choices=("minilm", "hashing"), default="minilm")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            parser.error(f"unknown mode {m!r}")
    info = machine()
    convs = load(args.data)
    inner: Embedder
    if args.embedder == "minilm":
        from memories_core.embedders import SentenceTransformerEmbedder

        inner = SentenceTransformerEmbedder()
    else:
        from memories_core.embedders import HashingEmbedder

        inner = HashingEmbedder()
    cache_dir = args.out / f"{STEM}_cache"
    embedder = CachedEmbedder(inner, cache_dir)
    seed = OUT / "cache" / embedder.file.name
    if seed.exists():  # the colleague's cache (read only): raw turns and questions
        data = np.load(seed)
        for key in data.files:
            embedder.vectors.setdefault(key, data[key])
    sets = {c.base.sample_id: record_sets(c) for c in convs}
    started = time.perf_counter()
    texts = sorted({it.key for s in sets.values() for items in s.values() for it in items})
    embedder.warm(texts, query=False)
    embedder.warm([qa.question for c in convs for qa in c.base.qa], query=True)
    embedder.save()
    embed_s = time.perf_counter() - started
    print(f"embedded {len(texts)} distinct texts in {embed_s:.1f}s", flush=True)
    built = {
        user: {name: build(user, items, embedder) for name, items in per.items()}
        for user, per in sets.items()
    }
    sizes = {name: sum(len(per[name]) for per in sets.values()) for name in SETS}
    sizes["multi-view (k obs + 1 summary)"] = sizes["obs"] + sizes["summaries"]
    results: dict[str, Any] = {"sizes": sizes}
    timings = {}
    for mode in modes:
        t0 = time.perf_counter()
        search_mode, fusion = MODES[mode]
        results[mode] = evaluate(convs, built, search_mode, fusion)
        timings[mode] = round(time.perf_counter() - t0, 1)
        print(f"{mode}: {timings[mode]}s", flush=True)
    ceil = ceiling(convs)
    trunc = truncation(convs) if args.embedder == "minilm" else None
    n_q = results[modes[0]]["raw"]["overall"]["n"]
    tables = []
    for mode in modes:
        tables += [overall_table(results, mode, ceil), ""]
    tables += [category_table(results, modes[0], ceil), ""]
    print("\n".join(tables))

    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "data": portable_path(args.data),
        "conversations": [c.base.sample_id for c in convs],
        "questions_with_evidence": n_q,
        "embedder": inner.name,
        "fusion_default": str(FusionConfig()),
        "machine": info,
        "embed_seconds": round(embed_s, 1),
        "search_seconds": timings,
        "ceiling": ceil,
        "obs_ctx_truncation": trunc,
        "results": results,
    }
    (args.out / f"{STEM}.json").write_text(json.dumps(report, indent=2), encoding="utf-8")
    plot(
        results,
        [m for m in ("hybrid", "dense", "lexical") if m in modes] or modes,
        args.out / f"{STEM}.png",
    )
    command = "python benchmarks/locomo_views.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])
    )
    md = [
        "## LoCoMo: fact-style records (observations, conditional shape, multi-view)",
        "",
        f"- machine: {info['nproc']} CPUs ({info['cpu']}), {info['ram']} RAM, {info['os']}, "
        f"Python {info['python']}; load average {info['load_avg_1min_at_start']} at start "
        "(shared machine)",
        f"- code: {info['code']}",
        f"- command: `{command.strip()}`",
        f"- data: `{args.data}` ({len(convs)} conversations, {n_q} questions with evidence); "
        f"embedder `{inner.name}`; fusion = library default `{FusionConfig()}`",
        "- records per set (all conversations): "
        + ", ".join(f"{LABELS[r]} {sizes[r]}" for r in ROWS),
        "- counting: records map to the dia_ids they cite; the first k records' ids, "
        "de-duplicated, are compared with the evidence ids; recall@k = found / evidence, mean "
        "over questions. k counts records (multi-view: k observations + 1 summary); "
        "ids@k = mean distinct dia_ids those records cover. A summary cites every turn of "
        "its session, so summary rows win recall by covering many turns: read them with ids@k.",
        "- ceiling: recall of a perfect ranking of all observations; evidence turns cited by "
        "no observation are out of reach of (ii)-(iv).",
        f"- time: embedding {embed_s:.1f}s (cached under `benchmarks/out/{STEM}_cache/`), "
        f"search per mode (8 sets x {n_q} questions): {timings}",
    ]
    if trunc and "share" in trunc:
        md.append(
            f"- (iii) texts longer than MiniLM's 256 word pieces (knowledge part cut from the "
            f"vector): {trunc['over_256_word_pieces']}/{trunc['texts']} "
            f"({100 * trunc['share']:.0f}%), median {trunc['median_word_pieces']} word pieces"
        )
    mv = results[modes[0]]["multi-view (k obs + 1 summary)"]["overall"]
    raw = results[modes[0]]["raw"]["overall"]
    md.append(
        f"- equal dia_id budget ({modes[0]}): multi-view at k=1 covers {mv['ids@1']:.1f} "
        f"dia_ids for R {mv['R@1']:.3f}; raw turns at k=25 cover {raw['ids@25']:.1f} for R "
        f"{raw['R@25']:.3f}; multi-view at k=5 covers {mv['ids@5']:.1f} for R {mv['R@5']:.3f}."
    )
    md += ["", *tables]
    (args.out / f"{STEM}.md").write_text("\n".join(md), encoding="utf-8")
    print(f"wrote {args.out / STEM}.json/.png/.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
