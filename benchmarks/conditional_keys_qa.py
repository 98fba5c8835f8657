"""Conditional memory's search keys, before and after, on the answer-quality harness.

``ConditionalMemory`` indexes each record twice: the rendered record
(``"Context: ... Knowledge: ..."``, what the reader sees) and a search key holding the note
alone, because the session context shared by every note of a session dominated the rendered
text's vector (BENCHMARKS.md, "Conditional memory: what is indexed"). This script measures
that change where it matters to a user, on answers: it copies a finished ``conditional``
ingest of ``benchmarks/locomo_qa.py`` (the memory folders and their ingest cost, no answer),
deletes the records' search keys through the engine's public ``delete_records`` (so recall
searches the rendered records alone, the shape before the change), and answers the same
questions again with the harness. The records, the reader and the questions are the same,
so the F1 difference is the keys' alone (the ``after`` row is the source run's own).

    python benchmarks/conditional_keys_qa.py --source <the ingest run's --out> \
        --out <a new folder> -- --conversations 2 --sessions 10 --questions 150 \
        --recall-budget 0

The arguments after ``--`` go to ``locomo_qa.py`` (``--mechanisms conditional --resume
--out OUT`` are added). The source's memory folders must be kept (the runner's ``--out``
of the ingest, not the committed copy, which holds only answers and costs).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_qa
from tqdm import tqdm

from memories_core import FixedClock
from memories_core.engine import MemoryEngine
from memories_core.retrieval.keys import KEY_FOR, SEARCH_KEY_KIND


def drop_record_keys(memory_dir: Path, user_id: str) -> tuple[int, int]:
    """Delete the search keys of ``user_id``'s conditional records; (records, keys deleted)."""
    from memories_core.embedders import SentenceTransformerEmbedder

    clock = FixedClock(datetime(2024, 1, 1, tzinfo=timezone.utc))  # deletion time only
    engine = MemoryEngine(path=memory_dir, clock=clock, embedder=SentenceTransformerEmbedder())
    try:
        records = {r.id for r in engine.records(user_id, where={"kind": "conditional"})}
        keys = [
            k.id
            for k in engine.records(user_id, where={"kind": SEARCH_KEY_KIND})
            if k.metadata.get(KEY_FOR) in records
        ]
        deleted = engine.delete_records(user_id, keys, reason="conditional_keys_qa: before")
    finally:
        engine.close()
    return len(records), deleted


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, required=True, help="the ingest run's --out")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    folders = locomo_qa.copy_ingest(args.source, args.out, "conditional")
    for folder in tqdm(folders, desc="drop record keys", unit="conversation"):
        records, deleted = drop_record_keys(folder / "memory", folder.name)
        print(f"{folder.name}: {records} records, {deleted} search keys deleted")
    return locomo_qa.main(
        [*rest, "--mechanisms", "conditional", "--resume", "--out", str(args.out)]
    )


if __name__ == "__main__":
    raise SystemExit(main())
