"""What ``MemoryStore`` shares with LangGraph's stores: values, filters, index configuration.

Three rules, each the one LangGraph's own stores follow, kept apart from the store so that
each can be read (and tested) alone:

* **Values** are stored as JSON, the way LangGraph's database stores keep them (``jsonb``):
  what JSON cannot hold is converted on the way in (:func:`to_json_value`) and a ``get``
  returns the JSON form. Non-finite floats and integers of any size round-trip.
* **Filters** (:func:`value_matches`) follow ``InMemoryStore``: a filter key names a
  top-level field of the value (``"user.access-level"`` is one key, dots included); a plain
  filter value must equal the field (lists element by element, dicts as a recursive subset
  match); a dict with ``$``-keys applies the operators ``$eq``, ``$ne``, ``$gt``, ``$gte``,
  ``$lt``, ``$lte``. Like LangGraph's stores, an unknown operator and an order comparison
  with a non-numeric text raise (here :class:`~memories_core.errors.InvalidInputError`, a
  ``ValueError``); a missing field never matches an order comparison.
* **Index configuration** (``index={"dims", "embed", "fields"}``): :func:`resolve_embedder`
  turns ``embed`` (LangChain ``Embeddings``, a function, a provider string, or a core
  embedder) into the engine's embedder; :func:`index_texts` extracts the texts to embed at
  the configured field paths with LangGraph's own path syntax
  (``"text"``, ``"user.bio"``, ``"tags[*]"``, ``"$"`` for the whole value).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, time
from decimal import Decimal
from pathlib import PurePath
from typing import Any

from langchain_core.embeddings import Embeddings
from langgraph.store.base import ensure_embeddings, get_text_at_path, tokenize_path

from memories_core.errors import ConfigurationError, InvalidInputError, check_count
from memories_core.interfaces import Embedder
from memories_core.types import holds_lone_surrogate

__all__ = [
    "OPERATORS",
    "compile_fields",
    "index_texts",
    "resolve_embedder",
    "to_json_value",
    "validate_filter",
    "value_matches",
]

#: The filter operators of LangGraph's stores.
OPERATORS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")

Fields = list[tuple[str, list[str] | str]]


# ---------------------------------------------------------------------------------- values
def _json_default(obj: Any) -> Any:
    """JSON form of what ``json`` cannot encode (LangGraph's serializer makes the same choices)."""
    if isinstance(obj, (datetime, date, time)):
        return obj.isoformat()
    if isinstance(obj, (uuid.UUID, Decimal, PurePath)):
        return str(obj)
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (set, frozenset)):
        return sorted(obj, key=repr)
    model_dump = getattr(obj, "model_dump", None)
    if callable(model_dump):  # pydantic v2 models
        return model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    raise TypeError(f"a value of type {type(obj).__name__} cannot be stored as JSON")


def to_json_value(value: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """The value as stored (its JSON form) and its JSON text.

    Datetimes become ISO-8601 strings, UUIDs, decimals and paths strings, enums their value,
    sets sorted lists, tuples lists, pydantic models and dataclasses their fields. Non-finite
    floats and big integers are kept.

    Raises:
        InvalidInputError: if ``value`` is not a mapping or holds something with no JSON
            form (bytes, an object, a non-text key that JSON cannot convert, a string with
            a lone surrogate).
    """
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"a store value is a dict, got {type(value).__name__}")
    try:
        text = json.dumps(dict(value), ensure_ascii=False, default=_json_default)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"store value cannot be stored as JSON: {exc}") from exc
    if holds_lone_surrogate(text):  # as LangGraph's PostgresStore, which cannot store it
        raise InvalidInputError(
            "store value holds a lone surrogate (not valid Unicode) in a key or a string"
        )
    return json.loads(text), text


# ---------------------------------------------------------------------------------- filters
def _number(value: Any, operator: str) -> int | float | None:
    """``value`` as a number for an order comparison (``None``: it never matches)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise InvalidInputError(
                f"filter operator {operator} compares numbers; got the text {value!r}"
            ) from None
    return None


def _operator(value: Any, operator: str, operand: Any) -> bool:
    if operator == "$eq":
        return bool(value == operand)
    if operator == "$ne":
        return bool(value != operand)
    if operator not in OPERATORS:
        raise InvalidInputError(f"unsupported filter operator {operator!r}")
    left, right = _number(value, operator), _number(operand, operator)
    if left is None or right is None:
        return False
    if operator == "$gt":
        return left > right
    if operator == "$gte":
        return left >= right
    if operator == "$lt":
        return left < right
    return left <= right


def _compare(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, Mapping):
        if any(isinstance(k, str) and k.startswith("$") for k in wanted):
            return all(_operator(value, op, operand) for op, operand in wanted.items())
        if not isinstance(value, Mapping):
            return False
        return all(_compare(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, (list, tuple)):
        return (
            isinstance(value, (list, tuple))
            and len(value) == len(wanted)
            and all(_compare(v, w) for v, w in zip(value, wanted, strict=True))
        )
    return bool(value == wanted)


def validate_filter(conditions: Mapping[str, Any] | None) -> None:
    """Reject a filter that is not a mapping or uses an unknown operator, before any read.

    Raises:
        InvalidInputError: on a bad filter.
    """
    if conditions is None:
        return
    if not isinstance(conditions, Mapping):
        raise InvalidInputError(f"filter must be a dict, got {type(conditions).__name__}")

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            if any(isinstance(k, str) and k.startswith("$") for k in node):
                for op in node:
                    if op not in OPERATORS:
                        raise InvalidInputError(f"unsupported filter operator {op!r}")
            else:
                for child in node.values():
                    walk(child)

    for wanted in conditions.values():
        walk(wanted)


def value_matches(value: Mapping[str, Any], conditions: Mapping[str, Any] | None) -> bool:
    """Whether a stored value matches a LangGraph filter (``InMemoryStore``'s semantics).

    Raises:
        InvalidInputError: on an unknown operator, or an order comparison with a text that
            is not a number (LangGraph's stores raise there too).
    """
    if not conditions:
        return True
    return all(_compare(value.get(key), wanted) for key, wanted in conditions.items())


# ---------------------------------------------------------------------------------- indexing
def compile_fields(fields: Sequence[str] | None) -> Fields:
    """Field paths with their tokens (``"$"``, the whole value, stays as is).

    Raises:
        ConfigurationError: if ``fields`` is not a list of non-empty strings.
    """
    if fields is None:
        return [("$", "$")]
    if isinstance(fields, str) or not all(isinstance(f, str) and f for f in fields):
        raise ConfigurationError("index fields must be a list of non-empty path strings")
    return [(f, f if f == "$" else tokenize_path(f)) for f in fields]


def index_texts(value: Mapping[str, Any], fields: Fields) -> list[str]:
    """The texts to embed for ``value``: every text found at every field path, in order."""
    texts: list[str] = []
    for _, tokens in fields:
        found = get_text_at_path(value, tokens)
        texts += [t for t in found if isinstance(t, str) and t.strip()]
    return texts


def _core_embedder(obj: Any) -> bool:
    return isinstance(obj, Embedder) and not isinstance(obj, Embeddings)


def resolve_embedder(embed: Any, dims: int | None) -> Embedder:
    """The engine embedder for an index configuration's ``embed``.

    ``embed`` may be a core embedder (used as is), a LangChain ``Embeddings``, a function
    ``texts -> vectors`` (sync or async, wrapped by LangGraph's ``ensure_embeddings``), or a
    provider string. Strings resolved offline: ``"hashing"`` / ``"hashing:<dims>"`` (the
    deterministic hashing embedder), ``"minilm"`` (the bundled all-MiniLM-L6-v2) and
    ``"sentence-transformers:<model>"`` (a locally available model); any other string goes to
    LangChain's ``init_embeddings`` (``"openai:text-embedding-3-small"``) and needs that
    provider's package. The vector length is probed with one embedding, so that the
    store can reject an index ``dims`` unlike it.

    Raises:
        ConfigurationError: on an unusable ``embed`` or ``dims``.
    """
    from langchain_memories.bridges import LangChainEmbedder
    from memories_core.embedders import HashingEmbedder

    if dims is not None:
        dims = check_count("index dims", dims)
    if _core_embedder(embed):
        return embed
    if isinstance(embed, str):
        name = embed.strip()
        provider, _, model = name.partition(":")
        if provider == "hashing":
            try:
                size = int(model) if model else (dims or 256)
            except ValueError:
                raise ConfigurationError(f"bad hashing embedder size in {embed!r}") from None
            return HashingEmbedder(size)
        if name == "minilm" or provider == "sentence-transformers":
            from memories_core.embedders import SentenceTransformerEmbedder

            return SentenceTransformerEmbedder(model or None)
        try:
            embeddings = ensure_embeddings(name)
        except Exception as exc:  # any provider failure is a configuration error
            raise ConfigurationError(f"cannot load embeddings {embed!r}: {exc}") from exc
        return LangChainEmbedder(embeddings, name=name)
    if isinstance(embed, Embeddings):
        return LangChainEmbedder(embed)
    if callable(embed):
        label = getattr(embed, "__qualname__", type(embed).__name__)
        module = getattr(embed, "__module__", "") or ""
        func: Callable[..., Any] = embed
        return LangChainEmbedder(ensure_embeddings(func), name=f"callable:{module}.{label}")
    raise ConfigurationError(
        "index embed must be an Embeddings, a function, a provider string or a core embedder, "
        f"got {type(embed).__name__}"
    )


def finite_or_none(score: float | None) -> float | None:
    """A similarity clamped into ``[0, 1]`` (``None`` and NaN stay without a score)."""
    if score is None or math.isnan(score):
        return None
    return min(1.0, max(0.0, float(score)))
