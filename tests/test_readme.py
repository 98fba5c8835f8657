"""The offline Python snippets of the README and of docs/ run as written and print as shown."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

# The snippets run as users run them: derivations in the background (they call flush()).
pytestmark = pytest.mark.background

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
# A python block, optionally followed by a ```text block with exactly what it prints.
BLOCK = re.compile(r"```python\n(.*?)```(?:\s*\n```text\n(.*?)```)?", re.S)


def _offline_blocks(page: Path) -> list[tuple[str, str]]:
    """Blocks that run offline: those on the deterministic embedder (the others need models)."""
    blocks = BLOCK.findall(page.read_text(encoding="utf-8"))
    return [(code, printed) for code, printed in blocks if "HashingEmbedder" in code]


OFFLINE = [
    (page.relative_to(ROOT).as_posix(), i, code, printed)
    for page in PAGES
    for i, (code, printed) in enumerate(_offline_blocks(page))
]


def test_readme_has_one_example_per_framework() -> None:
    readme = [code for page, _, code, _ in OFFLINE if page == "README.md"]
    assert any("langchain_memories" in code for code in readme)
    assert any("llamaindex_memories" in code for code in readme)


def test_docs_show_the_framework_patterns() -> None:
    pages = {page for page, _, _, _ in OFFLINE}
    assert {"docs/langchain.md", "docs/llamaindex.md"} <= pages
    assert len(OFFLINE) >= 20


def test_snippets_that_print_deterministic_output_show_it() -> None:
    assert any(printed for _, _, _, printed in OFFLINE)


@pytest.mark.parametrize(
    ("source", "printed"),
    [(code, printed) for _, _, code, printed in OFFLINE],
    ids=[f"{page}:{i}" for page, i, _, _ in OFFLINE],
)
def test_snippet_runs(source: str, printed: str) -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, "snippet", "exec"), {"__name__": "readme"})
    if printed:
        assert out.getvalue().strip() == printed.strip()
