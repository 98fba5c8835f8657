"""Docstrings cite measurements: the cited files and sections exist and ship in the sdist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared/memories_core", "langchain_memories", "llamaindex_memories")


def _sources() -> list[tuple[Path, str]]:
    return [
        (path, path.read_text(encoding="utf-8"))
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
    ]


def test_every_cited_benchmark_script_exists() -> None:
    missing = {
        f"{path.relative_to(ROOT)}: {script}"
        for path, text in _sources()
        for script in re.findall(r"benchmarks/[a-z_0-9]+\.py", text)
        if not (ROOT / script).is_file()
    }
    assert not missing, sorted(missing)


def test_every_cited_benchmarks_section_is_a_heading() -> None:
    headings = [
        line.lstrip("#").strip()
        for line in (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    ]
    cited = {
        (path.relative_to(ROOT), title)
        for path, text in _sources()
        for title in re.findall(r'BENCHMARKS\.md,\s+"([^"]+)"', text)
    }
    assert cited  # the pattern still finds the citations
    stale = [
        (str(p), t)
        for p, t in cited
        if not any(h.startswith(" ".join(re.sub(r"\n\s*#:?", " ", t).split())) for h in headings)
    ]
    assert not stale, stale


def test_the_sdist_ships_what_docstrings_cite() -> None:
    rules = (ROOT / "MANIFEST.in").read_text(encoding="utf-8").splitlines()
    assert any(r.startswith("include ") and "BENCHMARKS.md" in r.split() for r in rules)
    assert "recursive-include benchmarks *.py *.md" in rules
    assert any(r.startswith("recursive-include docs ") for r in rules)
