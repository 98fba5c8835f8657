"""A personalized doctor: DPeM memory + MaLP LoRA (Zhang et al., 2023), offline.

A diabetic patient who prefers concise advice talks to a doctor over four sessions. After each
session the script shows the patient's working memory, short-term memory (with flag-table
counts) and long-term memory as they evolve. Then it trains the patient's LoRA adapter on
SmolLM2-135M-Instruct (on a GPU if present, else the CPU; a few steps) and answers "I got
red spots on my skin recently" without personalization (base model, no memory) and with it
(adapter + recalled memory).

The coordinator is the rule-based stand-in ``dpem_reply`` (pass ``--coordinator local`` for
the bundled SmolLM2, slow and weak). SmolLM2 is tiny: the answers show the mechanics, not
medical quality.

    python examples/personalized_doctor.py [--steps 12] [--lr 3e-4] [--device cpu] [--hashing]
        [--tiny]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from memories_core import DualProcessMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder, SentenceTransformerEmbedder
from memories_core.interfaces import LLM
from memories_core.llms import LocalLLM, ScriptedLLM
from memories_core.personalize import LoRAConfig, Personalizer, tiny_model
from memories_core.prompts.dpem import dpem_reply
from memories_core.types import ChatMessage

PATIENT = "patient-ann"
QUESTION = "I got red spots on my skin recently, can you help me with this?"
START = datetime(2024, 3, 4, 9, 0, tzinfo=timezone.utc)

SESSIONS: list[list[tuple[str, str]]] = [
    [
        ("Hello doctor. I have type 2 diabetes.", "Thank you, I have noted that."),
        ("I prefer concise answers.", "Understood. I will keep it short."),
        ("My feet tingle at night.", "Check your feet daily. Keep your blood sugar steady."),
    ],
    [
        ("I have type 2 diabetes. My skin is dry and itchy.", "Keeping skin moist helps."),
        ("Can I eat rice?", "Small portions with vegetables. Keep your blood sugar steady."),
    ],
    [
        ("I prefer concise answers.", "Of course."),
        ("I feel tired after lunch.", "Walk after meals. Keep your blood sugar steady."),
        ("A cut on my toe heals slowly.", "Clean it daily. High sugar slows healing."),
    ],
    [
        ("I have type 2 diabetes. I take metformin.", "Noted: metformin every morning."),
        ("I am thirsty all the time.", "Test your sugar today. Drink water, not juice."),
        ("My skin itches again.", "Moisturise daily. Keeping skin moist helps."),
    ],
]


def show(memory: DualProcessMemory, session: int) -> None:
    stats = memory.stats(PATIENT)
    print(
        f"\n=== after session {session}: round {stats.rounds}, merges {stats.merges}, "
        f"promotions {stats.promotions}, STM refreshes {stats.refreshes}"
    )
    print(f"working memory ({stats.working} notes, refreshed every round):")
    for item in memory.working(PATIENT):
        print(f"   . {item.text}")
    print(f"short-term memory ({stats.stm}):")
    for item in memory.stm(PATIENT):
        print(f"   [{item.type:13s} x{item.count}] {item.text}")
    print(f"long-term memory ({stats.ltm}):")
    for item in memory.ltm(PATIENT):
        print(f"   [{item.type:13s} x{item.count}] {item.text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=12, help="LoRA training steps")
    parser.add_argument(
        "--lr", type=float, default=3e-4, help="learning rate (paper: 5e-5; library default 3e-3)"
    )
    parser.add_argument("--device", default=None, help="cpu, cuda, mps (default: best present)")
    parser.add_argument("--theta", type=int, default=2, help="recurrences that promote to LTM")
    parser.add_argument("--hashing", action="store_true", help="hashing embedder, not MiniLM")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model (seconds)")
    parser.add_argument("--coordinator", choices=["rules", "local"], default="rules")
    parser.add_argument("--max-new-tokens", type=int, default=60)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # fastest for a model this small on a shared CPU
    coordinator: LLM = (
        LocalLLM() if args.coordinator == "local" else ScriptedLLM(default=dpem_reply)
    )
    embedder = HashingEmbedder() if args.hashing else SentenceTransformerEmbedder()
    with tempfile.TemporaryDirectory() as folder:
        memory = DualProcessMemory(
            path=Path(folder) / "memory",
            llm=coordinator,
            embedder=embedder,
            theta=args.theta,
            stm_refresh_rounds=6,
        )
        for number, session in enumerate(SESSIONS, 1):
            day = START + timedelta(days=7 * (number - 1))
            for i, (said, answered) in enumerate(session):
                at = day + timedelta(minutes=2 * i)
                memory.save(
                    [Turn("user", said, timestamp=at), Turn("assistant", answered, timestamp=at)],
                    Scope(PATIENT, f"visit-{number}"),
                )
            # The coordinator works in the background; wait for it before printing its memory.
            memory.flush(PATIENT)
            show(memory, number)

        print("\n=== recalled memory for the new query (eq. 3's prompt p):")
        print(memory.prompt(QUESTION, Scope(PATIENT), k=4))

        config = LoRAConfig(learning_rate=args.lr, max_steps=args.steps, max_input_tokens=384)
        if args.tiny:
            texts = [t for session in SESSIONS for pair in session for t in pair]
            model, tokenizer = tiny_model(texts)
            personalizer = Personalizer(
                memory, model=model, tokenizer=tokenizer, config=config, device=args.device
            )
        else:  # SmolLM2-135M-Instruct
            personalizer = Personalizer(memory, config=config, device=args.device)
        personalizer.max_new_tokens = args.max_new_tokens
        print(
            f"\n=== training {PATIENT}'s LoRA adapter ({args.steps} steps, {personalizer.device})"
        )
        report = personalizer.train(PATIENT)
        print(
            f"{report.examples} examples, {report.seconds_per_step:.2f} s/step, loss "
            f"{report.losses[0]:.2f} -> {report.losses[-1]:.2f}, adapter "
            f"{report.adapter_bytes / 1e6:.2f} MB in the artifact store"
        )

        started = time.perf_counter()
        plain = personalizer.generate(None, [ChatMessage("user", QUESTION)]).text
        personal = personalizer.llm(PATIENT).generate([ChatMessage("user", QUESTION)])
        print(f"\n=== {QUESTION}")
        print(f"\n-- without personalization (base model, no memory):\n{plain}")
        print(f"\n-- with MaLP (adapter + DPeM memory):\n{personal}")
        print(f"\n(generation took {time.perf_counter() - started:.1f} s)")
        memory.close()


if __name__ == "__main__":
    main()
