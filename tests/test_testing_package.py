"""``memories_core.testing``: its public names, and the crash helpers' kill points."""

from __future__ import annotations

import itertools
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import memories_core.testing as testing
from memories_core.testing.crash import KillPoint, kill_at, kill_writer_repeatedly

#: Every name ``memories_core.testing`` exported when it was one module; they stay importable.
FORMER_NAMES = (
    "BAD_INPUT_CASES",
    "GARBAGE_MARKERS",
    "GARBAGE_REPLIES",
    "TRICKY_USER_IDS",
    "FlakyLLM",
    "GatedLLM",
    "MechanismContract",
    "TaughtLLM",
    "chroma_server",
    "run_crash_writer",
)


def test_public_names_are_pinned() -> None:
    assert sorted(testing.__all__) == sorted(
        [
            *FORMER_NAMES,
            "BadInputCase",
            "KillPoint",
            "ScriptedLLM",
            "StoreContract",
            "kill_writer_repeatedly",
            "rule_following_reply",
            "run_store_crash_writer",
        ]
    )
    for name in testing.__all__:
        assert getattr(testing, name) is not None, name


# A writer that prints a step, then blocks until its stdin has a line: it cannot run ahead of
# the parent, so each test knows exactly which lines a kill can follow.
STEPPER = """
import sys
print("opening", flush=True)
print("open", flush=True)
i = 0
while True:
    print(f"saving {i}", flush=True)
    print(f"ack {i}", flush=True)
    sys.stdin.readline()
    i += 1
"""


def _stepper() -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", STEPPER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("point", "expected"),
    [
        (KillPoint(acks=0, events=1), ["opening"]),
        (KillPoint(acks=1, events=0), ["opening", "open", "saving 0", "ack 0"]),
    ],
)
def test_kill_at_follows_the_writers_lines(point: KillPoint, expected: list[str]) -> None:
    """The kill comes right after the chosen line, with no clock involved."""
    proc = _stepper()
    lines = kill_at(proc, point)
    assert proc.returncode == -signal.SIGKILL
    # The writer may print a line or two more before the signal lands, never fewer.
    assert lines[: len(expected)] == expected


def test_kill_at_waits_for_a_slow_writer() -> None:
    """A writer that needs a push for every save is killed only after its second ack."""
    proc = _stepper()
    assert proc.stdin is not None
    proc.stdin.write("\n")  # lets the writer reach its second save
    proc.stdin.flush()
    lines = kill_at(proc, KillPoint(acks=2, events=0))
    assert proc.returncode == -signal.SIGKILL
    assert [line for line in lines if line.startswith("ack ")][:2] == ["ack 0", "ack 1"]


def test_a_writer_that_exits_before_its_kill_is_reported(tmp_path: Path) -> None:
    def command(start: int, seed: int) -> list[str]:
        return [sys.executable, "-c", "import sys; print('opening'); sys.exit(3)"]

    with pytest.raises(AssertionError, match="exited with 3 before the kill"):
        kill_writer_repeatedly(command, tmp_path, kills=1, seed=1)


def test_repeated_kills_continue_the_numbering_and_always_see_an_ack(tmp_path: Path) -> None:
    """Each writer starts after the last acknowledged save; the first run has an ack."""
    writer = (
        "import sys\nprint('opening', flush=True)\nprint('open', flush=True)\n"
        "i = int(sys.argv[1])\nwhile True:\n"
        "    print(f'saving {i}', flush=True)\n    print(f'ack {i}', flush=True)\n"
        "    i += 1\n"
    )
    starts: list[int] = []

    def command(start: int, seed: int) -> list[str]:
        starts.append(start)
        return [sys.executable, "-c", writer, str(start)]

    runs = kill_writer_repeatedly(command, tmp_path, kills=3, seed=random.randrange(2**32))
    assert runs.kills == 3 and runs.acked
    assert starts[0] == 0
    assert all(later > earlier for earlier, later in itertools.pairwise(starts))
    assert all(start - 1 in runs.in_flight for start in starts[1:])
