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

from memories_core.personalize.llm import PersonalizedLLM
from memories_core.personalize.setup import (
    ADAPTER_ARTIFACT,
    CHECKPOINT_ARTIFACT,
    LoRAConfig,
    NotEnoughDataError,
    TrainingExample,
    TrainingReport,
    default_dtype,
    require_personalize,
    select_device,
)
from memories_core.personalize.setup import DEFAULT_SYSTEM as DEFAULT_SYSTEM
from memories_core.personalize.setup import render_prompt as render_prompt
from memories_core.personalize.tiny import tiny_model
from memories_core.personalize.trainer import Personalizer

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
