"""Typed exceptions raised by the core.

Every error the package raises on purpose derives from :class:`MemoriesError`, so a caller can
catch one class. Input errors also derive from :class:`ValueError`.
"""

from __future__ import annotations

import operator

__all__ = [
    "BackendError",
    "ConfigurationError",
    "EmbedderMismatchError",
    "InvalidInputError",
    "LLMCancelledError",
    "LLMError",
    "LLMTimeoutError",
    "MemoriesError",
    "MissingExtraError",
    "MissingUserError",
    "ParseError",
    "SchemaVersionError",
    "SearchKeyError",
    "StoreInUseError",
    "as_whole",
    "check_count",
]


class MemoriesError(Exception):
    """Base class of every error raised on purpose by llm-memories."""


class InvalidInputError(MemoriesError, ValueError):
    """Input that cannot be stored: empty or whitespace text, wrong types, oversize text."""


class MissingUserError(InvalidInputError):
    """A read or write came without a ``user_id``; every operation must be scoped."""


class SearchKeyError(InvalidInputError):
    """A search key whose ``key_for`` target is missing, another user's, or itself a key."""


class ConfigurationError(MemoriesError, ValueError):
    """Contradictory or impossible constructor arguments."""


class EmbedderMismatchError(ConfigurationError):
    """The embedder does not match the one an existing store was built with.

    Open the store with the original embedder, or call ``reindex()`` after opening it with
    ``allow_embedder_change=True`` to re-embed every record with the new one.

    Attributes:
        stored: Name of the embedder the store was built with, when known.
        given: Name of the embedder it was opened with, when known.
    """

    def __init__(
        self, message: str, *, stored: str | None = None, given: str | None = None
    ) -> None:
        super().__init__(message)
        self.stored = stored
        self.given = given


class StoreInUseError(ConfigurationError):
    """An embedded store that one process at a time may open is open in another process.

    The embedded Chroma index (``ChromaIndex(path=...)``, the default index of
    ``MemoryEngine(path=...)``) keeps its HNSW graph in process memory and writes it back to
    its folder; two processes writing one folder lose or corrupt vectors, so the folder is
    locked by the process that opened it. For several workers on one memory use the server
    setup (docs/deploy.md): records in PostgreSQL (``PostgresRecordStore(dsn)``) with vectors
    in pgvector (``PgVectorIndex(dsn, dimension=...)``) or a Chroma server
    (``ChromaIndex(host=...)``).

    Attributes:
        path: The locked folder.
        holder: Process id that holds the lock, when known.
    """

    def __init__(self, message: str, *, path: str = "", holder: int | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.holder = holder


class BackendError(MemoriesError):
    """A storage backend failed (SQLite, Chroma, ...)."""


class SchemaVersionError(BackendError):
    """A store's schema is newer than this release reads, or an upgrade step failed.

    Attributes:
        found: The schema version recorded in the store.
        supported: The newest version this release knows.
    """

    def __init__(self, message: str, *, found: int, supported: int) -> None:
        super().__init__(message)
        self.found = found
        self.supported = supported


class LLMError(MemoriesError):
    """An LLM call failed (network, server, or the model raised)."""


class LLMTimeoutError(LLMError, TimeoutError):
    """An LLM call gave no answer within its timeout.

    A derivation that times out stays pending and is retried with backoff; a recall-time
    model step that runs out of its budget falls back to the plain search.

    Attributes:
        timeout: The limit that was exceeded, in seconds.
    """

    def __init__(self, message: str, *, timeout: float) -> None:
        super().__init__(message)
        self.timeout = timeout


class LLMCancelledError(LLMError):
    """A model call stopped before its answer because its caller asked it to.

    Raised by a model call when the engine stops its worker (``close()`` past its timeout,
    or the interpreter exiting), or when an inline ``flush(timeout=...)`` runs out of time,
    during a generation (:mod:`memories_core.llms.cancel`). The job it served is given back,
    pending, with no failure counted: nothing was wrong with the model or its reply.
    """


class ParseError(MemoriesError, ValueError):
    """Model output could not be parsed into the expected structure.

    Attributes:
        raw: The text that failed to parse.
        fix: What a repair request should ask of the model, when "the same content in the
            requested format" would repeat the fault (a copied placeholder); else ``None``.
    """

    def __init__(self, message: str, raw: str = "", *, fix: str | None = None) -> None:
        super().__init__(message)
        self.raw = raw
        self.fix = fix


class MissingExtraError(MemoriesError, ImportError):
    """An optional dependency is missing; the message names the extra to install."""

    def __init__(self, package: str, extra: str) -> None:
        super().__init__(
            f"{package} is not installed; install it with: pip install 'llm-memories[{extra}]'"
        )
        self.package = package
        self.extra = extra


def check_count(
    label: str,
    value: object,
    *,
    minimum: int = 1,
    error: type[MemoriesError] = ConfigurationError,
) -> int:
    """Return ``value`` as an ``int`` if it is a whole number (not a ``bool``) >= ``minimum``.

    The one check behind every count-like setting (sizes, batch sizes, threads, limits).
    A whole number is an ``int`` or any integer type (``numpy.int64`` from an array's
    arithmetic, for example); the caller keeps the plain ``int`` returned, so such a value
    is stored and serialised as Python's own.

    Args:
        label: The setting's name, as the message shows it.
        value: What the caller passed.
        minimum: The smallest value allowed (1: a positive int; 0: a non-negative one).
        error: The error class raised: :class:`ConfigurationError` for settings,
            :class:`InvalidInputError` for values that come with the data.

    Raises:
        ConfigurationError: (or ``error``) naming ``label`` and the value given.
    """
    whole = as_whole(value)
    if whole is None or whole < minimum:
        kind = {1: "a positive int", 0: "a non-negative int"}.get(minimum, f"an int >= {minimum}")
        raise error(f"{label} must be {kind}, got {value!r}")
    return whole


def as_whole(value: object) -> int | None:
    """``value`` as a plain ``int`` if it is a whole number, else ``None``.

    Whole numbers are ``int`` and every type that declares itself an integer
    (``__index__``: numpy's integers, for one); ``bool`` (and ``numpy.bool_``) and floats,
    even integral ones, are not.
    """
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        return None
