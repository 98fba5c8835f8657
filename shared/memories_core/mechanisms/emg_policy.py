"""The memory-selection policy of EMG-RAG (Wang et al., 2024, §4.3 and appendix A.4).

The agent that walks the memory graph sees, at each visited node, the state of three cosine
similarities (Eq. 1): question entity vs node entity, question relation vs edge relation,
question vs memory. It chooses between two actions (Eq. 2): include the node's memory and go
on to its neighbours (1), or stop this branch (0).

:class:`SelectionPolicy` is the paper's network: two layers, 20 ``tanh`` hidden units, two
outputs (A.4). Inference runs in numpy (no torch import on the answer path); training
(:func:`warm_start`, :func:`reinforce`) imports torch lazily:

* **warm start** (WS, Eq. 5): binary cross-entropy of ``P(include)`` against "the memory is
  one of the question's required memories";
* **policy gradient** (PG, Eq. 6, REINFORCE): ``-R · Σ log π(a|s)`` over an episode's actions,
  with ``R`` the episode's return. By Eq. 4 the undiscounted sum of the per-step rewards
  ``Δ(Â', A) - Δ(Â, A)`` telescopes to ``Δ(final) - Δ(initial)``, so one quality measurement
  per episode suffices. A running-mean baseline is subtracted (variance reduction; it does not
  change the expected gradient).

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
    "HIDDEN",
    "STATE_SIZE",
    "Episode",
    "SelectionPolicy",
    "reinforce",
    "rouge_l",
    "selection_f1",
    "warm_start",
]

#: Size of the state (Eq. 1).
STATE_SIZE = 3
#: Hidden units (A.4).
HIDDEN = 20


@dataclass
class SelectionPolicy:
    """Two-layer MLP ``3 -> 20 (tanh) -> 2`` (A.4); action 1 = include, 0 = stop.

    Attributes:
        w1, b1, w2, b2: The weights (numpy; ``w1`` is ``HIDDEN x 3``, ``w2`` is ``2 x HIDDEN``).
        trained: Whether any training step ran (an untrained policy is not used; selection
            falls back to a similarity threshold).
        meta: Free notes kept with the weights (training sizes, rewards).
    """

    w1: npt.NDArray[np.float64]
    b1: npt.NDArray[np.float64]
    w2: npt.NDArray[np.float64]
    b2: npt.NDArray[np.float64]
    trained: bool = False
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def initial(cls, seed: int = 0) -> SelectionPolicy:
        """A fresh, untrained policy (uniform init in ``±1/sqrt(fan_in)``, as torch's Linear)."""
        rng = np.random.default_rng(seed)
        a1, a2 = 1 / math.sqrt(STATE_SIZE), 1 / math.sqrt(HIDDEN)
        return cls(
            w1=rng.uniform(-a1, a1, (HIDDEN, STATE_SIZE)),
            b1=rng.uniform(-a1, a1, HIDDEN),
            w2=rng.uniform(-a2, a2, (2, HIDDEN)),
            b2=rng.uniform(-a2, a2, 2),
        )

    def include_probability(self, states: npt.ArrayLike) -> npt.NDArray[np.float64]:
        """``π(a=1 | s)`` for each row of ``states`` (shape ``n x 3``)."""
        x = np.atleast_2d(np.asarray(states, dtype=np.float64))
        hidden = np.tanh(x @ self.w1.T + self.b1)
        logits = hidden @ self.w2.T + self.b2
        logits -= logits.max(axis=1, keepdims=True)
        exp = np.exp(logits)
        return np.asarray(exp[:, 1] / exp.sum(axis=1), dtype=np.float64)

    def to_json(self) -> str:
        """The weights and notes as JSON."""
        return json.dumps(
            {
                "architecture": f"mlp-{STATE_SIZE}-{HIDDEN}-tanh-2",
                "w1": self.w1.tolist(),
                "b1": self.b1.tolist(),
                "w2": self.w2.tolist(),
                "b2": self.b2.tolist(),
                "trained": self.trained,
                "meta": self.meta,
            }
        )

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
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidInputError(f"not a selection policy: {exc}") from exc
        shapes = (policy.w1.shape, policy.b1.shape, policy.w2.shape, policy.b2.shape)
        if shapes != ((HIDDEN, STATE_SIZE), (HIDDEN,), (2, HIDDEN), (2,)):
            raise InvalidInputError(f"policy weights have shapes {shapes}")
        return policy

    # -- torch bridge -----------------------------------------------------------------------
    def _module(self) -> Any:
        import torch

        net = torch.nn.Sequential(
            torch.nn.Linear(STATE_SIZE, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, 2)
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
        states: ``n x 3`` states.
        labels: 1 if the visited memory is required for the question, else 0.
        epochs: Full-batch Adam steps.
        lr: Adam learning rate.
        balance: Weight positives by ``#neg / #pos`` (required memories are rare).
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
    if x.shape[0] == 0 or x.shape != (len(y), STATE_SIZE):
        raise InvalidInputError(f"need n x {STATE_SIZE} states and n labels, got {x.shape}")
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
    policy.meta["warm_start"] = {"states": len(y), "positives": int(positives), "epochs": epochs}
    return losses


@dataclass(frozen=True)
class Episode:
    """One sampled walk: the states met, the actions taken and the return ``R``."""

    states: tuple[tuple[float, ...], ...]
    actions: tuple[int, ...]
    reward: float


def reinforce(
    policy: SelectionPolicy,
    rollout: Callable[[SelectionPolicy, random.Random], Episode | None],
    *,
    episodes: int = 100,
    lr: float = 1e-3,
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
        seed: Seeds the sampling and torch.
        progress: Show a tqdm bar.

    Returns:
        The return of each episode that ran.
    """
    import torch
    from tqdm.auto import tqdm

    torch.manual_seed(seed)
    rng = random.Random(seed)
    net = policy._module()
    optim = torch.optim.Adam(net.parameters(), lr=lr)
    rewards: list[float] = []
    baseline = 0.0
    for _ in tqdm(range(episodes), desc="EMG policy gradient", disable=not progress):
        episode = rollout(policy, rng)
        if episode is None or not episode.actions:
            continue
        rewards.append(episode.reward)
        advantage = episode.reward - baseline
        baseline = 0.9 * baseline + 0.1 * episode.reward if len(rewards) > 1 else episode.reward
        states = torch.tensor(episode.states, dtype=torch.float64)
        actions = torch.tensor(episode.actions, dtype=torch.long)
        log_probs = torch.log_softmax(net(states), dim=1).gather(1, actions[:, None]).squeeze(1)
        loss = -advantage * log_probs.sum()
        optim.zero_grad()
        loss.backward()
        optim.step()
        policy._load_module(net)  # the next rollout samples from the updated policy
    policy.meta["policy_gradient"] = {
        "episodes": len(rewards),
        "mean_return": float(np.mean(rewards)) if rewards else None,
    }
    return rewards


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
