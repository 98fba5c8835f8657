"""One mechanism's variant on the answer-quality harness: the same kept ingest, answered again.

Some changes touch only how a mechanism recalls, not what it writes. Their effect on answers
is measured here without writing the memories again: the script copies the finished ingests
of one mechanism from a ``benchmarks/locomo_qa.py`` run (memory folders and ingest cost, no
answer, :func:`locomo_qa.copy_ingest`) and answers the same questions with the variant
built on those folders. Records, reader and questions are the same, so the F1 difference
from the source run's row is the variant's alone.

Variants (``--variant``):

* ``memochat-fused``: MemoChat's recall before it followed the model's memo choice (Lu et
  al., 2023, §3.2, Table 7): the model's choice as one more ranking, fused with the dense
  and lexical hits over memo and turn records, cut to k (a none-of-the-others answer still
  recalls k records). Rebuilt from public parts: a
  :class:`~memories_core.retrieval.Pipeline` of :class:`DenseSource`, :class:`LexicalSource`
  and :class:`~memories_core.mechanisms.memochat.LLMOptionSource`, rendered by the mechanism.
* ``emg-threshold``: EMG-RAG's untrained selection before the top-1 default: the walk that
  includes a memory when its activation passes the threshold (``fallback="threshold"``).
* ``dpem-stm-cut``: DPeM with the short-term lookup's measured relevance cut
  (``stm_cut=MEASURED_STM_CUT["levenshtein"]``; off by default).

    python benchmarks/variant_qa.py --variant memochat-fused \
        --source <the ingest run's --out> --out <a new folder> -- \
        --conversations 2 --sessions 10 --questions 150 --recall-budget 0

The arguments after ``--`` go to ``locomo_qa.py`` (``--mechanisms <mechanism> --resume --out
OUT`` are added). Conversations are answered in the harness's order; one with no kept ingest
in ``--source`` stops the run (the answers so far are kept, so copying its ingest later and
running the same command again resumes).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_qa

from memories_core import DualProcessMemory, EMGMemory, MemoChatMemory, Scope
from memories_core.mechanisms.base import MemoryBase
from memories_core.mechanisms.dpem import MEASURED_STM_CUT
from memories_core.mechanisms.memochat import LLMOptionSource
from memories_core.retrieval import DenseSource, LexicalSource, Pipeline
from memories_core.types import Recall


class FusedChoiceMemoChat(MemoChatMemory):
    """MemoChat whose recall fuses the model's memo choice with dense and lexical hits.

    The recall every adapter got before recall followed the model: the engine's fused
    search over memo and turn records, with the model's choice as one more ranking, cut
    to k.
    """

    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        return MemoryBase.recall(self, query, scope, k=k, now=now)


def memochat_fused(common: dict[str, Any], llm: Any, budget: float | None) -> Any:
    source = LLMOptionSource(llm, budget=budget)
    pipeline = Pipeline(sources=(DenseSource(), LexicalSource(), source), rerankers=())
    return FusedChoiceMemoChat(**common, llm=llm, budget=budget, pipeline=pipeline)


def emg_threshold(common: dict[str, Any], llm: Any, budget: float | None) -> Any:
    return EMGMemory(**common, llm=llm, fallback="threshold")


def dpem_stm_cut(common: dict[str, Any], llm: Any, budget: float | None) -> Any:
    return DualProcessMemory(**common, llm=llm, stm_cut=MEASURED_STM_CUT["levenshtein"])


#: variant -> (the harness row it re-answers, its factory on a kept memory folder)
VARIANTS: dict[str, tuple[str, Callable[[dict[str, Any], Any, float | None], Any]]] = {
    "memochat-fused": ("memochat", memochat_fused),
    "emg-threshold": ("emg", emg_threshold),
    "dpem-stm-cut": ("dpem", dpem_stm_cut),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, rest = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    parser.add_argument("--source", type=Path, required=True, help="the ingest run's --out")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    mechanism, factory = VARIANTS[args.variant]
    folders = locomo_qa.copy_ingest(args.source, args.out, mechanism)
    print(f"{args.variant}: {len(folders)} kept {mechanism} ingests")
    plain = locomo_qa.make_memory

    def make_memory(name: str, folder: Path, clock: Any, llm: Any, embedder: Any, **kw: Any) -> Any:
        if name != mechanism:
            return plain(name, folder, clock, llm, embedder, **kw)
        if not (folder / "records.sqlite3").is_file():
            # Only recall differs: a conversation with no kept ingest would be ingested here
            # for nothing (its answers so far stay kept; copy its ingest and resume).
            raise SystemExit(f"{folder.parent.name}: no kept {mechanism} ingest in --source")
        common = {"path": folder, "clock": clock, "embedder": embedder}
        return factory(common, llm, kw.get("recall_budget"))

    locomo_qa.make_memory = make_memory  # the harness builds its rows through this name
    return locomo_qa.main([*rest, "--mechanisms", mechanism, "--resume", "--out", str(args.out)])


if __name__ == "__main__":
    raise SystemExit(main())
