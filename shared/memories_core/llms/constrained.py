"""JSON-schema constrained decoding for the transformers runtime (lm-format-enforcer).

lm-format-enforcer was chosen over xgrammar (which pulls in triton) and outlines (a
Rust-built core and many dependencies): it is pure Python, two small packages, and works
with any tokenizer. Used by :class:`memories_core.llms.local.LocalLLM`.
"""

from __future__ import annotations

from typing import Any

from memories_core.llms.base import JsonSchema, ResponseFormat

__all__ = ["allowed_tokens_fn", "enforcer_data"]


def enforcer_data(tokenizer: Any) -> Any:
    """lm-format-enforcer's tokenizer data, built from the tokenizer directly.

    lm-format-enforcer's own transformers integration imports a module that transformers 5
    removed; its tokenizer-agnostic core only needs, per regular token, the text it decodes
    to after a digit (to see a leading space) and whether it starts a word.

    Tokens that decode to an incomplete UTF-8 sequence (a byte-level piece of a character the
    vocabulary has no token for, shown as U+FFFD) are left out: the enforcer sees them add no
    text, so it allowed them where the schema allowed nothing else (a string at its
    ``maxLength``), and the 1.5B model ended a conditional record there with ``"about\ufffdf``
    and no closing quote, an unparsable answer (BENCHMARKS.md, "Conditional memory: the record
    call with the local model"). The cost: a constrained answer cannot hold a character made
    of such pieces (some emoji and rare scripts); free-text answers are not affected.
    """
    from lmformatenforcer.tokenenforcer import TokenEnforcerTokenizerData

    vocab_size = len(tokenizer)
    zero = tokenizer.encode("0")[-1]
    special = set(tokenizer.all_special_ids)
    regular = []
    for token in range(vocab_size):
        if token in special:
            continue
        after_zero = tokenizer.decode([zero, token])[1:]
        alone = tokenizer.decode([token])
        if "\ufffd" in alone:
            continue
        regular.append((token, after_zero, len(after_zero) > len(alone)))

    def decode(tokens: list[int]) -> str:
        return str(tokenizer.decode(tokens)).rstrip("\ufffd")

    return TokenEnforcerTokenizerData(regular, decode, tokenizer.eos_token_id, False, vocab_size)


def allowed_tokens_fn(data: Any, fmt: ResponseFormat, prompt_length: int) -> Any:
    """A ``prefix_allowed_tokens_fn`` that keeps generation inside ``fmt``'s JSON schema.

    Args:
        data: :func:`enforcer_data` of the model's tokenizer (build it once per tokenizer).
        fmt: The response format (a :class:`JsonSchema`, or any JSON object).
        prompt_length: Tokens of the prompt; only what follows is checked.
    """
    from lmformatenforcer import JsonSchemaParser, TokenEnforcer

    schema = dict(fmt.schema) if isinstance(fmt, JsonSchema) else None
    enforcer = TokenEnforcer(data, JsonSchemaParser(schema))

    def allowed(batch_id: int, sentence: Any) -> Any:
        tokens = enforcer.get_allowed_tokens(sentence.tolist()[prompt_length:])
        return _indices(tokens.allowed_tokens)

    return allowed


def _indices(allowed: Any) -> Any:
    """The enforcer's allowed token ids as an index tensor for ``generate``'s mask.

    Inside a JSON string most of the vocabulary is allowed: ``generate`` turned that list of
    about 150,000 ids into an index itself, at every step of every row (about 28 ms each
    with the 1.5B model's vocabulary, a fifth of a step, and more than a batch saved per
    row); numpy reads the list in about 2 ms. (The enforcer's bitmask mode measured slower
    here: 36 ms per row and step.)
    """
    import numpy as np
    import torch

    return torch.from_numpy(np.fromiter(allowed, dtype=np.int64, count=len(allowed)))
