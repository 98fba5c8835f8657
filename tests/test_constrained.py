"""Constrained decoding's token table (lm-format-enforcer), with a tiny byte-level tokenizer."""

from __future__ import annotations

import json
from typing import ClassVar

import pytest

pytest.importorskip("lmformatenforcer")

from memories_core.llms.base import JsonSchema
from memories_core.llms.constrained import allowed_tokens_fn, enforcer_data

# id -> bytes: digits, letters, quote and brace pieces, and the two byte halves of "é".
PIECES = [b"0", b"a", b"b", b'"', b"{", b"}", b":", b"\xc3", b"\xa9", b"<eos>"]
EOS = len(PIECES) - 1
HALVES = {7, 8}


class ByteTokenizer:
    """Decodes ids to bytes and the bytes to text, as a byte-level BPE tokenizer does."""

    all_special_ids: ClassVar[list[int]] = [EOS]
    eos_token_id = EOS

    def __len__(self) -> int:
        return len(PIECES)

    def encode(self, text: str) -> list[int]:
        return [PIECES.index(bytes([b])) for b in text.encode("utf-8")]

    def decode(self, ids: list[int]) -> str:
        return b"".join(PIECES[i] for i in ids if i != EOS).decode("utf-8", errors="replace")


class Sentence(list[int]):
    def tolist(self) -> list[int]:
        return list(self)


def _walk(allowed: object, ids: list[int]) -> set[int]:
    """Ask for every prefix in turn, as generation does; the tokens allowed after ``ids``."""
    result: list[int] = []
    for end in range(len(ids) + 1):
        result = [int(t) for t in allowed(0, Sentence(ids[:end]))]  # type: ignore[operator]
        assert end == len(ids) or ids[end] in result, f"{ids[end]} refused after {ids[:end]}"
    return set(result)


def test_incomplete_utf8_pieces_are_never_allowed() -> None:
    """A byte half of a character adds no text the enforcer can see, so it used to pass where
    the schema allowed nothing else (a string at its maxLength): the 1.5B model ended a record
    there without the closing quote."""
    data = enforcer_data(ByteTokenizer())
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 2}}}
    allowed = allowed_tokens_fn(data, JsonSchema("t", json.loads(json.dumps(schema))), 0)
    tokenizer = ByteTokenizer()
    inside = _walk(allowed, tokenizer.encode('{"a":"b'))
    assert 2 in inside  # room for one more letter
    assert not HALVES & inside
    at_limit = _walk(allowed, tokenizer.encode('{"a":"bb'))
    assert at_limit and at_limit <= {3}  # only the closing quote


def test_the_allowed_ids_reach_generate_as_an_index_tensor() -> None:
    """``generate`` indexes its mask with them; a list of 150k ids was converted per step."""
    import torch

    from memories_core.llms.constrained import _indices

    index = _indices([3, 1, 150_000])
    assert index.dtype == torch.long and index.tolist() == [3, 1, 150_000]
