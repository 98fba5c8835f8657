"""Int8 weights for the local transformers runtime (dynamic quantisation of linear layers).

On a CPU, decoding a 1.5B model in float32 reads 6 GB of weights per token and is bound by
memory bandwidth; with int8 weights (activations quantised on the fly) it reads a quarter of
that. Measured on this project's 2-core machine for Qwen2.5-Coder-1.5B (BENCHMARKS.md,
"Local LLM runtime"): prompt reading 34 -> 67 tokens/s, writing 1.7 -> 7.1 tokens/s, after a
one-time 32 s conversion at load. The weights come from a 4-bit GGUF, so 8 bits per weight
lose little of what the file holds; the answer-quality harness measures what it changes.

The conversion is ``torch.ao.quantization.quantize_dynamic``, which torch marks deprecated
(in favour of ``torchao``) but still ships; where it is missing or fails, the model stays in
float32 and a warning says so. Nothing is saved: the converted model lives in memory only
(a quantised model can only be stored with pickle, which this project never loads).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Literal

__all__ = ["MIN_INT8_PARAMETERS", "Quantize", "has_int8", "quantize_int8", "wants_int8"]

logger = logging.getLogger(__name__)

Quantize = Literal["auto", "none", "int8"]

#: ``"auto"`` quantises models at least this large: below it a model is fast already and a
#: tiny model loses more of its little precision (SmolLM2-135M stays as it is).
MIN_INT8_PARAMETERS = 500_000_000


def wants_int8(model: Any, setting: Quantize, dtype_name: str) -> bool:
    """Whether ``model`` (loaded in ``dtype_name``) should get int8 linear layers.

    ``"auto"``: float32 models of at least :data:`MIN_INT8_PARAMETERS` parameters, when torch
    has a CPU int8 engine (``x86``/``fbgemm`` or ``qnnpack``). ``"int8"``: always tried.
    """
    if setting == "none":
        return False
    if setting == "int8":
        return True
    import torch

    engines = set(torch.backends.quantized.supported_engines) - {"none"}
    if dtype_name != "float32" or not engines:
        return False
    size = sum(p.numel() for p in model.parameters())
    return size >= MIN_INT8_PARAMETERS


def quantize_int8(model: Any) -> Any:
    """``model`` with int8 dynamic linear layers, or ``model`` itself if torch cannot do it."""
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", UserWarning)
            from torch.ao.quantization import quantize_dynamic

            converted = quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    except Exception as exc:  # an API torch removed, or an engine that refuses
        logger.warning("int8 weights unavailable (%s); the model runs in float32", exc)
        return model
    converted.eval()
    return converted


def has_int8(model: Any) -> bool:
    """Whether any layer of ``model`` holds int8 dynamic-quantised weights."""
    return any(
        type(module).__module__.startswith("torch.ao.nn.quantized") for module in model.modules()
    )
