"""``benchmarks/derive_vectors.py``: a kept store's rows derived on a copy and compared."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmark_scripts import load_script
from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.retrieval import late_interaction
from memories_core.retrieval.late_interaction import (
    LateInteractionReranker,
    late_interaction_pipeline,
)
from memories_core.token_vectors import TokenVectorStore, encoder_tag
from reranker_scenarios import NARROW, FakeEncoder, NarrowingEncoder


def _kept_store(folder: Path, user: str) -> None:
    """A store whose rows are all of the "wide" encoder, as before an upgrade."""
    reranker = LateInteractionReranker(FakeEncoder("wide"), candidates=3, pool=10)
    pipeline = late_interaction_pipeline(reranker=reranker)
    with HistoryMemory(path=folder, embedder=HashingEmbedder(), pipeline=pipeline) as memory:
        for i in range(20):
            memory.save([Turn("user", f"turn {i}: the cat, the garden, day {i}")], Scope(user))
        memory.flush()


def test_the_copy_is_derived_and_the_kept_store_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = load_script("derive_vectors")
    kept = tmp_path / "kept"
    _kept_store(kept / "late", bench.TARGET)
    encoder = NarrowingEncoder()

    def reranker(**_: Any) -> LateInteractionReranker:
        return LateInteractionReranker(encoder, candidates=3, pool=10)

    monkeypatch.setattr(sys.modules["latency"], "OUT", tmp_path / "out")
    monkeypatch.setattr(bench, "real_embedder", lambda threads: HashingEmbedder())
    monkeypatch.setattr(bench, "plot", lambda *a, **k: None)
    monkeypatch.setattr(late_interaction, "late_interaction_reranker", reranker)
    bench.main(["--store", str(kept), "--sample", "8", "--queries", "5", "--name", "d"])
    result = json.loads((tmp_path / "out" / "d.json").read_text())
    assert result["records"] == 20
    assert result["rebuild"]["rows_made"] == 20
    assert result["rebuild"]["dims_after"] == [NARROW]
    assert result["encoder_after"] == [encoder_tag("narrow")]
    sample = result["sample"]
    assert sample["records"] == 8 and sample["queries"] == 5
    # The fake's derivation is exactly its encoding: only int8 rounding can differ.
    assert sample["token_cosine_mean"] > 0.999
    assert sample["maxsim_abs_diff_max"] < 0.05
    # Only the sample went through the "model"; the rebuild derived everything.
    assert len(encoder.documents) == 8
    # The kept store still has its old rows; the copy is beside it.
    with HistoryMemory(path=kept / "late", embedder=HashingEmbedder()) as original:
        store = original.engine.store
        assert isinstance(store, TokenVectorStore)
        rows = store.token_vector_rows(bench.TARGET)
        assert {row.encoder for row in rows} == {encoder_tag("wide")}
    assert (tmp_path / "kept_derived" / "late" / "records.sqlite3").is_file()
    assert "| 20 |" in (tmp_path / "out" / "d.md").read_text()


def test_a_folder_without_a_store_is_refused(tmp_path: Path) -> None:
    bench = load_script("derive_vectors")
    with pytest.raises(SystemExit, match="no store"):
        bench.main(["--store", str(tmp_path)])
