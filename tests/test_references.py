"""What the code cites exists: repository files, and the BENCHMARKS.md sections it quotes.

Docstrings justify defaults with measurements ("BENCHMARKS.md, "Retrieval quality"",
``benchmarks/rerank_late.py``). A renamed section or a removed script would leave a claim
that nobody can check, so every such reference is resolved here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE = [
    *sorted((ROOT / "shared" / "memories_core").rglob("*.py")),
    *sorted((ROOT / "langchain_memories").rglob("*.py")),
    *sorted((ROOT / "llamaindex_memories").rglob("*.py")),
]
#: A repository path named in code: docs, benchmark scripts and outputs, examples.
PATH = re.compile(r"\b((?:docs|benchmarks|examples)/[\w./-]+\.(?:py|md|json|png|txt))")
#: ``BENCHMARKS.md, "Section"`` (the quote may follow a few words, across a line break).
SECTION = re.compile(r'BENCHMARKS\.md[^"\n]{0,40}?"([^"]+)"')


def _flat(text: str) -> str:
    """Text with line breaks (and the comment or docstring indent after them) joined."""
    return re.sub(r"\s*\n\s*(?:#:?\s*)?", " ", text)


def _headings() -> list[str]:
    lines = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
    return [line.lstrip("#").strip().lower() for line in lines if line.startswith("#")]


def cited_paths() -> dict[str, set[str]]:
    """Repository paths named in the package code -> the modules naming them."""
    found: dict[str, set[str]] = {}
    for module in CODE:
        for match in PATH.finditer(module.read_text(encoding="utf-8")):
            found.setdefault(match.group(1), set()).add(str(module.relative_to(ROOT)))
    return found


def cited_sections() -> dict[str, set[str]]:
    """BENCHMARKS.md section names quoted in the package code -> the modules quoting them."""
    found: dict[str, set[str]] = {}
    for module in CODE:
        for match in SECTION.finditer(_flat(module.read_text(encoding="utf-8"))):
            found.setdefault(match.group(1), set()).add(str(module.relative_to(ROOT)))
    return found


def test_every_cited_repository_file_exists() -> None:
    paths = cited_paths()
    assert paths, "the reader finds the citations"
    assert {p: m for p, m in paths.items() if not (ROOT / p).exists()} == {}


def test_every_quoted_benchmarks_section_exists() -> None:
    sections = cited_sections()
    assert len(sections) >= 5, "the reader finds the quoted sections"
    headings = _headings()
    missing = {
        name: modules
        for name, modules in sections.items()
        if not any(name.lower() in heading for heading in headings)
    }
    assert missing == {}


def test_the_readers_find_a_planted_citation() -> None:
    text = 'x = 1  #: chosen on LoCoMo (BENCHMARKS.md,\n    #: "No such section"); see docs/nope.md'
    assert [m.group(1) for m in SECTION.finditer(_flat(text))] == ["No such section"]
    assert [m.group(1) for m in PATH.finditer(text)] == ["docs/nope.md"]


def test_every_benchmark_script_is_in_the_index() -> None:
    index = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py"))
    assert [name for name in scripts if f"`{name}`" not in index] == []


def _strings(value: object) -> list[str]:
    if isinstance(value, dict):
        return [s for item in value.values() for s in _strings(item)]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return [value] if isinstance(value, str) else []


def test_benchmark_results_record_no_machine_path() -> None:
    """Results name paths as anyone can read them (relative to the repository, ``<tmp>``)."""
    import json

    absolute = re.compile(r"^/[\w.-]+/")
    found = {
        str(path.relative_to(ROOT)): hits
        for path in sorted((ROOT / "benchmarks" / "out").glob("*.json"))
        if (hits := [s for s in _strings(json.loads(path.read_text())) if absolute.match(s)])
    }
    assert not found, found


def _machine_info() -> Any:
    """The benchmarks' ``machine_info`` module (the scripts' folder is not a package)."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import machine_info
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return machine_info


def test_portable_path_is_relative_to_the_repository(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tempfile

    info = _machine_info()
    command_line, portable_path = info.command_line, info.portable_path
    data = ROOT.parent / "shared" / "datasets" / "x.json"
    assert portable_path(data) == "../shared/datasets/x.json"
    assert portable_path("relative/kept.json") == "relative/kept.json"
    assert portable_path(tmp_path / "a.db").startswith("<tmp>/")
    assert portable_path("/srv/kept/late100k_store") == "<local>/late100k_store"
    # A clone inside the temporary folder (a CI checkout) still records ``../shared``.
    monkeypatch.setattr(tempfile, "tempdir", str(ROOT.parent))
    assert portable_path(data) == "../shared/datasets/x.json"
    assert portable_path(ROOT / "benchmarks" / "out") == "benchmarks/out"
    assert command_line("benchmarks/x.py", ["--data", str(data)]) == (
        "python benchmarks/x.py --data ../shared/datasets/x.json"
    )
    # A database address names this machine's sockets and may hold credentials.
    assert command_line(
        "benchmarks/x.py", ["--dsn", "postgresql://u:secret@/db?host=/tmp/s", "--postgres-dsn=h"]
    ) == ("python benchmarks/x.py --dsn <dsn> --postgres-dsn=<dsn>")


def test_every_benchmark_records_one_machine_description() -> None:
    """One ``machine()`` for every script: the keys the reports read, no heavy import."""
    import sys

    info = _machine_info()
    heavy = {"torch", "chromadb", "sentence_transformers"} - set(sys.modules)
    m = info.machine()
    assert {"nproc", "cpu", "ram", "ram_gib", "python", "sqlite", "os", "versions", "code"} <= set(
        m
    )
    assert isinstance(m["nproc"], int) and m["nproc"] >= 1
    assert set(m["versions"]) == set(info.VERSIONED)
    assert not heavy & set(sys.modules)  # versions come from metadata, not imports
    line = info.machine_line(m)
    assert m["cpu"] in line and f"{m['nproc']} CPUs" in line and m["sqlite"] in line
    scripts = ROOT / "benchmarks"
    defining = [p.name for p in scripts.glob("*.py") if "\ndef machine(" in p.read_text()]
    assert defining == ["machine_info.py"], defining


def test_the_recorded_code_is_the_imported_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run with another checkout's package first on the path records that checkout."""
    import subprocess
    import sys
    import types

    repo_state = _machine_info().repo_state
    here = repo_state()
    assert here and "benchmark scripts" not in here  # the package is this checkout's
    other = tmp_path / "pinned"
    (other / "shared" / "memories_core").mkdir(parents=True)
    (other / "shared" / "memories_core" / "__init__.py").write_text("")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(other)]
    subprocess.run([*git[:5], "init", "-q", str(other)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "pinned"], check=True)
    commit = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    fake = types.ModuleType("memories_core")
    fake.__file__ = str(other / "shared" / "memories_core" / "__init__.py")
    monkeypatch.setitem(sys.modules, "memories_core", fake)
    state = repo_state()
    assert state.startswith(commit) and f"(benchmark scripts at {here.split()[0]}" in state
