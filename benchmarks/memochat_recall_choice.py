"""MemoChat through the generic recall path: does ``recall()`` return what the model chose?

Every generic adapter (LangChain ``MemoryRetriever``, middleware, tools, LangGraph store;
LlamaIndex ``MemoryBlock``, retriever, tools) calls ``MemoChatMemory.recall``. MemoChat's memo
retrieval (Lu et al., 2023, §3.2, Table 7) lets the model choose among memo options, or choose
none of the others (NOTO). This script stores the options of each MemoChat ``retrieval_*``
test item as the memos of one user (records of kind ``memo``, text ``"topic. summary"``),
recalls with the item's query sentence through ``recall(query, scope, k=3)``, and compares the
returned memos with the reference choice:

* ``noto items``: items whose reference is NOTO; ``records`` = mean records returned (0 is
  right), ``empty`` = share of recalls that return nothing;
* ``other items``: option-set F1 between the returned memos and the reference options, and
  the mean records returned.

The model is ``ScriptedLLM(default=rule_following_reply)``, the deterministic stand-in that
chooses the options sharing a content word with the query (else NOTO): the figures measure
whether recall follows a model's choice, not how good a real model's choice is. The NOTO
option's positions in the reference items are counted too (the paper inserts it at random).

    python benchmarks/memochat_recall_choice.py [--items N] [--embedder minilm|hashing]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from memochat_eval import DEFAULT_ITEMS, f1, retrieval_items

from memories_core import MemoChatMemory, Scope
from memories_core.llms import ScriptedLLM
from memories_core.prompts.memochat import rule_following_reply
from memories_core.types import MemoryRecord, new_id

OUT = Path(__file__).resolve().parent / "out"
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def run(items: list[dict[str, Any]], embedder: Any, k: int) -> dict[str, Any]:
    """Recall every item's query through ``MemoChatMemory.recall``; score against the reference."""
    llm = ScriptedLLM(default=lambda m: rule_following_reply(m) or "")
    memory = MemoChatMemory(llm=llm, embedder=embedder, k=k)
    noto_records: list[int] = []
    other_f1: list[float] = []
    other_records: list[int] = []
    for n, item in enumerate(items):
        user = f"item{n}"
        real = [(i, o) for i, o in enumerate(item["options"], 1) if i != item["noto"]]
        records = [
            MemoryRecord(
                new_id(),
                user,
                "memo",
                text,
                T0,
                metadata={"topic": text.split(". ", 1)[0], "summary": "", "option": i},
            )
            for i, text in real
        ]
        memory.engine.add_records(records)
        recall = memory.recall(item["query"], Scope(user), k=k)
        chosen = {
            int(h.record.metadata["option"]) for h in recall.records if h.record.kind == "memo"
        }
        gold = item["gold"] - {item["noto"]}
        if not gold:
            noto_records.append(len(recall.records))
        else:
            other_f1.append(f1(chosen, gold))
            other_records.append(len(recall.records))
    return {
        "noto_items": len(noto_records),
        "noto_mean_records": round(statistics.mean(noto_records), 3) if noto_records else None,
        "noto_empty": round(sum(1 for r in noto_records if r == 0) / len(noto_records), 3)
        if noto_records
        else None,
        "other_items": len(other_f1),
        "other_f1": round(statistics.mean(other_f1), 3) if other_f1 else None,
        "other_mean_records": round(statistics.mean(other_records), 3) if other_records else None,
        "llm_calls": len(llm.calls),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_ITEMS)
    parser.add_argument("--items", type=int, default=0, help="first N retrieval items (0: all)")
    parser.add_argument("--embedder", choices=("minilm", "hashing"), default="minilm")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--label", default="run", help="name of this run in the JSON output")
    args = parser.parse_args(argv)
    raw = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    items = retrieval_items(raw)
    if args.items:
        items = items[: args.items]
    if args.embedder == "minilm":
        from memories_core.embedders import SentenceTransformerEmbedder

        embedder: Any = SentenceTransformerEmbedder()
    else:
        from memories_core.embedders import HashingEmbedder

        embedder = HashingEmbedder()
    positions = Counter("last" if it["noto"] == len(it["options"]) else "not last" for it in items)
    started = time.perf_counter()
    result = run(items, embedder, args.k)
    result["seconds"] = round(time.perf_counter() - started, 1)
    result["reference_noto_position"] = dict(positions)
    result["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    print(json.dumps(result, indent=2))
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "memochat_recall_choice.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    saved[args.label] = {"items": len(items), "embedder": args.embedder, **result}
    path.write_text(json.dumps(saved, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
