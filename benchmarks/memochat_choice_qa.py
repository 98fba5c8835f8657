"""MemoChat's recall before and after it followed the model's choice, on the answer-quality harness.

With a model, ``MemoChatMemory.recall`` (the path of every generic adapter) returns the memos
the model chose among the options (Lu et al., 2023, §3.2, Table 7), possibly none (the
none-of-the-others answer), with the dialog lines each covers. Before that change, recall
fused the model's choice with the dense and lexical hits over memos and turns and always
returned k records. This script measures the change on answers: it copies a finished
``memochat`` ingest of ``benchmarks/locomo_qa.py`` (memory folders and ingest cost, no
answer) and answers the same questions again with the earlier recall, rebuilt from public
parts: a :class:`~memories_core.retrieval.Pipeline` of :class:`DenseSource`,
:class:`LexicalSource` and :class:`~memories_core.mechanisms.memochat.LLMOptionSource` (the
model's choice as a third ranking, fused), over the mechanism's memo and turn records,
rendered by the mechanism. Records, reader and questions are the same, so the F1 difference
is the recall path's alone (the ``after`` row is the source run's own).

    python benchmarks/memochat_choice_qa.py --source <the ingest run's --out> \
        --out <a new folder> -- --conversations 2 --sessions 10 --questions 150 \
        --recall-budget 0

The arguments after ``--`` go to ``locomo_qa.py`` (``--mechanisms memochat --resume --out
OUT`` are added). Conversations are answered in the harness's order; one with no kept
ingest in ``--source`` stops the run (the answers so far are kept, so copying its ingest
later and running the same command again resumes).
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_qa

from memories_core import MemoChatMemory, Scope
from memories_core.mechanisms.base import MemoryBase
from memories_core.mechanisms.memochat import LLMOptionSource
from memories_core.retrieval import DenseSource, LexicalSource, Pipeline
from memories_core.types import Recall


class FusedChoiceMemoChat(MemoChatMemory):
    """MemoChat whose recall fuses the model's memo choice with dense and lexical hits.

    The recall every adapter got before recall followed the model: the engine's fused
    search over memo and turn records, with the model's choice as one more ranking, cut
    to k (a none-of-the-others answer still returns k records).
    """

    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        return MemoryBase.recall(self, query, scope, k=k, now=now)


def fused_memochat(
    folder: Path, clock: Any, llm: Any, embedder: Any, *, recall_budget: float | None
) -> FusedChoiceMemoChat:
    """The ``before`` MemoChat on a kept memory folder, with the library's other defaults."""
    source = LLMOptionSource(llm, budget=recall_budget)
    pipeline = Pipeline(sources=(DenseSource(), LexicalSource(), source), rerankers=())
    return FusedChoiceMemoChat(
        path=folder,
        clock=clock,
        embedder=embedder,
        llm=llm,
        budget=recall_budget,
        pipeline=pipeline,
    )


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
    folders = locomo_qa.copy_ingest(args.source, args.out, "memochat")
    print(f"{len(folders)} kept memochat ingests: {', '.join(f.name for f in folders)}")
    plain = locomo_qa.make_memory

    def make_memory(name: str, folder: Path, clock: Any, llm: Any, embedder: Any, **kw: Any) -> Any:
        if name != "memochat":
            return plain(name, folder, clock, llm, embedder, **kw)
        if not (folder / "records.sqlite3").is_file():
            # Only recall differs: a conversation with no kept ingest would be ingested here
            # for nothing (its answers so far stay kept; copy its ingest and resume).
            raise SystemExit(f"{folder.parent.name}: no kept memochat ingest in --source")
        return fused_memochat(folder, clock, llm, embedder, recall_budget=kw.get("recall_budget"))

    locomo_qa.make_memory = make_memory  # the harness builds its rows through this name
    return locomo_qa.main([*rest, "--mechanisms", "memochat", "--resume", "--out", str(args.out)])


if __name__ == "__main__":
    raise SystemExit(main())
