"""MemoryBank companion: ten days with one user, a probing question, then thirty days later.

Replays the user Gary of MemoryBank's English evaluation data (Zhong et al., Table 1; his ten
days ship in ``examples/data/memorybank_gary.json``, MIT) day by day under a fixed clock, so each
new day's first save consolidates the previous day (§2.1). It prints the global portrait and
event summary, asks the paper's probing question on May 10 and shows what was recalled (and
reinforced, §2.3), asks again on May 20 and June 1 (spaced repetition), then jumps to June 9,
runs ``forget`` and shows what remains.

Offline and deterministic: the hashing embedder (``--minilm`` for the bundled MiniLM) and a
rule-based stand-in for the summarising model (``memorybank_reply``); pass a real model for
real summaries.

    python examples/memorybank_companion.py [--minilm]
    python examples/memorybank_companion.py --data memory_bank_en.json --user Linda  # any user
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

from memories_core import FixedClock, MemoryBankMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import Embedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.memorybank import memorybank_reply

#: Gary's ten days, shipped with the examples; ``--data`` reads the full file of 15 users.
DATA = Path(__file__).resolve().parent / "data" / "memorybank_gary.json"
QUESTION = "What good ways did you recommend me to relieve stress?"


def load_user(path: Path, name: str) -> dict[str, list[dict[str, str]]]:
    """One user's history ``{day: [{"query", "response"}, ...]}`` (user keys are stripped).

    Raises:
        SystemExit: with a message if the file cannot be read or does not hold the user.
    """
    try:
        users = {key.strip(): value for key, value in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError) as exc:
        raise SystemExit(f"cannot read MemoryBank data from {path}: {exc}") from None
    if name not in users:
        raise SystemExit(f"{path} has no user {name!r}; it has: {', '.join(sorted(users))}")
    return dict(users[name]["history"])


def day_turns(day: str, pairs: Sequence[dict[str, str]]) -> list[Turn]:
    """A day's exchanges as timestamped turns, from 8 pm, two minutes apart."""
    start = datetime.fromisoformat(day).replace(hour=20, tzinfo=timezone.utc)
    turns: list[Turn] = []
    for i, pair in enumerate(pairs):
        at = start + timedelta(minutes=2 * i)
        turns.append(Turn("user", pair["query"], timestamp=at))
        turns.append(Turn("assistant", pair["response"], timestamp=at + timedelta(seconds=40)))
    return turns


def short(text: str, width: int = 110) -> str:
    """One line of at most ``width`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def main(argv: Sequence[str] | None = None) -> int:
    """Run the replay; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--user", default="Gary", help="whose days to replay (default: Gary)")
    parser.add_argument(
        "--data",
        type=Path,
        default=DATA,
        help="MemoryBank's memory_bank_en.json (default: Gary's days shipped with the examples)",
    )
    parser.add_argument("--minilm", action="store_true", help="bundled MiniLM embedder")
    args = parser.parse_args(argv)
    embedder: Embedder = HashingEmbedder()
    if args.minilm:
        from memories_core.embedders import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder()
    history = load_user(args.data, args.user)
    user = args.user.lower()
    clock = FixedClock(datetime(2023, 4, 27, 20, tzinfo=timezone.utc))
    llm = ScriptedLLM(default=memorybank_reply)
    # The defaults: recall ranks by relevance (no query-time decay), the curve decides what
    # recall reinforces and what forget() archives.
    memory = MemoryBankMemory(llm=llm, embedder=embedder, clock=clock, k=4)

    print(f"== {len(history)} days with {args.user}")
    for day, pairs in history.items():
        turns = day_turns(day, pairs)
        clock.set(turns[-1].timestamp or clock.now())
        memory.save(turns, Scope(user, session_id=day))
        print(f"{day}: {len(turns)} turns; {short(pairs[0]['query'], 80)}")
    memory.consolidate(user)  # the last day has no next day to close it
    print(f"summary calls: {len(llm.calls)} ({len(llm.calls) // len(history)} per day)")
    print("\n== Global portrait\n" + (memory.portrait(user) or "-"))
    print("\n== Global event summary\n" + short(memory.global_summary(user) or "-", 400))

    for when in ("2023-05-10", "2023-05-20", "2023-06-01"):
        clock.set(datetime.fromisoformat(when).replace(hour=9, tzinfo=timezone.utc))
        recall = memory.recall(QUESTION, Scope(user))
        print(f"\n== {when}: {QUESTION!r} recalled")
        for hit in recall.records:
            state = memory.engine.get(user, [hit.record.id])[0].state
            print(f"  [{hit.record.kind}, S={state.strength:.0f}] {short(hit.record.text, 100)}")
    print("\n== Context for the reply (memories + portrait + global summary), first lines")
    print("\n".join(short(line) for line in recall.context.splitlines()[:4]))

    clock.set(datetime(2023, 6, 9, 9, tzinfo=timezone.utc))  # 30 days after May 10
    before = Counter(r.kind for r in memory.records(Scope(user)))
    report = memory.forget(user, policy="threshold", threshold=0.1)
    after = Counter(r.kind for r in memory.records(Scope(user)) if not r.state.archived)
    print(f"\n== 2023-06-09: forget (R = exp(-t/S) < 0.1) archived {len(report.forgotten)}")
    print(f"live before: {dict(before)}; after: {dict(after)}")
    kept = memory.engine.records(user, where={"kind": "turn", "archived": False})
    for record in kept:
        r = memory.retention(record)
        print(f"  kept (R={r:.2f}, S={record.state.strength:.0f}) {short(record.text, 90)}")
    recall = memory.recall(QUESTION, Scope(user), k=2)
    print("after forgetting, recalled:")
    for hit in recall.records:
        print(f"  [{hit.record.kind}] {short(hit.record.text, 100)}")
    print(f"restorable: {len(memory.forgotten(user))} archived memories")
    memory.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
