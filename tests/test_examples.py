"""Every script in ``examples/`` runs as a new user would run it: a fresh process, no argument.

Each example runs in its own process with the repository on the path and the current folder in
a temporary directory. Examples that offer a scripted or fake model run on it (seconds);
examples whose default loads real models (MiniLM, SmolLM2-135M pinned by ``conftest``) are
marked ``slow``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.llms import ScriptedLLM

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

#: The example each test runs; a new example without a test here fails the check below.
COVERED = {
    "agent_with_memory_tools.py",
    "conditional_feedback.py",
    "langchain_agent.py",
    "llamaindex_chat.py",
    "memochat_topics.py",
    "memory_graph_assistant.py",
    "memorybank_companion.py",
    "personalized_doctor.py",
    "quickstart.py",
}


def run_example(name: str, *args: str, cwd: Path, timeout: float = 600) -> str:
    """Run ``examples/<name>`` with ``args`` from ``cwd``; its standard output (exit 0)."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "shared"), str(ROOT)]),
        "OPENAI_API_KEY": "",
        "OPENAI_BASE_URL": "",
    }
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name[:-3]}", EXAMPLES / name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_has_a_test() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == COVERED


def test_memorybank_companion_runs_from_a_fresh_clone(tmp_path: Path) -> None:
    """Gary's days ship with the examples: no data path is needed."""
    out = run_example("memorybank_companion.py", cwd=tmp_path)
    assert "== 10 days with Gary" in out and "== Global portrait" in out
    assert "forget (R = exp(-t/S) < 0.1) archived" in out


def test_memorybank_companion_reports_a_missing_data_file(tmp_path: Path) -> None:
    module = load_example("memorybank_companion.py")
    with pytest.raises(SystemExit, match="cannot read MemoryBank data"):
        module.load_user(tmp_path / "none.json", "Gary")
    with pytest.raises(SystemExit, match="has no user 'Nobody'"):
        module.load_user(module.DATA, "Nobody")


def test_conditional_feedback_runs_offline(tmp_path: Path) -> None:
    out = run_example("conditional_feedback.py", cwd=tmp_path)
    assert "model: rule-following stand-in (not a model)" in out
    assert "== Stored conditional records\n- Context:" in out
    assert "recalled before answering:\n(nothing)" not in out


def test_conditional_feedback_survives_a_garbled_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A model whose answers cannot be parsed (what --local met) is reported, not fatal."""
    module = load_example("conditional_feedback.py")
    llm = ScriptedLLM([], default="")  # no response text at all: a ParseError each turn
    module.run(llm, HashingEmbedder(), "garbled")
    out = capsys.readouterr().out
    assert out.count("(no usable answer: ParseError") == 3
    assert "decisions pending: 3" in out


def test_langchain_agent_memory_does_not_snowball(tmp_path: Path) -> None:
    """Each run stores its two exchanges; the fake model's answers copy no memory."""
    path = tmp_path / "memory"
    first = run_example("langchain_agent.py", "--path", str(path), cwd=tmp_path)
    assert "recalled: nothing yet" in first
    second = run_example("langchain_agent.py", "--path", str(path), cwd=tmp_path)
    assert "8 turns of 'alice' stored" in second
    assert "my prompt carried: " in second and "vegetarian" in second
    with MemoryEngine(path=path, embedder=HashingEmbedder()) as engine:
        texts = [r.text for r in engine.records("alice")]
    assert sum("vegetarian" in t for t in texts) == 2  # the user's own two turns only
    assert max(len(t) for t in texts) < 120


def test_llamaindex_chat_runs_offline(tmp_path: Path) -> None:
    path = tmp_path / "memory"
    for _ in range(2):  # the demo starts over on every run
        out = run_example("llamaindex_chat.py", "--path", str(path), cwd=tmp_path)
        assert "[fake LLM sees]" in out and "vegetarian" in out
    with MemoryEngine(path=path, embedder=HashingEmbedder()) as engine:
        texts = [r.text for r in engine.records("alice")]
    assert sum("vegetarian" in t for t in texts) == 1


def test_memochat_topics_runs_offline(tmp_path: Path) -> None:
    out = run_example("memochat_topics.py", cwd=tmp_path)
    assert "evidence chosen:" in out and "LLM calls:" in out and "Japan" in out
    out = run_example("memochat_topics.py", "--llm-free", cwd=tmp_path)
    assert "mode: llm_free" in out.replace("-", "_") or "evidence chosen:" in out


def test_agent_with_memory_tools_runs_offline(tmp_path: Path) -> None:
    out = run_example("agent_with_memory_tools.py", "--path", str(tmp_path / "m"), cwd=tmp_path)
    assert "--- run 2" in out and "From memory:" in out


@pytest.mark.slow  # about a minute of policy training; test_emg runs its main() in-process
def test_memory_graph_assistant_runs_offline(tmp_path: Path) -> None:
    out = run_example("memory_graph_assistant.py", str(tmp_path / "graph"), cwd=tmp_path)
    assert "A: " in out and "01:30" in out
    assert (tmp_path / "graph" / "secretary_graph.png").stat().st_size > 10_000


def test_personalized_doctor_runs_on_a_tiny_model(tmp_path: Path) -> None:
    out = run_example("personalized_doctor.py", "--tiny", "--hashing", "--steps", "2", cwd=tmp_path)
    assert "=== after session 4" in out and "-- with MaLP" in out
    assert "working memory (0 notes" not in out  # the coordinator's work is waited for
    assert "long-term memory (0)" not in out.split("=== after session 4")[1]


@pytest.mark.slow
def test_personalized_doctor_runs_with_no_argument(tmp_path: Path) -> None:
    out = run_example("personalized_doctor.py", "--steps", "2", cwd=tmp_path, timeout=1800)
    assert "-- with MaLP" in out


@pytest.mark.slow
def test_conditional_feedback_runs_on_the_local_model(tmp_path: Path) -> None:
    out = run_example("conditional_feedback.py", "--local", cwd=tmp_path, timeout=1800)
    assert "model: local smollm2-135m" in out and "cost:" in out


@pytest.mark.slow
def test_quickstart_runs_with_no_argument(tmp_path: Path) -> None:
    out = run_example("quickstart.py", cwd=tmp_path, timeout=1800)
    assert "recalled before answering:" in out
    assert (tmp_path / ".quickstart_memory").is_dir()
