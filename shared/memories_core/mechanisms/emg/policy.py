"""The memory-selection policy of EMG-RAG (Wang et al., 2024, §4.3 and appendix A.4).

The agent that walks the memory graph sees, at each visited node, the state of three cosine
similarities (Eq. 1): question entity vs node entity, question relation vs edge relation,
question vs memory (:data:`PAPER_FEATURES`). It chooses between two actions (Eq. 2): include
the node's memory and go on to its neighbours (1), or stop this branch (0).

We add four features the paper does not have (:data:`EXTRA_FEATURES`), because the three
cosines are absolute: they cannot say whether a memory is the best one the question has, and
a fixed cut on an absolute cosine is what a fixed top-K already beats. The extras place a
memory among the question's candidates: its cosine minus the best candidate's, its rank in
the activation ranking (as ``1 / (1 + rank)``), its activation score relative to the best
one, and its depth (hops from the activated node it was reached from, as ``1 / (1 + d)``).
A policy records the features it was trained on (``features``), so a policy of the paper's
three features keeps working (both are compared in BENCHMARKS.md, "EMG-RAG: memory
selection on LoCoMo").

:class:`SelectionPolicy` is the paper's network: two layers, 20 ``tanh`` hidden units, two
outputs (A.4). Inference runs in numpy (no torch import on the answer path); training
(:func:`warm_start`, :func:`reinforce`) imports torch lazily:

* **warm start** (WS, Eq. 5): binary cross-entropy of ``P(include)`` against "the memory is
  one of the question's required memories";
* **policy gradient** (PG, Eq. 6, REINFORCE): ``-R · Σ log π(a|s)`` over an episode's actions,
  with ``R`` the episode's return. By Eq. 4 the undiscounted sum of the per-step rewards
  ``Δ(Â', A) - Δ(Â, A)`` telescopes to ``Δ(final) - Δ(initial)``, so one quality measurement
  per episode suffices. A baseline is subtracted from ``R`` (variance reduction; it does not
  change the expected gradient): the episode's own baseline when the rollout gives one (the
  return of the greedy walk on the same question, "self-critical"), else a running mean.
  Gradients of ``batch`` episodes are averaged per Adam step.

The weights are saved as JSON (no pickle): :meth:`SelectionPolicy.to_json`.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from memories_core.errors import InvalidInputError

__all__ = [
    "ALL_FEATURES",
    "EXTRA_FEATURES",
    "HIDDEN",
    "PAPER_FEATURES",
    "STATE_SIZE",
    "Episode",
    "SelectionPolicy",
    "calibrate",
    "expected_f1",
    "expected_f1_size",
    "reinforce",
    "rouge_l",
    "selection_f1",
    "warm_start",
]

#: The paper's state (Eq. 1): question entity vs node entity, question relation vs edge
#: relation, question vs memory.
PAPER_FEATURES: tuple[str, ...] = ("entity_cos", "relation_cos", "memory_cos")
#: Our additions (module docstring): the memory among the question's candidates.
EXTRA_FEATURES: tuple[str, ...] = ("memory_cos_gap", "rank", "score_ratio", "depth")
#: Every feature a walk computes, in state order.
ALL_FEATURES: tuple[str, ...] = PAPER_FEATURES + EXTRA_FEATURES
#: Size of the paper's state (Eq. 1).
STATE_SIZE = len(PAPER_FEATURES)
#: Hidden units (A.4).
HIDDEN = 20


@dataclass
class SelectionPolicy:
    """Two-layer MLP ``n -> 20 (tanh) -> 2`` (A.4); action 1 = include, 0 = stop.

    ``n`` is the number of state features (3 for the paper's state, Eq. 1).

    Attributes:
        w1, b1, w2, b2: The weights (numpy; ``w1`` is ``HIDDEN x n``, ``w2`` is ``2 x HIDDEN``).
        trained: Whether any training step ran (an untrained policy is not used; selection
            falls back to a similarity threshold).
        meta: Free notes kept with the weights (training sizes, rewards).
        features: Names of the state features, in input order (a subset of
            :data:`ALL_FEATURES`; default the paper's three).
    """

    w1: npt.NDArray[np.float64]
    b1: npt.NDArray[np.float64]
    w2: npt.NDArray[np.float64]
    b2: npt.NDArray[np.float64]
    trained: bool = False
    meta: dict[str, Any] = field(default_factory=dict)
    features: tuple[str, ...] = PAPER_FEATURES

    @classmethod
    def initial(cls, seed: int = 0, features: Sequence[str] = PAPER_FEATURES) -> SelectionPolicy:
        """A fresh, untrained policy (uniform init in ``±1/sqrt(fan_in)``, as torch's Linear).

        Raises:
            InvalidInputError: on an unknown or repeated feature name.
        """
        names = _check_features(features)
        rng = np.random.default_rng(seed)
        a1, a2 = 1 / math.sqrt(len(names)), 1 / math.sqrt(HIDDEN)
        return cls(
            w1=rng.uniform(-a1, a1, (HIDDEN, len(names))),
            b1=rng.uniform(-a1, a1, HIDDEN),
            w2=rng.uniform(-a2, a2, (2, HIDDEN)),
            b2=rng.uniform(-a2, a2, 2),
            features=names,
        )

    @property
    def columns(self) -> list[int]:
        """Positions of this policy's features in a full state (:data:`ALL_FEATURES` order)."""
        return [ALL_FEATURES.index(name) for name in self.features]

    def include_probability(self, states: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """``π(a=1 | s)`` for each row of ``states`` (shape ``n x len(features)``)."""
        x = np.atleast_2d(np.asarray(states, dtype=np.float64))
        hidden = np.tanh(x @ self.w1.T + self.b1)
        logits = hidden @ self.w2.T + self.b2
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        return np.asarray(exp[:, 1] / exp.sum(axis=1), dtype=np.float64)

    def _head_probability(self, states: npt.ArrayLike) -> npt.NDArray[np.float64]:
        head = self.meta.get("probability_head")
        if not head:
            return self.include_probability(states)
        x = np.atleast_2d(np.asarray(states, dtype=np.float64))
        hidden = np.tanh(x @ np.asarray(head["w1"]).T + np.asarray(head["b1"]))
        logits = hidden @ np.asarray(head["w2"]).T + np.asarray(head["b2"])
        return np.asarray(1 / (1 + np.exp(logits[:, 0] - logits[:, 1])), dtype=np.float64)

    def required_probability(self, states: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """``P(required | s)`` for the expected-F1 decode (:func:`expected_f1_size`).

        REINFORCE moves ``π(include)`` towards the reward's trade-off and away from a
        probability, so training keeps the warm-start network (WS, Eq. 5: binary
        cross-entropy against the required labels) as ``meta["probability_head"]`` and this
        reads it; without one, ``π(include)``. Then the Platt map of :func:`calibrate`, if
        fitted: ``sigmoid(a · logit(p) + b)`` with ``(a, b) = meta["platt"]``.
        """
        p = self._head_probability(states)
        platt = self.meta.get("platt")
        if not platt:
            return p
        a, b = float(platt[0]), float(platt[1])
        q = np.clip(p, 1e-7, 1 - 1e-7)
        return np.asarray(1 / (1 + np.exp(-(a * np.log(q / (1 - q)) + b))), dtype=np.float64)

    def to_json(self) -> str:
        """The weights and notes as JSON."""
        return json.dumps(
            {
                "architecture": self.architecture,
                "features": list(self.features),
                "w1": self.w1.tolist(),
                "b1": self.b1.tolist(),
                "w2": self.w2.tolist(),
                "b2": self.b2.tolist(),
                "trained": self.trained,
                "meta": self.meta,
            }
        )

    @property
    def architecture(self) -> str:
        """``"mlp-<n>-20-tanh-2"``."""
        return f"mlp-{len(self.features)}-{HIDDEN}-tanh-2"

    @classmethod
    def from_json(cls, text: str | bytes) -> SelectionPolicy:
        """Load weights written by :meth:`to_json`.

        Raises:
            InvalidInputError: if the text is not a policy of this architecture.
        """
        try:
            data = json.loads(text)
            policy = cls(
                w1=np.asarray(data["w1"], dtype=np.float64),
                b1=np.asarray(data["b1"], dtype=np.float64),
                w2=np.asarray(data["w2"], dtype=np.float64),
                b2=np.asarray(data["b2"], dtype=np.float64),
                trained=bool(data.get("trained", False)),
                meta=dict(data.get("meta", {})),
                features=_check_features(data.get("features", PAPER_FEATURES)),
            )
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InvalidInputError(f"not a selection policy: {exc}") from exc
        shapes = (policy.w1.shape, policy.b1.shape, policy.w2.shape, policy.b2.shape)
        size = len(policy.features)
        if shapes != ((HIDDEN, size), (HIDDEN,), (2, HIDDEN), (2,)):
            raise InvalidInputError(f"policy weights have shapes {shapes}")
        return policy

    # -- torch bridge -----------------------------------------------------------------------
    def _module(self) -> Any:
        import torch

        net = torch.nn.Sequential(
            torch.nn.Linear(len(self.features), HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 2)
        ).double()
        first, second = (m for m in net if isinstance(m, torch.nn.Linear))
        with torch.no_grad():
            first.weight.copy_(torch.from_numpy(self.w1))
            first.bias.copy_(torch.from_numpy(self.b1))
            second.weight.copy_(torch.from_numpy(self.w2))
            second.bias.copy_(torch.from_numpy(self.b2))
        return net

    def _load_module(self, net: Any) -> None:
        self.w1 = net[0].weight.detach().numpy().copy()
        self.b1 = net[0].bias.detach().numpy().copy()
        self.w2 = net[2].weight.detach().numpy().copy()
        self.b2 = net[2].bias.detach().numpy().copy()
        self.trained = True


def _check_features(features: Sequence[str]) -> tuple[str, ...]:
    names = tuple(str(name) for name in features)
    unknown = [name for name in names if name not in ALL_FEATURES]
    if not names or unknown or len(set(names)) != len(names):
        raise InvalidInputError(f"policy features must be distinct names of {ALL_FEATURES}")
    return names


def warm_start(
    policy: SelectionPolicy,
    states: npt.ArrayLike,
    labels: Sequence[int] | npt.ArrayLike,
    *,
    epochs: int = 200,
    lr: float = 1e-2,
    balance: bool = True,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """Warm-start stage (WS, Eq. 5): BCE of ``P(include)`` against the labels.

    Args:
        policy: Trained in place.
        states: ``n x len(policy.features)`` states.
        labels: 1 if the visited memory is required for the question, else 0.
        epochs: Full-batch Adam steps.
        lr: Adam learning rate.
        balance: Weight positives by ``#neg / #pos`` (required memories are rare). Off, the
            output is a calibrated ``P(required)``, which the policy-gradient stage then moves
            towards the reward's trade-off.
        seed: Torch seed.
        progress: Show a tqdm bar.

    Returns:
        The loss after each epoch.

    Raises:
        InvalidInputError: on mismatched or empty inputs.
    """
    import torch
    from tqdm.auto import tqdm

    x = np.atleast_2d(np.asarray(states, dtype=np.float64))
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    size = len(policy.features)
    if x.shape[0] == 0 or x.shape != (len(y), size):
        raise InvalidInputError(f"need n x {size} states and n labels, got {x.shape}")
    torch.manual_seed(seed)
    net = policy._module()
    optim = torch.optim.Adam(net.parameters(), lr=lr)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    positives = float(y.sum())
    weight = (len(y) - positives) / positives if balance and 0 < positives < len(y) else 1.0
    weights = torch.where(ty > 0.5, torch.tensor(weight, dtype=torch.float64), 1.0)
    losses: list[float] = []
    for _ in tqdm(range(epochs), desc="EMG warm start", disable=not progress):
        optim.zero_grad()
        p = torch.softmax(net(tx), dim=1)[:, 1].clamp(1e-7, 1 - 1e-7)
        loss = -(weights * (ty * torch.log(p) + (1 - ty) * torch.log(1 - p))).mean()
        loss.backward()
        optim.step()
        losses.append(float(loss.detach()))
    policy._load_module(net)
    policy.meta["warm_start"] = {
        "states": len(y),
        "positives": int(positives),
        "epochs": epochs,
        "balance": balance,
    }
    return losses


@dataclass(frozen=True)
class Episode:
    """One sampled walk: the states met, the actions taken and the return ``R``.

    ``baseline`` (optional) is subtracted from ``R``: e.g. the return of the greedy walk on
    the same question (self-critical baseline).
    """

    states: tuple[tuple[float, ...], ...]
    actions: tuple[int, ...]
    reward: float
    baseline: float | None = None


def reinforce(
    policy: SelectionPolicy,
    rollout: Callable[[SelectionPolicy, random.Random], Episode | None],
    *,
    episodes: int = 100,
    lr: float = 1e-3,
    batch: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> list[float]:
    """Policy-gradient stage (PG, Eq. 6): REINFORCE over ``episodes`` sampled walks.

    Args:
        policy: Trained in place.
        rollout: Samples one episode with the current policy (actions drawn from ``π``) and
            returns it with its return ``R`` (``None``: skip, e.g. a question with no
            reachable memory).
        episodes: Episodes (A.4: 100).
        lr: Adam learning rate (A.4: 0.001).
        batch: Episodes whose gradients are averaged per Adam step (1: a step per episode).
        seed: Seeds the sampling and torch.
        progress: Show a tqdm bar.

    Returns:
        The return of each episode that ran.

    Raises:
        InvalidInputError: on a batch size below 1.
    """
    import torch
    from tqdm.auto import tqdm

    if batch < 1:
        raise InvalidInputError("batch must be at least 1")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    net = policy._module()
    optim = torch.optim.Adam(net.parameters(), lr=lr)
    rewards: list[float] = []
    running = 0.0
    pending: list[Any] = []

    def step() -> None:
        optim.zero_grad()
        loss = torch.stack(pending).mean()
        loss.backward()
        optim.step()
        pending.clear()
        policy._load_module(net)  # the next rollout samples from the updated policy

    for _ in tqdm(range(episodes), desc="EMG policy gradient", disable=not progress):
        episode = rollout(policy, rng)
        if episode is None or not episode.actions:
            continue
        rewards.append(episode.reward)
        base = episode.baseline if episode.baseline is not None else running
        advantage = episode.reward - base
        running = 0.9 * running + 0.1 * episode.reward if len(rewards) > 1 else episode.reward
        states = torch.tensor(episode.states, dtype=torch.float64)
        actions = torch.tensor(episode.actions, dtype=torch.long)
        log_probs = torch.log_softmax(net(states), dim=1).gather(1, actions[:, None]).squeeze(1)
        pending.append(-advantage * log_probs.sum())
        if len(pending) >= batch:
            step()
    if pending:
        step()
    policy.meta["policy_gradient"] = {
        "episodes": len(rewards),
        "batch": batch,
        "mean_return": float(np.mean(rewards)) if rewards else None,
    }
    return rewards


def _poisson_binomial(p: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Distribution of the number of successes of independent trials with probabilities ``p``."""
    dist = np.zeros(p.size + 1, dtype=np.float64)
    dist[0] = 1.0
    for q in p:
        dist[1:] = dist[1:] * (1 - q) + dist[:-1] * q
        dist[0] *= 1 - q
    return dist


def expected_f1(
    probabilities: Sequence[float] | npt.ArrayLike, max_size: int | None = None
) -> npt.NDArray[np.float64]:
    """Expected F1 of each best-first prefix of the candidates, if they are independent.

    With ``p`` sorted best first, the prefix of size ``k`` holds ``H`` required memories and
    the rest ``O`` (both Poisson-binomial, independent), so its F1 is ``2H / (k + H + O)``
    (0 when ``H = 0``); the expectation is summed exactly over both distributions. Not in
    the paper: a decode of ``P(required)`` into a set whose size follows how the probability
    mass is spread, instead of one include/stop decision per node (§4.3's Eq. 2).

    Args:
        probabilities: ``P(required)`` of each candidate, any order.
        max_size: Largest prefix scored (default: all candidates).

    Returns:
        ``E[F1]`` for sizes ``1..`` (index ``k - 1``), candidates sorted best first.
    """
    p = np.sort(np.clip(np.asarray(probabilities, dtype=np.float64).reshape(-1), 0, 1))[::-1]
    top = p.size if max_size is None else min(max_size, p.size)
    out = np.zeros(max(top, 0), dtype=np.float64)
    for k in range(1, top + 1):
        hits, others = _poisson_binomial(p[:k]), _poisson_binomial(p[k:])
        h = np.arange(hits.size, dtype=np.float64)[:, None]
        o = np.arange(others.size, dtype=np.float64)[None, :]
        out[k - 1] = float((hits[:, None] * others[None, :] * (2 * h / (k + h + o))).sum())
    return out


def expected_f1_size(
    probabilities: Sequence[float] | npt.ArrayLike, *, min_size: int = 1, max_size: int = 10
) -> int:
    """The selection size with the highest :func:`expected_f1` (ties: the smaller size).

    Confident top candidate (one ``p`` near 1, the rest near 0): size 1. Mass spread over
    several candidates of similar ``p``: a larger set. Clamped to ``[min_size, max_size]``
    and to the number of candidates.
    """
    scores = expected_f1(probabilities, max_size=max(max_size, min_size))
    if scores.size == 0:
        return 0
    low, high = max(min_size, 1), min(max_size, scores.size)
    if high < low:
        return min(low, scores.size)
    return int(low + np.argmax(scores[low - 1 : high]))


def calibrate(
    policy: SelectionPolicy, states: npt.ArrayLike, labels: Sequence[int] | npt.ArrayLike
) -> tuple[float, float]:
    """Fit a Platt map ``sigmoid(a · logit(p) + b)`` of the probability head to the labels.

    The expected-F1 decode (:func:`expected_f1_size`) needs probabilities; a class-balanced
    warm start (``balance=True``) does not give them, so the map is fitted on the training
    states (logistic regression on one feature, Newton steps). Stored in
    ``policy.meta["platt"]``; :meth:`SelectionPolicy.required_probability` applies it.

    Raises:
        InvalidInputError: on mismatched or empty inputs, or labels of one class.
    """
    x = np.atleast_2d(np.asarray(states, dtype=np.float64))
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    if x.shape[0] == 0 or x.shape[0] != len(y) or y.min() == y.max():
        raise InvalidInputError("need states and labels of both classes")
    p = np.clip(policy._head_probability(x), 1e-7, 1 - 1e-7)
    z = np.log(p / (1 - p))
    design = np.stack([z, np.ones_like(z)], axis=1)
    w = np.array([1.0, 0.0])
    for _ in range(50):
        q = 1 / (1 + np.exp(-(design @ w)))
        grad = design.T @ (q - y)
        hess = design.T @ (design * (q * (1 - q))[:, None]) + 1e-6 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        w -= step
        if float(np.abs(step).max()) < 1e-9:
            break
    policy.meta["platt"] = [float(w[0]), float(w[1])]
    return float(w[0]), float(w[1])


def _tokens(text: str) -> list[str]:
    import re

    return re.findall(r"\w+", text.lower())


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 of two texts (longest common subsequence of lower-cased word tokens)."""
    a, b = _tokens(candidate), _tokens(reference)
    if not a or not b:
        return 0.0
    prev = [0] * (len(b) + 1)
    for token in a:
        row = [0]
        for j, other in enumerate(b):
            row.append(prev[j] + 1 if token == other else max(prev[j + 1], row[j]))
        prev = row
    lcs = prev[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(a), lcs / len(b)
    return 2 * precision * recall / (precision + recall)


def selection_f1(selected: Sequence[str], required: Collection[str]) -> float:
    """F1 of a selected set of memory ids against the required ones (0 if either is empty)."""
    chosen, wanted = set(selected), set(required)
    hits = len(chosen & wanted)
    if not hits:
        return 0.0
    precision, recall = hits / len(chosen), hits / len(wanted)
    return 2 * precision * recall / (precision + recall)
