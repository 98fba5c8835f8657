"""The onnxruntime query pass of SentenceTransformerEmbedder: same vectors, or torch."""

from __future__ import annotations

import importlib.util
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from memories_core.embedders import SentenceTransformerEmbedder
from memories_core.errors import ConfigurationError

needs_exporter = pytest.mark.skipif(
    importlib.util.find_spec("onnx") is None or importlib.util.find_spec("onnxruntime") is None,
    reason="the fast extra (onnx, onnxruntime) is not installed",
)
QUERIES = ["", "ok", "Where did Ana adopt her grey cat Pixel last spring?", "long " * 600]


def test_query_runtime_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="query_runtime"):
        SentenceTransformerEmbedder(query_runtime="onnx")  # type: ignore[arg-type]


@pytest.mark.slow
@needs_exporter
def test_queries_run_in_onnxruntime_with_torchs_vectors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_MEMORIES_CACHE", str(tmp_path))
    fast = SentenceTransformerEmbedder()
    torch_only = SentenceTransformerEmbedder(query_runtime="torch")
    assert fast.query_runtime == "torch"  # nothing exported yet
    errors: list[BaseException] = []

    def busy(n: int) -> None:  # the caller's threads keep embedding during the export
        try:
            for i in range(15):
                fast.embed_documents([f"turn {n} {i} about the garden"])
                fast.embed_query(f"what about the garden {n} {i}")
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=busy, args=(n,)) for n in range(3)]
    for worker in workers:
        worker.start()
    assert fast.prepare_query_runtime() == "onnxruntime"
    for worker in workers:
        worker.join()
    assert errors == []
    for text in QUERIES:
        want = torch_only.embed_query(text)
        got = fast.embed_query(text)
        assert got.dtype == np.float32 and got.shape == (384,)
        assert float(np.abs(got - want).max()) < 1e-5
    assert torch_only.prepare_query_runtime() == "torch"
    assert fast.usage.calls >= len(QUERIES)  # queries are counted either way
    (export,) = (tmp_path / "onnx-query").glob("*/model.onnx")
    stamp = export.stat().st_mtime_ns
    again = SentenceTransformerEmbedder()
    assert again.prepare_query_runtime() == "onnxruntime"
    assert export.stat().st_mtime_ns == stamp  # the cached export is reused, not redone
    # a damaged cached file is exported again, and queries stay right meanwhile
    export.write_bytes(b"not an onnx graph")
    damaged = SentenceTransformerEmbedder()
    assert damaged.prepare_query_runtime() == "onnxruntime"
    assert (
        float(np.abs(damaged.embed_query(QUERIES[2]) - fast.embed_query(QUERIES[2])).max()) < 1e-6
    )


@pytest.mark.slow
def test_without_the_exporter_queries_stay_on_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLM_MEMORIES_CACHE", str(tmp_path))
    monkeypatch.setattr(
        "memories_core.embedders.sentence_transformer.onnx_export_available", lambda: False
    )
    embedder = SentenceTransformerEmbedder()
    vector = embedder.embed_query(QUERIES[2])
    assert embedder.prepare_query_runtime() == "torch"
    assert float(np.linalg.norm(vector)) == pytest.approx(1.0, abs=1e-5)
    assert not (tmp_path / "onnx-query").exists()  # nothing was exported


@pytest.mark.slow
@needs_exporter
def test_an_export_that_fails_leaves_torch_and_logs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import torch

    monkeypatch.setenv("LLM_MEMORIES_CACHE", str(tmp_path))

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError("exporter refused the model")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    embedder = SentenceTransformerEmbedder()
    with caplog.at_level(logging.INFO, logger="memories_core.embedders.query_onnx"):
        assert embedder.prepare_query_runtime() == "torch"
    assert "exporter refused the model" in caplog.text
    assert embedder.embed_query(QUERIES[2]).shape == (384,)  # torch answers, nothing raised
    assert not list((tmp_path / "onnx-query").rglob("*.onnx*"))  # no partial file is left


def test_an_export_cut_short_leaves_no_file_for_long(tmp_path: Path) -> None:
    import os
    import time

    from memories_core.embedders.query_onnx import _drop_stale

    old, fresh = tmp_path / "a.onnx.tmp", tmp_path / "b.onnx.tmp"
    for path in (old, fresh):
        path.write_bytes(b"partial")
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    _drop_stale(tmp_path)
    assert not old.exists() and fresh.exists()  # a fresh one may be another process's
