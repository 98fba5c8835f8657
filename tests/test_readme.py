"""The README's Python snippets run as written (offline), so the README stays true."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
# The first block uses the default bundled embedder and a local folder: run the rest here.
OFFLINE = [b for b in BLOCKS if "HashingEmbedder" in b]


def test_readme_has_the_six_framework_patterns() -> None:
    assert len(OFFLINE) >= 6


@pytest.mark.parametrize("source", OFFLINE, ids=[f"block{i}" for i in range(len(OFFLINE))])
def test_readme_snippet_runs(source: str) -> None:
    exec(compile(source, "README.md", "exec"), {"__name__": "readme"})
