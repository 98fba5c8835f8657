"""EMG-RAG's names and result types: record kinds, node ids, artifact names, edits, selections.

Every other module of the package speaks in these terms; nothing here reads the store.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import numpy as np
import numpy.typing as npt

from memories_core.mechanisms.emg.policy import SelectionPolicy
from memories_core.types import ScoredRecord, ensure_utc

__all__ = [
    "HOLD_OUT",
    "LAST_TRAINING",
    "MEMORY_KIND",
    "POLICY_ARTIFACT",
    "POLICY_JOBS",
    "REASON",
    "ROOT",
    "SELF_NAMES",
    "SKIPPED_ROLES",
    "STALE_ARTIFACT",
    "STORE_OWNER",
    "TRAINING_GENERATED",
    "TRAINING_OWN",
    "TRAINING_STORE",
    "Answer",
    "Edit",
    "EditOp",
    "PolicyStatus",
    "Reminder",
    "Selection",
    "TrainingExample",
    "TrainingReport",
    "TrainingRun",
    "cosine",
    "entity_id",
    "iso",
    "norm",
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
#: Fewest held-out questions on which a trained policy may replace top-1. With fewer, the
#: check would score the questions it trained on: 8 questions written by the offline 1.5B
#: model trained a policy that "beat" top-1 on them (0.44-0.56 vs 0.29-0.33) and lost to it
#: on LoCoMo's real questions (0.405-0.465 vs 0.512; BENCHMARKS.md, "EMG-RAG").
MIN_HELD_OUT = 5
#: Subjects that mean the user (mapped to the root node).
SELF_NAMES = frozenset({"user", "i", "me", "my", "myself", "the user", "mine"})
#: Turn roles that are never extracted from (the assistant's and system's words).
SKIPPED_ROLES = frozenset({"assistant", "system", "ai", "tool"})
#: Prefix of the update-history reason of every graph edit (``"emg insert: ..."``).
REASON = "emg"

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
            -> value, :data:`~memories_core.mechanisms.emg.policy.ALL_FEATURES`), for
            inspection.
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


def norm(text: str) -> str:
    """``text`` lower-cased, its words joined by single spaces (punctuation dropped)."""
    return " ".join(re.findall(r"[^\W_]+", text.lower()))


def entity_id(label: str) -> str:
    """The node id of an entity (the root for the user themself)."""
    key = norm(label)
    if key in SELF_NAMES or not key:
        return ROOT
    return "ent:" + hashlib.sha1(key.encode("utf-8")).hexdigest()[:20]


def iso(value: datetime | None) -> str | None:
    """``value`` as an ISO-8601 UTC string (``None`` stays ``None``)."""
    return None if value is None else ensure_utc(value).isoformat()


def cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    """The cosine of two vectors; 0 when either is the zero vector."""
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return 0.0 if na == 0 or nb == 0 else float(np.dot(a, b) / (na * nb))
