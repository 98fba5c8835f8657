"""The llm-memories command line, through main(argv) and once as a real console process."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memories_core import HistoryMemory, LLMError, Scope, SummaryMemory, Turn
from memories_core.cli import main
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.llms import ScriptedLLM
from memories_core.types import MemoryRecord, new_id

ROOT = Path(__file__).resolve().parents[1]


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


@pytest.fixture
def memory_path(tmp_path: Path) -> Path:
    path = tmp_path / "mem"
    with MemoryEngine(path=path, embedder=HashingEmbedder()) as engine:
        memory = HistoryMemory(engine=engine)
        memory.save([Turn("user", "I love Thai food"), Turn("assistant", "Noted")], Scope("alice"))
        memory.save([Turn("user", "I play chess")], Scope("bob"))
        engine.add_records(
            [MemoryRecord(new_id(), "alice", "memory", "Alice is vegan", engine.clock.now())]
        )
    return path


def cli(path: Path, *argv: str) -> tuple[int, str]:
    return run("--path", str(path), "--embedder", "hashing", "-q", *argv)


def test_users_show_search(memory_path: Path) -> None:
    code, out = cli(memory_path, "users")
    assert code == 0
    assert out.splitlines()[2:] == ["alice  3", "bob    1"]
    code, out = cli(memory_path, "show", "alice")
    lines = out.splitlines()
    assert lines[0].split() == ["created", "kind", "id", "state", "text"]
    assert "Alice is vegan" in lines[2]  # newest first
    assert "I love Thai food" in lines[-1]
    code, out = cli(memory_path, "show", "alice", "--kind", "memory")
    assert len(out.splitlines()) == 3
    code, out = cli(memory_path, "search", "alice", "thai food", "-k", "1")
    assert code == 0 and "I love Thai food" in out and "chess" not in out


def test_export_import_forget(memory_path: Path, tmp_path: Path) -> None:
    file = tmp_path / "alice.zip"
    assert cli(memory_path, "export", "alice", str(file))[0] == 0
    code, _ = cli(memory_path, "import", str(file))
    assert code == 2  # refused: alice is there
    code, out = cli(memory_path, "import", str(file), "--merge")
    assert code == 0 and "0 records (3 already present)" in out
    other = tmp_path / "other"
    code, out = cli(other, "import", str(file))
    assert code == 0 and "imported alice: 3 records" in out and "vectors reused" in out
    assert cli(other, "users")[1].splitlines()[2:] == ["alice  3"]
    code, _ = cli(memory_path, "forget", "alice")
    assert code == 2  # needs --yes
    assert cli(memory_path, "forget", "alice", "--record", "nope")[0] == 2
    code, out = cli(memory_path, "forget", "alice", "--yes")
    assert code == 0
    assert cli(memory_path, "users")[1].splitlines()[2:] == ["bob   1"]


def test_reindex_stats_and_errors(memory_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = cli(memory_path, "reindex")
    assert code == 0 and "reindexed" in out
    code, out = cli(memory_path, "stats")
    assert "users: 2" in out and "records: 4 (memory 1, turn 3)" in out
    assert "pending jobs: 0" in out and "disk: " in out and "index: ok" in out
    assert "llm usage: none recorded" in out
    code, _ = run("--path", str(memory_path), "--embedder", "hashing-64", "users")
    assert code == 2
    assert "hashing-256" in capsys.readouterr().err
    assert run("--path", str(memory_path / "nowhere"), "--embedder", "hashing", "users")[0] == 2
    # An unreachable PostgreSQL server: a clear error that shows no password.
    capsys.readouterr()
    dsn = "postgresql://u:pw-hidden@/y?host=/nonexistent-socket-dir&connect_timeout=2"
    assert run("--path", dsn, "users")[0] == 2
    err = capsys.readouterr().err
    assert "cannot connect to PostgreSQL" in err and "pw-hidden" not in err


def test_retry_pending_runs_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mem"
    with MemoryEngine(path=path, embedder=HashingEmbedder()) as engine:
        summary = SummaryMemory(engine=engine, llm=ScriptedLLM([], default=LLMError("down")))
        summary.save([Turn("user", "I moved to Porto")], Scope("alice", session_id="s1"))
        summary.end_session(Scope("alice", session_id="s1"))
        assert engine.pending("alice")
    import memories_core.mechanisms.summary as summary_module

    monkeypatch.setattr(
        summary_module, "default_llm", lambda: ScriptedLLM([], default="The user moved to Porto.")
    )
    code, out = cli(path, "retry-pending")
    assert code == 0 and "1 done, 0 still pending" in out
    code, out = cli(path, "show", "alice", "--kind", "summary")
    assert "moved to Porto" in out
    assert "no pending work" in cli(path, "retry-pending", "alice")[1]
    assert "llm usage (recorded by retry-pending): 1 calls, 0 failed" in cli(path, "stats")[1]


def test_console_script_smoke(memory_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'shared'}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "memories_core.cli",
            "--path",
            str(memory_path),
            "--embedder",
            "hashing",
            "users",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "alice" in done.stdout and "bob" in done.stdout
