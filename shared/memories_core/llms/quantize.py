"""Int8 weights for the local transformers runtime.

On a CPU, decoding a 1.5B model in float32 reads 6 GB of weights per token and is bound by
memory bandwidth. Two ways to read less, chosen with ``LocalLLM(quantize=...)``:

* ``"int8"``: dynamic quantisation of every linear layer (int8 weights, activations rounded
  to 8 bits on the fly): prompts read 2-3x and tokens written 3-6x faster (two runs), but
  answers and memories lose F1 (measured: the 40-minute answer-quality command took 24.3 min
  instead of 47, MemoryBank's F1 fell from 0.372 to 0.267, raw turns' from 0.324 to 0.311).
  The conversion is ``torch.ao.quantization.quantize_dynamic``, which torch marks deprecated
  but still ships.
* ``"int8-decode"`` (:mod:`memories_core.llms.decode_int8`): prompts are read with the
  float32 weights (the first written token is exact) and each later token with an int8 copy
  of the weights, activations unrounded: about 2.8x faster writing, the same answers from the
  same context, memories in other words (one conversation measured end to end).

``"auto"`` applies :data:`AUTO_QUANTIZE` to float32 models of at least
:data:`MIN_INT8_PARAMETERS` parameters; it is chosen by the answer-quality harness
(BENCHMARKS.md, "Answer quality end to end (LoCoMo QA)"). Where torch lacks what a setting
needs, the model stays in float32 and a warning says so. Nothing is saved: converted layers
live in memory only (a quantised model could only be stored with pickle, which this project
never loads). Speed on this project's 2-core machine: BENCHMARKS.md, "Int8 weights for the
1.5B model".
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Literal

__all__ = [
    "AUTO_QUANTIZE",
    "MIN_INT8_PARAMETERS",
    "Applied",
    "Quantize",
    "apply_quantize",
    "has_int8",
    "quantize_int8",
    "quantized_as",
    "resolve_quantize",
]

logger = logging.getLogger(__name__)

Quantize = Literal["auto", "none", "int8", "int8-decode"]
Applied = Literal["none", "int8", "int8-decode"]

#: ``"auto"`` considers models at least this large: below it a model is fast already and a
#: tiny model loses more of its little precision (SmolLM2-135M stays as it is).
MIN_INT8_PARAMETERS = 500_000_000

#: What ``"auto"`` does to a large float32 model, chosen by measurement: on the 40-minute
#: answer-quality command ``"int8-decode"`` took 31.0 min instead of about 47 with the same F1
#: where the context is the same (no memory 0.167, raw turns 0.324: 30 of 30 answers
#: identical) and MemoryBank 0.369 against 0.372 from memories written differently.
AUTO_QUANTIZE: Applied = "int8-decode"


def resolve_quantize(model: Any, setting: Quantize, dtype_name: str) -> Applied:
    """The conversion ``setting`` asks for ``model`` (loaded in ``dtype_name``).

    ``"auto"`` is :data:`AUTO_QUANTIZE` for float32 models of at least
    :data:`MIN_INT8_PARAMETERS` parameters, and ``"none"`` for any other model; an explicit
    setting is returned as it is.
    """
    if setting != "auto":
        return setting
    if AUTO_QUANTIZE == "none" or dtype_name != "float32":
        return "none"
    size = sum(p.numel() for p in model.parameters())
    return AUTO_QUANTIZE if size >= MIN_INT8_PARAMETERS else "none"


def apply_quantize(model: Any, applied: Applied) -> Any:
    """``model`` converted as ``applied`` says (in place where possible), or left as it is."""
    if applied == "int8":
        return quantize_int8(model)
    if applied == "int8-decode":
        from memories_core.llms.decode_int8 import convert_for_decoding

        if convert_for_decoding(model) == 0:
            logger.warning("int8 decoding weights unavailable; the model runs in float32")
    return model


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


def quantized_as(model: Any) -> Applied:
    """Which conversion ``model``'s layers carry: ``"int8"``, ``"int8-decode"`` or ``"none"``."""
    from memories_core.llms.decode_int8 import DecodeInt8Linear  # a model means torch is here

    for module in model.modules():
        if type(module).__module__.startswith("torch.ao.nn.quantized"):
            return "int8"
        if isinstance(module, DecodeInt8Linear):
            return "int8-decode"
    return "none"


def has_int8(model: Any) -> bool:
    """Whether any layer of ``model`` holds int8 weights (either conversion)."""
    return quantized_as(model) != "none"
