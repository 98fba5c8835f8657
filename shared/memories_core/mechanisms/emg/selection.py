"""Selecting a question's memories by walking the graph from activated nodes (§4.3).

The question activates the top-``activate`` memories (K=3, Table 6); from each activated node
the agent walks depth first. At each memory reached by a relation edge it sees a state and
includes the memory and continues, or stops the branch (Eq. 2). The state is Eq. 1's three
cosines plus four relative features (:mod:`memories_core.mechanisms.emg.policy`). The
question's entities and relation are read without a model
(:func:`~memories_core.prompts.emg.question_parts`), and the question is embedded once. The walk
stays inside the ``pool`` memories nearest to the question (a hub such as the user has an edge
per memory; this bounds a question's cost).

Untrained (no policy), the selection is the activation ranking's top memory
(``fallback="top1"``), or with ``fallback="threshold"`` the walk that includes a memory when its
cosine to the question reaches ``threshold``. A trained policy's selection is decoded either as
the paper's include/stop walk (``decode="greedy"``) or, ours, as the best-first prefix of the
walked memories with the highest expected F1 under ``P(required)`` (``decode="expected_f1"``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from memories_core.mechanisms.emg.embeddings import EmbeddingCache
from memories_core.mechanisms.emg.policy import ALL_FEATURES, SelectionPolicy, expected_f1_size
from memories_core.mechanisms.emg.schema import MEMORY_KIND, ROOT, Selection, entity_id
from memories_core.prompts.emg import question_parts
from memories_core.types import GraphEdge, MemoryRecord, ScoredRecord

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine
    from memories_core.retrieval import FusionConfig, Pipeline, RecallBackend, RecallRequest
    from memories_core.retrieval.fusion import Ranking

__all__ = [
    "Decision",
    "SelectionConfig",
    "SelectionSettings",
    "Selector",
    "State",
    "VectorSource",
    "Visit",
    "WalkEnvironment",
]

#: A memory's state as the agent sees it: :data:`~.policy.ALL_FEATURES`, in order.
State = npt.NDArray[np.float64]
#: A decision at a memory: include it (and walk on), and its score.
Decision = Callable[[State], tuple[bool, float]]


class SelectionSettings(Protocol):
    """What the selector reads at each selection (``EMGMemory`` itself provides it)."""

    @property
    def activate(self) -> int:
        """Activated nodes per question (K)."""
        ...

    @property
    def pool(self) -> int:
        """Nearest memories the walk may visit."""
        ...

    @property
    def max_select(self) -> int:
        """Most memories one selection returns."""
        ...

    @property
    def min_select(self) -> int:
        """Fewest memories one selection returns (filled with the best-scored visited)."""
        ...

    @property
    def threshold(self) -> float:
        """Cosine at which the threshold fallback includes a memory."""
        ...

    @property
    def fallback(self) -> str:
        """``"top1"`` or ``"threshold"``: the selection while no policy is trained."""
        ...

    @property
    def decode(self) -> str:
        """``"expected_f1"`` or ``"greedy"``: how a trained policy's decisions become a set."""
        ...

    @property
    def fusion(self) -> FusionConfig | None:
        """Fusion of the activation ranking (``None``: the engine's)."""
        ...


@dataclass
class SelectionConfig:
    """Selector settings for use without an ``EMGMemory`` (the defaults are EMGMemory's)."""

    activate: int = 3
    pool: int = 50
    max_select: int = 10
    min_select: int = 1
    threshold: float = 0.35
    fallback: str = "top1"
    decode: str = "expected_f1"
    fusion: FusionConfig | None = None


@dataclass
class WalkEnvironment:
    """A question's walk environment (§4.3): pool, activated ids, edges and states.

    Attributes:
        question: The question.
        activated: Ids of the activated memories (the pool's top ``activate``).
        pool: The memories the walk may visit, nearest first.
        edges: Each pool memory's relation edge (``None``: stored without edges).
        adjacency: Entity node -> pool memories whose edge touches it.
        states: Each pool memory's state without the depth feature.
        scores: Each pool memory's activation score.
    """

    question: str
    activated: list[str]
    pool: dict[str, MemoryRecord] = field(default_factory=dict)
    edges: dict[str, GraphEdge | None] = field(default_factory=dict)
    adjacency: dict[str, list[str]] = field(default_factory=dict)
    states: dict[str, State] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Visit:
    """One decision of a walk: the memory, its full state, the action and its score."""

    record_id: str
    state: State
    include: bool
    score: float


@dataclass(frozen=True)
class VectorSource:
    """A dense source that uses an already computed query vector (one embedding a select)."""

    vector: npt.NDArray[np.float32]
    weight: float
    name: str = "dense"

    def candidates(self, request: RecallRequest, backend: RecallBackend, depth: int) -> Ranking:
        """The records nearest to ``vector``."""
        return backend.dense(
            self.vector, user_id=request.user_id, depth=depth, where=request.filter
        )


class Selector:
    """Builds walk environments and selects memories in them (§4.3).

    Args:
        engine: Searches the memories and holds the graph.
        vectors: Embeddings of names and relations (shared with the editor).
        settings: Selection settings, read at each call.
    """

    def __init__(
        self, engine: MemoryEngine, vectors: EmbeddingCache, settings: SelectionSettings
    ) -> None:
        self.engine = engine
        self.vectors = vectors
        self.settings = settings

    def select(
        self,
        question: str,
        user_id: str,
        now: datetime,
        *,
        activate: int | None = None,
        policy: SelectionPolicy | None = None,
        decode: str | None = None,
    ) -> Selection:
        """Build ``question``'s environment and walk it with ``policy`` (fallback if ``None``)."""
        env = self.environment(question, user_id, now, activate or self.settings.activate)
        return self.choose(env, policy, decode)

    # ------------------------------------------------------------------ decoding
    def choose(
        self, env: WalkEnvironment, policy: SelectionPolicy | None, decode: str | None = None
    ) -> Selection:
        """Walk ``env`` with ``policy`` (the fallback if ``None``) and rank what it included."""
        settings = self.settings
        decode = decode or settings.decode
        walk: list[Visit]
        if policy is None and settings.fallback == "top1":
            # Untrained: the activation ranking's best memories (``min_select``, at least
            # one). On LoCoMo top-1 has the best F1 of every fixed K and of the threshold
            # walk (BENCHMARKS.md, EMG-RAG), so an untrained user is never below it;
            # the reader's answers agree (BENCHMARKS.md, answer quality: top-3 and the
            # threshold walk answer worse).
            decode = "top1"
            walk = []
            ranked = [(rid, env.scores.get(rid, 0.0)) for rid in env.pool][
                : max(settings.min_select, 1)
            ]
        elif policy is not None and decode == "expected_f1":
            walk = self.traverse(env, self.scorer(policy))
            ranked = self.expected_f1_pick(walk)
        else:
            decode = "greedy"
            walk = self.traverse(env, self.decider(policy))
            ranked = self.picked(walk)
        return Selection(
            question=env.question,
            memories=tuple(ScoredRecord(env.pool[i], float(s)) for i, s in ranked),
            activated=tuple(env.activated),
            visited=len(walk),
            policy=("top1" if decode == "top1" else "threshold") if policy is None else "trained",
            decode=decode,
            states={
                v.record_id: dict(zip(ALL_FEATURES, (float(x) for x in v.state), strict=True))
                for v in walk
            },
        )

    def picked(self, walk: list[Visit]) -> list[tuple[str, float]]:
        """Included memories best first (at most ``max_select``), filled to ``min_select``."""
        picked: dict[str, float] = {}
        for visit in walk:
            if visit.include and picked.get(visit.record_id, -2.0) < visit.score:
                picked[visit.record_id] = visit.score
        ranked = sorted(picked.items(), key=lambda pair: -pair[1])[: self.settings.max_select]
        if len(ranked) < self.settings.min_select:
            # Fill with the best-scored memories the agent saw (P(include), or the cosine):
            # a trained policy that includes nothing still ranks the candidates.
            extra = sorted(
                ((v.record_id, v.score) for v in walk if v.record_id not in picked),
                key=lambda pair: -pair[1],
            )
            ranked += extra[: self.settings.min_select - len(ranked)]
        return ranked

    def expected_f1_pick(self, walk: list[Visit]) -> list[tuple[str, float]]:
        """The best-first prefix of the walked memories with the highest expected F1."""
        best: dict[str, float] = {}
        for visit in walk:
            best[visit.record_id] = max(best.get(visit.record_id, 0.0), visit.score)
        ranked = sorted(best.items(), key=lambda pair: -pair[1])
        size = expected_f1_size(
            [p for _, p in ranked],
            min_size=max(self.settings.min_select, 1),
            max_size=self.settings.max_select,
        )
        return ranked[:size]

    @staticmethod
    def scorer(policy: SelectionPolicy) -> Decision:
        """Score every reachable memory with ``P(include)`` and walk on (expected-F1 decode)."""
        columns = policy.columns
        return lambda state: (True, float(policy.required_probability(state[columns])[0]))

    def decider(self, policy: SelectionPolicy | None) -> Decision:
        """The greedy decision: ``P(include) >= 0.5``, or untrained the cosine threshold."""
        if policy is None:
            memory_cos = ALL_FEATURES.index("memory_cos")
            return lambda s: (bool(s[memory_cos] >= self.settings.threshold), float(s[memory_cos]))
        columns = policy.columns

        def decide(state: State) -> tuple[bool, float]:
            p = float(policy.include_probability(state[columns])[0])
            return p >= 0.5, p

        return decide

    # ------------------------------------------------------------------ the environment
    def activation_pipeline(self, vector: npt.NDArray[np.float32] | None = None) -> Pipeline:
        """Top-K activation: the engine's dense + lexical fusion, without context spreading.

        With ``vector`` the dense sources use it instead of embedding the question again.
        """
        from memories_core.retrieval import DenseSource, Pipeline

        base = (self.settings.fusion or self.engine.retriever.fusion).pipeline()
        sources = tuple(
            VectorSource(vector, s.weight, s.name)
            if vector is not None and isinstance(s, DenseSource)
            else s
            for s in base.sources
        )
        return Pipeline(sources=sources, fusion=base.fusion, rerankers=(), depth=base.depth)

    def environment(
        self, question: str, user_id: str, now: datetime, activate: int
    ) -> WalkEnvironment:
        """What a walk for ``question`` may see: the pool, its graph edges and the states.

        Constructing the environment (§4.3): the ``pool`` memories nearest to the question
        (dense + lexical fusion), of which the top ``activate`` are the activated nodes.
        Each memory's state (:data:`~.policy.ALL_FEATURES`, depth added by the walk):

        * ``entity_cos``: the question's entities (:func:`question_parts`) against the two
          entity nodes the memory's relation edge joins, the best pair (a memory has the
          same state whichever end the walk reached it from); without a named entity in the
          question, the question's own embedding stands for it;
        * ``relation_cos``: the question's relation words against the edge's relation (the
          question's embedding when no relation word is left);
        * ``memory_cos``: the question against the memory;
        * the extras of :mod:`.policy` (gap to the best ``memory_cos``, activation rank,
          activation score relative to the best).

        A memory without edges (extraction fallback) uses ``memory_cos`` for all three.
        """
        q = np.asarray(self.engine.embedder.embed_query(question), dtype=np.float32)
        pool_hits = self.engine.search(
            question,
            user_id,
            k=max(self.settings.pool, activate),
            kinds=[MEMORY_KIND],
            now=now,
            pipeline=self.activation_pipeline(q),
        )
        ids = [h.record.id for h in pool_hits]
        env = WalkEnvironment(question=question, activated=ids[:activate])
        if not pool_hits:
            return env
        env.pool = {h.record.id: h.record for h in pool_hits}
        env.scores = {h.record.id: float(h.score) for h in pool_hits}
        graph = self.engine.graph
        for rid in ids:
            found = [e for e in graph.edges(user_id, record_id=rid) if e.id == f"e:{rid}"]
            env.edges[rid] = found[0] if found else None
            if found:
                for node in {found[0].source, found[0].target}:
                    env.adjacency.setdefault(node, []).append(rid)

        def label(record: MemoryRecord, end: str) -> str:
            value = str(record.metadata.get(end) or "")
            return "the user" if entity_id(value) == ROOT else value

        names = list(
            dict.fromkeys(
                label(r, end)
                for r in env.pool.values()
                for end in ("subject", "object")
                if r.metadata.get(end)
            )
        )
        entities, relation = question_parts(question, names)
        # The memories' vectors are already in the index: read them instead of embedding the
        # pool's texts again (an index without ``vectors`` falls back to the cache).
        reader = getattr(self.engine.index, "vectors", None)
        stored: dict[str, npt.NDArray[np.float32]] = (
            dict(reader(ids, user_id=user_id)) if callable(reader) else {}
        )
        relations = {
            rid: str(r.metadata.get("relation") or "").replace("_", " ")
            for rid, r in env.pool.items()
        }
        texts = list(
            dict.fromkeys(
                [
                    *(env.pool[rid].text for rid in ids if rid not in stored),
                    *names,
                    *(x for x in relations.values() if x),
                    *entities,
                    *([relation] if relation else []),
                ]
            )
        )
        vectors = dict(zip(texts, self.vectors.vectors(texts), strict=True)) if texts else {}

        def unit(v: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
            n = float(np.linalg.norm(v))
            return v / n if n else v

        qu = unit(q)
        memory_cos = np.array(
            [
                float(unit(stored[rid] if rid in stored else vectors[env.pool[rid].text]) @ qu)
                for rid in ids
            ]
        )
        ent_vectors = [unit(vectors[e]) for e in entities] or [qu]
        rel_vector = unit(vectors[relation]) if relation else qu
        rows = []
        top_score = max(float(pool_hits[0].score), 1e-12)
        for i, rid in enumerate(ids):
            record = env.pool[rid]
            msim = float(memory_cos[i])
            if env.edges[rid] is None or not relations[rid]:
                ent = rel = msim
            else:
                ends = [label(record, end) for end in ("subject", "object")]
                ent = max(
                    float(unit(vectors[name]) @ e) for name in ends if name for e in ent_vectors
                )
                rel = float(unit(vectors[relations[rid]]) @ rel_vector)
            rows.append(
                (
                    ent,
                    rel,
                    msim,
                    msim - float(memory_cos.max()),
                    1.0 / (1 + i),
                    float(pool_hits[i].score) / top_score,
                )
            )
        env.states = {
            rid: np.asarray(row, dtype=np.float64) for rid, row in zip(ids, rows, strict=True)
        }
        return env

    # ------------------------------------------------------------------ the walk
    @staticmethod
    def traverse(env: WalkEnvironment, decide: Decision) -> list[Visit]:
        """Depth-first walk from each activated node (§4.3); one decision per memory.

        At a memory reached by a relation edge the agent includes it and continues to the
        edge's other entity node, or stops this branch and restarts from the next one on the
        stack (Eq. 2). The depth feature is ``1 / (1 + hops from the activated node)``.
        """
        visits: list[Visit] = []
        decided: dict[str, bool] = {}
        seen_nodes: set[str] = set()

        def visit(rid: str, depth: int) -> bool:
            state = np.append(env.states[rid], 1.0 / (1 + depth))
            include, score = decide(state)
            visits.append(Visit(rid, state, include, score))
            return include

        for start in env.activated:
            edge = env.edges.get(start)
            if edge is None:
                if start not in decided:
                    decided[start] = visit(start, 0)
                continue
            # The in-degree node first (it holds the memory), then the head entity.
            stack: list[tuple[str, str, int]] = [(edge.source, start, 0), (edge.target, start, 0)]
            while stack:
                node, rid, depth = stack.pop()
                if rid not in decided:
                    decided[rid] = visit(rid, depth)
                if not decided[rid] or node in seen_nodes:
                    continue  # stopped: restart from the other branches (Eq. 2)
                seen_nodes.add(node)
                for other_id in env.adjacency.get(node, ()):
                    if other_id in decided:
                        continue
                    other = env.edges[other_id]
                    assert other is not None
                    nxt = other.target if other.source == node else other.source
                    stack.append((nxt, other_id, depth + 1))
        return visits
