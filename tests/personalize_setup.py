"""Shared setup of the personalization adapter tests: a DPeM memory and a tiny trained model."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from memories_core import DualProcessMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.personalize import LoRAConfig, Personalizer, tiny_model
from memories_core.prompts.dpem import dpem_reply

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=timezone.utc)

ANN = [
    ("I have type 2 diabetes and I like short answers.", "Noted. Keep sugar steady."),
    ("My feet feel numb in the evening.", "Check your feet daily. Keep sugar steady."),
    ("I have type 2 diabetes, remember?", "Yes. Keep sugar steady."),
    ("My skin is dry.", "Moisturise daily. Keep sugar steady."),
]
BOB = [
    ("I twisted my ankle while running.", "Rest it, ice it, raise it for two days."),
    ("My knee aches on stairs.", "Strengthen the thigh muscles and rest a little."),
]


def trained_personalizer(path: Path) -> Personalizer:
    """ann and bob's DPeM memories, and a tiny model with ann's adapter (6 steps)."""
    import torch

    torch.set_num_threads(1)
    memory = DualProcessMemory(
        path=path,
        llm=ScriptedLLM(default=dpem_reply),
        embedder=HashingEmbedder(dimension=64),
        theta=2,
    )
    for user, pairs in (("ann", ANN), ("bob", BOB)):
        for i, (question, answer) in enumerate(pairs):
            at = T0 + timedelta(hours=i)
            memory.save(
                [Turn("user", question, timestamp=at), Turn("assistant", answer, timestamp=at)],
                Scope(user),
            )
    # DPeM's derivations run in a background worker: let them finish, or a recall made by
    # an engine and one made by the test may see different memories (seen on a loaded run).
    assert memory.flush(timeout=120) == 0
    model, tokenizer = tiny_model([t for pair in ANN + BOB for t in pair])
    config = LoRAConfig(learning_rate=3e-3, max_steps=6, checkpoint_every=0)
    personalizer = Personalizer(
        memory, model=model, tokenizer=tokenizer, config=config, max_new_tokens=8
    )
    personalizer.train("ann", progress=False)
    return personalizer
