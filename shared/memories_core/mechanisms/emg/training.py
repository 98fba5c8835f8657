"""Training the selection policy: warm start (Eq. 5), then REINFORCE (Eq. 6) (§4.3, A.4).

WS states come from walks that include every visited memory (the teacher explores the whole
reachable neighbourhood), labelled by the example's required memories. PG samples walks from
the policy; the return is the change in answer quality (Eq. 3-4): with a reward model and
reference answers, ROUGE-L of its answer from the selected memories minus that from none;
offline, the F1 of the selection against the required memories (a retrieval-quality reward),
with the greedy walk's F1 on the same question as the baseline (self-critical).

:func:`train_and_check` is the automatic training's guard: generated questions are noisy, so a
policy trained on them is kept only if it beats the top-1 fallback on held-out questions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from memories_core.errors import InvalidInputError, LLMError, ParseError
from memories_core.mechanisms.emg.applications import memory_line
from memories_core.mechanisms.emg.archive import PolicyArchive
from memories_core.mechanisms.emg.policy import (
    ALL_FEATURES,
    Episode,
    SelectionPolicy,
    calibrate,
    reinforce,
    rouge_l,
    selection_f1,
    warm_start,
)
from memories_core.mechanisms.emg.schema import (
    HOLD_OUT,
    MEMORY_KIND,
    MIN_HELD_OUT,
    POLICY_ARTIFACT,
    STALE_ARTIFACT,
    STORE_OWNER,
    TrainingExample,
    TrainingReport,
)
from memories_core.mechanisms.emg.selection import Selector, State, WalkEnvironment
from memories_core.prompts.emg import ANSWER, AnswerInput
from memories_core.prompts.spec import PromptSpec, run_spec
from memories_core.types import check_user_id, ensure_utc

if TYPE_CHECKING:
    from memories_core.interfaces import LLM

__all__ = [
    "TRAINING_SETTINGS",
    "beats_top1",
    "held_out_check",
    "is_held_out",
    "retrain_policy",
    "train_and_check",
    "train_on",
    "train_policy",
]

#: The :func:`train_policy` arguments a saved policy remembers (and retraining reuses).
TRAINING_SETTINGS = (
    "features",
    "warm_epochs",
    "episodes",
    "batch",
    "lr",
    "warm_lr",
    "balance",
    "seed",
)


def is_held_out(example: TrainingExample) -> bool:
    """Whether a generated question checks automatic policies (1 in :data:`HOLD_OUT`, by hash)."""
    return hashlib.sha1(example.question.encode("utf-8")).digest()[0] % HOLD_OUT == 0


def train_policy(
    selector: Selector,
    archive: PolicyArchive,
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
    answer_spec: PromptSpec[AnswerInput, str] = ANSWER,
) -> TrainingReport:
    """Train the store's (or ``user_id``'s) policy on ``examples``; see ``EMGMemory.train_policy``.

    ``answer_spec`` is the answer prompt ``reward_llm`` answers with (the memory's, with its
    ``emg.answer`` override).

    A user's own policy starts from the store's weights (when their features match) and
    inherits its contributors. With ``save`` the policy and each user's examples are kept
    (:meth:`PolicyArchive.save_trained`).

    Raises:
        InvalidInputError: if there are no examples, a per-user policy gets another user's
            example, or no state could be collected.
    """
    if not examples:
        raise InvalidInputError("train_policy needs at least one example")
    if user_id is not None:
        check_user_id(user_id)
        if any(e.user_id != user_id for e in examples):
            raise InvalidInputError("a user's own policy trains on that user's examples only")
    engine = selector.engine
    when = ensure_utc(now) if now is not None else engine.clock.now()
    from tqdm.auto import tqdm

    activate = selector.settings.activate
    envs = [
        selector.environment(e.question, e.user_id, when, activate)
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
    base = archive.load() if user_id is not None else None
    contributors = {e.user_id for e in examples}
    if base is not None and list(base.features) == list(features):
        policy = SelectionPolicy.from_json(base.to_json())
        info = engine.artifacts.get(STORE_OWNER, POLICY_ARTIFACT)
        contributors |= set(info.meta.get("contributors", ())) if info else set()
    else:
        policy = SelectionPolicy.initial(seed, features)
    report = train_on(
        selector,
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
        answer_spec=answer_spec,
    )
    owner = STORE_OWNER if user_id is None else user_id
    if save:
        archive.save_trained(policy, examples, user_id, when, contributors, settings)
    return dataclasses.replace(
        report, owner=owner, contributors=tuple(sorted(contributors)), kept=save
    )


def train_on(
    selector: Selector,
    policy: SelectionPolicy,
    examples: list[TrainingExample],
    envs: list[WalkEnvironment],
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
    answer_spec: PromptSpec[AnswerInput, str] = ANSWER,
) -> TrainingReport:
    """WS + PG of ``policy`` (in place) on prepared environments, one per example.

    The benchmark's cross-validation builds the environments once and reuses them.

    Raises:
        InvalidInputError: if no memory is reachable from any example's question.
    """
    columns = policy.columns
    states: list[npt.NDArray[np.float64]] = []
    labels: list[int] = []
    for example, env in zip(examples, envs, strict=True):
        for v in selector.traverse(env, lambda s: (True, 1.0)):
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
        lines = tuple(memory_line(envs[index].pool[i]) for i in chosen)
        try:
            text = run_spec(reward_llm, answer_spec, AnswerInput(example.question, lines, when))
        except (LLMError, ParseError):
            text = ""
        return rouge_l(text, example.answer)

    def rollout(current: SelectionPolicy, rng: random.Random) -> Episode | None:
        if not usable:
            return None
        index = rng.choice(usable)
        env = envs[index]

        def sample(state: State) -> tuple[bool, float]:
            p = float(current.include_probability(state[columns])[0])
            return rng.random() < p, p

        walk = selector.traverse(env, sample)
        if not walk:
            return None
        chosen = [i for i, _ in selector.picked(walk)]
        if index not in empty_quality:
            empty_quality[index] = quality(index, []) if use_llm else 0.0
        reward = quality(index, chosen) - empty_quality[index]
        baseline = None
        if not use_llm:  # self-critical: the greedy walk's return on the same question
            greedy = selector.traverse(env, selector.decider(current))
            baseline = quality(index, [i for i, _ in selector.picked(greedy)])
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
    selector: Selector,
    archive: PolicyArchive,
    user_id: str | None = None,
    *,
    progress: bool = True,
) -> TrainingReport | None:
    """Train the store's (or ``user_id``'s) policy again from the stored examples.

    The examples are those the contributing users still have; required ids whose memories
    are gone are dropped; the settings are those the policy was trained with.

    Returns:
        The report, or ``None`` when no stored example is left (the policy and its stale
        mark are removed; the untrained fallback serves).

    Raises:
        InvalidInputError: if there is no policy (nor stale mark) to retrain.
    """
    engine = selector.engine
    owner = STORE_OWNER if user_id is None else check_user_id(user_id)
    source = engine.artifacts.get(owner, POLICY_ARTIFACT) or engine.artifacts.get(
        owner, STALE_ARTIFACT
    )
    if source is None:
        raise InvalidInputError("there is no policy to retrain")
    settings = dict(source.meta.get("settings", {}))
    users = [user_id] if user_id is not None else list(source.meta.get("contributors", ()))
    examples: list[TrainingExample] = []
    when: datetime | None = None
    for uid in users:
        assert uid is not None
        if engine.store.is_deleting(uid):
            continue
        stored = archive.trained_examples(uid, own=user_id is not None)
        if stored is None:
            continue
        loaded, at = stored
        alive = {r.id for r in engine.records(uid, where={"kind": MEMORY_KIND})}
        for example in loaded:
            required = example.required & alive
            if required:
                examples.append(dataclasses.replace(example, required=frozenset(required)))
        when = at if when is None or (at is not None and at > when) else when
    if not examples:
        archive.remove(owner)
        return None
    kwargs = {k: v for k, v in settings.items() if k in TRAINING_SETTINGS}
    return train_policy(
        selector, archive, examples, user_id=user_id, now=when, progress=progress, **kwargs
    )


def beats_top1(check: Mapping[str, float]) -> bool:
    """The rule an automatic policy is kept by: it beats top-1 on enough held-out questions.

    ``check`` holds ``questions``, ``policy_f1`` and ``top1_f1`` (as
    :func:`train_and_check` reports it); fewer than :data:`MIN_HELD_OUT` questions never
    replace the top-1 default.
    """
    return check["questions"] >= MIN_HELD_OUT and check["policy_f1"] > check["top1_f1"]


def held_out_check(
    selector: Selector,
    policy: SelectionPolicy,
    examples: Sequence[TrainingExample],
    envs: Sequence[WalkEnvironment] | None = None,
) -> dict[str, float]:
    """Mean selection F1 of ``policy`` and of the top-1 fallback on ``examples``.

    The check :func:`beats_top1` reads (``questions``, ``policy_f1``, ``top1_f1``; F1s are 0
    without examples). ``envs`` are the examples' selection environments when the caller
    has built them already (same order); otherwise they are built now.
    """
    when = selector.engine.clock.now()
    top = max(selector.settings.min_select, 1)
    ours: list[float] = []
    top1: list[float] = []
    for i, example in enumerate(examples):
        env = (
            envs[i]
            if envs is not None
            else selector.environment(
                example.question, example.user_id, when, selector.settings.activate
            )
        )
        chosen = [h.record.id for h in selector.choose(env, policy).memories]
        ours.append(selection_f1(chosen, example.required))
        top1.append(selection_f1(list(env.pool)[:top], example.required))
    return {
        "questions": float(len(examples)),
        "policy_f1": float(np.mean(ours)) if ours else 0.0,
        "top1_f1": float(np.mean(top1)) if top1 else 0.0,
    }


def train_and_check(
    selector: Selector,
    archive: PolicyArchive,
    examples: Sequence[TrainingExample],
    training: Mapping[str, Any],
    *,
    progress: bool = False,
    answer_spec: PromptSpec[AnswerInput, str] = ANSWER,
) -> TrainingReport:
    """Train the store's policy on generated questions; keep it only if it beats top-1.

    Every :data:`HOLD_OUT`-th question (by a hash of its text) is held out; the policy is
    trained on the rest (``training`` settings) and saved only if its mean selection F1 on
    the held-out questions is above that of the top-1 fallback. With fewer than
    :data:`MIN_HELD_OUT` held-out questions (or none to train on) it is trained on all of them
    and never kept: a check on its own training questions proves nothing, and the untrained
    default must stay top-1 (the check then reports 0 questions).
    """
    held = [e for e in examples if is_held_out(e)]
    train = [e for e in examples if not is_held_out(e)]
    enough = len(held) >= MIN_HELD_OUT and bool(train)
    if not enough:
        held, train = [], list(examples)
    settings = {"progress": progress, **training, "save": False, "answer_spec": answer_spec}
    report = train_policy(selector, archive, train, **settings)
    assert report.policy is not None
    engine = selector.engine
    check = held_out_check(selector, report.policy, held)
    kept = beats_top1(check)  # with too few held out, ``held`` is empty: never kept
    if kept:
        known = {k: v for k, v in training.items() if k in TRAINING_SETTINGS}
        # Saved as the store's, with its examples (it was trained with ``save=False``).
        archive.save_trained(
            report.policy, train, None, engine.clock.now(), report.contributors, known
        )
    return dataclasses.replace(report, kept=kept, held_out=check)
