"""Plot MemoryBank's forgetting (Zhong et al., §2.3): retention curves and live memories per day.

Left: ``R = exp(-t / S)`` for S = 1..5 over two weeks (t in days). Right: the number of live
turn memories of all 15 users of ``memory_bank_en.json`` per simulated day, with and without
forgetting: days 1-10 replay the data (each evening: the day's turns are saved, then every
user asks their first question of that day again, which reinforces what it recalls); days
11-30 have no new dialogue. With forgetting, ``forget(policy="stochastic", seed=day)`` runs
every night. Offline and deterministic (hashing embedder, rule-based summariser, fixed clock).

    python benchmarks/memorybank_forgetting.py [--out benchmarks/out/memorybank_forgetting.png]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from memories_core import FixedClock, MemoryBankMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.forgetting import retention
from memories_core.prompts.memorybank import memorybank_reply

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_info import datasets_dir

OUT = Path(__file__).resolve().parent / "out"
DAYS = 30


def load_users(path: Path) -> dict[str, dict[str, list[dict[str, str]]]]:
    """``{user: {day: [{"query", "response"}, ...]}}``; stray spaces in user keys stripped."""
    data = json.loads(path.read_text())
    return {key.strip(): dict(value["history"]) for key, value in data.items()}


def simulate(users: dict[str, dict[str, list[dict[str, str]]]], *, forget: bool) -> list[int]:
    """Live turn memories of all users at the end of each simulated day."""
    start = datetime(2023, 4, 27, tzinfo=timezone.utc)
    clock = FixedClock(start)
    memory = MemoryBankMemory(
        llm=ScriptedLLM(default=memorybank_reply), embedder=HashingEmbedder(), clock=clock
    )
    live: list[int] = []
    for offset in range(DAYS):
        evening = start + timedelta(days=offset, hours=20)
        day = evening.date().isoformat()
        for name, history in users.items():
            pairs = history.get(day, [])
            turns: list[Turn] = []
            for i, pair in enumerate(pairs):
                at = evening + timedelta(minutes=2 * i)
                turns += [
                    Turn("user", pair["query"], timestamp=at),
                    Turn("assistant", pair["response"], timestamp=at + timedelta(seconds=40)),
                ]
            clock.set(evening)
            if turns:
                memory.save(turns, Scope(name, session_id=day))
                clock.set(evening + timedelta(hours=2))
                memory.recall(pairs[0]["query"], Scope(name), k=3)
        night = evening + timedelta(hours=3)
        clock.set(night)
        total = 0
        for name in users:
            if forget:
                memory.forget(name, night, policy="stochastic", seed=offset)
            total += len(memory.engine.records(name, where={"kind": "turn", "archived": False}))
        live.append(total)
    memory.close()
    return live


def plot(with_forgetting: Sequence[int], without: Sequence[int], path: Path) -> None:
    """Write the two-panel PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    t = np.linspace(0, 14, 200)
    for strength in range(1, 6):
        left.plot(t, [retention(x, strength) for x in t], label=f"S = {strength}")
    left.set(
        xlabel="days since last recall (t)",
        ylabel="retention R = exp(-t/S)",
        title="Forgetting curve (MemoryBank §2.3)",
    )
    left.legend()
    days = range(1, len(without) + 1)
    right.plot(days, without, marker=".", label="without forgetting")
    right.plot(days, with_forgetting, marker=".", label="forget() every night (stochastic)")
    right.axvline(10.5, color="grey", linestyle=":", label="end of the dialogue data")
    right.set(
        xlabel="simulated day",
        ylabel="live turn memories (15 users)",
        title="Live memories per day",
    )
    right.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    """Simulate both runs, print the counts, write the PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, default=datasets_dir() / "memorybank" / "memory_bank_en.json"
    )
    parser.add_argument("--out", type=Path, default=OUT / "memorybank_forgetting.png")
    args = parser.parse_args(argv)
    users = load_users(args.data)
    without = simulate(users, forget=False)
    with_forgetting = simulate(users, forget=True)
    print("day  without  with-forgetting")
    for day, (a, b) in enumerate(zip(without, with_forgetting, strict=True), start=1):
        print(f"{day:>3}  {a:>7}  {b:>15}")
    plot(with_forgetting, without, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
