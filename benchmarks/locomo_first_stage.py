"""First-stage experiments on LoCoMo dev: what else lifts recall cheaply.

Every variant keeps the library's default pipeline (dense + BM25 z-score fusion, context
spreading with the question-answer rule, temporal boost) and changes one part, LLM-free:

* ``prf-dense``: dense pseudo-relevance feedback (Rocchio, 1971): the query vector plus
  ``beta`` times the mean vector of the ``m`` best fused candidates, searched again; the
  new dense ranking replaces the first one in a second fusion.
* ``prf-lex``: lexical feedback in the manner of RM3 (Abdul-Jaleel et al., 2004): the ``t``
  terms most frequent in the ``m`` best fused candidates (not in the question, no
  stopwords) are searched with BM25 as a third source of weight ``w``.
* ``qlen``: the lexical weight depends on the number of content terms in the question.
* ``sentence keys``: each sentence of a turn with two or more sentences is a search key of
  its turn (an index-time key, no model), so one relevant sentence is not diluted.
* ``mmr``: maximal marginal relevance over the head of the final ranking.
* ``session-diverse``: a candidate loses ``gamma`` x the score range per better candidate
  of its time cluster (turns within 30 minutes), so one session does not fill the top.
* ``session-support``: a candidate gains ``lambda`` x the summed scores of the other
  candidates of its time cluster (a session with several matches rises).
* ``speaker``: candidates spoken by a person the question names (``"Name: text"``) gain
  ``w`` x the score range of the best 50.
* ``dense-keywords``: the dense query mixes the question's vector with the vector of its
  content words (stopwords and question words dropped).

Raw dense and lexical rankings are computed once per question and re-fused per grid point;
each family is chosen by leave-one-conversation-out cross-validation (the helpers of
``locomo_retrieval.py``), the current library default first (it wins ties), with and without
the "no category worse than the current default" constraint.

    python benchmarks/locomo_first_stage.py --data ../shared/datasets/locomo/locomo_dev.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memories_core.backends.sqlite_store import query_terms
from memories_core.evaluation import load_locomo
from memories_core.retrieval import FusionConfig, RecallRequest
from memories_core.retrieval.fusion import zscore_fuse
from memories_core.retrieval.keys import KeyedBackend
from memories_core.retrieval.pipeline import RecallContext
from memories_core.retrieval.rerankers import MMR

sys.path.insert(0, str(Path(__file__).resolve().parent))
from locomo_retrieval import (
    DEPTH_K,
    OUT,
    CachedEmbedder,
    Row,
    build_backend,
    cross_validate,
    dated_sessions,
    question_time,
    render,
    score_question,
    summarise_rows,
)

_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def sentences(text: str) -> list[str]:
    """Split a turn's content into sentences (end punctuation then a capital)."""
    return [part.strip() for part in _SENTENCE.split(text) if len(part.strip()) > 1]


@dataclass(frozen=True)
class Point:
    """One grid point of a family; the defaults are the library default."""

    family: str = "default"
    lexical: float = 0.65
    m: int = 0
    beta: float = 0.0
    terms: int = 0
    weight: float = 0.0
    short_lexical: float = 0.65
    short_max: int = 0
    lambda_: float = 1.0
    gamma: float = 0.0
    mix: float = 0.0

    def label(self) -> str:
        if self.family == "mmr":
            return f"mmr lambda {self.lambda_:.2f} depth {self.m}"
        if self.family == "speaker":
            return f"speaker boost {self.gamma:.2f} {'one name' if self.m else 'any name'}"
        if self.family == "session-support":
            return f"session-support lambda {self.gamma:.2f} depth {self.m}"
        if self.family == "session-diverse":
            return f"session-diverse gamma {self.gamma:.2f} depth {self.m}"
        if self.family == "dense-keywords":
            return f"dense-keywords mix {self.mix:.2f} lex {self.lexical:.2f}"
        if self.family == "prf-dense":
            return f"prf-dense m {self.m} beta {self.beta:.2f} lex {self.lexical:.2f}"
        if self.family == "prf-lex":
            return f"prf-lex m {self.m} terms {self.terms} w {self.weight:.2f}"
        if self.family == "qlen":
            return (
                f"qlen <= {self.short_max} terms: lex {self.short_lexical:.2f}, "
                f"else {self.lexical:.2f}"
            )
        return f"{self.family} lex {self.lexical:.2f}"


class Experiment:
    """Raw rankings per question, re-fused per grid point."""

    def __init__(self, conversations: Sequence[Any], embedder: CachedEmbedder) -> None:
        self.conversations = conversations
        self.embedder = embedder
        # The library default's rerankers (context spreading with the question-answer rule,
        # temporal boost); the variants change what comes before them or add a stage after.
        self.stages = FusionConfig().pipeline().rerankers

    def questions(self, key_sets: dict[str, list[tuple[str, str]]] | None) -> list[Any]:
        """(conversation id, qa, ctx, dense, lexical, query vector) per question."""
        items = []
        for conversation in self.conversations:
            keys = (key_sets or {}).get(conversation.sample_id, [])
            inner = build_backend(conversation, self.embedder, "no session ids", keys)
            backend: Any = KeyedBackend(inner) if keys else inner
            now = question_time(conversation)
            for qa in conversation.qa:
                if not qa.evidence:
                    continue
                request = RecallRequest(
                    qa.question, user_id=conversation.sample_id, k=DEPTH_K, now=now
                )
                ctx = RecallContext(request, backend)
                vector = ctx.query_vector()
                dense = list(ctx.dense(vector, user_id=request.user_id, depth=DEPTH_K, where=None))
                lexical = list(
                    ctx.lexical(qa.question, user_id=request.user_id, depth=DEPTH_K, where=None)
                )
                items.append((conversation.sample_id, qa, ctx, dense, lexical, vector, inner))
        return items

    def finish(
        self, ranked: list[tuple[str, float]], ctx: RecallContext, point: Point | None = None
    ) -> list[str]:
        for stage in self.stages:
            ranked = list(stage.rerank(ranked, ctx.request, ctx))
        if point is not None and point.family == "mmr":
            ranked = MMR(lambda_=point.lambda_, depth=point.m).rerank(ranked, ctx.request, ctx)
        if point is not None and point.family == "speaker":
            ranked = speaker_boost(ranked, ctx, point.gamma, bool(point.m))
        if point is not None and point.family == "session-support":
            ranked = session_support(ranked, ctx, point.gamma, point.m)
        if point is not None and point.family == "session-diverse":
            ranked = session_diverse(ranked, ctx, point.gamma, point.m)
        ids = list(dict.fromkeys(item for item, _ in ranked))
        known = ctx.load(ids[: DEPTH_K + 20], user_id=ctx.request.user_id)
        return [item for item in ids if item in known][:DEPTH_K]

    def rows(self, items: list[Any], point: Point) -> list[Row]:
        out: list[Row] = []
        for sample_id, qa, ctx, dense, lexical, vector, inner in items:
            lex_w = point.lexical
            if point.family == "qlen" and len(query_terms(qa.question)) <= point.short_max:
                lex_w = point.short_lexical
            weights = [round(1 - lex_w, 2), lex_w]
            if point.family == "dense-keywords":
                words = " ".join(query_terms(qa.question)) or qa.question
                kv = self.embedder.embed_query(words)
                q = (1 - point.mix) * vector / np.linalg.norm(vector) + point.mix * kv / max(
                    float(np.linalg.norm(kv)), 1e-9
                )
                q = (q / np.linalg.norm(q)).astype(np.float32)
                dense = list(ctx.dense(q, user_id=sample_id, depth=DEPTH_K, where=None))
            fused = zscore_fuse([dense, lexical], weights, depth=DEPTH_K)
            if point.family == "prf-dense":
                top = [item for item, _ in fused[: point.m]]
                found = inner.vectors(top, user_id=sample_id)
                if found:
                    centroid = np.mean([found[i] for i in top if i in found], axis=0)
                    q = vector / np.linalg.norm(vector) + point.beta * centroid
                    q = (q / np.linalg.norm(q)).astype(np.float32)
                    dense2 = list(ctx.dense(q, user_id=sample_id, depth=DEPTH_K, where=None))
                    fused = zscore_fuse([dense2, lexical], weights, depth=DEPTH_K)
            elif point.family == "prf-lex":
                top = [item for item, _ in fused[: point.m]]
                records = ctx.load(top, user_id=sample_id)
                asked = set(query_terms(qa.question))
                counts: Counter[str] = Counter()
                for item in top:
                    if item in records:
                        text = records[item].text.split(":", 1)[-1]
                        counts.update(set(query_terms(text)) - asked)
                expansion = [t for t, c in counts.most_common(point.terms) if c >= 2]
                if expansion:
                    lex2 = list(
                        ctx.lexical(
                            " ".join(expansion), user_id=sample_id, depth=DEPTH_K, where=None
                        )
                    )
                    fused = zscore_fuse(
                        [dense, lexical, lex2], [*weights, point.weight], depth=DEPTH_K
                    )
            out.append(
                (
                    sample_id,
                    qa.category,
                    score_question(self.finish(fused, ctx, point), qa.evidence),
                )
            )
        return out


def speaker_boost(
    ranked: list[tuple[str, float]], ctx: RecallContext, weight: float, one: bool
) -> list[tuple[str, float]]:
    """Raise candidates spoken by a person the question names (``"Name: text"`` records) by
    ``weight`` x the score range of the best 50; with ``one``, only when it names one."""
    items = list(dict.fromkeys(item for item, _ in ranked))
    scores = dict(reversed(ranked))
    head, rest = items[:50], items[50:]
    records = ctx.load(head, user_id=ctx.request.user_id)
    speaker = {i: r.text.split(":", 1)[0].strip() for i, r in records.items() if ":" in r.text}
    words = set(re.findall(r"[a-z]+", ctx.request.query.lower()))
    named = {name for name in speaker.values() if name.lower() in words}
    if not named or (one and len(named) > 1):
        return list(ranked)
    values = [scores[i] for i in head]
    spread = max(values) - min(values)
    adjusted = {i: scores[i] + (weight * spread if speaker.get(i) in named else 0.0) for i in head}
    order = {item: n for n, item in enumerate(head)}
    out = sorted(adjusted.items(), key=lambda p: (-p[1], order[p[0]]))
    low = min(adjusted.values(), default=0.0)
    return out + [(i, min(scores[i], low)) for i in rest]


def clusters(ids: Sequence[str], ctx: RecallContext) -> dict[str, int]:
    """Time clusters of candidates: sorted by time, a new cluster after a 30-minute gap."""
    records = ctx.load(list(ids), user_id=ctx.request.user_id)
    timed = sorted((records[i].created_at, i) for i in ids if i in records)
    cluster: dict[str, int] = {}
    last = None
    number = -1
    for when, item in timed:
        if last is None or (when - last).total_seconds() > 1800:
            number += 1
        cluster[item] = number
        last = when
    return cluster


def session_support(
    ranked: list[tuple[str, float]], ctx: RecallContext, weight: float, depth: int
) -> list[tuple[str, float]]:
    """Raise a candidate by ``weight`` x the summed (shifted) scores of the other candidates
    of its time cluster among the best ``depth``: a session with several matches rises."""
    items = list(dict.fromkeys(item for item, _ in ranked))
    scores = dict(reversed(ranked))
    head, rest = items[:depth], items[depth:]
    cluster = clusters(head, ctx)
    floor = min(scores[i] for i in head) if head else 0.0
    total: Counter[int] = Counter()
    for item in head:
        if item in cluster:
            total[cluster[item]] += scores[item] - floor  # type: ignore[assignment]
    adjusted = {
        item: scores[item]
        + (weight * (total[cluster[item]] - (scores[item] - floor)) if item in cluster else 0.0)
        for item in head
    }
    order = {item: n for n, item in enumerate(head)}
    out = sorted(adjusted.items(), key=lambda p: (-p[1], order[p[0]]))
    low = min(adjusted.values(), default=0.0)
    return out + [(i, min(scores[i], low)) for i in rest]


def session_diverse(
    ranked: list[tuple[str, float]], ctx: RecallContext, gamma: float, depth: int
) -> list[tuple[str, float]]:
    """Lower a candidate by ``gamma`` x score range per better candidate of its time cluster
    (candidates within 30 minutes of each other form one cluster)."""
    items = list(dict.fromkeys(item for item, _ in ranked))
    scores = dict(reversed(ranked))
    head, rest = items[:depth], items[depth:]
    records = ctx.load(head, user_id=ctx.request.user_id)
    timed = sorted((records[i].created_at, i) for i in head if i in records)
    cluster: dict[str, int] = {}
    last = None
    number = -1
    for when, item in timed:
        if last is None or (when - last).total_seconds() > 1800:
            number += 1
        cluster[item] = number
        last = when
    values = [scores[i] for i in head]
    spread = (max(values) - min(values)) if values else 0.0
    seen: Counter[int] = Counter()
    adjusted: dict[str, float] = {}
    for item in head:
        c = cluster.get(item, -1 - len(adjusted))
        adjusted[item] = scores[item] - gamma * spread * seen[c]
        seen[c] += 1
    floor = min(adjusted.values(), default=0.0)
    order = {item: n for n, item in enumerate(head)}
    out = sorted(adjusted.items(), key=lambda p: (-p[1], order[p[0]]))
    return out + [(i, min(scores[i], floor)) for i in rest]


def sentence_keys(conversation: Any, mapping: str = "caption") -> list[tuple[str, str]]:
    """``(key text, dia_id)``: each sentence of a multi-sentence turn, with its speaker."""
    pairs = []
    for dated in dated_sessions(conversation).values():
        for turn, _ in dated:
            text = render(turn, mapping).split(": ", 1)[1]
            parts = sentences(text)
            if len(parts) >= 2:
                pairs += [(f"{turn.speaker}: {part}", turn.dia_id) for part in parts]
    return pairs


def fmt(o: dict[str, float]) -> str:
    return f"R@5 {o['R@5']:.3f} R@10 {o['R@10']:.3f} R@25 {o['R@25']:.3f} S@10 {o['S@10']:.3f}"


def run_family(
    name: str, items: list[Any], exp: Experiment, points: list[Point], folds: list[str]
) -> dict[str, Any]:
    scored = {p: exp.rows(items, p) for p in points}
    result: dict[str, Any] = {"grid_points": len(points)}
    for constrained in (True, False):
        cv = cross_validate(scored, folds, constrained=constrained)  # type: ignore[arg-type]
        tag = "no category worse" if constrained else "unconstrained"
        result[tag] = cv
        print(f"  CV {name}, {tag}: {fmt(cv['held_out']['overall'])} chosen {cv['chosen_counts']}")
    result["all_points"] = {p.label(): summarise_rows(r) for p, r in scored.items()}
    best = max(scored, key=lambda p: result["all_points"][p.label()]["overall"]["R@5"])
    print(f"  best R@5 on all: {best.label()} {fmt(result['all_points'][best.label()]['overall'])}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--families",
        default="qlen,prf-dense,prf-lex,mmr,session-diverse,session-support,speaker,dense-keywords,sentence-keys",
    )
    args = parser.parse_args(argv)
    from memories_core.embedders import SentenceTransformerEmbedder

    conversations = load_locomo(args.data)
    embedder = CachedEmbedder(SentenceTransformerEmbedder(), args.out / "cache")
    folds = [c.sample_id for c in conversations]
    exp = Experiment(conversations, embedder)
    started = time.perf_counter()
    items = exp.questions(None)
    base = Point()
    report: dict[str, Any] = {}
    families: dict[str, Callable[[], list[Point]]] = {
        "qlen": lambda: (
            [base]
            + [
                Point("qlen", lexical=lx, short_lexical=sl, short_max=sm)
                for sm in (2, 3, 4)
                for sl in (0.35, 0.5, 0.65, 0.8)
                for lx in (0.5, 0.65, 0.8)
                if (sl, lx) != (0.65, 0.65)
            ]
        ),
        "prf-dense": lambda: (
            [base]
            + [
                Point("prf-dense", lexical=lx, m=m, beta=b)
                for m in (3, 5, 10)
                for b in (0.25, 0.5, 1.0)
                for lx in (0.5, 0.65)
            ]
        ),
        "mmr": lambda: (
            [base]
            + [Point("mmr", lambda_=lam, m=d) for lam in (0.5, 0.7, 0.85, 0.95) for d in (10, 20)]
        ),
        "speaker": lambda: (
            [base]
            + [Point("speaker", gamma=g, m=one) for g in (0.05, 0.1, 0.2, 0.3) for one in (0, 1)]
        ),
        "session-support": lambda: (
            [base]
            + [
                Point("session-support", gamma=g, m=d)
                for g in (0.02, 0.05, 0.1, 0.2)
                for d in (20, 50)
            ]
        ),
        "session-diverse": lambda: (
            [base]
            + [
                Point("session-diverse", gamma=g, m=d)
                for g in (0.05, 0.1, 0.2, 0.4)
                for d in (10, 20, 50)
            ]
        ),
        "dense-keywords": lambda: (
            [base]
            + [
                Point("dense-keywords", mix=mx, lexical=lx)
                for mx in (0.25, 0.5, 1.0)
                for lx in (0.5, 0.65)
            ]
        ),
        "prf-lex": lambda: (
            [base]
            + [
                Point("prf-lex", m=m, terms=t, weight=w)
                for m in (5, 10)
                for t in (3, 5, 10)
                for w in (0.1, 0.2, 0.35)
            ]
        ),
    }
    for name in args.families.split(","):
        if name in families:
            print(f"{name}:", flush=True)
            report[name] = run_family(name, items, exp, families[name](), folds)
        elif name == "sentence-keys":
            print("sentence-keys:", flush=True)
            keys = {c.sample_id: sentence_keys(c) for c in conversations}
            print(f"  {sum(len(v) for v in keys.values())} keys")
            embedder.warm([t for v in keys.values() for t, _ in v], query=False)
            embedder.save()
            keyed = exp.questions(keys)
            points = [Point("sentence keys", lexical=lx) for lx in (0.65, 0.5, 0.8)]
            scored = {base: exp.rows(items, base)} | {p: exp.rows(keyed, p) for p in points}
            result: dict[str, Any] = {}
            for constrained in (True, False):
                cv = cross_validate(scored, folds, constrained=constrained)  # type: ignore[arg-type]
                result["no category worse" if constrained else "unconstrained"] = cv
                print(
                    f"  CV constrained={constrained}: {fmt(cv['held_out']['overall'])} "
                    f"chosen {cv['chosen_counts']}"
                )
            result["all_points"] = {p.label(): summarise_rows(r) for p, r in scored.items()}
            for label, summary in result["all_points"].items():
                print(f"  {label}: {fmt(summary['overall'])}")
            report[name] = result
    report["seconds"] = round(time.perf_counter() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "locomo_first_stage.json").write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
