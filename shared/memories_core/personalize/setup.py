"""What training needs: the LoRA settings, examples, report, device, base model and checkpoints."""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memories_core.errors import (
    ConfigurationError,
    InvalidInputError,
    MissingExtraError,
    check_count,
)
from memories_core.types import ChatMessage

__all__ = [
    "ADAPTER_ARTIFACT",
    "CHECKPOINT_ARTIFACT",
    "DEFAULT_SYSTEM",
    "LoRAConfig",
    "NotEnoughDataError",
    "TrainingExample",
    "TrainingReport",
    "default_dtype",
    "render_prompt",
    "require_personalize",
    "select_device",
]


#: Artifact name of a user's adapter, and of an unfinished training's checkpoint.
ADAPTER_ARTIFACT = "malp/lora"


CHECKPOINT_ARTIFACT = "malp/lora.checkpoint"


DEFAULT_SYSTEM = (
    "You are a helpful assistant. Use what you remember about the user to tailor your answer."
)


class NotEnoughDataError(InvalidInputError):
    """The user has too few assistant turns to train an adapter on."""


def require_personalize() -> None:
    """Raise :class:`MissingExtraError` unless torch, transformers and peft are importable."""
    for module in ("torch", "transformers", "peft"):
        if importlib.util.find_spec(module) is None:
            raise MissingExtraError(module, "personalize")


@dataclass(frozen=True)
class LoRAConfig:
    """LoRA and training settings (defaults: Zhang et al., "Setup", except two).

    Rank, alpha, weight decay, warm-up and text lengths are the paper's. The learning rate
    and the number of steps are not: at the paper's 5e-5 an adapter trained for the minutes a
    CPU allows barely moves (held-out perplexity -3 %). ``learning_rate=3e-3`` with
    ``max_steps=60`` had the largest mean *gap* (drop of the user's own held-out perplexity
    minus the mean drop of the other users') among the settings that helped every user, on
    MemoryBank's three simulated users with the most data (the project's LoRA grid benchmark:
    own -44 %, others -34 %, short texts; leave-one-user-out mean gap +4.9 points, positive
    for one user of three). Pass ``max_steps=None`` to train the paper's ``epochs`` instead.

    Attributes:
        rank: Rank ``r`` of the update matrices.
        alpha: LoRA scaling ``alpha``.
        dropout: LoRA dropout.
        target_modules: Modules given LoRA (``None``: peft's default for the architecture,
            ``q_proj``/``v_proj`` for LLaMA-like models such as SmolLM2).
        learning_rate: AdamW learning rate.
        weight_decay: AdamW weight decay.
        warmup_ratio: Share of the steps of linear warm-up (then linear decay).
        epochs: Passes over the examples (when ``max_steps`` is ``None``).
        max_steps: Training steps (one example each); overrides ``epochs``.
        max_input_tokens: Longest prompt (memory, history, user message); cut from the left.
        max_output_tokens: Longest target (assistant reply); cut from the right.
        history_turns: Earlier turns put in each example's prompt.
        memory_k: Memory items recalled for each prompt (eq. 3's ``p``).
        min_examples: Fewest assistant turns training accepts.
        checkpoint_every: Steps between checkpoints (0: none).
        seed: Seed of LoRA initialisation and example order.
    """

    rank: int = 8
    alpha: int = 32
    dropout: float = 0.05
    target_modules: tuple[str, ...] | None = None
    learning_rate: float = 3e-3
    weight_decay: float = 1e-4
    warmup_ratio: float = 0.1
    epochs: int = 3
    max_steps: int | None = 60
    max_input_tokens: int = 1024
    max_output_tokens: int = 2048
    history_turns: int = 4
    memory_k: int = 4
    min_examples: int = 2
    checkpoint_every: int = 25
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("rank", "alpha", "epochs", "max_input_tokens", "max_output_tokens"):
            object.__setattr__(self, name, check_count(name, getattr(self, name)))
        for name in ("history_turns", "memory_k", "min_examples", "checkpoint_every"):
            object.__setattr__(self, name, check_count(name, getattr(self, name), minimum=0))
        if self.max_steps is not None and (
            isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int)
        ):
            raise ConfigurationError(f"max_steps must be an int or None, got {self.max_steps!r}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigurationError("max_steps must be >= 1")
        if not self.learning_rate > 0 or self.weight_decay < 0:
            raise ConfigurationError("learning_rate must be > 0 and weight_decay >= 0")
        if not 0 <= self.warmup_ratio < 1 or not 0 <= self.dropout < 1:
            raise ConfigurationError("warmup_ratio and dropout must be in [0, 1)")


@dataclass(frozen=True)
class TrainingExample:
    """One training example: a chat prompt and the assistant reply to learn.

    Attributes:
        messages: The prompt (system message with the memory, earlier turns, the user's turn).
        target: The assistant's reply (the only tokens the loss is computed on).
    """

    messages: tuple[ChatMessage, ...]
    target: str


@dataclass(frozen=True)
class TrainingReport:
    """What one :meth:`Personalizer.train` did.

    Attributes:
        user_id: Whose adapter.
        examples: Training examples.
        steps: Steps of the whole run (resumed steps included).
        resumed_from: Step the run resumed from (0: a fresh start).
        losses: Loss of every step run now.
        seconds: Wall time of this call.
        seconds_per_step: Mean time of the steps run now.
        adapter_bytes: Size of the saved adapter on disk.
        trainable_parameters: Parameters LoRA trains.
    """

    user_id: str
    examples: int
    steps: int
    resumed_from: int
    losses: tuple[float, ...]
    seconds: float
    seconds_per_step: float
    adapter_bytes: int
    trainable_parameters: int


def select_device(device: str | None = None) -> str:
    """The torch device to train and serve on: ``device`` if given, else the fastest present.

    CUDA if a GPU is visible, else Apple's MPS, else the CPU (the paper trained on GPUs,
    "Setup"; a CPU works for SmolLM2-135M, slowly).

    Args:
        device: A torch device string (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``) that
            overrides the choice; ``None`` chooses.

    Raises:
        ConfigurationError: for a device string torch does not know.
        MissingExtraError: without the ``personalize`` extra.
    """
    require_personalize()
    import torch

    if device is not None:
        try:
            return str(torch.device(device))
        except (RuntimeError, TypeError) as exc:
            raise ConfigurationError(f"unknown torch device {device!r}: {exc}") from exc
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def default_dtype(device: str) -> Any:
    """The base weights' dtype on ``device``: bfloat16 on a CUDA GPU that has it, else float32.

    bfloat16 halves the memory and keeps float32's range, so the frozen base can run in it
    while peft keeps the LoRA matrices themselves in float32. float16 (older CUDA GPUs, Apple's
    MPS) is not chosen: without loss scaling its small range can underflow the gradients that
    reach the adapter; pass ``dtype=torch.float16`` to accept that. On the CPU half-precision
    matmuls are slow, so float32.
    """
    require_personalize()
    import torch

    if torch.device(device).type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


@dataclass
class _Base:
    model: Any
    tokenizer: Any
    identity: str

    def to(self, device: str, dtype: Any) -> _Base:
        """This base with its model moved to ``device`` (and cast to ``dtype`` if given)."""
        if dtype is None:
            self.model.to(device)
        else:
            self.model.to(device=device, dtype=dtype)
        return self


def _default_base_path() -> Path:
    """The converted SmolLM2-135M-Instruct folder of :class:`LocalLLM` (converted once)."""
    from memories_core.llms.local import LocalLLM

    return LocalLLM()._ensure_converted()


def _load_base(base_model: str | Path | None, dtype: Any = None) -> _Base:
    require_personalize()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if base_model is None:
        for module in ("gguf",):
            if importlib.util.find_spec(module) is None:
                raise MissingExtraError(module, "local")
        path: str | Path = _default_base_path()
        identity = "smollm2-135m-instruct"
    else:
        path = base_model
        identity = str(base_model)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"cannot load the base model {str(path)!r}: {exc}") from exc
    return _Base(model, tokenizer, identity)


def render_prompt(tokenizer: Any, messages: Sequence[ChatMessage]) -> str:
    """The prompt text of ``messages`` ready for generation.

    The tokenizer's chat template if it has one, else plain ``Role: text`` lines ending with
    ``Assistant:``.
    """
    if getattr(tokenizer, "chat_template", None):
        return str(
            tokenizer.apply_chat_template(
                [m.to_dict() for m in messages], tokenize=False, add_generation_prompt=True
            )
        )
    lines = [f"{m.role.capitalize()}: {m.content}" for m in messages]
    return "\n".join([*lines, "Assistant:"])


def _encode(
    tokenizer: Any, example: TrainingExample, config: LoRAConfig
) -> tuple[list[int], list[int]]:
    """Token ids and labels (prompt masked with -100) of one example."""
    prompt_ids = list(
        tokenizer(render_prompt(tokenizer, example.messages), add_special_tokens=False)["input_ids"]
    )
    target = example.target if getattr(tokenizer, "chat_template", None) else " " + example.target
    target_ids = list(tokenizer(target, add_special_tokens=False)["input_ids"])
    target_ids = target_ids[: config.max_output_tokens - 1]
    if tokenizer.eos_token_id is not None:
        target_ids.append(int(tokenizer.eos_token_id))
    prompt_ids = prompt_ids[-config.max_input_tokens :]
    return prompt_ids + target_ids, [-100] * len(prompt_ids) + target_ids


#: The files of a stored adapter that serving reads (PEFT's names); nothing else is loaded.
_ADAPTER_WEIGHTS = "adapter_model.safetensors"


_ADAPTER_FILES = ("adapter_config.json", _ADAPTER_WEIGHTS)


#: Files of a training checkpoint: tensors (safetensors) and the rest (JSON); no pickle, so
#: loading a checkpoint cannot run code.
_CHECKPOINT_TENSORS = "trainer.safetensors"


_CHECKPOINT_STATE = "trainer.json"


def _dump(folder: Path, model: Any, optimizer: Any, scheduler: Any, step: int) -> None:
    """Write a checkpoint: adapter, optimizer moments and RNG as tensors; the rest as JSON."""
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {
        f"adapter.{k}": v for k, v in get_peft_model_state_dict(model).items()
    }
    optimizer_state = optimizer.state_dict()
    for index, values in optimizer_state["state"].items():
        for key, value in values.items():
            tensor = value if isinstance(value, torch.Tensor) else torch.tensor(value)
            tensors[f"optimizer.{index}.{key}"] = tensor
    tensors["rng"] = torch.get_rng_state()
    save_file(
        {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()},
        str(folder / _CHECKPOINT_TENSORS),
    )
    state = {
        "step": step,
        "param_groups": optimizer_state["param_groups"],
        "scheduler": scheduler.state_dict(),
    }
    (folder / _CHECKPOINT_STATE).write_text(json.dumps(state))


def _restore(folder: Path, model: Any, optimizer: Any, scheduler: Any) -> int:
    """Load a checkpoint written by :func:`_dump` into the run; returns its step."""
    import torch
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    tensors = load_file(str(folder / _CHECKPOINT_TENSORS), device="cpu")
    state = json.loads((folder / _CHECKPOINT_STATE).read_text())
    adapter = {k[len("adapter.") :]: v for k, v in tensors.items() if k.startswith("adapter.")}
    set_peft_model_state_dict(model, adapter)
    moments: dict[int, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        if name.startswith("optimizer."):
            _, index, key = name.split(".", 2)
            moments.setdefault(int(index), {})[key] = tensor
    optimizer.load_state_dict({"state": moments, "param_groups": state["param_groups"]})
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(tensors["rng"])
    return int(state["step"])


def _fingerprint(examples: Sequence[TrainingExample], config: LoRAConfig, base: str) -> str:
    digest = hashlib.sha256()
    digest.update(json.dumps(asdict(config), sort_keys=True, default=str).encode())
    digest.update(base.encode())
    for example in examples:
        for message in example.messages:
            digest.update(f"{message.role}\x00{message.content}\x01".encode())
        digest.update(example.target.encode() + b"\x02")
    return digest.hexdigest()
