"""Int8 weights for the local transformers runtime (dynamic quantisation of linear layers).

On a CPU, decoding a 1.5B model in float32 reads 6 GB of weights per token and is bound by
memory bandwidth; with int8 weights (activations quantised on the fly) it reads a quarter of
that. ``LocalLLM(quantize="int8")`` opts in; the default is float32, chosen by measurement
(BENCHMARKS.md, "Answer quality end to end (LoCoMo QA): does memory make the assistant
answer better?"): with int8 weights the 40-minute answer-quality command took 24.3 min
instead of 47, but MemoryBank's F1 fell from 0.372 to 0.267 and raw turns' from 0.324 to
0.311 (the int8 model wrote worse summaries and answered in sentences, not the short phrases
asked for). Speed on this project's 2-core machine: ``benchmarks/local_int8.py``.

The conversion is ``torch.ao.quantization.quantize_dynamic``, which torch marks deprecated
(in favour of ``torchao``) but still ships; where it is missing or fails, the model stays in
float32 and a warning says so. Nothing is saved: the converted model lives in memory only
(a quantised model can only be stored with pickle, which this project never loads).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Literal

__all__ = [
    "AUTO_INT8",
    "MIN_INT8_PARAMETERS",
    "Quantize",
    "has_int8",
    "quantize_int8",
    "wants_int8",
]

logger = logging.getLogger(__name__)

Quantize = Literal["auto", "none", "int8"]

#: ``"auto"`` considers models at least this large: below it a model is fast already and a
#: tiny model loses more of its little precision (SmolLM2-135M stays as it is).
MIN_INT8_PARAMETERS = 500_000_000

#: Whether ``"auto"`` converts a large float32 model. Off: measured, int8 answers worse
#: (module docstring); kept as a switch so the measurement can be repeated.
AUTO_INT8 = False


def wants_int8(model: Any, setting: Quantize, dtype_name: str) -> bool:
    """Whether ``model`` (loaded in ``dtype_name``) should get int8 linear layers.

    ``"auto"``: only while :data:`AUTO_INT8` is on (it is off), float32 models of at least
    :data:`MIN_INT8_PARAMETERS` parameters when torch has a CPU int8 engine. ``"int8"``:
    always tried.
    """
    if setting == "none" or (setting == "auto" and not AUTO_INT8):
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
