"""One mechanism's variant on the answer-quality harness: the same kept ingest, answered again.

Some changes touch only how a mechanism recalls, not what it writes. Their effect on answers
is measured here without writing the memories again: the script copies the finished ingests
of one mechanism from a ``benchmarks/locomo_qa.py`` run (memory folders, or where the run
kept none its memory files restored with the run's embedder, and ingest cost, no answer,
:func:`locomo_qa.copy_ingest`) and answers the same questions with the variant
built on those folders. Records, reader and questions are the same, so the F1 difference
from the source run's row is the variant's alone. Answering can change a memory's state
(MemoryBank reinforces what it recalls), so each copy's record state is first put back as
the ingest left it (:func:`~memories_core.evaluation.harness.rewind_state`, from the update
history, to before the question time).

Variants (``--variant``):

* ``memochat-fused``: MemoChat's recall before it followed the model's memo choice (Lu et
  al., 2023, §3.2, Table 7): the model's choice as one more ranking, fused with the dense
  and lexical hits over memo and turn records, cut to k (a none-of-the-others answer still
  recalls k records). Rebuilt from public parts: a
  :class:`~memories_core.retrieval.Pipeline` of :class:`DenseSource`, :class:`LexicalSource`
  and :class:`~memories_core.mechanisms.memochat.LLMOptionSource`, rendered by the mechanism.
* ``memochat-choice``: MemoChat's recall as it is, the model's memo choice alone (a
  none-of-the-others answer recalls nothing): the after beside ``memochat-fused`` when the
  source run's own answers came from another runtime or question draw, so both are answered
  on the same copies, by the same reader, in the same sitting.
* ``emg-threshold``: EMG-RAG's untrained selection before the top-1 default: the walk that
  includes a memory when its activation passes the threshold (``fallback="threshold"``).
* ``emg-top3``: EMG-RAG's untrained selection widened from the top memory to the top three
  (``min_select=3``). Top-1 was chosen on the selection's F1 against the required memories
  (``benchmarks/emg_selection.py``), which counts every extra memory against it; this
  measures what the reader does with three.
* ``emg-undated``: EMG-RAG's recall context without each memory's date
  (``show_dates=False``), as it was before EMG's context was dated like every other
  mechanism's.
* ``dpem-stm-cut``: DPeM with the short-term lookup's measured relevance cut
  (``stm_cut=MEASURED_STM_CUT["levenshtein"]``; off by default); with ``--dpem`` the copies
  are first replayed with those settings (as ``dpem-replay``), to measure the cut on an STM
  that holds more items.
* ``dpem-keep-all``: DPeM without forgetting: every knowledge item its STM refreshes
  dropped (the paper's "STM is refreshed periodically", Zhang et al., 2023, "Executive
  Process") is put back in STM from the update history, as it was when dropped.
* ``dpem-all-ltm``: the same items, and the ones still stored, all moved to LTM (looked up
  by the engine's semantic search instead of STM's edit distance): DPeM as if each item
  reached the promotion threshold on its first round.
* ``dpem-replay``: DPeM's executive process run again on the recorded rounds' typed items
  with other settings (``--dpem theta=1,stm_refresh_rounds=24``): what the memory would
  hold with another promotion threshold, STM refresh period or capacity, without the
  coordinator's calls.
* ``memorybank-decay``: MemoryBank's recall before cross-validation chose no query-time
  decay: scores multiplied by retention (``forgetting_weight=1``) and daily summaries not
  decaying (``summaries_decay=False``), the earlier defaults.
* ``conditional-no-keys``: conditional memory as it was indexed before each record's note
  got a search key of its own (BENCHMARKS.md, "Conditional memory: what is indexed"): the
  copies' note keys are deleted through the engine's public ``delete_records``, so recall
  ranks the rendered records (``"Context: ... Knowledge: ..."``) alone.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import locomo_qa
from tqdm import tqdm

from memories_core import (
    DualProcessMemory,
    EMGMemory,
    FixedClock,
    MemoChatMemory,
    MemoryBankMemory,
    Scope,
)
from memories_core.engine import Derivation, MemoryEngine
from memories_core.evaluation import load_locomo
from memories_core.evaluation.harness import question_time, rewind_state
from memories_core.files import write_json_atomic
from memories_core.mechanisms.base import MemoryBase
from memories_core.mechanisms.dpem import KNOWLEDGE_KIND, LTM, MEASURED_STM_CUT, STM
from memories_core.mechanisms.memochat import LLMOptionSource
from memories_core.retrieval import DenseSource, LexicalSource, Pipeline
from memories_core.retrieval.keys import KEY_FOR, SEARCH_KEY_KIND
from memories_core.types import MemoryRecord, Recall, new_id

#: A factory on a kept memory folder: (path/clock/embedder, the model, the recall budget).
Factory = Callable[[dict[str, Any], Any, "float | None"], Any]


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
    """MemoChat's earlier recall: the model's choice fused as a third ranking."""
    source = LLMOptionSource(llm, budget=budget)
    pipeline = Pipeline(sources=(DenseSource(), LexicalSource(), source), rerankers=())
    return FusedChoiceMemoChat(**common, llm=llm, budget=budget, pipeline=pipeline)


def emg_threshold(common: dict[str, Any], llm: Any, budget: float | None) -> Any:
    return EMGMemory(**common, llm=llm, fallback="threshold")


def emg_top3(common: dict[str, Any], llm: Any, budget: float | None) -> Any:
    return EMGMemory(**common, llm=llm, min_select=3)


def emg_undated(common: dict[str, Any], llm: Any, budget: float | None) -> Any:
    return EMGMemory(**common, llm=llm, show_dates=False)


def dpem_stm_cut(common: dict[str, Any], llm: Any, budget: float | None) -> Any:
    return DualProcessMemory(**common, llm=llm, stm_cut=MEASURED_STM_CUT["levenshtein"])


def memorybank_decay(common: dict[str, Any], llm: Any, budget: float | None) -> Any:
    """MemoryBank's earlier defaults: scores x retention, daily summaries kept at R = 1."""
    return MemoryBankMemory(**common, llm=llm, forgetting_weight=1.0, summaries_decay=False)


def drop_note_keys(memory_dir: Path, user_id: str, embedder: Any) -> tuple[int, int]:
    """Delete the search keys of ``user_id``'s conditional records; (records, keys deleted)."""
    clock = FixedClock(datetime(2024, 1, 1, tzinfo=timezone.utc))  # deletion time only
    engine = MemoryEngine(path=memory_dir, clock=clock, embedder=embedder)
    try:
        records = {r.id for r in engine.records(user_id, where={"kind": "conditional"})}
        keys = [
            k.id
            for k in engine.records(user_id, where={"kind": SEARCH_KEY_KIND})
            if k.metadata.get(KEY_FOR) in records
        ]
        deleted = engine.delete_records(user_id, keys, reason="variant_qa: conditional-no-keys")
    finally:
        engine.close()
    return len(records), deleted


def forgotten_items(
    engine: MemoryEngine, user_id: str
) -> list[tuple[MemoryRecord, dict[str, Any]]]:
    """DPeM knowledge items its STM refreshes deleted, rebuilt from the update history.

    A deletion keeps the item's text (``old``); its attributes (rounds, count, type) are
    the last state written before it, and its time the first. Returns (record, attributes).
    """
    first: dict[str, datetime] = {}
    state: dict[str, dict[str, Any]] = {}
    items: list[tuple[MemoryRecord, dict[str, Any]]] = []
    for change in engine.history(user_id):
        first.setdefault(change.record_id, change.at)
        if "tier" in change.new:
            state[change.record_id] = dict(change.new)
        old = change.old
        if change.new.get("deleted") and old.get("kind") == KNOWLEDGE_KIND:
            kept = state.get(change.record_id, {})
            attrs = dict(kept.get("attrs") or {})
            record = MemoryRecord(
                new_id(),
                user_id,
                KNOWLEDGE_KIND,
                str(old["text"]),
                first[change.record_id],
                metadata={"type": attrs.get("type", "common-sense")},
            )
            items.append((record, attrs))
    return items


def restore_forgotten(
    memory_dir: Path, user_id: str, embedder: Any, *, tier: str = STM
) -> tuple[int, int]:
    """Put back every knowledge item DPeM's STM refreshes dropped, all in ``tier``.

    With ``tier=LTM`` every item (the ones still stored too) is long-term: what DPeM
    would hold if each item were promoted on its first round and nothing were dropped.
    Returns (items stored before, items put back).
    """
    clock = FixedClock(datetime(2024, 1, 1, tzinfo=timezone.utc))  # write time only
    engine = MemoryEngine(path=memory_dir, clock=clock, embedder=embedder)
    try:
        stored = engine.records(user_id, where={"kind": KNOWLEDGE_KIND})
        back = forgotten_items(engine, user_id)
        moved = {r.id: {"tier": tier, "attrs": dict(r.state.attrs)} for r in stored}
        engine.write_derivation(
            user_id,
            Derivation(
                add=[record for record, _ in back],
                state={
                    **{record.id: {"tier": tier, "attrs": attrs} for record, attrs in back},
                    **(moved if tier != STM else {}),
                },
                reason=f"variant_qa: forgotten DPeM items restored to {tier}",
            ),
        )
        engine.index_pending()
    finally:
        engine.close()
    return len(stored), len(back)


def restore_to_ltm(memory_dir: Path, user_id: str, embedder: Any) -> tuple[int, int]:
    return restore_forgotten(memory_dir, user_id, embedder, tier=LTM)


def recorded_rounds(
    engine: MemoryEngine, user_id: str
) -> dict[int, tuple[datetime, list[tuple[str, str]]]]:
    """Each round's typed knowledge as the recorded run memorized it, from the history.

    An item is filed in the round that created it, and again in each round it recurred in
    (its text standing in for the recurrence's wording, which was a near-duplicate of it).
    Returns round -> (when it was memorized, its ``(item, type)`` pairs in order).
    """
    texts = {r.id: r.text for r in engine.records(user_id, where={"kind": KNOWLEDGE_KIND})}
    seen: dict[str, set[int]] = {}
    filed: list[tuple[int, datetime, str, str]] = []  # (round, when, record id, type)
    for change in engine.history(user_id):
        if change.new.get("deleted") and change.old.get("kind") == KNOWLEDGE_KIND:
            texts[change.record_id] = str(change.old["text"])
        attrs = change.new.get("attrs") or {}
        if change.new.get("tier") not in (STM, LTM) or "rounds" not in attrs:
            continue
        rounds = {int(n) for n in attrs["rounds"]}
        for number in sorted(rounds - seen.get(change.record_id, set())):
            filed.append((number, change.at, change.record_id, str(attrs.get("type"))))
        seen[change.record_id] = seen.get(change.record_id, set()) | rounds
    out: dict[int, tuple[datetime, list[tuple[str, str]]]] = {}
    for number, when, record_id, kind in filed:
        if record_id in texts:
            out.setdefault(number, (when, []))[1].append((texts[record_id], kind))
    return dict(sorted(out.items()))


#: The recorded rounds a replay ran on, beside the replayed memory folder.
ROUNDS_FILE = "recorded_rounds.json"


def replay_dpem(
    memory_dir: Path, user_id: str, embedder: Any, *, settings: dict[str, int]
) -> tuple[int, int]:
    """DPeM's executive process run again on the recorded rounds with other ``settings``.

    The coordinator's typed items are the recorded run's; only what the executive does
    with them (``theta``, ``stm_refresh_rounds``, ``stm_capacity``) changes. The recorded
    rounds are kept beside the folder (:data:`ROUNDS_FILE`) before the replay rewrites the
    memory. Returns (items stored before, items stored after).
    """
    clock = FixedClock(datetime(2024, 1, 1, tzinfo=timezone.utc))
    engine = MemoryEngine(path=memory_dir, clock=clock, embedder=embedder)
    try:
        rounds = recorded_rounds(engine, user_id)
        kept = [
            {"round": n, "at": when.isoformat(), "items": [list(pair) for pair in typed]}
            for n, (when, typed) in rounds.items()
        ]
        write_json_atomic(memory_dir.parent / ROUNDS_FILE, kept)
        stored = [r.id for r in engine.records(user_id, where={"kind": KNOWLEDGE_KIND})]
        engine.delete_records(user_id, stored, reason="variant_qa: dpem-replay")
        memory = DualProcessMemory(engine=engine, llm=None, **settings)  # type: ignore[arg-type]
        # The run's counters (last refresh, merges, ...) belong to the recorded settings.
        engine.set_user_state(user_id, memory._log_key, {})
        for number, (when, typed) in tqdm(rounds.items(), desc="replay", unit="round"):
            clock.set(when)
            memory.memorize(user_id, number, typed)
        after = len(engine.records(user_id, where={"kind": KNOWLEDGE_KIND}))
    finally:
        engine.close()
    return len(stored), after


def dpem_settings(text: str) -> dict[str, int]:
    """``theta=1,stm_refresh_rounds=24`` as keyword arguments (integers, known names only)."""
    known = {"theta", "stm_refresh_rounds", "stm_capacity"}
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in known or not value.isdigit():
            raise SystemExit(f"--dpem: expected name=integer with a name in {sorted(known)}")
        out[name] = int(value)
    return out


@dataclass(frozen=True)
class Variant:
    """What a variant re-answers and how.

    Attributes:
        mechanism: The harness row whose kept ingest is answered again.
        factory: The variant on a kept memory folder (``None``: the row's own memory).
        prepare: Run once on each new copy's memory folder (``memory_dir``, user id,
            embedder) before answering, e.g. to delete what the variant does without; a copy
            kept from an interrupted run is not prepared again. Returns two counts (what
            each means is the preparation's own: records before and after, or kept and
            put back).
    """

    mechanism: str
    factory: Factory | None = None
    prepare: Callable[[Path, str, Any], tuple[int, int]] | None = None


VARIANTS: dict[str, Variant] = {
    "memochat-fused": Variant("memochat", memochat_fused),
    "memochat-choice": Variant("memochat"),
    "emg-threshold": Variant("emg", emg_threshold),
    "emg-top3": Variant("emg", emg_top3),
    "emg-undated": Variant("emg", emg_undated),
    "dpem-stm-cut": Variant("dpem", dpem_stm_cut),
    "dpem-keep-all": Variant("dpem", prepare=restore_forgotten),
    "dpem-all-ltm": Variant("dpem", prepare=restore_to_ltm),
    "dpem-replay": Variant("dpem", prepare=partial(replay_dpem, settings={})),
    "memorybank-decay": Variant("memorybank", memorybank_decay),
    "conditional-no-keys": Variant("conditional", prepare=drop_note_keys),
}


#: Variants whose copies may first be replayed with other executive settings (``--dpem``).
REPLAYABLE = ("dpem-replay", "dpem-stm-cut")


def resolve_variant(name: str, dpem: str = "") -> Variant:
    """The variant ``name``, its copies first replayed with the ``--dpem`` settings if given.

    ``dpem-replay`` replays with DPeM's defaults when no settings are given; ``dpem-stm-cut``
    replays only when asked, so the cut can be measured on a memory that holds more STM
    items than the ingest left (``--dpem theta=3,stm_refresh_rounds=100000``). The other
    variants prepare their copies their own way and refuse ``--dpem``.
    """
    variant = VARIANTS[name]
    if not dpem:
        return variant
    if name not in REPLAYABLE:
        raise SystemExit(f"--dpem applies to {', '.join(REPLAYABLE)}, not {name}")
    replay = partial(replay_dpem, settings=dpem_settings(dpem))
    return Variant(variant.mechanism, variant.factory, prepare=replay)


def split_args(argv: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """The script's own arguments and the harness's (those after ``--``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--" not in args:
        return args, []
    cut = args.index("--")
    return args[:cut], args[cut + 1 :]


def main(argv: Sequence[str] | None = None) -> int:
    argv, rest = split_args(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    parser.add_argument("--source", type=Path, required=True, help="the ingest run's --out")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--dpem",
        default="",
        help="replay the copies with these executive settings first (dpem-replay, "
        "dpem-stm-cut), e.g. theta=1,stm_refresh_rounds=24,stm_capacity=64",
    )
    args = parser.parse_args(argv)
    variant = resolve_variant(args.variant, args.dpem)
    mechanism = variant.mechanism
    from memories_core.embedders import SentenceTransformerEmbedder

    embedder = SentenceTransformerEmbedder()
    harness = locomo_qa.parse_args(rest)  # the harness's own --data and --sessions
    asked = {c.sample_id: question_time(c, harness.sessions) for c in load_locomo(harness.data)}

    def on_copy(target: Path) -> None:
        """A new copy: its state put back, then the variant's preparation (once per copy)."""
        clock = FixedClock(asked[target.name])
        engine = MemoryEngine(path=target / "memory", clock=clock, embedder=embedder)
        try:
            changed = rewind_state(engine, target.name, asked[target.name])
        finally:
            engine.close()
        print(f"{target.name}: {changed} records' state put back as the ingest left it")
        if variant.prepare is not None:
            before, after = variant.prepare(target / "memory", target.name, embedder)
            print(f"{target.name}: {args.variant} prepared the copy ({before}, {after})")

    folders = locomo_qa.copy_ingest(
        args.source, args.out, mechanism, on_copy=on_copy, embedder=embedder
    )
    print(f"{args.variant}: {len(folders)} kept {mechanism} ingests")
    plain = locomo_qa.make_memory

    def make_memory(
        name: str,
        folder: Path,
        clock: Any,
        llm: Any,
        embedder: Any,
        *,
        recall_budget: float | None = locomo_qa.DEFAULT_RECALL_BUDGET,
    ) -> Any:
        if name != mechanism:
            return plain(name, folder, clock, llm, embedder, recall_budget=recall_budget)
        if locomo_qa.kept_ingest(folder.parent) is None:
            # Only recall differs: a conversation with no kept ingest would be ingested here
            # for nothing (its answers so far stay kept; copy its ingest and resume).
            raise SystemExit(f"{folder.parent.name}: no kept {mechanism} ingest in --source")
        if variant.factory is None:
            return plain(name, folder, clock, llm, embedder, recall_budget=recall_budget)
        common = {"path": folder, "clock": clock, "embedder": embedder}
        return variant.factory(common, llm, recall_budget)

    return locomo_qa.main(
        [*rest, "--mechanisms", mechanism, "--resume", "--out", str(args.out)],
        factory=make_memory,
        embedder=embedder,
    )


if __name__ == "__main__":
    raise SystemExit(main())
