"""Int8 weights for decoding only: prompts are read with the float32 weights.

A CPU decodes one token per forward pass, and each pass reads every weight: for a 1.5B model
in float32 that is 6 GB per token, bound by memory bandwidth. A prompt is read in one pass
over many tokens, bound by arithmetic, where float32 matrix products are fastest. So each
linear layer keeps its float32 weight for passes over several tokens (prompt reading: the
first generated token comes from exact float32 logits) and an int8 copy, one scale per output
row (weights only; activations stay unquantised, in bfloat16), for single-token passes.

Unlike dynamic int8 (:func:`memories_core.llms.quantize.quantize_int8`), no activation is
rounded to 8 bits, which is where that scheme lost answer quality. Costs: the int8 copy adds
a quarter of the float32 weights to memory (1.5 GB for the 1.5B model), and building it takes
about 15 s at load. Nothing is saved to disk.

The kernel is ``torch._weight_int8pack_mm`` (int8 weights, one scale per row); measured on
this project's 2-core AVX2 machine for a 1536 x 8960 layer and one token: float32 5.1 ms,
int8 weights with bfloat16 activations 1.5 ms. Layers the kernel cannot take stay float32.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from torch.nn import functional

__all__ = ["DECODE_ROWS", "DecodeInt8Linear", "convert_for_decoding", "kernel_works"]

logger = logging.getLogger(__name__)

#: Passes over at most this many tokens per sequence use the int8 copy: one generated token
#: per step, for one sequence or each of a batch. A prompt, or the part of it not served from
#: the key/value cache, uses the float32 weights when it is longer.
DECODE_ROWS = 1


class _Pass:
    """The token count of the forward pass in progress, shared by a model's converted layers.

    Set by a hook on the input embeddings and cleared when the model's forward ends. A layer
    cannot tell from its own input: the language-model head sees only the last position even
    while a prompt is read (transformers computes logits for the last token only), so by its
    input alone the first written token would be chosen with int8 weights.
    """

    tokens: int | None = None


class DecodeInt8Linear(nn.Module):
    """A linear layer with float32 weights for prompts and int8 weights for decoding steps.

    Args:
        linear: The float32 layer. Its weight (and bias) are shared, not copied, so a weight
            tied to another module (a language-model head tied to the embeddings) stays tied.
    """

    def __init__(self, linear: nn.Linear, current: _Pass | None = None) -> None:
        super().__init__()
        self._pass = current if current is not None else _Pass()
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        with torch.no_grad():
            weight = linear.weight.detach().float()
            scale = (weight.abs().amax(dim=1) / 127.0).clamp(min=1e-12)
            quantised = torch.clamp(torch.round(weight / scale[:, None]), -127, 127)
        self.weight_int8: torch.Tensor
        self.scale: torch.Tensor
        self.register_buffer("weight_int8", quantised.to(torch.int8), persistent=False)
        self.register_buffer("scale", scale.to(torch.bfloat16), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W.T + b``: int8 weights for a decoding step, float32 otherwise.

        A step is a forward pass over at most :data:`DECODE_ROWS` tokens per sequence (the
        pass's sequence length, told by the model's hook, whatever the batch size); outside
        a hooked model, the rows of ``x`` are counted instead.
        """
        rows = x.numel() // self.in_features
        tokens = self._pass.tokens
        if tokens is None:
            tokens = rows
        if tokens > DECODE_ROWS or x.dtype != torch.float32 or x.device.type != "cpu":
            return functional.linear(x, self.weight, self.bias)
        # One new token per sequence: a batch of sequences shares the step (the kernel reads
        # the int8 weights once for all rows).
        flat = x.reshape(rows, self.in_features).to(torch.bfloat16)
        out = torch._weight_int8pack_mm(flat, self.weight_int8, self.scale).to(x.dtype)
        out = out.reshape(*x.shape[:-1], self.out_features)
        return out if self.bias is None else out + self.bias

    def extra_repr(self) -> str:
        """Shown in the model's printout."""
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 decode"


def kernel_works() -> bool:
    """Whether this torch has a working CPU int8-weight kernel (tried on a small layer)."""
    kernel = getattr(torch, "_weight_int8pack_mm", None)
    if kernel is None:
        return False
    try:
        layer = nn.Linear(32, 16)
        x = torch.randn(1, 32)
        out = DecodeInt8Linear(layer)(x)
        expected = layer(x)
    except Exception as exc:  # an unsupported CPU, or a changed private API
        logger.debug("int8 decoding kernel unavailable: %s", exc)
        return False
    return bool(torch.allclose(out, expected, atol=0.05, rtol=0.05))


def convert_for_decoding(model: Any) -> int:
    """Give every float32 ``nn.Linear`` of ``model`` an int8 copy for decoding, in place.

    A model with input embeddings (``get_input_embeddings``, as transformers models have)
    gets hooks that tell its layers how many tokens the pass holds, so that the whole pass
    that reads a prompt, the head included, runs in float32.

    Converting a model that is already converted changes nothing (no second set of hooks)
    and returns its count of converted layers.

    Returns:
        How many layers were converted (0 if the kernel is unavailable).
    """
    done = sum(1 for module in model.modules() if isinstance(module, DecodeInt8Linear))
    if done:
        return done
    if not kernel_works():
        return 0
    current = _Pass()
    converted = 0
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear and child.weight.dtype == torch.float32:
                    setattr(parent, name, DecodeInt8Linear(child, current))
                    converted += 1
    embeddings = getattr(model, "get_input_embeddings", None)
    embedding = embeddings() if callable(embeddings) else None
    if converted and isinstance(embedding, nn.Module):

        def count(module: nn.Module, args: tuple[Any, ...]) -> None:
            if args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 1:
                current.tokens = int(args[0].shape[-1])

        def clear(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            current.tokens = None

        embedding.register_forward_pre_hook(count)
        model.register_forward_hook(clear)
    return converted
