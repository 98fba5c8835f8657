"""The llm-memories command line, through main(argv) and once as a real console process."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from memories_core import HistoryMemory, LLMError, Scope, SummaryMemory, Turn
from memories_core.cli import build_parser, main
from memories_core.embedders import HashingEmbedder
from memories_core.engine import JobPolicy, MemoryEngine
from memories_core.llms import ScriptedLLM
from memories_core.types import MemoryRecord, new_id

ROOT = Path(__file__).resolve().parents[1]
CONSOLE = [sys.executable, "-m", "memories_core.cli"]


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


@pytest.mark.parametrize("user", ["", "   ", "a\x00b"])
def test_forget_refuses_a_bad_user_id_before_asking_for_confirmation(
    memory_path: Path, user: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli(memory_path, "forget", user)[0] == 2
    error = capsys.readouterr().err
    assert "user" in error and "--yes" not in error
    assert cli(memory_path, "users")[1].splitlines()[2:] == ["alice  3", "bob    1"]


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


def test_stats_counts_parked_jobs_and_retry_pending_runs_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "mem"
    garbage = ScriptedLLM([], default="@@@ not a summary")
    with MemoryEngine(path=path, embedder=HashingEmbedder(), jobs=JobPolicy(max_attempts=1)) as e:
        summary = SummaryMemory(engine=e, llm=garbage)
        summary.save([Turn("user", "I moved to Porto")], Scope("alice", session_id="s1"))
        summary.end_session(Scope("alice", session_id="s1"))
        assert summary.status("alice").parked == 1
    assert "pending jobs: 1 (summary 1), 1 failed at least once, 1 parked" in cli(path, "stats")[1]
    import memories_core.mechanisms.summary as summary_module

    monkeypatch.setattr(
        summary_module, "default_llm", lambda: ScriptedLLM([], default="The user moved to Porto.")
    )
    assert "1 done, 0 still pending" in cli(path, "retry-pending")[1]
    assert "pending jobs: 0\n" in cli(path, "stats")[1]


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


# -- what a new user met: ids, hints, headers, quiet, paths, help, bad values, files ---------


def test_ids_that_show_prints_are_what_forget_takes(memory_path: Path) -> None:
    out = cli(memory_path, "show", "alice", "--kind", "memory")[1]
    shown = out.splitlines()[2].split()[3]
    assert len(shown) == 12
    code, out = cli(memory_path, "forget", "alice", "--record", shown)
    assert code == 0 and "deleted 1 record(s) of alice" in out
    assert "Alice is vegan" not in cli(memory_path, "show", "alice")[1]
    # --full-ids prints whole ids; any unique prefix of 4 or more characters names a record.
    full = cli(memory_path, "show", "alice", "--full-ids")[1].splitlines()[2].split()[3]
    assert len(full) == 32
    assert cli(memory_path, "forget", "alice", "--record", full[:6])[0] == 0
    assert len(cli(memory_path, "show", "alice")[1].splitlines()) == 3


def test_short_or_shared_prefixes_delete_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mem"
    with MemoryEngine(path=path, embedder=HashingEmbedder()) as engine:
        now = engine.clock.now()
        engine.add_records(
            [
                MemoryRecord("note-1001", "ann", "memory", "first note", now),
                MemoryRecord("note-1002", "ann", "memory", "second note", now),
            ]
        )
    assert cli(path, "forget", "ann", "--record", "note-10")[0] == 2
    assert "match several records" in capsys.readouterr().err
    assert cli(path, "forget", "ann", "--record", "not")[0] == 2  # under 4 characters
    assert cli(path, "forget", "ann", "--record", "note-1001", "--record", "zzzz")[0] == 2
    assert "no record zzzz; nothing deleted" in capsys.readouterr().err
    assert cli(path, "users")[1].splitlines()[2:] == ["ann   2"]
    assert cli(path, "forget", "ann", "--record", "note-1002")[0] == 0
    assert "first note" in cli(path, "show", "ann")[1]


def test_error_hints_name_flags_not_python_arguments(
    memory_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "alice.zip"
    assert cli(memory_path, "export", "alice", str(file))[0] == 0
    capsys.readouterr()
    assert cli(memory_path, "import", str(file))[0] == 2
    err = capsys.readouterr().err
    assert "--merge" in err and "forget alice --yes" in err and "on_conflict" not in err
    assert run("--path", str(memory_path), "--embedder", "hashing-64", "users")[0] == 2
    err = capsys.readouterr().err
    assert "run again with --embedder hashing-256" in err
    assert "allow_embedder_change" not in err and "Traceback" not in err


def test_every_table_has_a_header(memory_path: Path) -> None:
    for argv, header in [
        (["users"], ["user", "records"]),
        (["show", "alice"], ["created", "kind", "id", "state", "text"]),
        (["show", "nobody"], ["created", "kind", "id", "state", "text"]),
        (["search", "alice", "chess"], ["score", "kind", "id", "text"]),
        (["search", "nobody", "chess"], ["score", "kind", "id", "text"]),
    ]:
        lines = cli(memory_path, *argv)[1].splitlines()
        assert lines[0].split() == header, argv
        assert set(lines[1].replace(" ", "")) == {"-"}, argv
    out = cli(memory_path, "show", "alice", "--limit", "1")[1]
    assert "(1 of 3 records shown; --limit N for more)" in out


def test_quiet_silences_progress_bars_in_either_position(
    memory_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loud = run("--path", str(memory_path), "--embedder", "hashing", "reindex")
    assert loud[0] == 0 and "indexing" in capsys.readouterr().err
    for argv in (
        ["--path", str(memory_path), "--embedder", "hashing", "-q", "reindex"],
        ["reindex", "--path", str(memory_path), "--embedder", "hashing", "--quiet"],
    ):
        code, out = run(*argv)
        assert code == 0 and "reindexed 4 records" in out
        assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_quiet_silences_the_model_loading_bar(memory_path: Path, tmp_path: Path) -> None:
    """MiniLM's "Loading weights" bar is drawn by transformers; ``-q`` turns it off."""
    file = tmp_path / "alice.zip"
    assert cli(memory_path, "export", "alice", str(file))[0] == 0
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'shared'}{os.pathsep}{ROOT}"}
    argv = [sys.executable, "-m", "memories_core.cli", "--path", str(tmp_path / "minilm")]
    done = subprocess.run(
        [*argv, "-q", "import", str(file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "re-embedded" in done.stdout
    assert "Loading weights" not in done.stderr and "it/s" not in done.stderr


def test_stats_prints_the_path_as_given(memory_path: Path) -> None:
    out = cli(memory_path, "stats")[1]
    assert out.splitlines()[0] == f"path: {memory_path}"
    assert "PosixPath" not in out


def test_every_command_describes_its_arguments() -> None:
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert set(commands.choices) == {
        "users",
        "show",
        "search",
        "export",
        "import",
        "forget",
        "reindex",
        "retry-pending",
        "stats",
    }
    for name, command in commands.choices.items():
        assert command.description, name
        for action in command._actions:
            assert action.help and action.help != argparse.SUPPRESS, (name, action.dest)
    help_text = io.StringIO()
    commands.choices["forget"].print_help(help_text)
    assert "unique prefix" in help_text.getvalue()


@pytest.mark.parametrize("value", ["hashing-x", "hashing-4", "bert", "hashing-"])
def test_a_bad_embedder_value_is_a_usage_error(
    memory_path: Path, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--path", str(memory_path), "--embedder", value, "users"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --embedder: unknown embedder" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["show", "alice", "--limit", "-1"], "--limit"),
        (["show", "alice", "--limit", "0"], "--limit"),
        (["show", "alice", "--width", "0"], "--width"),
        (["search", "alice", "vegan", "-k", "0"], "-k"),
        (["search", "alice", "vegan", "-k", "five"], "-k"),
        (["search", "alice", "vegan", "--width", "-3"], "--width"),
    ],
)
def test_counts_below_one_are_usage_errors(
    memory_path: Path, argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--limit -1`` printed "(-1 of 1 records shown)"; every count is now checked."""
    with pytest.raises(SystemExit) as exit_:
        main(["--path", str(memory_path), "--embedder", "hashing", "-q", *argv])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}:" in err and "Traceback" not in err


def test_export_to_a_folder_is_refused_and_leaves_nothing(
    memory_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    assert cli(memory_path, "export", "alice", str(folder))[0] == 2
    assert "is a folder; give the file to write" in capsys.readouterr().err
    assert list(folder.iterdir()) == [] and sorted(tmp_path.iterdir()) == [memory_path, folder]
    # A parent that is a file: an error message, not a traceback.
    (tmp_path / "plain").write_text("x")
    assert cli(memory_path, "export", "alice", str(tmp_path / "plain" / "a.zip"))[0] == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_failed_export_leaves_no_partial_file(
    memory_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memories_core.portable as portable

    def disk_full(memory: object, user_id: str, path: Path) -> Path:
        Path(f"{path}.tmp").write_bytes(b"PK partial")  # the writer got this far
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(portable, "export_user", disk_full)
    assert cli(memory_path, "export", "alice", str(tmp_path / "a.zip"))[0] == 2
    assert not (tmp_path / "a.zip.tmp").exists() and not (tmp_path / "a.zip").exists()


def test_import_of_a_bad_file_creates_no_memory(
    memory_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "alice.zip"
    assert cli(memory_path, "export", "alice", str(good))[0] == 0
    garbage = tmp_path / "garbage.zip"
    garbage.write_bytes(b"not a zip at all")
    no_manifest = tmp_path / "no_manifest.zip"
    with zipfile.ZipFile(no_manifest, "w") as archive:
        archive.writestr("records.jsonl", "")
    future = tmp_path / "future.zip"  # passes the first check; import_user refuses it
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(future, "w") as dst:
        for item in src.infolist():
            data = src.read(item)
            if item.filename == "manifest.json":
                data = json.dumps({**json.loads(data), "version": 99}).encode()
            dst.writestr(item, data)
    empty = tmp_path / "empty"
    empty.mkdir()
    for bad in (garbage, no_manifest, future, tmp_path / "missing.zip", tmp_path):
        for target in (tmp_path / "new" / "mem", empty):
            capsys.readouterr()
            assert cli(target, "import", str(bad))[0] == 2, bad
            assert "Traceback" not in capsys.readouterr().err
            assert not (tmp_path / "new").exists() and list(empty.iterdir()) == [], bad
    # A retry with the good file works. In its own process, as a user would run it: this
    # process's embedded Chroma client still caches the folder it saw created and removed.
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'shared'}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [*CONSOLE, "--path", str(empty), "--embedder", "hashing", "-q", "import", str(good)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "imported alice: 3 records" in done.stdout
