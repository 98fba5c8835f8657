"""Every benchmark script imports and prints its ``--help`` (the commands BENCHMARKS.md gives).

Most scripts take minutes and data this suite does not have, so their own tests run a few
of them on tiny inputs. This one reaches all of them: a module-level import that a rename
broke, an option declared twice, or a help text whose ``%`` argparse cannot format fails
here and not on the first reader who runs the command.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmark_scripts import BENCHMARKS, load_script

SCRIPTS = sorted(
    p.stem for p in BENCHMARKS.glob("*.py") if 'if __name__ == "__main__":' in p.read_text()
)


def test_the_scripts_are_found() -> None:
    assert len(SCRIPTS) >= 50
    assert {"latency", "locomo_retrieval", "rerank_late", "cold_recall"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_script_prints_its_help(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = load_script(name)
    monkeypatch.setattr(sys, "argv", [str(Path(module.__file__)), "--help"])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code in (0, None)
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "--help" in out
