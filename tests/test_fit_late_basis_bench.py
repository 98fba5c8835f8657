"""``benchmarks/fit_late_basis.py``: the corpus it reads and the basis it writes."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from benchmark_scripts import load_script
from reranker_scenarios import needs_bundled


def _datasets(folder: Path) -> Path:
    """A tiny MemoryBank file and MemoChat file in the datasets' layouts."""
    (folder / "memorybank").mkdir(parents=True)
    (folder / "memochat").mkdir()
    history = {
        "2023-04-27": [
            {"query": "I love painting and tea.", "response": "Painting and tea, lovely."},
            {"query": "I love painting and tea.", "response": "Tell me about your piano."},
        ]
    }
    users = {"Emily": {"name": "Emily", "history": history}}
    (folder / "memorybank" / "memory_bank_en.json").write_text(json.dumps(users))
    prompt = "```\nshort\nuser: my sister moved to Lisbon last spring for a new job.\n```"
    lines = [json.dumps({"question_id": str(i), "text": prompt}) for i in range(3)]
    (folder / "memochat" / "test.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def test_the_corpus_is_every_distinct_text_and_no_fence_or_short_line(tmp_path: Path) -> None:
    bench = load_script("fit_late_basis")
    data = _datasets(tmp_path / "data")
    assert bench.memorybank_texts(data) == [
        "I love painting and tea.",
        "Painting and tea, lovely.",
        "Tell me about your piano.",
    ]
    # Fences and lines of 30 characters or less are prompt scaffolding, not dialogue.
    assert bench.memochat_texts(data, 10, 0) == [
        "user: my sister moved to Lisbon last spring for a new job."
    ]
    assert bench.memochat_texts(data, 0, 0) == []


@pytest.mark.slow
@needs_bundled
def test_the_written_basis_is_orthonormal_and_strongest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = load_script("fit_late_basis")
    monkeypatch.setattr("latency.OUT", tmp_path / "out")
    data = _datasets(tmp_path / "data")
    target = tmp_path / "basis.npy"
    bench.main(["--data", str(data), "--basis", str(target), "--name", "basis_test"])
    basis = np.load(target, allow_pickle=False)
    assert basis.shape == (384, 384) and basis.dtype == np.float32
    assert np.allclose(basis.T @ basis, np.eye(384), atol=1e-3)
    report = json.loads((tmp_path / "out" / "basis_test.json").read_text())
    energy = [report["energy"][w] for w in ("32", "64", "128", "384")]
    assert all(later >= earlier - 1e-9 for earlier, later in itertools.pairwise(energy))
    assert energy[-1] == pytest.approx(1.0)
    assert not list(tmp_path.glob("*.tmp.npy"))  # written through a temporary file
