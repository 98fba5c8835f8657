"""EMG-RAG edit correctness (Wang et al., 2024, §4.2) on a scripted suite of edits.

A seeded script of insertions, replacements (the same subject and relation, a new object)
and deletions (a memory with an end of validity) is applied to one user's graph through
``EMGMemory.add_memories`` (no LLM), one edit per message time. After the script:

* the graph's live ``(subject, relation, object)`` triples at several times must equal the
  triples a plain dictionary model of the script expects at those times;
* no memory is returned by ``recall``, ``select`` or ``memories`` after its validity ended
  (expired or replaced), checked with a query per memory at a time after its end;
* every replaced memory is still stored, with ``valid_until`` and ``attrs.replaced_by``.

Run: ``PYTHONPATH=shared:. python benchmarks/emg_edits.py [--edits 400] [--seed 0]``
Writes ``benchmarks/out/emg_edits.json``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from machine_info import machine
from tqdm.auto import tqdm

from memories_core import EMGMemory, FixedClock, Scope
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.emg import ExtractedMemory, emg_reply

OUT = Path(__file__).resolve().parent / "out"
T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
SUBJECTS = [f"Person{i}" for i in range(12)]
RELATIONS = ["lives_in", "works_at", "drives", "flight_time", "hotel", "phone_number"]


def script(n: int, seed: int) -> list[dict[str, Any]]:
    """A random edit script; each step: subject, relation, object, time, optional end."""
    rng = random.Random(seed)
    steps: list[dict[str, Any]] = []
    for i in range(n):
        at = T0 + timedelta(hours=i)
        until = at + timedelta(hours=rng.randint(1, n)) if rng.random() < 0.2 else None
        steps.append(
            {
                "subject": rng.choice(SUBJECTS),
                "relation": rng.choice(RELATIONS),
                "object": f"value{rng.randint(0, 9)}",
                "at": at,
                "until": until,
            }
        )
    return steps


def expected(steps: list[dict[str, Any]], now: datetime) -> set[tuple[str, str, str]]:
    """The live triples at ``now`` by the §4.2 rules, on a plain dictionary."""
    current: dict[tuple[str, str], dict[str, Any]] = {}
    for step in steps:
        if step["at"] > now:
            break
        key = (step["subject"], step["relation"])
        old = current.get(key)
        live_old = old is not None and (old["until"] is None or old["until"] > step["at"])
        if live_old and old is not None and old["object"] == step["object"]:
            continue  # a duplicate: nothing changes
        current[key] = step
    return {
        (s["subject"], s["relation"], s["object"])
        for s in current.values()
        if s["until"] is None or s["until"] > now
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--edits", type=int, default=400)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    steps = script(args.edits, args.seed)
    memory = EMGMemory(
        llm=ScriptedLLM(default=emg_reply),
        embedder=HashingEmbedder(dimension=256),
        clock=FixedClock(T0),
        relation_match=1.0,
    )
    user = "suite"
    ops: dict[str, int] = {}
    started = time.perf_counter()
    for step in tqdm(steps, desc="edits"):
        text = f"{step['subject']} {step['relation'].replace('_', ' ')} {step['object']}."
        new = ExtractedMemory(
            text,
            "Attribute",
            "Personal belongings/Pets",
            step["subject"],
            step["relation"],
            step["object"],
            valid_until=step["until"],
        )
        for edit in memory.add_memories(user, [new], at=step["at"]):
            ops[edit.op] = ops.get(edit.op, 0) + 1
    seconds = time.perf_counter() - started
    checks = [T0 + timedelta(hours=h) for h in range(0, 2 * args.edits, max(1, args.edits // 20))]
    graph_ok = sum(memory.triples(user, now=t) == expected(steps, t) for t in checks)
    # Expired and replaced memories are never returned after their end.
    leaks = 0
    ended = [r for r in memory.memories(user, include_expired=True) if r.state.valid_until]
    for record in tqdm(ended, desc="expiry"):
        after = record.state.valid_until + timedelta(seconds=1)
        returned = {
            h.record.id for h in memory.recall(record.text, Scope(user), k=20, now=after).records
        }
        returned |= {h.record.id for h in memory.select(record.text, user, now=after).memories}
        returned |= {r.id for r in memory.memories(user, now=after)}
        leaks += record.id in returned
    replaced = [r for r in ended if r.state.attrs.get("replaced_by")]
    result = {
        "edits": args.edits,
        "ops": ops,
        "graph_checks": len(checks),
        "graph_equal": graph_ok,
        "ended_memories": len(ended),
        "replaced_kept": len(replaced),
        "returned_after_end": leaks,
        "history_entries": len(memory.edits(user)),
        "seconds": seconds,
        "machine": machine(),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "emg_edits.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "machine"}, indent=1))


if __name__ == "__main__":
    main()
