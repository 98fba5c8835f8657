"""EMG-RAG (Wang et al., 2024): an editable memory graph with RL memory selection.

**The graph** (§4.2, Figure 2a), one per user in the engine's graph store
(:attr:`MemoryEngine.graph`; networkx only for export and drawing):

* the root node is the user (node id ``"user"``); a subject such as "I" or "the user" *is*
  the root;
* the **Memory Type Layer**: Relationship, Preference, Event, Attribute (``type:<T>``);
* the **Memory Subclass Layer**: Table 7's subclasses (``sub:<T>/<S>``), extensible with
  ``subclasses=``; each keeps its *partition centre*, the mean embedding of its memories;
* the **Memory Graph Layer**: entity nodes (``ent:<hash>``) and one relation edge per
  memory, ``subject --relation--> object``, whose ``record_id`` is the memory: the in-degree
  node is linked to the memory it came from. Each entity hangs under the subclass nearest to
  the embedding of its name (the paper uses TransE embeddings; we use the engine's sentence
  embedder on entity and subclass names, which needs no training).

Memories are engine records of kind ``"emg_memory"`` (metadata: type, subclass, subject,
relation, object, event time), derived from the user's turns by an engine job.

**Extraction** (appendix A.1 step 2): :data:`~memories_core.prompts.emg.EXTRACT` turns a turn,
an app notification or OCR text (:meth:`EMGMemory.ingest`) into memories, with relative dates
resolved against the message time. If the model's answer cannot be parsed, the text is still
stored as one memory under its nearest subclass, without edges (documented fallback); an LLM
outage leaves the job pending and retried.

**Editing** (§4.2): each new memory is placed in its partition (the subclass the model gave,
else the nearest partition centre); the memories of that partition with the same subject are
compared with it by relation (same name, or relation-name embeddings at least
``relation_match`` apart), the top-1 by embedding decides:

* same relation, same object: a duplicate, nothing is written;
* same relation, another object: **replacement**. The new memory is added; the old one's
  validity ends (``valid_until`` = the new message's time) and it keeps
  ``attrs.replaced_by``. Nothing is destroyed: the old record, its edge and its history stay;
* a new relation with an end of validity: **deletion** (the memory is inserted with
  ``valid_until``; after that time it is never returned);
* otherwise **insertion**.

Every edit is written with the records in one transaction (``Derivation.apply``) and kept in
the engine's update history with its reason (:meth:`EMGMemory.edits`).

**Selection** (§4.3): the question activates the top-``activate`` memories (K=3, Table 6);
from each activated node the agent walks depth first. At each memory reached by a relation
edge it sees a state and includes the memory and continues, or stops the branch (Eq. 2).
The state is Eq. 1's three cosines (question entity vs node entity, question relation vs
edge relation, question vs memory) plus four documented relative features
(:mod:`.emg_policy`). The question's entities and relation are read without a model
(:func:`~memories_core.prompts.emg.question_parts`: the graph's entity names found in the
question, capitalised words, the remaining words as the relation), so no LLM runs before
retrieval, and the question is embedded once. The walk stays inside the ``pool`` memories
nearest to the question (a hub such as the user has an edge per memory; this bounds a
question's cost). The policy is trained by :meth:`EMGMemory.train_policy` and saved as an
artifact per store (or per user); untrained, the selection is the activation ranking's top
memory (``fallback="top1"``, the best fixed K on LoCoMo, so an untrained user never gets
less than top-1), or with ``fallback="threshold"`` the walk that includes a memory when its
cosine to the question reaches ``threshold``. A trained policy's selection is decoded, by
default, as a set (``decode="expected_f1"``, ours, not the paper's): the walk scores every
reachable memory with ``P(required)`` (the warm-start network, Eq. 5, kept with the policy)
and the best-first prefix of highest expected F1 is returned, so the size follows how confident the
top memory is; ``decode="greedy"`` keeps the paper's include/stop walk, which on LoCoMo
always stops at one memory (``benchmarks/emg_selection.py``, BENCHMARKS.md).

**Training questions from the user's own memories** (appendix A.1 step 3): no user labels
questions, so :meth:`EMGMemory.generate_questions` has the model write them
(:data:`~memories_core.prompts.emg.QUESTIONS`): the memories in time order, cut into
sessions, each giving question-answer pairs with the memories they need, validated (cited
memories exist, the answer is in them). After a :meth:`~EMGMemory.save`, when a user has
another ``questions_every`` memories, a *pending job* is enqueued (mechanism
``<name>/policy``); saves and recalls never run it. :meth:`EMGMemory.run_training` (from a
worker or a schedule) runs the due jobs: it generates the questions, keeps them as the
user's artifact, and once the store holds ``train_after`` generated examples (and again
after each further ``train_after``) trains the store's policy on them.

**Policies and deletion**: the examples a policy is trained on are kept per user, as that
user's artifact, and the policy lists its contributors. :meth:`EMGMemory.delete_user`
removes the user's examples and own policy, and drops every policy the user contributed to
(it carries their influence), leaving a *stale* mark (:meth:`EMGMemory.policy_status`) until
:meth:`EMGMemory.retrain_policy` trains it again from the remaining users' examples; in the
meantime the untrained fallback serves.

**Applications** (§4.4): :meth:`EMGMemory.answer`, :meth:`EMGMemory.autofill`,
:meth:`EMGMemory.reminders`. The walk is also the candidate source of the retrieval pipeline
(:class:`EMGSource`): by default (``recall_mode="selection"``) :meth:`EMGMemory.recall`
returns the selection itself, at most ``k``, so the generic adapters (retrievers, memory
blocks, middleware) show the variable-size set; ``recall_mode="fused"`` fuses it with dense
and lexical search and cuts to ``k``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import random
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import numpy.typing as npt

from memories_core.engine import Derivation, JobFailed, check_query, check_scope, default_llm
from memories_core.errors import ConfigurationError, InvalidInputError, LLMError, ParseError
from memories_core.mechanisms.base import MemoryBase
from memories_core.mechanisms.emg_policy import (
    ALL_FEATURES,
    Episode,
    SelectionPolicy,
    calibrate,
    expected_f1_size,
    reinforce,
    rouge_l,
    selection_f1,
    warm_start,
)
from memories_core.prompts.emg import (
    ANSWER,
    AUTOFILL,
    EXTRACT,
    MEMORY_TYPES,
    QUESTIONS,
    TABLE7_SUBCLASSES,
    AnswerInput,
    AutofillInput,
    ExtractedMemory,
    ExtractInput,
    MemoryLine,
    QuestionsInput,
    question_parts,
)
from memories_core.prompts.spec import run_spec
from memories_core.types import (
    GraphEdge,
    GraphNode,
    Job,
    JobSpec,
    MemoryRecord,
    Recall,
    Scope,
    ScoredRecord,
    StateChange,
    Turn,
    check_user_id,
    ensure_utc,
    new_id,
)

if TYPE_CHECKING:
    from memories_core.interfaces import LLM
    from memories_core.retrieval import Pipeline, RecallBackend, RecallRequest
    from memories_core.retrieval.fusion import Ranking

__all__ = [
    "HOLD_OUT",
    "LAST_TRAINING",
    "MEMORY_KIND",
    "POLICY_ARTIFACT",
    "POLICY_JOBS",
    "ROOT",
    "STALE_ARTIFACT",
    "STORE_OWNER",
    "TRAINING_GENERATED",
    "TRAINING_OWN",
    "TRAINING_STORE",
    "Answer",
    "EMGMemory",
    "EMGSource",
    "Edit",
    "PolicyStatus",
    "Reminder",
    "Selection",
    "TrainingExample",
    "TrainingReport",
    "TrainingRun",
    "is_held_out",
]

#: Record kind of an extracted memory.
MEMORY_KIND = "emg_memory"
#: Node id of the user (the root of every graph).
ROOT = "user"
#: Artifact name of a selection policy.
POLICY_ARTIFACT = "emg/policy"
#: Artifact owner of the store-wide policy (shared by every user without a policy of their own).
STORE_OWNER = "__emg_store__"
#: Marker left where a policy was dropped because a contributing user was deleted.
STALE_ARTIFACT = "emg/policy-stale"
#: A user's examples that trained the store's policy (their artifact: deleted with them).
TRAINING_STORE = "emg/training/store"
#: A user's examples that trained their own policy.
TRAINING_OWN = "emg/training/own"
#: Questions generated from a user's own memories (appendix A.1 step 3; their artifact).
TRAINING_GENERATED = "emg/training/generated"
#: Suffix of the mechanism name under which question-generation and training jobs wait.
POLICY_JOBS = "/policy"
#: The store's last automatic training: how many generated examples, and its held-out check.
LAST_TRAINING = "emg/training/last"
#: Every ``HOLD_OUT``-th generated question (by a hash) checks an automatic policy.
HOLD_OUT = 5
#: Subjects that mean the user (mapped to the root node).
_SELF = frozenset({"user", "i", "me", "my", "myself", "the user", "mine"})
#: Turn roles that are never extracted from (the assistant's and system's words).
_SKIPPED_ROLES = frozenset({"assistant", "system", "ai", "tool"})
_REASON = "emg"

EditOp = Literal["insert", "delete", "replace", "duplicate", "fallback"]


@dataclass(frozen=True)
class Edit:
    """One edit of a user's graph (§4.2).

    Attributes:
        op: ``"insert"``, ``"delete"`` (inserted with an end of validity), ``"replace"``,
            ``"duplicate"`` (nothing written) or ``"fallback"`` (stored without edges).
        text: The new memory's statement.
        record_id: The new memory's id (``None`` for a duplicate).
        replaced_id: The memory whose validity this edit ended (replacement) or that the
            duplicate repeats.
    """

    op: EditOp
    text: str
    record_id: str | None = None
    replaced_id: str | None = None


@dataclass(frozen=True)
class Selection:
    """The memories the agent selected for a question, with what it saw.

    Attributes:
        question: The question.
        memories: Selected memories, best first (score = ``P(include)`` or, untrained, the
            cosine to the question).
        activated: Ids of the activated memories (top-K).
        visited: Number of memories the agent evaluated.
        policy: ``"trained"``, or the untrained fallback: ``"top1"`` (the activation
            ranking's best memory, the default) or ``"threshold"`` (cosine walk).
        decode: How the policy's decisions became the set: ``"greedy"`` (include/stop walk),
            ``"expected_f1"`` (the prefix of highest expected F1, ``EMGMemory.decode``) or
            ``"top1"`` (the untrained fallback; no walk).
        states: The state the agent saw at each evaluated memory (record id -> feature name
            -> value, :data:`~.emg_policy.ALL_FEATURES`), for inspection.
    """

    question: str
    memories: tuple[ScoredRecord, ...]
    activated: tuple[str, ...]
    visited: int
    policy: str
    states: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    decode: str = "greedy"


@dataclass(frozen=True)
class Answer:
    """An answer (§4.4 question answering) and the memories it was generated from."""

    question: str
    text: str
    memories: tuple[ScoredRecord, ...]


@dataclass(frozen=True)
class Reminder:
    """An upcoming event or expiry (§4.4 user services, reminders)."""

    at: datetime
    what: Literal["event", "expires"]
    text: str
    record_id: str


@dataclass(frozen=True)
class TrainingExample:
    """One question with the memories it requires (Table 1, step 3) and its reference answer."""

    user_id: str
    question: str
    required: frozenset[str]
    answer: str | None = None


@dataclass(frozen=True)
class TrainingReport:
    """What :meth:`EMGMemory.train_policy` did.

    Attributes:
        states: WS states collected; positives: of which required.
        warm_start_loss: Last WS loss; episodes: PG episodes run; mean_return: their mean.
        reward: ``"selection-f1"`` (offline) or ``"rouge-l"``.
        owner: Whose policy (:data:`STORE_OWNER` for the store's).
        policy: The trained policy.
        contributors: Users whose examples trained it.
        kept: Whether the policy was saved (``False``: it did not beat top-1 on the
            held-out questions of :meth:`EMGMemory.run_training`, or ``save=False``).
        held_out: The held-out check, when one ran: ``questions``, ``policy_f1``,
            ``top1_f1``.
    """

    states: int
    positives: int
    warm_start_loss: float | None
    episodes: int
    mean_return: float | None
    reward: str
    owner: str
    policy: SelectionPolicy | None = None
    contributors: tuple[str, ...] = ()
    kept: bool = True
    held_out: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PolicyStatus:
    """The state of a selection policy (:meth:`EMGMemory.policy_status`).

    Attributes:
        owner: :data:`STORE_OWNER` or the user.
        trained: A policy is saved and serves.
        stale: A contributing user was deleted since it was trained; the weights were
            dropped and :meth:`EMGMemory.retrain_policy` has not run yet.
        contributors: Users whose stored examples train it.
    """

    owner: str
    trained: bool
    stale: bool
    contributors: tuple[str, ...]


@dataclass(frozen=True)
class TrainingRun:
    """What :meth:`EMGMemory.run_training` did with the pending policy jobs.

    Attributes:
        questions: Questions generated and kept (validated) in this run.
        sessions: Memory sessions sent to the model; rejected: of which gave no usable pair.
        trained: Training reports of the policies trained in this run.
        failed: Jobs that failed (left pending, retried after a backoff).
        remaining: Policy jobs still pending.
    """

    questions: int = 0
    sessions: int = 0
    rejected: int = 0
    trained: tuple[TrainingReport, ...] = ()
    failed: int = 0
    remaining: int = 0


@dataclass
class _Planned:
    records: list[MemoryRecord] = field(default_factory=list)
    nodes: dict[str, GraphNode] = field(default_factory=dict)
    edges: list[GraphEdge] = field(default_factory=list)
    changes: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    edge_updates: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    centres: dict[str, list[npt.NDArray[np.float32]]] = field(default_factory=dict)
    edits: list[Edit] = field(default_factory=list)
    at: datetime | None = None


def _norm(text: str) -> str:
    return " ".join(re.findall(r"[^\W_]+", text.lower()))


def entity_id(label: str) -> str:
    """The node id of an entity (the root for the user themself)."""
    key = _norm(label)
    if key in _SELF or not key:
        return ROOT
    return "ent:" + hashlib.sha1(key.encode("utf-8")).hexdigest()[:20]


def _iso(value: datetime | None) -> str | None:
    return None if value is None else ensure_utc(value).isoformat()


def _cos(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return 0.0 if na == 0 or nb == 0 else float(np.dot(a, b) / (na * nb))


class EMGMemory(MemoryBase):
    """EMG-RAG: see the module docstring (Wang et al., 2024, §4.1-4.4).

    Setup:
        Nothing to install (networkx, numpy; torch only to train the policy; matplotlib only
        to draw). Give a real ``llm`` for real extraction; offline,
        ``ScriptedLLM(default=emg_reply)`` (:mod:`memories_core.prompts.emg`) answers the
        prompts by rule.

    Key init args:
        llm: Extracts memories and answers (default: the engine's, else the bundled model).
        k: Memories a :meth:`recall` returns by default.
        activate: Activated nodes per question (K, Table 6: 3).
        pool: Nearest memories the walk may visit.
        max_select: Most memories one selection returns.
        min_select: Fewest (the best-scored visited memories fill a short selection).
        threshold: Cosine at which the threshold fallback includes a memory.
        relation_match: Cosine of relation names at which two relations are the same.
        subclasses: Extra subclasses per type, added to Table 7's.
        retries: Repair attempts of an unparsable extraction before the fallback.
        decode: How a trained policy's decisions become the selected set (:meth:`select`):
            ``"expected_f1"`` (default; variable size, the prefix of the walked memories by
            ``P(required)`` with the highest expected F1) or ``"greedy"`` (the paper's
            include/stop walk, Eq. 2). The threshold fallback always walks greedily.
        fallback: Selection while no policy is trained: ``"top1"`` (default; the activation
            ranking's best ``max(min_select, 1)`` memories) or ``"threshold"``.
        recall_mode: ``"selection"`` (default: :meth:`recall` returns the selection, at most
            ``k``) or ``"fused"`` (walk + dense + lexical, cut to ``k``).
        train_after: Generated examples in the store before the policy is trained
            automatically, and again after each further ``train_after`` (``None``: never;
            no job is enqueued). See :meth:`run_training`.
        questions_every: New memories of a user per question-generation job.
        session_size: Consecutive memories shown together to the question writer (A.1).
        questions_per_session: Question-answer pairs asked per session.
        training: Settings of the automatic training (:meth:`train_policy` arguments).
        **kwargs: Engine or storage options of :class:`~memories_core.mechanisms.base.MemoryBase`.

    Instantiate, save, ask:
        .. code-block:: python

            from memories_core import EMGMemory, Scope, Turn
            from memories_core.embedders import HashingEmbedder
            from memories_core.llms import ScriptedLLM
            from memories_core.prompts.emg import emg_reply

            memory = EMGMemory(llm=ScriptedLLM(default=emg_reply), embedder=HashingEmbedder())
            memory.save([Turn("user", "I booked the EK349 flight.")], Scope("ann"))
            print(memory.answer("Which flight did I book?", Scope("ann")).text)

    Raises:
        ConfigurationError: on a bad ``activate``, ``pool``, ``threshold``, ``fallback``,
            ``recall_mode``, ``train_after`` or subclass.
    """

    mechanism_name: ClassVar[str] = "emg"
    recall_kinds: ClassVar[tuple[str, ...]] = (MEMORY_KIND,)
    index_turns: ClassVar[bool] = False

    def __init__(
        self,
        *,
        llm: LLM | None = None,
        k: int = 5,
        activate: int = 3,
        pool: int = 50,
        max_select: int = 10,
        min_select: int = 1,
        threshold: float = 0.35,
        relation_match: float = 0.9,
        subclasses: Mapping[str, Sequence[str]] | None = None,
        retries: int = 1,
        decode: Literal["greedy", "expected_f1"] = "expected_f1",
        fallback: Literal["top1", "threshold"] = "top1",
        recall_mode: Literal["selection", "fused"] = "selection",
        train_after: int | None = 50,
        questions_every: int = 20,
        session_size: int = 8,
        questions_per_session: int = 3,
        training: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if decode not in ("greedy", "expected_f1"):
            raise ConfigurationError("decode must be 'expected_f1' or 'greedy'")
        if fallback not in ("top1", "threshold"):
            raise ConfigurationError("fallback must be 'top1' or 'threshold'")
        if recall_mode not in ("selection", "fused"):
            raise ConfigurationError("recall_mode must be 'selection' or 'fused'")
        if train_after is not None and train_after < 1:
            raise ConfigurationError("train_after must be None or at least 1")
        if questions_every < 1 or session_size < 1 or questions_per_session < 1:
            raise ConfigurationError(
                "questions_every, session_size and questions_per_session must be at least 1"
            )
        self.decode: str = decode
        self.fallback: str = fallback
        self.recall_mode: str = recall_mode
        self.train_after = train_after
        self.questions_every = questions_every
        self.session_size = session_size
        self.questions_per_session = questions_per_session
        self.training: dict[str, Any] = dict(training or {})
        if not 1 <= activate <= pool:
            raise ConfigurationError("activate must be between 1 and pool")
        if not 0 <= min_select <= max_select:
            raise ConfigurationError("need 0 <= min_select <= max_select")
        if not -1 <= threshold <= 1 or not -1 <= relation_match <= 1:
            raise ConfigurationError("threshold and relation_match are cosines in [-1, 1]")
        taxonomy = {t: list(s) for t, s in TABLE7_SUBCLASSES.items()}
        for kind, extra in (subclasses or {}).items():
            if kind not in taxonomy:
                raise ConfigurationError(f"unknown memory type {kind!r}; use {MEMORY_TYPES}")
            for name in extra:
                if not isinstance(name, str) or not name.strip() or "/" in kind:
                    raise ConfigurationError(f"bad subclass name {name!r}")
                if name not in taxonomy[kind]:
                    taxonomy[kind].append(name)
        self.taxonomy: dict[str, tuple[str, ...]] = {t: tuple(s) for t, s in taxonomy.items()}
        self.subclass_labels: tuple[str, ...] = tuple(
            f"{t}/{s}" for t, subs in self.taxonomy.items() for s in subs
        )
        engine = kwargs.get("engine")
        if llm is None and (engine is None or engine.llm is None):
            llm = default_llm()
        self.activate = activate
        self.pool = pool
        self.max_select = max_select
        self.min_select = min_select
        self.threshold = threshold
        self.relation_match = relation_match
        self.retries = retries
        self._cache: OrderedDict[str, npt.NDArray[np.float32]] = OrderedDict()
        self._cache_lock = threading.Lock()
        self._policies: dict[str, tuple[str, SelectionPolicy]] = {}
        super().__init__(k=k, llm=llm, **kwargs)
        if self.pipeline is None:
            self.pipeline = self.recall_pipeline()

    # ------------------------------------------------------------------ configuration
    def recall_pipeline(self) -> Pipeline:
        """The recall pipeline of :attr:`recall_mode`.

        ``"selection"``: the graph walk's selection only (:class:`EMGSource`), so
        :meth:`recall` and every generic adapter return the policy's variable-size set (at
        most ``k``). ``"fused"``: the walk fused with dense and lexical search, cut to ``k``.
        """
        from memories_core.retrieval import DenseSource, LexicalSource, Pipeline

        if self.recall_mode == "selection":
            return Pipeline(sources=(EMGSource(self, weight=1.0),), rerankers=())
        return Pipeline(
            sources=(EMGSource(self), DenseSource(weight=0.2), LexicalSource(weight=0.3)),
            rerankers=(),
        )

    # ------------------------------------------------------------------ embeddings
    def _vectors(self, texts: Sequence[str]) -> list[npt.NDArray[np.float32]]:
        """Embeddings of short texts (names, relations, memories), cached in memory."""
        with self._cache_lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            embedded = self.embedder.embed_documents(missing)
            with self._cache_lock:
                for text, vector in zip(missing, embedded, strict=True):
                    self._cache[text] = np.asarray(vector, dtype=np.float32)
                while len(self._cache) > 100_000:
                    self._cache.popitem(last=False)
        with self._cache_lock:
            out = []
            for text in texts:
                vector = self._cache.get(text)
                if vector is None:  # evicted meanwhile by another thread
                    vector = np.asarray(self.embedder.embed_documents([text])[0], np.float32)
                out.append(vector)
            return out

    def _subclass_of_name(self, name: str) -> str:
        """The subclass whose name is nearest to ``name`` (entity assignment, §4.2)."""
        vectors = self._vectors([name, *(self._subclass_text(s) for s in self.subclass_labels)])
        sims = [_cos(vectors[0], v) for v in vectors[1:]]
        return self.subclass_labels[int(np.argmax(sims))]

    @staticmethod
    def _subclass_text(label: str) -> str:
        kind, sub = label.split("/", 1)
        return f"{sub.replace('/', ' or ')} ({kind.lower()})"

    def _partition(self, memory: ExtractedMemory | None, text: str, user_id: str) -> str:
        """The partition of a memory: the model's subclass if known, else the nearest centre."""
        if memory is not None:
            wanted = _norm(f"{memory.type}/{memory.subclass}")
            for label in self.subclass_labels:
                if _norm(label) == wanted or (
                    label.startswith(memory.type + "/")
                    and _norm(label.split("/", 1)[1]) == _norm(memory.subclass)
                ):
                    return label
        centres = {
            n.label: n.data.get("centre")
            for n in self.engine.graph.nodes(user_id, kind="subclass")
            if n.data.get("centre")
        }
        vector = self._vectors([text])[0]
        best, best_sim = None, -2.0
        for label in self.subclass_labels:
            if memory is not None and not label.startswith(memory.type + "/"):
                continue
            centre = centres.get(label)
            target = (
                np.asarray(centre, dtype=np.float32)
                if centre
                else self._vectors([self._subclass_text(label)])[0]
            )
            sim = _cos(vector, target)
            if sim > best_sim:
                best, best_sim = label, sim
        assert best is not None
        return best

    # ------------------------------------------------------------------ writing (jobs)
    def ingest(
        self, text: str, scope: Scope, *, source: str = "notification", at: datetime | None = None
    ) -> None:
        """Store raw text that is not a chat turn (an app notification, OCR'd screenshot text).

        It is kept as a turn whose role is ``source`` and extracted like a user turn (A.1).
        """
        self.save([Turn(source, text, timestamp=at)], scope)

    def _turn_jobs(self, records: Sequence[MemoryRecord]) -> Iterable[JobSpec]:
        return [
            JobSpec(self.name, "extract", f"turn:{r.id}", {"turn_id": r.id})
            for r in records
            if str(r.metadata.get("role", "user")).lower() not in _SKIPPED_ROLES
        ]

    def _run_job(self, job: Job) -> Derivation | None:
        user_id = job.user_id
        found = self.engine.get(user_id, [str(job.payload["turn_id"])])
        if not found:
            return None
        turn = found[0]
        from memories_core.mechanisms.base import turn_from_record

        content = turn_from_record(turn).content
        role = str(turn.metadata.get("role", "user"))
        inputs = ExtractInput(content, turn.created_at, role, self.subclass_labels)
        llm = self._llm(Scope(user_id))
        try:
            memories: list[ExtractedMemory] | None = run_spec(
                llm, EXTRACT, inputs, retries=self.retries
            )
        except LLMError as exc:
            raise JobFailed("extract", f"extraction of turn {turn.id} failed: {exc}") from exc
        except ParseError:
            memories = None  # documented fallback: stored under its nearest subclass
        planned = self._plan(user_id, memories, content, turn.created_at, (turn.id,))
        if not planned.records and not planned.changes:
            return None
        return Derivation(add=planned.records, apply=self._applier(user_id, planned))

    def add_memories(
        self,
        user_id: str,
        memories: Sequence[ExtractedMemory],
        *,
        at: datetime | None = None,
        source_ids: Sequence[str] = (),
        edit: bool = True,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[Edit]:
        """Edit the graph with memories extracted elsewhere (no model call), atomically.

        The same insertion / deletion / replacement rules as for extracted turns (§4.2).
        ``edit=False`` inserts every memory without comparing it with the graph (a bulk load
        of facts that are known not to replace each other, e.g. a benchmark's observations);
        ``metadata`` is added to every new memory's metadata.

        Returns:
            The edits made, in order.
        """
        check_user_id(user_id)
        for memory in memories:
            if not isinstance(memory, ExtractedMemory):
                raise InvalidInputError("memories must be ExtractedMemory objects")
            if memory.type not in MEMORY_TYPES:
                raise InvalidInputError(f"unknown memory type {memory.type!r}")
        when = ensure_utc(at) if at is not None else self.clock.now()
        with self.engine.user_lock(user_id):
            planned = self._plan(
                user_id, list(memories), None, when, tuple(source_ids), edit, metadata
            )
            apply = self._applier(user_id, planned)
            with self.engine.transaction():
                if planned.records:
                    self.store.add(planned.records, indexed=True)
                apply()
        self.engine.index_pending()
        return planned.edits

    def add_text(
        self, user_id: str, text: str, *, at: datetime | None = None, source_ids: Sequence[str] = ()
    ) -> list[Edit]:
        """Store a statement as one memory without edges, under its nearest subclass.

        This is the extraction fallback (no model call), also for bulk loads (benchmarks).
        """
        check_user_id(user_id)
        from memories_core.types import clean_text

        text = clean_text(text)
        when = ensure_utc(at) if at is not None else self.clock.now()
        with self.engine.user_lock(user_id):
            planned = self._plan(user_id, None, text, when, tuple(source_ids))
            with self.engine.transaction():
                self.store.add(planned.records, indexed=True)
                self._applier(user_id, planned)()
        self.engine.index_pending()
        return planned.edits

    def _plan(
        self,
        user_id: str,
        memories: list[ExtractedMemory] | None,
        raw: str | None,
        at: datetime,
        source_ids: tuple[str, ...],
        edit: bool = True,
        metadata: Mapping[str, Any] | None = None,
    ) -> _Planned:
        """Decide the edits of new memories against the committed graph (§4.2)."""
        out = _Planned(at=at)
        if memories is None:
            assert raw is not None
            label = self._partition(None, raw, user_id)
            record = MemoryRecord(
                new_id(),
                user_id,
                MEMORY_KIND,
                raw,
                at,
                metadata={"type": label.split("/", 1)[0], "subclass": label, "fallback": True},
                source_ids=source_ids,
            )
            out.records.append(record)
            out.changes.append(
                (record.id, {"attrs": {"emg_op": "fallback"}}, f"{_REASON} fallback: {raw[:200]}")
            )
            out.centres.setdefault(label, []).append(self._vectors([raw])[0])
            out.edits.append(Edit("fallback", raw, record.id))
            return out
        # One embedding call for the batch's statements, names and relations (then served from
        # the cache: the walk compares questions with them).
        self._vectors(
            list(
                dict.fromkeys(
                    t
                    for m in memories
                    for t in (m.text, m.subject, m.object, m.relation.replace("_", " "))
                    if entity_id(t) != ROOT
                )
            )
        )
        seen: set[tuple[str, str, str]] = set()
        for memory in memories:
            key = (entity_id(memory.subject), memory.relation, _norm(memory.object))
            if key in seen:  # repeated in the same batch: one edit per memory all the same
                out.edits.append(Edit("duplicate", memory.text))
                continue
            seen.add(key)
            self._plan_one(user_id, memory, at, source_ids, out, edit, metadata or {})
        return out

    def _plan_one(
        self,
        user_id: str,
        memory: ExtractedMemory,
        at: datetime,
        source_ids: tuple[str, ...],
        out: _Planned,
        edit: bool = True,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        label = self._partition(memory, memory.text, user_id)
        subject, obj = entity_id(memory.subject), entity_id(memory.object)
        match = self._matching(user_id, subject, memory, label, at) if edit else None
        if match is not None and _norm(str(match.metadata.get("object", ""))) == _norm(
            memory.object
        ):
            if _norm(match.text) == _norm(memory.text):
                out.edits.append(Edit("duplicate", memory.text, None, match.id))
                return
            # The same subject, relation and object but other words: a second memory of
            # that slot (another detail), not a change of it, so neither a duplicate nor a
            # replacement (§4.2 replaces when the relation's value changed).
            match = None
        record = MemoryRecord(
            new_id(),
            user_id,
            MEMORY_KIND,
            memory.text,
            at,
            metadata={
                **dict(extra or {}),
                "type": memory.type,
                "subclass": label,
                "subject": memory.subject,
                "relation": memory.relation,
                "object": memory.object,
                "when": _iso(memory.when),
            },
            source_ids=source_ids,
        )
        out.records.append(record)
        out.centres.setdefault(label, []).append(self._vectors([memory.text])[0])
        for node_id, name in ((subject, memory.subject), (obj, memory.object)):
            if node_id != ROOT and node_id not in out.nodes:
                home = self._subclass_of_name(name)
                out.nodes[node_id] = GraphNode(node_id, "entity", name, {"subclass": home})
                out.edges.append(
                    GraphEdge(f"c:{home}:{node_id}", f"sub:{home}", node_id, "contains")
                )
        out.edges.append(
            GraphEdge(
                f"e:{record.id}",
                subject,
                obj,
                memory.relation,
                record_id=record.id,
                data={
                    "subject": memory.subject,
                    "object": memory.object,
                    "when": _iso(memory.when),
                    "valid_until": _iso(memory.valid_until),
                },
            )
        )
        state: dict[str, Any] = {"attrs": {"emg_op": "insert", "subclass": label}}
        if match is not None:
            state["attrs"] = {"emg_op": "replace", "replaces": match.id, "subclass": label}
            old_end = match.state.valid_until
            end = at if old_end is None or old_end > at else old_end
            out.changes.append(
                (
                    match.id,
                    {"valid_until": end, "attrs": {"replaced_by": record.id}},
                    f"{_REASON} replace: {match.text[:200]!r} -> {memory.text[:200]!r}",
                )
            )
            out.edge_updates.append((f"e:{match.id}", {"valid_until": _iso(end)}))
            out.edits.append(Edit("replace", memory.text, record.id, match.id))
            reason = f"{_REASON} replace: new memory {memory.text[:200]!r}"
        elif memory.valid_until is not None:
            state["attrs"] = {"emg_op": "delete", "subclass": label}
            out.edits.append(Edit("delete", memory.text, record.id))
            reason = (
                f"{_REASON} delete: valid until {_iso(memory.valid_until)}: {memory.text[:200]!r}"
            )
        else:
            out.edits.append(Edit("insert", memory.text, record.id))
            reason = f"{_REASON} insert: {memory.text[:200]!r}"
        if memory.valid_until is not None:
            state["valid_until"] = memory.valid_until
        out.changes.append((record.id, state, reason))

    def _matching(
        self, user_id: str, subject: str, memory: ExtractedMemory, label: str, at: datetime
    ) -> MemoryRecord | None:
        """Top-1 live memory of the partition with the same subject and relation (§4.2)."""
        edges = [
            e
            for e in self.engine.graph.edges(user_id, node_id=subject)
            if e.source == subject and e.record_id is not None
        ]
        if not edges:
            return None
        relations = sorted({e.relation for e in edges})
        same: set[str] = {memory.relation} if memory.relation in relations else set()
        others = [r for r in relations if r != memory.relation]
        if others and self.relation_match < 1:
            vectors = self._vectors(
                [memory.relation.replace("_", " ")] + [r.replace("_", " ") for r in others]
            )
            same |= {
                r
                for r, v in zip(others, vectors[1:], strict=True)
                if _cos(vectors[0], v) >= self.relation_match
            }
        ids = [e.record_id for e in edges if e.relation in same and e.record_id]
        if not ids:
            return None
        candidates = [
            r
            for r in self.engine.get(user_id, ids)
            if r.metadata.get("subclass") == label and r.state.is_live(at)
        ]
        if not candidates:
            return None
        same_text = [r for r in candidates if _norm(r.text) == _norm(memory.text)]
        if same_text:  # the memory itself, told again
            return same_text[0]
        vectors = self._vectors([memory.text] + [r.text for r in candidates])
        sims = [_cos(vectors[0], v) for v in vectors[1:]]
        return candidates[int(np.argmax(sims))]

    def _skeleton(self, user_id: str) -> tuple[list[GraphNode], list[GraphEdge]]:
        nodes = [GraphNode(ROOT, "user", user_id)]
        edges: list[GraphEdge] = []
        for kind, subs in self.taxonomy.items():
            nodes.append(GraphNode(f"type:{kind}", "type", kind))
            edges.append(GraphEdge(f"t:{kind}", ROOT, f"type:{kind}", "has_type"))
            for sub in subs:
                label = f"{kind}/{sub}"
                nodes.append(GraphNode(f"sub:{label}", "subclass", label))
                edges.append(
                    GraphEdge(f"s:{label}", f"type:{kind}", f"sub:{label}", "has_subclass")
                )
        return nodes, edges

    def _applier(self, user_id: str, planned: _Planned) -> Callable[[], None]:
        """The store writes of a plan; run inside the transaction that adds its records."""

        def apply() -> None:
            graph = self.engine.graph
            existing = {n.label: n for n in graph.nodes(user_id, kind="subclass")}
            nodes, edges = self._skeleton(user_id)
            known = set(existing)
            nodes = [n for n in nodes if n.kind != "subclass" or n.label not in known]
            # Partition centres: running means of the memories' embeddings (§4.2).
            for label, vectors in planned.centres.items():
                node = existing.get(label)
                data = dict(node.data) if node is not None else {}
                count = int(data.get("count", 0))
                centre = np.asarray(data.get("centre") or np.zeros_like(vectors[0]), np.float64)
                total = centre * count + np.sum(np.asarray(vectors, np.float64), axis=0)
                count += len(vectors)
                data.update(count=count, centre=[round(float(x), 6) for x in total / count])
                nodes.append(GraphNode(f"sub:{label}", "subclass", label, data))
            graph.put(
                user_id, nodes=[*nodes, *planned.nodes.values()], edges=[*edges, *planned.edges]
            )
            if planned.edge_updates:
                current = {
                    e.id: e
                    for eid, _ in planned.edge_updates
                    for e in graph.edges(user_id, record_id=eid[2:])
                }
                updated = [
                    GraphEdge(
                        e.id, e.source, e.target, e.relation, e.record_id, {**dict(e.data), **extra}
                    )
                    for eid, extra in planned.edge_updates
                    if (e := current.get(eid)) is not None
                ]
                if updated:
                    graph.put(user_id, edges=updated)
            now = planned.at or self.clock.now()  # the edit happened when the message came
            for record_id, fields, reason in planned.changes:
                self.store.update_state(user_id, {record_id: fields}, at=now, reason=reason)

        return apply

    # ------------------------------------------------------------------ reading the graph
    def edits(self, user_id: str) -> list[StateChange]:
        """The user's graph edits from the update history (old, new, when, why), oldest first."""
        return [
            c for c in self.engine.history(user_id) if (c.reason or "").startswith(_REASON + " ")
        ]

    def memories(
        self, user_id: str, *, now: datetime | None = None, include_expired: bool = False
    ) -> list[MemoryRecord]:
        """The user's memories as of ``now`` (all with ``include_expired``), oldest first.

        As of ``now``: formed at or before it, not archived, and inside their validity.
        """
        records = self.engine.records(check_user_id(user_id), where={"kind": MEMORY_KIND})
        if include_expired:
            return records
        when = ensure_utc(now) if now is not None else self.clock.now()
        # "As of" ``now``: valid then, and already known then (formed at or before it).
        return [r for r in records if r.state.is_live(when) and r.created_at <= when]

    def triples(self, user_id: str, *, now: datetime | None = None) -> set[tuple[str, str, str]]:
        """The live ``(subject, relation, object)`` edges of the user's graph at ``now``."""
        live = {r.id for r in self.memories(user_id, now=now)}
        labels = {n.id: n.label for n in self.engine.graph.nodes(user_id)}
        labels[ROOT] = "user"
        return {
            (labels[e.source], e.relation, labels[e.target])
            for e in self.engine.graph.edges(user_id)
            if e.record_id in live
        }

    def to_networkx(self, user_id: str) -> Any:
        """The user's graph as a ``networkx.MultiDiGraph`` (see ``GraphStore.to_networkx``)."""
        return self.engine.graph.to_networkx(check_user_id(user_id))

    def export_graph(
        self,
        user_id: str,
        path: str | Path | None = None,
        *,
        format: Literal["json", "graphml"] = "json",
        now: datetime | None = None,
    ) -> str:
        """Export one user's graph for inspection; returns the text (and writes ``path``).

        JSON: ``{"nodes": [...], "edges": [...]}`` (node-link form); GraphML: attribute
        values that are dicts are JSON strings. Each relation edge carries its memory's text
        and ``live`` (whether it is valid at ``now``).
        """
        import networkx as nx

        graph = self.to_networkx(user_id)
        when = ensure_utc(now) if now is not None else self.clock.now()
        records = {r.id: r for r in self.memories(user_id, include_expired=True)}
        for _, _, data in graph.edges(data=True):
            record = records.get(data.get("record_id") or "")
            data["memory"] = record.text if record is not None else ""
            data["live"] = bool(record is not None and record.state.is_live(when))
        if format == "json":
            text = json.dumps(nx.node_link_data(graph, edges="edges"), default=str, indent=1)
        elif format == "graphml":
            flat = nx.MultiDiGraph()
            for node, data in graph.nodes(data=True):
                flat.add_node(node, **{k: _flat(v) for k, v in data.items()})
            for u, v, key, data in graph.edges(keys=True, data=True):
                flat.add_edge(u, v, key=key, **{k: _flat(x) for k, x in data.items()})
            text = "\n".join(nx.generate_graphml(flat))
        else:
            raise InvalidInputError("format must be 'json' or 'graphml'")
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    def draw(self, user_id: str, path: str | Path, *, now: datetime | None = None) -> Path:
        """Draw one user's graph as a PNG; expired edges dashed.

        Needs matplotlib (extra ``graph``), imported here.

        Raises:
            MissingExtraError: if matplotlib is not installed.
        """
        try:
            import matplotlib
        except ImportError as exc:
            from memories_core.errors import MissingExtraError

            raise MissingExtraError("matplotlib", "graph") from exc
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import networkx as nx

        graph = self.to_networkx(user_id)
        when = ensure_utc(now) if now is not None else self.clock.now()
        live = {r.id for r in self.memories(user_id, now=when)}
        layers = {"user": 0, "type": 1, "subclass": 2, "entity": 3}
        for _node, data in graph.nodes(data=True):
            data["layer"] = layers.get(data["kind"], 3)
        used = {n for u, v, d in graph.edges(data=True) if d["record_id"] for n in (u, v)}
        used |= {f"sub:{graph.nodes[n]['data'].get('subclass')}" for n in used if n != ROOT}
        used |= {f"type:{s.split('/', 1)[0][4:]}" for s in list(used) if s.startswith("sub:")}
        keep = [n for n in graph.nodes if n in used or graph.nodes[n]["kind"] in {"user", "type"}]
        view = graph.subgraph(keep).copy()
        # Layers left to right, nodes stacked in each: horizontal labels never overlap.
        pos = nx.multipartite_layout(view, subset_key="layer", align="vertical", scale=3)
        colours = {"user": "#d62728", "type": "#ff7f0e", "subclass": "#2ca02c", "entity": "#1f77b4"}
        fig, ax = plt.subplots(figsize=(16, 10))
        nx.draw_networkx_nodes(
            view,
            pos,
            ax=ax,
            node_size=500,
            node_color=[colours.get(view.nodes[n]["kind"], "#999999") for n in view.nodes],
        )
        nx.draw_networkx_labels(
            view,
            pos,
            ax=ax,
            font_size=7,
            labels={n: str(view.nodes[n]["label"])[:28] for n in view.nodes},
        )
        solid = [
            (u, v)
            for u, v, d in view.edges(data=True)
            if not d["record_id"] or d["record_id"] in live
        ]
        dashed = [
            (u, v)
            for u, v, d in view.edges(data=True)
            if d["record_id"] and d["record_id"] not in live
        ]
        # Arcs: edges between entities of one column bow out instead of running over each other.
        arc = "arc3,rad=0.35"
        nx.draw_networkx_edges(
            view, pos, ax=ax, edgelist=solid, alpha=0.6, arrows=True, connectionstyle=arc
        )
        nx.draw_networkx_edges(
            view,
            pos,
            ax=ax,
            edgelist=dashed,
            style="dashed",
            alpha=0.4,
            edge_color="#888888",
            arrows=True,
            connectionstyle=arc,
        )
        nx.draw_networkx_edge_labels(
            view,
            pos,
            ax=ax,
            font_size=6,
            connectionstyle=arc,
            edge_labels={
                (u, v): d["relation"] for u, v, d in view.edges(data=True) if d["record_id"]
            },
        )
        ax.set_title(f"Editable memory graph (dashed: no longer valid at {when:%Y-%m-%d %H:%M})")
        ax.axis("off")
        target = Path(path)
        fig.savefig(target, dpi=110, bbox_inches="tight")
        plt.close(fig)
        return target

    # ------------------------------------------------------------------ selection (§4.3)
    def policy(self, user_id: str | None = None) -> SelectionPolicy | None:
        """The trained policy serving ``user_id`` (theirs, else the store's), or ``None``."""
        owners = [check_user_id(user_id), STORE_OWNER] if user_id is not None else [STORE_OWNER]
        for owner in owners:
            info = self.engine.artifacts.get(owner, POLICY_ARTIFACT)
            if info is None:
                continue
            cached = self._policies.get(owner)
            if cached is not None and cached[0] == info.sha256:
                return cached[1]
            policy = SelectionPolicy.from_json(
                self.engine.artifacts.read(owner, POLICY_ARTIFACT, "policy.json")
            )
            self._policies[owner] = (info.sha256, policy)
            return policy
        return None

    def save_policy(
        self,
        policy: SelectionPolicy,
        user_id: str | None = None,
        *,
        contributors: Sequence[str] = (),
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        """Save a policy for the whole store (``user_id=None``) or for one user (artifact).

        Args:
            policy: The weights.
            user_id: Owner of a per-user policy; ``None`` for the store's.
            contributors: Users whose examples trained it (kept in the artifact's metadata:
                deleting one of them drops this policy, see :meth:`policy_status`).
            settings: Training settings :meth:`retrain_policy` reuses.
        """
        owner = STORE_OWNER if user_id is None else check_user_id(user_id)
        self.engine.artifacts.put(
            owner,
            POLICY_ARTIFACT,
            {"policy.json": policy.to_json().encode("utf-8")},
            meta={
                "architecture": policy.architecture,
                "features": list(policy.features),
                "trained": policy.trained,
                "contributors": sorted(set(contributors)),
                "settings": dict(settings or {}),
            },
        )
        self.engine.artifacts.delete(owner, STALE_ARTIFACT)
        self._policies.pop(owner, None)

    def policy_status(self, user_id: str | None = None) -> PolicyStatus:
        """Whether the store's (or ``user_id``'s own) policy is trained, or stale.

        A policy is *stale* when a user whose examples trained it was deleted: the weights
        are dropped at once (they carry that user's influence), selection falls back to the
        next policy (the store's) or the untrained fallback, and :meth:`retrain_policy`
        trains it again from the remaining users' stored examples.
        """
        owner = STORE_OWNER if user_id is None else check_user_id(user_id)
        info = self.engine.artifacts.get(owner, POLICY_ARTIFACT)
        marker = self.engine.artifacts.get(owner, STALE_ARTIFACT)
        source = info if info is not None else marker
        return PolicyStatus(
            owner=owner,
            trained=info is not None,
            stale=marker is not None,
            contributors=tuple(source.meta.get("contributors", ())) if source else (),
        )

    def select(
        self,
        question: str,
        scope: Scope | str,
        *,
        now: datetime | None = None,
        activate: int | None = None,
        policy: SelectionPolicy | Literal["auto"] | None = "auto",
        decode: Literal["greedy", "expected_f1"] | None = None,
    ) -> Selection:
        """Select the memories for a question by walking the graph (§4.3).

        The question is embedded once (the activation search and the state share the
        vector); its entities and relation are read without a model
        (:func:`~memories_core.prompts.emg.question_parts`).

        Args:
            question: The question.
            scope: Whose graph (a :class:`Scope` or a user id).
            now: Time of the question; memories not valid then are never visited.
            activate: Activated nodes (default: ``self.activate``).
            policy: A policy to use, ``None`` for the untrained fallback (``fallback``),
                ``"auto"`` for the user's or store's trained policy (fallback if none).
            decode: How a trained policy's ``P(include)`` becomes the set (default:
                ``self.decode``): ``"greedy"``, the include/stop walk of Eq. 2; or
                ``"expected_f1"``, every reachable memory scored, then the best-first prefix
                of highest expected F1 (:func:`~.emg_policy.expected_f1_size`). The
                threshold fallback always walks greedily.

        Raises:
            InvalidInputError: on an empty question.
        """
        check_query(question)
        user_id = scope.user_id if isinstance(scope, Scope) else check_user_id(scope)
        when = ensure_utc(now) if now is not None else self.clock.now()
        chosen = self.policy(user_id) if policy == "auto" else policy
        env = self._environment(question, user_id, when, activate or self.activate)
        return self._choose(env, chosen, decode)

    def _choose(
        self, env: _Env, policy: SelectionPolicy | None, decode: str | None = None
    ) -> Selection:
        """Walk ``env`` with ``policy`` (threshold if ``None``) and rank what it included."""
        decode = decode or self.decode
        if policy is None and self.fallback == "top1":
            # Untrained: the activation ranking's best memories (``min_select``, at least
            # one). On LoCoMo top-1 has the best F1 of every fixed K and of the threshold
            # walk (benchmarks/emg_selection.py), so an untrained user is never below it.
            decode = "top1"
            walk = []
            ranked = [(rid, env.scores.get(rid, 0.0)) for rid in env.pool][
                : max(self.min_select, 1)
            ]
        elif policy is not None and decode == "expected_f1":
            walk = self._traverse(env, self._scorer(policy))
            ranked = self._expected_f1_pick(walk)
        else:
            decode = "greedy"
            walk = self._traverse(env, self._decider(policy))
            ranked = self._picked(env, walk)
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

    def _picked(self, env: _Env, walk: list[_Visit]) -> list[tuple[str, float]]:
        """Included memories best first (at most ``max_select``), filled to ``min_select``."""
        picked: dict[str, float] = {}
        for visit in walk:
            if visit.include and picked.get(visit.record_id, -2.0) < visit.score:
                picked[visit.record_id] = visit.score
        ranked = sorted(picked.items(), key=lambda pair: -pair[1])[: self.max_select]
        if len(ranked) < self.min_select:
            # Fill with the best-scored memories the agent saw (P(include), or the cosine):
            # a trained policy that includes nothing still ranks the candidates.
            extra = sorted(
                ((v.record_id, v.score) for v in walk if v.record_id not in picked),
                key=lambda pair: -pair[1],
            )
            ranked += extra[: self.min_select - len(ranked)]
        return ranked

    def _expected_f1_pick(self, walk: list[_Visit]) -> list[tuple[str, float]]:
        """The best-first prefix of the walked memories with the highest expected F1."""
        best: dict[str, float] = {}
        for visit in walk:
            best[visit.record_id] = max(best.get(visit.record_id, 0.0), visit.score)
        ranked = sorted(best.items(), key=lambda pair: -pair[1])
        size = expected_f1_size(
            [p for _, p in ranked], min_size=max(self.min_select, 1), max_size=self.max_select
        )
        return ranked[:size]

    def _scorer(self, policy: SelectionPolicy) -> Callable[[_State], tuple[bool, float]]:
        """Score every reachable memory with ``P(include)`` and walk on (expected-F1 decode)."""
        columns = policy.columns
        return lambda state: (True, float(policy.required_probability(state[columns])[0]))

    def _decider(self, policy: SelectionPolicy | None) -> Callable[[_State], tuple[bool, float]]:
        if policy is None:
            memory_cos = ALL_FEATURES.index("memory_cos")
            return lambda s: (bool(s[memory_cos] >= self.threshold), float(s[memory_cos]))
        columns = policy.columns

        def decide(state: _State) -> tuple[bool, float]:
            p = float(policy.include_probability(state[columns])[0])
            return p >= 0.5, p

        return decide

    def _activation_pipeline(self, vector: npt.NDArray[np.float32] | None = None) -> Pipeline:
        """Top-K activation: the engine's dense + lexical fusion, without context spreading.

        With ``vector`` the dense sources use it instead of embedding the question again.
        """
        from memories_core.retrieval import DenseSource, Pipeline

        base = (self.fusion or self.engine.retriever.fusion).pipeline()
        sources = tuple(
            _VectorSource(vector, s.weight, s.name)
            if vector is not None and isinstance(s, DenseSource)
            else s
            for s in base.sources
        )
        return Pipeline(sources=sources, fusion=base.fusion, rerankers=(), depth=base.depth)

    def _environment(self, question: str, user_id: str, now: datetime, activate: int) -> _Env:
        """What a walk for ``question`` may see: the pool, its graph edges and the states.

        Constructing the environment (§4.3): the ``pool`` memories nearest to the question
        (dense + lexical fusion), of which the top ``activate`` are the activated nodes.
        Each memory's state (:data:`~.emg_policy.ALL_FEATURES`, depth added by the walk):

        * ``entity_cos``: the question's entities (:func:`question_parts`) against the two
          entity nodes the memory's relation edge joins, the best pair (a memory has the
          same state whichever end the walk reached it from); without a named entity in the
          question, the question's own embedding stands for it;
        * ``relation_cos``: the question's relation words against the edge's relation (the
          question's embedding when no relation word is left);
        * ``memory_cos``: the question against the memory;
        * the extras of :mod:`.emg_policy` (gap to the best ``memory_cos``, activation rank,
          activation score relative to the best).

        A memory without edges (extraction fallback) uses ``memory_cos`` for all three.
        """
        q = np.asarray(self.embedder.embed_query(question), dtype=np.float32)
        pool_hits = self.engine.search(
            question,
            user_id,
            k=max(self.pool, activate),
            kinds=[MEMORY_KIND],
            now=now,
            pipeline=self._activation_pipeline(q),
        )
        ids = [h.record.id for h in pool_hits]
        env = _Env(question=question, activated=ids[:activate])
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
        vectors = dict(zip(texts, self._vectors(texts), strict=True)) if texts else {}

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

    def _traverse(self, env: _Env, decide: Callable[[_State], tuple[bool, float]]) -> list[_Visit]:
        """Depth-first walk from each activated node (§4.3); one decision per memory.

        At a memory reached by a relation edge the agent includes it and continues to the
        edge's other entity node, or stops this branch and restarts from the next one on the
        stack (Eq. 2). The depth feature is ``1 / (1 + hops from the activated node)``.
        """
        visits: list[_Visit] = []
        decided: dict[str, bool] = {}
        seen_nodes: set[str] = set()

        def visit(rid: str, depth: int) -> bool:
            state = np.append(env.states[rid], 1.0 / (1 + depth))
            include, score = decide(state)
            visits.append(_Visit(rid, state, include, score))
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

    # ------------------------------------------------------------------ training
    def train_policy(
        self,
        examples: Sequence[TrainingExample],
        *,
        user_id: str | None = None,
        features: Sequence[str] = ALL_FEATURES,
        warm_epochs: int = 300,
        episodes: int = 3000,
        batch: int = 16,
        lr: float = 1e-3,
        warm_lr: float = 1e-2,
        balance: bool = False,
        reward_llm: LLM | None = None,
        now: datetime | None = None,
        seed: int = 0,
        progress: bool = True,
        save: bool = True,
    ) -> TrainingReport:
        """Train the selection policy: warm start (Eq. 5), then REINFORCE (Eq. 6).

        WS states come from walks that include every visited memory (the teacher explores
        the whole reachable neighbourhood), labelled by ``example.required``. PG samples
        walks from the policy; the return is the change in answer quality (Eq. 3-4):

        * with ``reward_llm`` and reference answers: ROUGE-L of the LLM's answer from the
          selected memories minus ROUGE-L of its answer from none (§4.3);
        * otherwise (offline): the F1 of the selected memories against the required ones,
          minus that of the empty selection (0): a retrieval-quality reward.

        Offline, the greedy walk's F1 on the same question is the baseline (self-critical);
        with an LLM reward a running mean is (no extra model calls). Each question's
        environment is built once.

        With ``save`` the policy is saved (store-wide, or ``user_id``'s), and each user's
        examples are kept as that user's artifact (``emg/training/...``), so they go with
        :meth:`delete_user`, which also drops the policies they trained (see
        :meth:`policy_status`, :meth:`retrain_policy`).

        Args:
            examples: Questions with required memory ids (and reference answers).
            user_id: Train ``user_id``'s own policy (online fine-tuning, §4.4) from their
                examples only, starting from the store's policy; default: the store's.
            features: State features (default every one; the paper's Eq. 1 is
                :data:`~.emg_policy.PAPER_FEATURES`).
            warm_epochs: WS epochs (0 skips WS).
            episodes: PG episodes (A.4 uses 100; 0 skips PG).
            batch: PG episodes per Adam step.
            lr: PG learning rate (A.4: 0.001).
            warm_lr: WS learning rate.
            balance: Class-balanced BCE in WS (see :func:`.emg_policy.warm_start`).
            reward_llm: Model whose answers are scored by ROUGE-L.
            now: Time of the questions.
            seed: Seed of initialisation, sampling and torch.
            progress: tqdm bars.
            save: Save the policy and the examples as artifacts.

        Raises:
            InvalidInputError: if there are no examples, a per-user policy gets another
                user's example, or no state could be collected.
        """
        if not examples:
            raise InvalidInputError("train_policy needs at least one example")
        if user_id is not None:
            check_user_id(user_id)
            if any(e.user_id != user_id for e in examples):
                raise InvalidInputError("a user's own policy trains on that user's examples only")
        when = ensure_utc(now) if now is not None else self.clock.now()
        from tqdm.auto import tqdm

        envs = [
            self._environment(e.question, e.user_id, when, self.activate)
            for e in tqdm(examples, desc="EMG environments", disable=not progress)
        ]
        settings = {
            "features": list(features),
            "warm_epochs": warm_epochs,
            "episodes": episodes,
            "batch": batch,
            "lr": lr,
            "warm_lr": warm_lr,
            "balance": balance,
            "seed": seed,
        }
        base = self.policy() if user_id is not None else None
        contributors = {e.user_id for e in examples}
        if base is not None and list(base.features) == list(features):
            policy = SelectionPolicy.from_json(base.to_json())
            info = self.engine.artifacts.get(STORE_OWNER, POLICY_ARTIFACT)
            contributors |= set(info.meta.get("contributors", ())) if info else set()
        else:
            policy = SelectionPolicy.initial(seed, features)
        report = self._train(
            policy,
            list(examples),
            envs,
            warm_epochs=warm_epochs,
            episodes=episodes,
            batch=batch,
            lr=lr,
            warm_lr=warm_lr,
            balance=balance,
            reward_llm=reward_llm,
            when=when,
            seed=seed,
            progress=progress,
        )
        owner = STORE_OWNER if user_id is None else user_id
        if save:
            self._save_trained(policy, examples, user_id, when, contributors, settings)
        return dataclasses.replace(
            report, owner=owner, contributors=tuple(sorted(contributors)), kept=save
        )

    def _save_trained(
        self,
        policy: SelectionPolicy,
        examples: Sequence[TrainingExample],
        user_id: str | None,
        when: datetime,
        contributors: Iterable[str],
        settings: Mapping[str, Any],
    ) -> None:
        """Save a trained policy, and each user's examples as that user's artifact."""
        name = TRAINING_STORE if user_id is None else TRAINING_OWN
        for uid in sorted({e.user_id for e in examples}):
            mine = [e for e in examples if e.user_id == uid]
            self.engine.artifacts.put(
                uid,
                name,
                {"examples.json": _examples_json(mine, when).encode("utf-8")},
                meta={"examples": len(mine)},
            )
        self.save_policy(policy, user_id, contributors=sorted(contributors), settings=settings)

    def _keep_store_policy(
        self,
        policy: SelectionPolicy,
        examples: Sequence[TrainingExample],
        contributors: Iterable[str],
    ) -> None:
        """Save a policy trained with ``save=False`` as the store's (with its examples)."""
        known = ("features", "warm_epochs", "episodes", "batch", "lr", "warm_lr", "balance", "seed")
        settings = {k: v for k, v in self.training.items() if k in known}
        self._save_trained(policy, examples, None, self.clock.now(), contributors, settings)

    def _train(
        self,
        policy: SelectionPolicy,
        examples: list[TrainingExample],
        envs: list[_Env],
        *,
        warm_epochs: int,
        episodes: int,
        batch: int,
        lr: float,
        warm_lr: float,
        balance: bool,
        reward_llm: LLM | None,
        when: datetime,
        seed: int,
        progress: bool,
    ) -> TrainingReport:
        """WS + PG on prepared environments (the benchmark's cross-validation reuses them)."""
        columns = policy.columns
        states: list[npt.NDArray[np.float64]] = []
        labels: list[int] = []
        for example, env in zip(examples, envs, strict=True):
            for v in self._traverse(env, lambda s: (True, 1.0)):
                states.append(v.state[columns])
                labels.append(int(v.record_id in example.required))
        if not states:
            raise InvalidInputError("no memory was reachable from any training question")
        losses = (
            warm_start(
                policy,
                np.stack(states),
                labels,
                epochs=warm_epochs,
                lr=warm_lr,
                balance=balance,
                seed=seed,
                progress=progress,
            )
            if warm_epochs > 0
            else []
        )
        head = (
            {
                "w1": policy.w1.tolist(),
                "b1": policy.b1.tolist(),
                "w2": policy.w2.tolist(),
                "b2": policy.b2.tolist(),
            }
            if warm_epochs > 0
            else None
        )
        use_llm = reward_llm is not None and all(e.answer for e in examples)
        empty_quality: dict[int, float] = {}
        usable = [i for i, env in enumerate(envs) if env.pool]

        def quality(index: int, chosen: Sequence[str]) -> float:
            example = examples[index]
            if not use_llm:
                return selection_f1(chosen, example.required)
            assert reward_llm is not None and example.answer is not None
            lines = tuple(self._line(envs[index].pool[i]) for i in chosen)
            try:
                text = run_spec(reward_llm, ANSWER, AnswerInput(example.question, lines, when))
            except (LLMError, ParseError):
                text = ""
            return rouge_l(text, example.answer)

        def rollout(current: SelectionPolicy, rng: random.Random) -> Episode | None:
            if not usable:
                return None
            index = rng.choice(usable)
            env = envs[index]

            def sample(state: _State) -> tuple[bool, float]:
                p = float(current.include_probability(state[columns])[0])
                return rng.random() < p, p

            walk = self._traverse(env, sample)
            if not walk:
                return None
            chosen = [i for i, _ in self._picked(env, walk)]
            if index not in empty_quality:
                empty_quality[index] = quality(index, []) if use_llm else 0.0
            reward = quality(index, chosen) - empty_quality[index]
            baseline = None
            if not use_llm:  # self-critical: the greedy walk's return on the same question
                greedy = self._traverse(env, self._decider(current))
                baseline = quality(index, [i for i, _ in self._picked(env, greedy)])
            return Episode(
                states=tuple(tuple(float(x) for x in v.state[columns]) for v in walk),
                actions=tuple(int(v.include) for v in walk),
                reward=reward,
                baseline=baseline,
            )

        returns = (
            reinforce(
                policy, rollout, episodes=episodes, lr=lr, batch=batch, seed=seed, progress=progress
            )
            if episodes > 0
            else []
        )
        policy.trained = True
        if head is not None:  # the WS network: P(required) for the expected-F1 decode
            policy.meta["probability_head"] = head
        if 0 < sum(labels) < len(labels):
            # Probabilities for the expected-F1 decode, refitted on the training states only.
            calibrate(policy, np.stack(states), labels)
        return TrainingReport(
            states=len(states),
            positives=sum(labels),
            warm_start_loss=losses[-1] if losses else None,
            episodes=len(returns),
            mean_return=float(np.mean(returns)) if returns else None,
            reward="rouge-l" if use_llm else "selection-f1",
            owner=STORE_OWNER,
            policy=policy,
        )

    def retrain_policy(
        self, user_id: str | None = None, *, progress: bool = True
    ) -> TrainingReport | None:
        """Train the store's (or ``user_id``'s) policy again from the stored examples.

        The examples are those the contributing users still have (each user's
        ``emg/training/...`` artifact, which :meth:`delete_user` removes); required ids whose
        memories are gone are dropped. The settings are those the policy was trained with.
        Used after a contributor was deleted (:meth:`policy_status` ``stale``).

        Returns:
            The report, or ``None`` when no stored example is left (no policy is saved; the
            untrained fallback serves).
        """
        owner = STORE_OWNER if user_id is None else check_user_id(user_id)
        artifacts = self.engine.artifacts
        source = artifacts.get(owner, POLICY_ARTIFACT) or artifacts.get(owner, STALE_ARTIFACT)
        if source is None:
            raise InvalidInputError("there is no policy to retrain")
        settings = dict(source.meta.get("settings", {}))
        name = TRAINING_STORE if user_id is None else TRAINING_OWN
        users = [user_id] if user_id is not None else list(source.meta.get("contributors", ()))
        examples: list[TrainingExample] = []
        when: datetime | None = None
        for uid in users:
            assert uid is not None
            if artifacts.get(uid, name) is None or self.engine.store.is_deleting(uid):
                continue
            loaded, at = _examples_from_json(uid, artifacts.read(uid, name, "examples.json"))
            alive = {r.id for r in self.engine.records(uid, where={"kind": MEMORY_KIND})}
            for example in loaded:
                required = example.required & alive
                if required:
                    examples.append(dataclasses.replace(example, required=frozenset(required)))
            when = at if when is None or (at is not None and at > when) else when
        if not examples:
            artifacts.delete(owner, POLICY_ARTIFACT)
            artifacts.delete(owner, STALE_ARTIFACT)
            self._policies.pop(owner, None)
            return None
        known = {
            "features",
            "warm_epochs",
            "episodes",
            "batch",
            "lr",
            "warm_lr",
            "balance",
            "seed",
        }
        kwargs = {k: v for k, v in settings.items() if k in known}
        return self.train_policy(examples, user_id=user_id, now=when, progress=progress, **kwargs)

    def _drop_policies_trained_by(self, user_id: str) -> None:
        """Drop every policy ``user_id``'s examples trained; leave a stale marker (deletion).

        Per-user policies start from the store's weights, so they list the store's
        contributors too; they are looked for only while a store policy (or its marker)
        exists.
        """
        artifacts = self.engine.artifacts
        owners = [STORE_OWNER]
        if artifacts.get(STORE_OWNER, POLICY_ARTIFACT) or artifacts.get(
            STORE_OWNER, STALE_ARTIFACT
        ):
            owners += [u for u in self.engine.users() if u != user_id]
        for owner in owners:
            for name in (POLICY_ARTIFACT, STALE_ARTIFACT):
                info = artifacts.get(owner, name)
                if info is None or user_id not in info.meta.get("contributors", ()):
                    continue
                remaining = [c for c in info.meta.get("contributors", ()) if c != user_id]
                artifacts.put(
                    owner,
                    STALE_ARTIFACT,
                    {"stale.json": b'{"reason": "a contributing user was deleted"}'},
                    meta={"contributors": remaining, "settings": info.meta.get("settings", {})},
                )
                artifacts.delete(owner, POLICY_ARTIFACT)
                self._policies.pop(owner, None)
                break

    # ------------------------------------------------------------------ generated questions (A.1)
    @property
    def policy_jobs(self) -> str:
        """Mechanism name of the question-generation and training jobs (``<name>/policy``).

        They are engine jobs (stored, retried with backoff, listed by ``engine.pending``)
        that no save runs: :meth:`run_training` runs them, from a worker or a schedule.
        """
        return self.name + POLICY_JOBS

    def generate_questions(
        self,
        user_id: str,
        *,
        memories: Sequence[MemoryRecord] | None = None,
        session_size: int | None = None,
        per_session: int | None = None,
        max_sessions: int | None = None,
        llm: LLM | None = None,
        now: datetime | None = None,
        progress: bool = False,
    ) -> tuple[list[TrainingExample], int, int]:
        """Write training questions from a user's own memories (appendix A.1, step 3).

        The memories (default: every memory valid at ``now``) are ordered by time and cut
        into sessions of ``session_size`` consecutive memories; the model writes up to
        ``per_session`` question-answer pairs per session with the memories each answer
        needs (:data:`~memories_core.prompts.emg.QUESTIONS`). A pair is kept only if its
        cited memories exist and hold its answer (:func:`~memories_core.prompts.emg.
        parse_questions`); a session whose reply stays unusable after one repair is skipped
        and counted in ``usage.failures`` (``"questions"``).

        Args:
            user_id: Whose memories.
            memories: The memories to ask about (default: all valid at ``now``).
            session_size: Memories per session (default: ``self.session_size``).
            per_session: Pairs asked per session (default: ``self.questions_per_session``).
            max_sessions: Most sessions sent to the model (the most recent ones).
            llm: The writer (default: the user's model, :meth:`_llm`).
            now: Validity time of the default memories.
            progress: tqdm bar over the sessions.

        Returns:
            ``(examples, sessions, rejected)``: the validated examples (with reference
            answers), the sessions sent, and how many gave no usable pair.

        Raises:
            LLMError: if the model fails (nothing is kept of this call).
        """
        check_user_id(user_id)
        when = ensure_utc(now) if now is not None else self.clock.now()
        pool = list(memories) if memories is not None else self.memories(user_id, now=when)
        pool = [r for r in pool if r.user_id == user_id and r.kind == MEMORY_KIND]
        pool.sort(key=lambda r: r.created_at)  # stable: equal times keep the given order
        size = session_size or self.session_size
        sessions = [pool[i : i + size] for i in range(0, len(pool), size)]
        if max_sessions is not None:
            sessions = sessions[-max_sessions:] if max_sessions > 0 else []
        model = llm or self._llm(Scope(user_id))
        from tqdm.auto import tqdm

        out: list[TrainingExample] = []
        rejected = 0
        for session in tqdm(sessions, desc="EMG questions", disable=not progress):
            inputs = QuestionsInput(
                tuple(self._line(r) for r in session),
                tuple(r.created_at for r in session),
                per_session or self.questions_per_session,
            )
            try:
                pairs = run_spec(model, QUESTIONS, inputs, retries=self.retries)
            except ParseError:
                self.engine.count_failure("questions")
                rejected += 1
                continue
            if not pairs:
                rejected += 1
            for pair in pairs:
                required = frozenset(session[i].id for i in pair.memories)
                out.append(TrainingExample(user_id, pair.question, required, pair.answer))
        return out, len(sessions), rejected

    def generated_examples(self, user_id: str) -> list[TrainingExample]:
        """The questions generated so far from ``user_id``'s memories (their artifact)."""
        check_user_id(user_id)
        if self.engine.artifacts.get(user_id, TRAINING_GENERATED) is None:
            return []
        data = self.engine.artifacts.read(user_id, TRAINING_GENERATED, "examples.json")
        return _examples_from_json(user_id, data)[0]

    def _keep_generated(
        self, user_id: str, examples: Sequence[TrainingExample], seen: Iterable[str]
    ) -> int:
        """Add generated examples to the user's artifact (new questions only); total kept.

        ``seen`` lists the memories already shown to the writer, so the next job asks about
        the new ones only.
        """
        kept = {e.question.strip().lower(): e for e in self.generated_examples(user_id)}
        for example in examples:
            kept.setdefault(example.question.strip().lower(), example)
        self.engine.artifacts.put(
            user_id,
            TRAINING_GENERATED,
            {"examples.json": _examples_json(list(kept.values()), self.clock.now()).encode()},
            meta={"examples": len(kept), "seen": sorted(set(seen))},
        )
        return len(kept)

    def _generated_total(self) -> int:
        total = 0
        for uid in self.engine.users():
            info = self.engine.artifacts.get(uid, TRAINING_GENERATED)
            total += int(info.meta.get("examples", 0)) if info is not None else 0
        return total

    def schedule_training(self, user_id: str) -> int:
        """Enqueue a question-generation job if ``user_id`` has enough new memories.

        A job is due each time the user's memory count passes another multiple of
        ``questions_every`` (the job key holds that multiple, so a job exists once). Called
        after every :meth:`save`; cheap (one count, at most one job row) and never runs a
        model. Nothing happens when ``train_after`` is ``None``.

        Returns:
            How many jobs were enqueued (0 or 1).
        """
        check_user_id(user_id)
        if self.train_after is None:
            return 0
        count = len(self.engine.records(user_id, where={"kind": MEMORY_KIND}))
        step = count // self.questions_every
        if step < 1:
            return 0
        spec = JobSpec(self.policy_jobs, "questions", f"questions:{step}", {"memories": count})
        return self.engine.enqueue(user_id, [spec])

    def save(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Store turns and extract memories (see :class:`MemoryBase`), then schedule.

        Question generation is only enqueued (:meth:`schedule_training`), never run here.
        """
        super().save(turns, scope)
        if self.train_after is not None:
            self.schedule_training(check_scope(scope).user_id)

    def run_training(self, user_id: str | None = None, *, progress: bool = False) -> TrainingRun:
        """Run the due question-generation and training jobs (of one user, or all).

        The automatic training loop (appendix A.1 step 3, then §4.3's training): a
        ``questions`` job generates questions from the user's memories not asked about yet
        (:meth:`generate_questions`) and keeps them as the user's artifact
        (:data:`TRAINING_GENERATED`, deleted with the user); when the store holds
        ``train_after`` generated examples, and again each time another ``train_after``
        accumulate, a ``train`` job trains the store's policy on every user's generated
        examples (:meth:`train_policy` with the ``training`` settings given at
        construction; the users are its contributors).
        Saves and recalls never run these jobs: call this from a worker, a schedule or a
        quiet moment. A failed job (model down) stays pending with a backoff.

        Returns:
            What ran (:class:`TrainingRun`).
        """
        if user_id is not None:
            check_user_id(user_id)
        store, policy = self.engine.store, self.engine.policy
        questions = sessions = rejected = failed = 0
        trained: list[TrainingReport] = []
        down = False
        for kind in ("questions", "train"):  # a questions job may enqueue the train job
            now = self.clock.now()
            jobs = [
                j
                for j in self.engine.pending(user_id, mechanism=self.policy_jobs)
                if j.kind == kind and j.next_attempt_at <= now
            ]
            for job in jobs:
                if down or not store.claim_job(job.id, now=self.clock.now(), lease=policy.lease):
                    continue
                try:
                    if kind == "questions":
                        made, sent, bad = self._questions_job(job, progress=progress)
                        questions, sessions = questions + made, sessions + sent
                        rejected += bad
                    else:
                        report = self._train_job(progress=progress)
                        if report is not None:
                            trained.append(report)
                except (LLMError, InvalidInputError) as exc:
                    self.engine.count_failure(kind)
                    store.fail_job(
                        job.id,
                        error=f"{type(exc).__name__}: {exc}",
                        retry_at=policy.retry_at(self.clock.now(), job.attempts),
                    )
                    failed += 1
                    down = isinstance(exc, LLMError)  # the model is down: stop calling it
                    continue
                with store.transaction():
                    store.finish_job(job.id)
        remaining = len(self.engine.pending(user_id, mechanism=self.policy_jobs))
        return TrainingRun(questions, sessions, rejected, tuple(trained), failed, remaining)

    def _questions_job(self, job: Job, *, progress: bool) -> tuple[int, int, int]:
        """Generate questions from the memories no earlier job asked about; maybe train."""
        user_id = job.user_id
        asked = {rid for e in self.generated_examples(user_id) for rid in e.required}
        info = self.engine.artifacts.get(user_id, TRAINING_GENERATED)
        seen = set(info.meta.get("seen", ())) if info is not None else set()
        fresh = [r for r in self.memories(user_id) if r.id not in asked and r.id not in seen]
        examples, sent, rejected = self.generate_questions(
            user_id, memories=fresh, progress=progress
        )
        self._keep_generated(user_id, examples, seen | {r.id for r in fresh})
        store_total = self._generated_total()
        info = self.engine.artifacts.get(STORE_OWNER, LAST_TRAINING)
        last = int(info.meta.get("generated_examples", 0)) if info else 0
        if self.train_after is not None and store_total - last >= self.train_after:
            step = store_total // self.train_after
            spec = JobSpec(self.policy_jobs, "train", f"train:{step}", {"examples": store_total})
            self.engine.enqueue(user_id, [spec])
        return len(examples), sent, rejected

    def _train_job(self, *, progress: bool) -> TrainingReport | None:
        """Train the store's policy on every user's generated examples still alive."""
        examples: list[TrainingExample] = []
        for uid in self.engine.users():
            if self.engine.store.is_deleting(uid):
                continue
            alive = {r.id for r in self.engine.records(uid, where={"kind": MEMORY_KIND})}
            for example in self.generated_examples(uid):
                required = example.required & alive
                if required:
                    examples.append(dataclasses.replace(example, required=frozenset(required)))
        if not examples:
            return None
        total = self._generated_total()
        report = self.train_and_check(examples, progress=progress)
        self.engine.artifacts.put(
            STORE_OWNER,
            LAST_TRAINING,
            {"last.json": json.dumps(dict(report.held_out)).encode()},
            meta={"generated_examples": total, "kept": report.kept, **report.held_out},
        )
        return report

    def train_and_check(
        self, examples: Sequence[TrainingExample], *, progress: bool = False
    ) -> TrainingReport:
        """Train the store's policy on generated questions; keep it only if it beats top-1.

        Every :data:`HOLD_OUT`-th question (by a hash of its text; all of them when there
        are fewer than :data:`HOLD_OUT`) is held out; the policy is trained on the rest
        (``training`` settings) and saved only if its mean selection F1 on the held-out
        questions is above that of the top-1 fallback. Generated questions are noisy (a
        small model, or the rule-based stand-in, writes them), so this check is what keeps
        an automatically trained user no worse than top-1 on the questions we can see.

        Returns:
            The report; ``kept`` says whether the policy was saved, ``held_out`` the check.
        """
        held = [e for e in examples if is_held_out(e)]
        train = [e for e in examples if not is_held_out(e)]
        if len(examples) < HOLD_OUT or not held or not train:
            held, train = list(examples), list(examples)
        settings = {"progress": progress, **self.training, "save": False}
        report = self.train_policy(train, **settings)
        assert report.policy is not None
        when = self.clock.now()
        ours: list[float] = []
        top1: list[float] = []
        for example in held:
            env = self._environment(example.question, example.user_id, when, self.activate)
            chosen = [h.record.id for h in self._choose(env, report.policy).memories]
            ours.append(selection_f1(chosen, example.required))
            top1.append(selection_f1(list(env.pool)[: max(self.min_select, 1)], example.required))
        check = {
            "questions": float(len(held)),
            "policy_f1": float(np.mean(ours)),
            "top1_f1": float(np.mean(top1)),
        }
        kept = check["policy_f1"] > check["top1_f1"]
        if kept:
            self._keep_store_policy(report.policy, train, report.contributors)
        return dataclasses.replace(report, kept=kept, held_out=check)

    # ------------------------------------------------------------------ recall and applications
    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """The selection, at most ``k`` (``recall_mode="fused"``: fused with dense + lexical).

        Raises:
            InvalidInputError: on an empty query or a bad ``k``.
            MissingUserError: if ``scope`` has no user.
        """
        scope = check_scope(scope)
        hits = self._search(query, scope, k=self.default_k if k is None else k, now=now)
        return Recall(query=query, records=tuple(hits), context=self._render(hits))

    def _render(self, hits: Sequence[ScoredRecord]) -> str:
        return "\n".join(self._line(h.record).render() for h in hits)

    @staticmethod
    def _line(record: MemoryRecord) -> MemoryLine:
        meta = record.metadata
        return MemoryLine(
            record.text,
            str(meta.get("subject") or ""),
            str(meta.get("relation") or ""),
            str(meta.get("object") or ""),
        )

    def answer(self, question: str, scope: Scope, *, now: datetime | None = None) -> Answer:
        """Answer a question from the selected memories (§4.3 ``LLM(Q ⊕ M)``, §4.4).

        Raises:
            InvalidInputError: on an empty question.
            LLMError: if the model fails; ParseError: if its answer is empty or markup.
        """
        scope = check_scope(scope)
        when = ensure_utc(now) if now is not None else self.clock.now()
        chosen = self.select(question, scope, now=when)
        lines = tuple(self._line(h.record) for h in chosen.memories)
        text = run_spec(self._llm(scope), ANSWER, AnswerInput(question, lines, when))
        return Answer(question, text, chosen.memories)

    async def aanswer(self, question: str, scope: Scope, *, now: datetime | None = None) -> Answer:
        """Async twin of :meth:`answer`."""
        return await asyncio.to_thread(self.answer, question, scope, now=now)

    def autofill(
        self, fields: Sequence[str], scope: Scope, *, now: datetime | None = None
    ) -> dict[str, str | None]:
        """Fill form fields from the user's memories (§4.4 autofill forms).

        Each field becomes the question "What is the user's <field>?"; its memories are
        selected and the model gives the value. A value no memory holds, or an unusable
        answer, gives ``None`` (documented graceful fallback); an outage raises ``LLMError``.
        """
        scope = check_scope(scope)
        if isinstance(fields, str) or not all(isinstance(f, str) and f.strip() for f in fields):
            raise InvalidInputError("fields must be a list of non-empty field names")
        when = ensure_utc(now) if now is not None else self.clock.now()
        out: dict[str, str | None] = {}
        for name in fields:
            chosen = self.select(f"What is the user's {name}?", scope, now=when)
            lines = tuple(self._line(h.record) for h in chosen.memories)
            try:
                out[name] = run_spec(self._llm(scope), AUTOFILL, AutofillInput(name, lines))
            except ParseError:
                out[name] = None
        return out

    def reminders(
        self,
        scope: Scope,
        now: datetime | None = None,
        horizon: timedelta = timedelta(days=7),
    ) -> list[Reminder]:
        """Upcoming events and expiries in ``(now, now + horizon]`` (§4.4 reminders).

        Events come from the memories' extracted event times (absolute, A.1); memories not
        valid at ``now`` (expired, replaced) are left out; a memory valid until a time inside
        the horizon gives an "expires" reminder. Soonest first.
        """
        scope = check_scope(scope)
        if horizon <= timedelta(0):
            raise InvalidInputError("horizon must be positive")
        when = ensure_utc(now) if now is not None else self.clock.now()
        end = when + horizon
        out: list[Reminder] = []
        for record in self.memories(scope.user_id, now=when):
            raw = record.metadata.get("when")
            if raw:
                at = ensure_utc(datetime.fromisoformat(str(raw)))
                if when < at <= end:
                    out.append(Reminder(at, "event", record.text, record.id))
            until = record.state.valid_until
            if until is not None and when < until <= end:
                out.append(Reminder(until, "expires", record.text, record.id))
        return sorted(out, key=lambda r: (r.at, r.text))

    def _on_delete_user(self, user_id: str) -> None:
        """Forget what the user left in this process and in shared policies.

        Drops cached embeddings (they may hold the user's texts), the user's cached policy,
        and every policy the user's examples trained (marked stale, see
        :meth:`policy_status`). The user's own artifacts (their policy, their stored
        examples) are removed by the engine.
        """
        with self._cache_lock:
            self._cache.clear()
        self._policies.pop(user_id, None)
        self._drop_policies_trained_by(user_id)


_State = npt.NDArray[np.float64]


@dataclass
class _Env:
    """A question's walk environment (§4.3): pool, activated ids, edges and states."""

    question: str
    activated: list[str]
    pool: dict[str, MemoryRecord] = field(default_factory=dict)
    edges: dict[str, GraphEdge | None] = field(default_factory=dict)
    adjacency: dict[str, list[str]] = field(default_factory=dict)
    states: dict[str, _State] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Visit:
    record_id: str
    state: _State
    include: bool
    score: float


@dataclass(frozen=True)
class _VectorSource:
    """A dense source that uses an already computed query vector (one embedding a select)."""

    vector: npt.NDArray[np.float32]
    weight: float
    name: str = "dense"

    def candidates(self, request: RecallRequest, backend: RecallBackend, depth: int) -> Ranking:
        """The records nearest to ``vector``."""
        return backend.dense(
            self.vector, user_id=request.user_id, depth=depth, where=request.filter
        )


def is_held_out(example: TrainingExample) -> bool:
    """Whether a generated question checks automatic policies (1 in :data:`HOLD_OUT`, by hash)."""
    return hashlib.sha1(example.question.encode("utf-8")).digest()[0] % HOLD_OUT == 0


def _examples_json(examples: Sequence[TrainingExample], at: datetime) -> str:
    return json.dumps(
        {
            "at": ensure_utc(at).isoformat(),
            "examples": [
                {"question": e.question, "required": sorted(e.required), "answer": e.answer}
                for e in examples
            ],
        }
    )


def _examples_from_json(user_id: str, data: bytes) -> tuple[list[TrainingExample], datetime | None]:
    parsed = json.loads(data)
    at = parsed.get("at")
    return [
        TrainingExample(user_id, e["question"], frozenset(e["required"]), e.get("answer"))
        for e in parsed.get("examples", [])
    ], (datetime.fromisoformat(at) if at else None)


def _flat(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, (str, int, float, bool)):
        return value
    return json.dumps(value, default=str)


@dataclass(frozen=True)
class EMGSource:
    """The graph walk as a candidate source of the retrieval pipeline (§4.3).

    Candidates are the memories the agent selects, scored by ``P(include)`` (or cosine).
    """

    memory: EMGMemory
    weight: float = 0.5
    name: str = "emg"

    def candidates(self, request: RecallRequest, backend: RecallBackend, depth: int) -> Ranking:
        """Run the selection for ``request.query`` and return it as a ranking."""
        chosen = self.memory.select(request.query, request.user_id, now=request.now)
        return [(h.record.id, h.score) for h in chosen.memories][:depth]
