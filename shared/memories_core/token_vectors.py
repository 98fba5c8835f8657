"""Stored late-interaction token vectors: the row, its compact codec, the store capability.

A late-interaction reranker (:mod:`memories_core.retrieval.late_interaction`) scores a record
by its token vectors (one unit vector per word piece; Khattab & Zaharia, 2020, "ColBERT",
§3.3). They depend on the record's text (and, with ``context``, the text before it) and on
the encoder only, so they are computed once, when the record is saved, and kept with the
record. Kept per record:

* ``data``: the ``(tokens, dim)`` matrix as int8 with one ``scale`` per record (a value is
  ``data * scale``), a quarter of float32. A record's largest absolute value sets the scale,
  so the rounding error per value is at most ``scale / 2``. Measured on LoCoMo dev with the
  default late-interaction pipeline (997 questions, BENCHMARKS.md, "Token vectors stored as
  int8"): MaxSim moves by 0.006 on average, which reorders near-ties (half the questions'
  top 10 lists differ from float32's), but recall does not change (R@5 / R@10 / session
  R@10 0.757 / 0.832 / 0.964 against 0.757 / 0.831 / 0.964); a scale per row halved the
  error without a recall gain;
* ``encoder``: a digest of the encoder's name (its model and settings): vectors of another
  model are never read, and a model change rebuilds them;
* ``digest``: a digest of the encoder name and the exact text encoded: vectors of an edited
  record (or of a record whose previous turn was edited) no longer match and are encoded
  again.

A store offers them through :class:`TokenVectorStore` (the SQL stores do: table
``token_vectors``, deleted with the record and with the user). A store without it keeps
none, and the reranker's in-process cache is all there is.

:func:`export_rows` and :func:`read_rows` carry them in a memory file
(:mod:`memories_core.portable`, format version 2): ``token_vectors.jsonl`` (one row per
record: id, encoder, digest, tokens, dim, scale) and ``token_vectors.npy`` (every row's
int8 values, in order, as one flat array), validated on import like every other row.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from memories_core.errors import InvalidInputError

__all__ = [
    "MAX_TOKENS",
    "MAX_TOKEN_DIM",
    "ROWS_MEMBER",
    "VALUES_MEMBER",
    "PoolReader",
    "PoolRow",
    "TokenVectorStore",
    "TokenVectors",
    "encoder_tag",
    "export_rows",
    "quantize",
    "read_rows",
    "text_digest",
]

#: Most token rows a stored record may have (the encoders cut texts far below this).
MAX_TOKENS = 4096
#: Widest token vector a stored record may have.
MAX_TOKEN_DIM = 4096
_DIGEST = re.compile(r"[0-9a-f]{32}")
#: Memory-file member with one JSON row per record's vectors.
ROWS_MEMBER = "token_vectors.jsonl"
#: Memory-file member with every row's int8 values, one flat array.
VALUES_MEMBER = "token_vectors.npy"
_ROW_FIELDS = frozenset({"id", "encoder", "digest", "tokens", "dim", "scale"})


def encoder_tag(encoder_name: str) -> str:
    """The ``encoder`` column of an encoder: a digest of its name (model and settings)."""
    return hashlib.blake2b(encoder_name.encode(), digest_size=16).hexdigest()


def text_digest(encoder_name: str, text: str) -> str:
    """The ``digest`` column: the encoder's name and the exact text it encoded."""
    return hashlib.blake2b(f"{encoder_name}\x00{text}".encode(), digest_size=16).hexdigest()


@dataclass(frozen=True)
class TokenVectors:
    """One record's stored token vectors (see the module docstring).

    Attributes:
        record_id: The record.
        encoder: :func:`encoder_tag` of the encoder that made them.
        digest: :func:`text_digest` of the encoder and the text encoded.
        data: ``(tokens, dim)`` int8 values.
        scale: A value is ``data * scale`` (finite, > 0).
    """

    record_id: str
    encoder: str
    digest: str
    data: npt.NDArray[np.int8]
    scale: float

    def __post_init__(self) -> None:
        for label, value in (("encoder", self.encoder), ("digest", self.digest)):
            if not isinstance(value, str) or not _DIGEST.fullmatch(value):
                raise InvalidInputError(f"token vectors: {label} must be 32 hex digits")
        if not isinstance(self.record_id, str) or not self.record_id:
            raise InvalidInputError("token vectors: record_id must be a non-empty str")
        data = self.data
        if not isinstance(data, np.ndarray) or data.dtype != np.int8 or data.ndim != 2:
            raise InvalidInputError("token vectors: data must be a 2-d int8 array")
        tokens, dim = data.shape
        if not (1 <= tokens <= MAX_TOKENS and 1 <= dim <= MAX_TOKEN_DIM):
            raise InvalidInputError(f"token vectors: shape {data.shape} is out of range")
        scale = self.scale
        if (
            isinstance(scale, bool)
            or not isinstance(scale, (int, float))
            or not math.isfinite(scale)
            or not scale > 0
        ):
            raise InvalidInputError("token vectors: scale must be a finite number > 0")

    @property
    def tokens(self) -> int:
        """Rows (word pieces)."""
        return int(self.data.shape[0])

    @property
    def dim(self) -> int:
        """Width of a row."""
        return int(self.data.shape[1])

    def floats(self) -> npt.NDArray[np.float32]:
        """The vectors as float32 (``data * scale``)."""
        return self.data.astype(np.float32) * np.float32(self.scale)

    @classmethod
    def from_bytes(
        cls,
        record_id: str,
        encoder: str,
        digest: str,
        raw: bytes,
        *,
        tokens: int,
        dim: int,
        scale: float,
    ) -> TokenVectors:
        """Rebuild a row from its stored bytes (checked: the size must match the shape).

        Raises:
            InvalidInputError: on a size, shape, scale or digest that does not fit.
        """
        if not (1 <= tokens <= MAX_TOKENS and 1 <= dim <= MAX_TOKEN_DIM):
            raise InvalidInputError(f"token vectors: shape ({tokens}, {dim}) is out of range")
        if len(raw) != tokens * dim:
            raise InvalidInputError(
                f"token vectors: {len(raw)} bytes for a ({tokens}, {dim}) int8 matrix"
            )
        data = np.frombuffer(bytes(raw), dtype=np.int8).reshape(tokens, dim)
        return cls(record_id, encoder, digest, data, float(scale))


def quantize(
    record_id: str, encoder: str, digest: str, rows: npt.NDArray[np.floating]
) -> TokenVectors:
    """``rows`` as int8 with one scale (the largest absolute value maps to 127).

    Raises:
        InvalidInputError: if ``rows`` is not a finite non-empty 2-d matrix.
    """
    matrix = np.asarray(rows, dtype=np.float32)
    if matrix.ndim != 2 or not matrix.size or not np.isfinite(matrix).all():
        raise InvalidInputError(f"token vectors must be a finite 2-d matrix, got {matrix.shape}")
    peak = float(np.abs(matrix).max())
    scale = peak / 127.0 if peak > 0 else 1.0
    data = np.clip(np.rint(matrix / scale), -127, 127).astype(np.int8)
    return TokenVectors(record_id, encoder, digest, data, scale)


@runtime_checkable
class TokenVectorStore(Protocol):
    """A record store that keeps token vectors with the records (the SQL stores).

    Every call is scoped to one user: a row is read, written or deleted only with its
    record's owner. A row goes when its record goes (``delete``, ``delete_user``).
    """

    def put_token_vectors(self, user_id: str, rows: Sequence[TokenVectors]) -> int:
        """Store (or replace) rows of ``user_id``'s records; a missing record is skipped.

        Returns:
            How many rows were written.
        """
        ...

    def token_vectors(
        self, user_id: str, ids: Sequence[str], *, encoder: str
    ) -> Mapping[str, TokenVectors]:
        """The rows of ``ids`` (of ``user_id``) made by ``encoder``, in one query."""
        ...

    def token_vector_rows(self, user_id: str) -> list[TokenVectors]:
        """Every row of ``user_id`` (any encoder), for export."""
        ...

    def delete_token_vectors(self, user_id: str, *, keep_encoder: str | None = None) -> int:
        """Delete ``user_id``'s rows (all, or those of encoders other than ``keep_encoder``)."""
        ...


class PoolRow(NamedTuple):
    """What :class:`PoolReader` gives for one record of a pool.

    Attributes:
        previous: The text of the record before it in its conversation (``None``: none).
        vectors: Its stored row of the asked encoder (``None``: none, or unreadable).
    """

    previous: str | None
    vectors: TokenVectors | None


@runtime_checkable
class PoolReader(Protocol):
    """A token-vector store that reads a pool's links and vectors in one query (the SQL stores).

    A reranker that scores each record after the one before it needs, per record of its
    pool, that record's previous text (to know what was encoded) and its stored vectors;
    read apart, they are three queries over the same ids.
    """

    def pool_rows(
        self, user_id: str, ids: Sequence[str], *, encoder: str, gap: timedelta | None
    ) -> Mapping[str, PoolRow]:
        """Each of ``user_id``'s records among ``ids``: its previous text and stored row.

        The previous record follows :meth:`~memories_core.interfaces.NeighbourStore.adjacent`
        (same kind; same session, or without one within ``gap``). Other users' and missing
        ids are left out.
        """
        ...


# -- memory files ---------------------------------------------------------------------------


def export_rows(store: object, user_id: str) -> dict[str, bytes] | None:
    """The memory-file members holding ``user_id``'s stored vectors (``None``: there are none)."""
    if not isinstance(store, TokenVectorStore):
        return None
    rows = store.token_vector_rows(user_id)
    if not rows:
        return None
    listing = [
        {
            "id": r.record_id,
            "encoder": r.encoder,
            "digest": r.digest,
            "tokens": r.tokens,
            "dim": r.dim,
            "scale": float(r.scale),
        }
        for r in rows
    ]
    values = np.concatenate([r.data.reshape(-1) for r in rows])
    buffer = io.BytesIO()
    np.save(buffer, values, allow_pickle=False)
    return {
        ROWS_MEMBER: "".join(json.dumps(row) + "\n" for row in listing).encode(),
        VALUES_MEMBER: buffer.getvalue(),
    }


def read_rows(
    read: Callable[[str], bytes],
    record_ids: set[str],
    *,
    max_rows: int,
    fail: Callable[[str, str], Exception],
) -> list[TokenVectors]:
    """Validate a memory file's vector members (untrusted) and return their rows.

    Every row must name a record of the file once, carry 32-hex-digit tags, a shape in
    range, a finite positive scale; the values must be one flat int8 array exactly as long
    as the rows' shapes add up to. Nothing is unpickled.

    Args:
        read: Returns a member's bytes (bounded by the import's limits).
        record_ids: The ids of the file's records.
        max_rows: Most rows accepted.
        fail: Builds the error to raise (member, problem).
    """
    text = read(ROWS_MEMBER).decode("utf-8", errors="strict")
    listing: list[Mapping[str, Any]] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{ROWS_MEMBER} line {number}"
        if len(listing) >= max_rows:
            raise fail(ROWS_MEMBER, f"more than {max_rows} rows (the limit)")
        try:
            row = json.loads(line, parse_constant=_refuse)
        except (ValueError, RecursionError) as exc:
            raise fail(where, f"not valid JSON ({exc})") from exc
        if not isinstance(row, dict) or set(row) != _ROW_FIELDS:
            raise fail(where, f"must be an object with exactly {sorted(_ROW_FIELDS)}")
        if row["id"] not in record_ids:
            raise fail(where, f"{row['id']!r} is no record of the file")
        for key in ("tokens", "dim"):
            if isinstance(row[key], bool) or not isinstance(row[key], int) or row[key] < 1:
                raise fail(where, f"{key} must be a positive int")
        scale = row["scale"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            raise fail(where, "scale must be a number")
        if not math.isfinite(scale) or not scale > 0:
            raise fail(where, "scale must be finite and > 0")
        listing.append(row)
    ids = [row["id"] for row in listing]
    if len(set(ids)) != len(ids):
        raise fail(ROWS_MEMBER, "a record has two rows")
    try:
        values = np.load(io.BytesIO(read(VALUES_MEMBER)), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise fail(VALUES_MEMBER, f"not a plain numeric array ({exc})") from exc
    if not isinstance(values, np.ndarray) or values.dtype != np.int8 or values.ndim != 1:
        raise fail(VALUES_MEMBER, "must be a flat int8 array")
    sizes = [int(row["tokens"]) * int(row["dim"]) for row in listing]
    if sum(sizes) != values.size:
        raise fail(VALUES_MEMBER, f"holds {values.size} values; the rows need {sum(sizes)}")
    out: list[TokenVectors] = []
    start = 0
    for row, size in zip(listing, sizes, strict=True):
        try:
            out.append(
                TokenVectors.from_bytes(
                    row["id"],
                    row["encoder"],
                    row["digest"],
                    values[start : start + size].tobytes(),
                    tokens=row["tokens"],
                    dim=row["dim"],
                    scale=float(row["scale"]),
                )
            )
        except InvalidInputError as exc:
            raise fail(f"{ROWS_MEMBER} row {row['id']!r}", str(exc)) from exc
        start += size
    return out


def _refuse(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")
