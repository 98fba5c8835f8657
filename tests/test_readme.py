"""The README's Python snippets run as written (offline) and print what the README shows."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

# The snippets run as users run them: derivations in the background (they call flush()).
pytestmark = pytest.mark.background

README = Path(__file__).resolve().parents[1] / "README.md"
# A python block, optionally followed by a ```text block with exactly what it prints.
BLOCKS = re.findall(
    r"```python\n(.*?)```(?:\s*\n```text\n(.*?)```)?", README.read_text(encoding="utf-8"), re.S
)
# The first block uses the default bundled embedder and a local folder: run the rest here.
OFFLINE = [(code, printed) for code, printed in BLOCKS if "HashingEmbedder" in code]


def test_readme_has_the_framework_patterns() -> None:
    assert len(OFFLINE) >= 7


def test_snippets_that_print_deterministic_output_show_it() -> None:
    assert any(printed for _, printed in OFFLINE)


@pytest.mark.parametrize(
    ("source", "printed"), OFFLINE, ids=[f"block{i}" for i in range(len(OFFLINE))]
)
def test_readme_snippet_runs(source: str, printed: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "README.md", "exec"), {"__name__": "readme"})
    if printed:
        assert out.getvalue().strip() == printed.strip()
