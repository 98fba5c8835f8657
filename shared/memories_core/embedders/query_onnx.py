"""A faster query pass for a sentence-transformers model: its own weights, run by onnxruntime.

A recall embeds one short query. On the CPUs this project is measured on, torch spends most
of that pass outside its matrix products (all-MiniLM-L6-v2, a 13-piece query, one thread: about
20 ms in torch, about 10 ms for the same graph in onnxruntime; BENCHMARKS.md, "Retrieval
quality", the late-interaction latency rows). So a :class:`QueryOnnx` exports the model's
transformer once per machine with torch's ONNX exporter into the llm-memories cache
(:func:`memories_core.cache.cache_root`), checks the export against the torch forward on
probe texts of several lengths, and from then on runs single queries in onnxruntime. Pooling
(mean over the query's pieces) and normalisation are the model's own, done here in numpy.

What it never changes: documents stay on torch (batched and padded, where an exported
graph's mask handling would be a risk), and a query gets the same vector up to float
rounding (the check refuses an export whose pooled vector differs by more than
:data:`MAX_DIFFERENCE`). Anything that fails (no ``onnx`` package, an exporter that refuses
the model, a failed check, a model that is not mean-pooled and normalised) leaves the
embedder on torch and is logged once at INFO; nothing is raised to the caller.

The export runs on a background thread the first time a query is embedded; queries use torch
until it is ready. The cached file is named by a digest of the model's files, so a changed
model is exported again. Files are written atomically (a temporary name, then a rename).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import hashlib
import logging
import os
import tempfile
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from memories_core.cache import cache_root

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

__all__ = ["MAX_DIFFERENCE", "PROBES", "QueryOnnx", "onnx_export_available"]

logger = logging.getLogger(__name__)

#: Largest difference allowed between the exported and the torch pooled unit vectors.
MAX_DIFFERENCE = 1e-4
#: Texts the export is checked on: one word piece, a question, and a long turn.
PROBES = (
    "ok",
    "What did Caroline say about the adoption agency she called last week?",
    " ".join(["We walked along the river after dinner and talked about the new job."] * 12),
)
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
#: Seconds the interpreter's exit waits for an export or check still under way: as long as
#: an engine's ``close()`` waits for its job in hand. The preparation took 0.6 s here with
#: the export cached (the model loaded); an export is a one-time cost per machine.
EXIT_TIMEOUT = 60.0
#: Accelerators whose preparation was started, for :func:`_wait_at_exit`.
_STARTED: weakref.WeakSet[QueryOnnx] = weakref.WeakSet()


def _wait_at_exit() -> None:
    """Let a preparation under way finish before the interpreter finalizes.

    The preparing thread is a daemon (a caller never waits for it), but one still inside
    torch or onnxruntime when the interpreter finalizes makes the C++ runtime abort the
    process (exit code 134): a script that embeds one query and ends would crash after its
    last line. Waits at most :data:`EXIT_TIMEOUT` seconds per accelerator.
    """
    for fast in list(_STARTED):
        thread = fast._thread
        if thread is not None and thread.is_alive():
            thread.join(EXIT_TIMEOUT)


atexit.register(_wait_at_exit)


def onnx_export_available() -> bool:
    """Whether ``onnx`` and ``onnxruntime`` are installed (the exporter needs ``onnx``)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnx", "onnxruntime"))


def _mean_pooled(model: SentenceTransformer) -> bool:
    """Whether ``model`` is Transformer -> mean Pooling -> Normalize (what is reproduced)."""
    names = [type(module).__name__ for module in model]
    if names != ["Transformer", "Pooling", "Normalize"]:
        return False
    pooling = model[1]
    mode = getattr(pooling, "pooling_mode_mean_tokens", None)
    if mode is None:
        mode = getattr(pooling, "pooling_mode", None) == "mean"
    return bool(mode)


def _digest(folder: Path) -> str:
    """A digest of a model folder's files (names, sizes and the bytes of small ones)."""
    hasher = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = path.stat()
        hasher.update(f"{path.relative_to(folder)}:{stat.st_size}\n".encode())
        if stat.st_size <= 1 << 20:  # configs, vocabularies: their content
            hasher.update(path.read_bytes())
        else:  # weights: their first and last MiB
            with path.open("rb") as handle:
                hasher.update(handle.read(1 << 20))
                handle.seek(-(1 << 20), os.SEEK_END)
                hasher.update(handle.read(1 << 20))
    return hasher.hexdigest()[:16]


def _drop_stale(folder: Path, age_s: float = 600.0) -> None:
    """Delete temporary files left by exports that were cut short.

    The export thread is a daemon, so a process killed mid-export (or one whose exit waited
    :data:`EXIT_TIMEOUT` in vain) leaves its temporary file; one younger than ``age_s`` may be
    another process's export in progress.
    """
    import time

    for leftover in folder.glob("*.onnx.tmp"):
        with contextlib.suppress(OSError):
            if time.time() - leftover.stat().st_mtime > age_s:
                leftover.unlink()


def _own_tokenizer(folder: Path, max_length: int) -> Any:
    """The model's ``tokenizer.json`` as a ``tokenizers.Tokenizer`` of our own, set once.

    Its settings never change after this, so concurrent queries only read it.
    """
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(max_length=max_length)
    return tokenizer


class QueryOnnx:
    """onnxruntime for the single-query pass of one sentence-transformers model.

    Args:
        model: The loaded model (Transformer, mean Pooling, Normalize).
        folder: The model's folder (its files name the cached export).
        threads: onnxruntime intra-op threads.
        cache: Where exports are kept (default ``<cache_root>/onnx-query``).
    """

    def __init__(
        self,
        model: SentenceTransformer,
        folder: Path,
        *,
        threads: int = 1,
        cache: Path | None = None,
    ) -> None:
        self._model = model
        self._folder = folder
        self._threads = threads
        self._cache = cache if cache is not None else cache_root() / "onnx-query"
        self._session: Any = None
        self._tokenizer: Any = None
        self._inputs: tuple[str, ...] = ()
        self._state = "new"  # new -> preparing -> ready | off
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        """Whether queries now run in onnxruntime."""
        return self._state == "ready"

    @property
    def off(self) -> bool:
        """Whether the accelerator gave up (queries stay on torch)."""
        return self._state == "off"

    def start(self) -> None:
        """Prepare the session on a background thread (once; later calls do nothing)."""
        if self._state != "new":  # every query calls this: no lock once started
            return
        with self._lock:
            if self._state != "new":
                return
            self._state = "preparing"
            self._thread = threading.Thread(target=self._prepare, name="query-onnx", daemon=True)
            _STARTED.add(self)
            self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Prepare now if not started, wait for it, and return :attr:`ready`."""
        self.start()
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return self.ready

    def _prepare(self) -> None:
        try:
            # A private copy: exporting and checking never touch the model (or the fast
            # tokenizer, which refuses concurrent calls) that the caller's threads use.
            model = copy.deepcopy(self._model)
            limit: Any = model[0].max_seq_length
            self._tokenizer = _own_tokenizer(self._folder, int(limit))
        except Exception as exc:  # any failure leaves the embedder on torch
            logger.info("query embedding stays on torch: %s", exc)
            self._state = "off"
            return
        for attempt in range(2):  # a cached file that fails is exported again, once
            path: Path | None = None
            try:
                path = self._exported(model)
                session = self._open(path)
                if not self._agrees(session, model):
                    raise ValueError(f"the export at {path} does not reproduce torch's vectors")
                self._session = session
                self._state = "ready"
                return
            except Exception as exc:  # any failure leaves the embedder on torch
                if attempt == 0 and path is not None and path.is_file():
                    path.unlink(missing_ok=True)
                    continue
                logger.info("query embedding stays on torch: %s", exc)
                break
        self._state = "off"

    def _exported(self, model: SentenceTransformer) -> Path:
        """The cached export of this model, made now (from ``model``) if missing."""
        if not _mean_pooled(model):
            raise ValueError("only mean-pooled, normalised models are exported")
        target = self._cache / _digest(self._folder) / "model.onnx"
        if target.is_file():
            return target
        import torch

        target.parent.mkdir(parents=True, exist_ok=True)
        _drop_stale(target.parent)
        transformer: Any = model[0].auto_model
        transformer.eval()

        class _Hidden(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = transformer

            def forward(self, ids: Any, mask: Any, types: Any) -> Any:
                out = self.inner(input_ids=ids, attention_mask=mask, token_type_ids=types)
                return out.last_hidden_state

        sample = self._features(PROBES[1])
        axes = {name: {1: "pieces"} for name in (*_INPUTS, "hidden")}
        handle, temporary = tempfile.mkstemp(dir=target.parent, suffix=".onnx.tmp")
        os.close(handle)
        try:
            with torch.no_grad():
                torch.onnx.export(
                    _Hidden().eval(),
                    tuple(torch.from_numpy(sample[name]) for name in _INPUTS),
                    temporary,
                    input_names=list(_INPUTS),
                    output_names=["hidden"],
                    dynamic_axes=axes,
                    opset_version=17,
                    dynamo=False,
                )
            os.replace(temporary, target)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
        return target

    def _open(self, path: Path) -> Any:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._inputs = tuple(i.name for i in session.get_inputs())
        return session

    def _features(self, text: str) -> dict[str, npt.NDArray[np.int64]]:
        """One text as the model's inputs (its own ``tokenizer.json``, cut at its max length)."""
        encoded = self._tokenizer.encode(text)
        return {
            "input_ids": np.asarray([encoded.ids], dtype=np.int64),
            "attention_mask": np.asarray([encoded.attention_mask], dtype=np.int64),
            "token_type_ids": np.asarray([encoded.type_ids], dtype=np.int64),
        }

    def _run(self, session: Any, text: str) -> npt.NDArray[np.float32]:
        features = self._features(text)
        hidden = session.run(None, {k: v for k, v in features.items() if k in self._inputs})[0]
        mask = features["attention_mask"][0].astype(np.float32)[:, None]
        pooled = (np.asarray(hidden, dtype=np.float32)[0] * mask).sum(axis=0) / max(
            float(mask.sum()), 1e-9
        )
        norm = float(np.linalg.norm(pooled))
        return (pooled / norm if norm > 0 else pooled).astype(np.float32)

    def _agrees(self, session: Any, model: SentenceTransformer) -> bool:
        reference = model.encode(
            list(PROBES), normalize_embeddings=True, convert_to_numpy=True, batch_size=1
        )
        return all(
            float(np.abs(self._run(session, text) - np.asarray(want)).max()) <= MAX_DIFFERENCE
            for text, want in zip(PROBES, reference, strict=True)
        )

    def embed(self, text: str) -> npt.NDArray[np.float32] | None:
        """The query's unit vector from onnxruntime, or ``None`` while not :attr:`ready`."""
        if self._state != "ready":
            return None
        return self._run(self._session, text)
