"""Choose MaLP's LoRA learning rate and steps by own-user vs other-user held-out perplexity.

Data: MemoryBank's simulated users (``memory_bank_en.json``, 15 users x 10 days of
query/response pairs with an AI companion). The ``--users`` users (default: the three with the
most pairs) each get a DPeM memory (rule-based coordinator ``dpem_reply``, hashing embedder)
of days 1-8; a user's adapter is trained on those days' pairs with the recalled memory as
prompt prefix (eq. 3). Held out: the first ``--held-out`` pairs of days 9-10 of every user
(never trained on, never in a memory), each prompted with its own user's memory.

For every (user, learning rate, steps) cell the adapter of that user scores:

* **own**: the relative drop of that user's held-out perplexity (``1 - after / before``);
* **other**: the mean relative drop of every other user's held-out perplexity under it;
* **gap** = own - other: how much more the adapter helps its user than anyone else.

``run`` trains and scores cells and merges them into the JSON (one invocation per user keeps
each under ten minutes on a busy CPU); ``report`` picks the setting by leave-one-user-out
cross-validation (choose on the other users' mean gap, score the left-out user) and writes the
Markdown table. Texts are cut short (96 prompt and 32 reply tokens, one memory item, no
earlier turns) so that a step costs seconds on a CPU.

    python benchmarks/personalize_grid.py run --users Frank   # then Emily, Luna
    python benchmarks/personalize_grid.py report
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_info import machine
from memorybank_bench import datasets_dir

from memories_core import DualProcessMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.personalize import LoRAConfig, Personalizer, TrainingExample
from memories_core.prompts.dpem import dpem_reply

OUT = Path(__file__).resolve().parent / "out"
TRAIN_DAYS = 8
T0 = datetime(2023, 4, 27, 9, 0, tzinfo=timezone.utc)


def load_users(path: Path) -> dict[str, list[list[tuple[str, str]]]]:
    """Every user's days (sorted), each a list of (query, response) pairs."""
    raw = json.loads(path.read_text())
    return {
        name.strip(): [
            [(p["query"], p["response"]) for p in entry["history"][day]]
            for day in sorted(entry["history"])
        ]
        for name, entry in raw.items()
    }


def default_users(data: dict[str, list[list[tuple[str, str]]]], count: int = 3) -> list[str]:
    """The ``count`` users with the most pairs (ties by name)."""
    return sorted(data, key=lambda u: (-sum(len(d) for d in data[u]), u))[:count]


def build_memory(
    path: Path, data: dict[str, list[list[tuple[str, str]]]], users: Sequence[str]
) -> DualProcessMemory:
    memory = DualProcessMemory(
        path=path,
        llm=ScriptedLLM(default=dpem_reply),
        embedder=HashingEmbedder(dimension=256),
        theta=2,
    )
    for user in users:
        for d, day in enumerate(data[user][:TRAIN_DAYS]):
            for i, (query, response) in enumerate(day):
                at = T0 + timedelta(days=d, minutes=2 * i)
                memory.save(
                    [Turn("user", query, timestamp=at), Turn("assistant", response, timestamp=at)],
                    Scope(user),
                )
    memory.flush()  # every round learned before examples are built from the memory
    return memory


def held_out(
    personalizer: Personalizer, data: dict[str, list[list[tuple[str, str]]]], user: str, n: int
) -> list[TrainingExample]:
    pairs = [pair for day in data[user][TRAIN_DAYS:] for pair in day][:n]
    return [TrainingExample(tuple(personalizer.prompt_messages(user, [], q)), a) for q, a in pairs]


def run(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.threads)
    data = load_users(args.data)
    pool = args.pool or default_users(data)
    trained = args.users or pool
    results: dict[str, Any] = json.loads(args.json.read_text()) if args.json.exists() else {}
    results.setdefault("cells", [])
    results["pool"] = pool
    results.setdefault("machine", []).append(machine())
    results["settings"] = {
        "max_input_tokens": args.max_input_tokens,
        "max_output_tokens": args.max_output_tokens,
        "history_turns": args.history_turns,
        "memory_k": args.memory_k,
        "held_out": args.held_out,
        "train_days": TRAIN_DAYS,
        "threads": args.threads,
    }
    with tempfile.TemporaryDirectory() as tmp:
        memory = build_memory(Path(tmp) / "m", data, pool)
        base = LoRAConfig(
            max_input_tokens=args.max_input_tokens,
            max_output_tokens=args.max_output_tokens,
            history_turns=args.history_turns,
            memory_k=args.memory_k,
            checkpoint_every=0,
        )
        personalizer = Personalizer(memory, config=base)
        tests = {u: held_out(personalizer, data, u, args.held_out) for u in pool}
        before = results.setdefault("before", {})
        for user in pool:
            if user not in before:
                before[user] = personalizer.perplexity(tests[user])
        for user in trained:
            examples = personalizer.examples(user)
            for lr in args.lr:
                for steps in args.steps:
                    personalizer.config = LoRAConfig(
                        **{**base.__dict__, "learning_rate": lr, "max_steps": steps}
                    )
                    report = personalizer.train(user, examples=examples, progress=False)
                    tick = time.perf_counter()
                    after = {u: personalizer.perplexity(tests[u], adapter_of=user) for u in pool}
                    own = 1 - after[user] / before[user]
                    other = statistics.mean(1 - after[u] / before[u] for u in pool if u != user)
                    cell = {
                        "user": user,
                        "lr": lr,
                        "steps": steps,
                        "examples": len(examples),
                        "own": round(own, 4),
                        "other": round(other, 4),
                        "gap": round(own - other, 4),
                        "after": {u: round(v, 3) for u, v in after.items()},
                        "seconds_per_step": round(report.seconds_per_step, 3),
                        "eval_seconds": round(time.perf_counter() - tick, 1),
                        "first_loss": round(report.losses[0], 3),
                        "last_loss": round(report.losses[-1], 3),
                    }
                    print(json.dumps(cell), flush=True)
                    results["cells"] = [
                        c
                        for c in results["cells"]
                        if (c["user"], c["lr"], c["steps"]) != (user, lr, steps)
                    ] + [cell]
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps(results, indent=1))
                    personalizer.delete_adapter(user)
        memory.close()


def choose(cells: Sequence[dict[str, Any]], users: Sequence[str]) -> tuple[float, int] | None:
    """The (lr, steps) with the highest mean gap over ``users`` (ties: fewer steps, lower lr).

    Only settings measured for every one of ``users`` compete, and only those whose adapter
    lowered its own user's held-out perplexity for every one of them: an adapter that hurts
    its user less than it hurts the others has a positive gap but does not personalise.
    """
    by: dict[tuple[float, int], dict[str, float]] = {}
    helps: dict[tuple[float, int], bool] = {}
    for c in cells:
        key = (c["lr"], c["steps"])
        by.setdefault(key, {})[c["user"]] = c["gap"]
        if c["user"] in users:
            helps[key] = helps.get(key, True) and c["own"] > 0
    full = {k: v for k, v in by.items() if all(u in v for u in users) and helps.get(k, False)}
    if not full:
        return None
    return max(full, key=lambda k: (statistics.mean(full[k][u] for u in users), -k[1], -k[0]))


def report(args: argparse.Namespace) -> None:
    results = json.loads(args.json.read_text())
    cells = results["cells"]
    users = sorted({c["user"] for c in cells})
    settings = sorted({(c["lr"], c["steps"]) for c in cells})
    lines = [
        "| lr | steps | s/step | own ppl drop | other users' ppl drop | gap (own - other) | "
        "users |",
        "|---|---|---|---|---|---|---|",
    ]
    for lr, steps in settings:
        row = [c for c in cells if (c["lr"], c["steps"]) == (lr, steps)]
        lines.append(
            f"| {lr:g} | {steps} | {statistics.mean(c['seconds_per_step'] for c in row):.2f} | "
            f"{100 * statistics.mean(c['own'] for c in row):+.1f}% | "
            f"{100 * statistics.mean(c['other'] for c in row):+.1f}% | "
            f"{100 * statistics.mean(c['gap'] for c in row):+.1f} pts | {len(row)} |"
        )
    folds = []
    for left in users:
        pick = choose(cells, [u for u in users if u != left])
        cell = next(
            (c for c in cells if pick and (c["lr"], c["steps"]) == pick and c["user"] == left),
            None,
        )
        if pick and cell:
            folds.append({"left_out": left, "lr": pick[0], "steps": pick[1], **cell})
    overall = choose(cells, users)
    lines += ["", "Leave-one-user-out: setting chosen on the other users, scored on the left-out:"]
    lines += ["", "| left-out user | chosen lr | chosen steps | own | other | gap |"]
    lines += ["|---|---|---|---|---|---|"]
    for f in folds:
        lines.append(
            f"| {f['left_out']} | {f['lr']:g} | {f['steps']} | {100 * f['own']:+.1f}% | "
            f"{100 * f['other']:+.1f}% | {100 * f['gap']:+.1f} pts |"
        )
    if folds:
        lines.append(
            f"| **mean** | | | {100 * statistics.mean(f['own'] for f in folds):+.1f}% | "
            f"{100 * statistics.mean(f['other'] for f in folds):+.1f}% | "
            f"{100 * statistics.mean(f['gap'] for f in folds):+.1f} pts |"
        )
    if overall:
        lines += ["", f"Chosen on all users: lr {overall[0]:g}, {overall[1]} steps."]
    results["cross_validation"] = folds
    results["chosen"] = {"lr": overall[0], "steps": overall[1]} if overall else None
    args.json.write_text(json.dumps(results, indent=1))
    table = "\n".join(lines)
    args.json.with_suffix(".md").write_text(table + "\n")
    print(table)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run")
    go.add_argument("--users", nargs="*", default=None, help="users to train (default: pool)")
    go.add_argument("--pool", nargs="*", default=None, help="users scored (default: top 3)")
    go.add_argument("--lr", type=float, nargs="+", default=[1e-3, 3e-3, 3e-4])
    go.add_argument("--steps", type=int, nargs="+", default=[20])
    go.add_argument("--held-out", type=int, default=3)
    go.add_argument("--max-input-tokens", type=int, default=96)
    go.add_argument("--max-output-tokens", type=int, default=32)
    go.add_argument("--history-turns", type=int, default=0)
    go.add_argument("--memory-k", type=int, default=1)
    go.add_argument("--threads", type=int, default=1)
    go.add_argument("--data", type=Path, default=datasets_dir() / "memorybank/memory_bank_en.json")
    for p in (go, sub.add_parser("report")):
        p.add_argument("--json", type=Path, default=OUT / "personalize_grid.json")
    args = parser.parse_args(argv)
    run(args) if args.command == "run" else report(args)


if __name__ == "__main__":
    main()
