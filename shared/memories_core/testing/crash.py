"""Crash helpers: writer processes SIGKILLed at points of their own progress.

A writer prints a line at each step (``opening``, ``open``, ``saving <n>``, ``ack <n>``,
``recall <n>``, ``end <n>``, ``ended <n>``); the parent kills it right after reading a chosen
line. Kills therefore follow the writer's acknowledgements, never the wall clock: on a loaded
machine both sides only run slower, and every run that should see an acknowledgement does.
Where exactly inside the next step the kill lands is left to the scheduler, which is the
randomness a crash test wants (the parent's ``SIGKILL`` and the writer's next write race).
"""

from __future__ import annotations

import importlib
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memories_core.llms.scripted import ScriptedLLM
from memories_core.prompts.rule_following import rule_following_reply
from memories_core.testing._scenario import _BASE_TIME, _exchange
from memories_core.types import ChatMessage, Scope, Turn

if TYPE_CHECKING:
    from memories_core.testing.mechanism_contract import MechanismContract

__all__ = [
    "CRASH_USERS",
    "CrashRuns",
    "KillPoint",
    "crash_counts",
    "crash_number",
    "crash_text",
    "kill_at",
    "kill_writer_repeatedly",
    "random_kill_point",
    "run_crash_writer",
]

#: The two users the crash writers alternate between (exchange ``n`` goes to ``n % 2``).
CRASH_USERS: tuple[str, str] = ("crash-a", "crash-b")
_CRASH_RE = re.compile(r"^crash fact (\d+): ")
#: How long a writer may go without printing a line before it is taken to hang. Not a kill
#: time: a writer that hangs this long is killed and the run reports what it acknowledged.
HANG_SECONDS = 900.0


def crash_text(i: int) -> str:
    """The user's text of crash exchange ``i``."""
    return f"crash fact {i}: remember that box{i}x holds item {i}"


def crash_number(content: str) -> int | None:
    """The exchange number in a crash text, ``None`` for any other text."""
    match = _CRASH_RE.match(content)
    return int(match.group(1)) if match else None


def crash_counts(turns: Iterable[Turn], role: str) -> Counter[int]:
    """How often each crash exchange occurs among ``turns`` of ``role``."""
    numbers = (crash_number(t.content) for t in turns if t.role == role)
    return Counter(n for n in numbers if n is not None)


@dataclass(frozen=True)
class KillPoint:
    """Where a writer is killed: after its ``acks``-th ``ack`` line and ``events`` more lines.

    With ``acks=0`` the lines count from the start (``events=1``: right after ``opening``,
    so the kill lands while the memory opens and recovers; ``0``: before any line at all).
    """

    acks: int
    events: int


def random_kill_point(rng: random.Random, *, need_ack: bool = False) -> KillPoint:
    """A kill point drawn from ``rng``: at most three acks in, then up to three more lines.

    Args:
        rng: The test's seeded generator (the seed replays a run).
        need_ack: Whether the point must come after at least one acknowledgement.
    """
    acks = rng.randint(1 if need_ack else 0, 3)
    events = rng.randint(0, 3) if acks else rng.randint(1, 3)
    return KillPoint(acks, events)


def kill_at(proc: subprocess.Popen[str], point: KillPoint) -> list[str]:
    """Read ``proc``'s lines until ``point``, SIGKILL it there, and return the lines read.

    A writer that exits by itself before the point is not killed (its return code shows it);
    one that prints nothing for :data:`HANG_SECONDS` is killed as hung.
    """
    lines: list[str] = []
    reached = threading.Event()
    progress = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        acks = 0
        after = 0
        if point.acks == 0 and point.events == 0:
            reached.set()
        for raw in proc.stdout:
            line = raw.strip()
            lines.append(line)
            progress.set()
            if reached.is_set():
                continue
            if acks < point.acks:
                acks += line.startswith("ack ")
            else:
                after += 1
            if acks >= point.acks and after >= point.events:
                reached.set()
        reached.set()  # end of output: the writer exited

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while not reached.wait(timeout=HANG_SECONDS):
        if not progress.is_set():
            break  # no line for HANG_SECONDS: hung
        progress.clear()
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    reader.join(timeout=60)
    return list(lines)


@dataclass
class CrashRuns:
    """What the killed writers acknowledged, for the checks after the crashes.

    Attributes:
        acked: Numbers of the saves a writer acknowledged (``ack <n>``).
        in_flight: Numbers of the saves that may have been under way at a kill (present or
            absent, never in part).
        kills: How many writers were killed.
        seed: The seed of the run (``MEMORIES_CONTRACT_SEED`` replays it).
    """

    acked: set[int] = field(default_factory=set)
    in_flight: set[int] = field(default_factory=set)
    kills: int = 0
    seed: int = 0

    @property
    def where(self) -> str:
        """The run, for failure messages."""
        return f"seed {self.seed}, {self.kills} kills, {len(self.acked)} saves acknowledged"


def kill_writer_repeatedly(
    command: Callable[[int, int], Sequence[str]],
    folder: Path,
    *,
    kills: int,
    seed: int | None = None,
) -> CrashRuns:
    """Start a writer ``kills`` times, killing each at a random :class:`KillPoint`.

    Each writer continues the numbering where the last acknowledged save stopped (skipping
    the one that may have been in flight). The first writer is killed only after its first
    acknowledgement, so a run always has acknowledged saves to check, however slow the
    machine. Kill points come from ``seed`` (default: ``MEMORIES_CONTRACT_SEED`` or random).

    Args:
        command: ``(first exchange number, writer seed) -> argv`` of the writer process.
        folder: Where the writers' stderr files go.
        kills: How many writers to start and kill.
        seed: The run's seed.

    Raises:
        AssertionError: if a writer exits before its kill (its stderr tail is in the message)
            or no save was acknowledged.
    """
    if seed is None:
        seed = int(os.environ.get("MEMORIES_CONTRACT_SEED", random.randrange(2**32)))
    rng = random.Random(seed)
    runs = CrashRuns(seed=seed)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        "HF_HUB_OFFLINE": "1",
        "ANONYMIZED_TELEMETRY": "False",
    }
    start = 0
    for kill in range(kills):
        point = random_kill_point(rng, need_ack=kill == 0)
        stderr_file = folder / f"writer-{kill}.err"
        with stderr_file.open("w") as stderr:
            proc = subprocess.Popen(
                list(command(start, rng.randrange(2**32))),
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
            )
            lines = kill_at(proc, point)
        runs.kills += 1
        if proc.returncode != -signal.SIGKILL:
            raise AssertionError(
                f"the writer exited with {proc.returncode} before the kill at {point} "
                f"(seed {seed}):\n" + stderr_file.read_text()[-3000:]
            )
        acks = [int(line.split()[1]) for line in lines if line.startswith("ack ")]
        if kill == 0 and not acks:
            raise AssertionError(
                f"the first writer printed no ack before {HANG_SECONDS:.0f} s without output "
                f"(seed {seed}); its lines: {lines[-5:]}\n" + stderr_file.read_text()[-3000:]
            )
        runs.acked.update(acks)
        last = max(acks, default=start - 1)
        runs.in_flight.add(last + 1)
        start = last + 2
    assert runs.acked, f"no save was acknowledged before the kills (seed {seed})"
    return runs


def run_crash_writer(argv: Sequence[str]) -> None:
    """Child process of the mechanism crash test: save numbered exchanges until killed.

    Args:
        argv: Module and qualified name of the :class:`MechanismContract` subclass, the
            memory's path, the first exchange number and a random seed.

    Prints ``opening`` before the memory opens and ``open`` after, ``saving <n>`` before and
    ``ack <n>`` after each save of exchange ``n``, ``recall <n>`` before a recall (recalls
    update state: counts, strengths), and ``end <n>``/``ended <n>`` around an
    ``end_session``. The LLM follows the prompts after a small random delay, so kills also
    land inside derivations.
    """
    module_name, qualname, path, start, seed = argv
    owner: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        owner = getattr(owner, part)
    contract: MechanismContract = owner()
    rng = random.Random(int(seed))

    def slow_reply(messages: Sequence[ChatMessage]) -> str:
        time.sleep(rng.uniform(0.0, 0.01))
        return rule_following_reply(messages)

    print("opening", flush=True)
    memory: Any = contract.make_memory(Path(path), ScriptedLLM(default=slow_reply))
    print("open", flush=True)
    i = int(start)
    while True:
        scope = Scope(CRASH_USERS[i % 2], f"s{i // 4}")
        at = _BASE_TIME + timedelta(seconds=10 * i)
        print(f"saving {i}", flush=True)
        memory.save(_exchange(crash_text(i), f"crash fact {i}: noted, box{i}x", at), scope)
        print(f"ack {i}", flush=True)
        if i % 3 == 0:
            print(f"recall {i}", flush=True)
            memory.recall(crash_text(i - 1), scope, k=3)
        if i % 4 >= 2:
            print(f"end {i}", flush=True)
            memory.end_session(scope)
            print(f"ended {i}", flush=True)
        i += 1
