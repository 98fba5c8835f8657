"""A tiny randomly initialised causal LM and tokenizer for tests and offline demos."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memories_core.personalize.setup import require_personalize

__all__ = ["tiny_model"]


def tiny_model(texts: Sequence[str], *, seed: int = 0, vocab_size: int = 400) -> tuple[Any, Any]:
    """A tiny randomly initialised causal LM and a tokenizer fitted to ``texts``.

    For tests and offline demos of the training and serving code paths (it learns in seconds
    on a CPU, and knows nothing): a 2-layer LLaMA (hidden size 32) and a byte-level BPE
    tokenizer trained on ``texts``, without a chat template (prompts are rendered as
    ``Role: text`` lines). Pass them as ``Personalizer(model=..., tokenizer=...)``.

    Raises:
        MissingExtraError: without the ``personalize`` extra.
    """
    require_personalize()
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    corpus = [*texts, "System: User: Assistant: remember"]
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus * 3,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=["[UNK]", "</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token="</s>", unk_token="[UNK]", pad_token="</s>"
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config), tokenizer
