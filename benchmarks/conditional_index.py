"""Conditional memory on LoCoMo: what its records index, and recall@k of the evidence turns.

The conditional record (Yuan et al., §3.1, Table 1) reads ``"Context: <why> Knowledge: <note>"``.
On the project's LoCoMo stand-in (``benchmarks/locomo_views.py``: LoCoMo's ``observation``
facts as notes, the ``session_summary`` as context) that shape recalled worse than the plain
notes. Every note of a session shares one context, which dominates the text's vector; this
script measures, through a real :class:`ConditionalMemory` (its engine, its default pipeline,
its ``recall``), which indexed shape recovers the notes' own ranking:

* ``paper``: one record per note, text = the rendered record, nothing else (the shape
  before the fix);
* ``self key``: the rendered record plus a search key of the record whose text is the note
  alone (the engine ranks the record by the better of its own and its key's score);
* ``note text``: the record's text is the note alone (context kept in metadata only);
* ``mechanism``: what :meth:`ConditionalMemory.derive_records` writes today (its keys of the
  source turn are left out: no turns are stored here, and conditional recall never returns
  turns).

recall@k = share of a question's evidence dia_ids cited by the first k records (a note cites
the turn(s) of its observation), mean over the questions with evidence; same counting as
``locomo_views.py``.

    python benchmarks/conditional_index.py [--conversations N] [--shapes paper,mechanism]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from locomo_retrieval import CachedEmbedder
from locomo_views import DEFAULT_DATA, Conversation, ids_at, load, recall, turn_position
from machine_info import machine

from memories_core import ConditionalMemory, Scope
from memories_core.llms import ScriptedLLM
from memories_core.prompts.conditional import ConditionalNote, render_record
from memories_core.retrieval.keys import KEY_FOR, SEARCH_KEY_KIND
from memories_core.types import MemoryRecord, new_id

OUT = Path(__file__).resolve().parent / "out"
KS = (1, 5, 10, 25)
SHAPES = ("paper", "self key", "note text", "mechanism")
T0 = datetime(2023, 1, 1, tzinfo=timezone.utc)


def records_of(
    memory: ConditionalMemory, user: str, conv: Conversation, shape: str
) -> tuple[list[MemoryRecord], dict[str, tuple[str, ...]]]:
    """The records ``shape`` stores for every observation of ``conv``, and what each cites."""
    out: list[MemoryRecord] = []
    cites: dict[str, tuple[str, ...]] = {}
    ordered = sorted(conv.observations, key=lambda o: turn_position(o[2][0]))
    for n, (session, text, ids) in enumerate(ordered):
        note = ConditionalNote(
            related_context="", summary=conv.summaries.get(session, ""), note=text
        )
        at = T0 + timedelta(days=session, minutes=n)
        turn = MemoryRecord(new_id(), user, "turn", text, at, session_id=f"s{session}")
        if shape == "mechanism":
            made = memory.derive_records(note, turn)
            batch = {r.id for r in made}
            made = [r for r in made if r.kind != SEARCH_KEY_KIND or r.metadata[KEY_FOR] in batch]
        else:
            shown = text if shape == "note text" else render_record(note)
            record = MemoryRecord(
                new_id(), user, "conditional", shown, at, session_id=f"s{session}"
            )
            made = [record]
            if shape == "self key":
                key_meta = {KEY_FOR: record.id}
                made.append(
                    MemoryRecord(new_id(), user, SEARCH_KEY_KIND, text, at, f"s{session}", key_meta)
                )
        for r in made:
            if r.kind == "conditional":
                cites[r.id] = ids
        out += made
    return out, cites


def evaluate(convs: list[Conversation], embedder: Any, shape: str) -> dict[str, Any]:
    per_k: dict[int, list[float]] = {k: [] for k in KS}
    for conv in convs:
        user = conv.base.sample_id
        memory = ConditionalMemory(llm=ScriptedLLM(), embedder=embedder)
        records, cites = records_of(memory, user, conv, shape)
        memory.engine.add_records(records)
        for qa in conv.base.qa:
            if not qa.evidence:
                continue
            hits = memory.recall(qa.question, Scope(user), k=max(KS)).records
            ranked = [h.record.id for h in hits]
            for k in KS:
                per_k[k].append(recall(ids_at(ranked, cites, k), qa.evidence))
        memory.close()
    return {f"R@{k}": round(statistics.mean(v), 3) for k, v in per_k.items()} | {
        "questions": len(per_k[1])
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--conversations", type=int, default=0, help="first N (0: all)")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--seed-cache", type=Path, default=None, help="read-only .npz of vectors")
    parser.add_argument("--label", default="run")
    parser.add_argument("--embedder", choices=("minilm", "hashing"), default="minilm")
    args = parser.parse_args(argv)
    from memories_core.embedders import HashingEmbedder, SentenceTransformerEmbedder

    convs = load(args.data)
    if args.conversations:
        convs = convs[: args.conversations]
    inner = SentenceTransformerEmbedder() if args.embedder == "minilm" else HashingEmbedder()
    embedder = CachedEmbedder(inner, OUT / "conditional_index_cache")
    if args.seed_cache is not None and args.seed_cache.exists():
        data = np.load(args.seed_cache)
        for key in data.files:
            embedder.vectors.setdefault(key, data[key])
    report: dict[str, Any] = {
        "machine": machine(),
        "conversations": len(convs),
        "embedder": inner.name,
        "shapes": {},
    }
    for shape in [s.strip() for s in args.shapes.split(",") if s.strip()]:
        started = time.perf_counter()
        report["shapes"][shape] = evaluate(convs, embedder, shape)
        report["shapes"][shape]["seconds"] = round(time.perf_counter() - started, 1)
        print(shape, json.dumps(report["shapes"][shape]), flush=True)
    embedder.save()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "conditional_index.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    saved[args.label] = report
    path.write_text(json.dumps(saved, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
