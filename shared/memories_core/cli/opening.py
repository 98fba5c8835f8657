"""Opening the memory a command names: a folder or a DSN, with the embedder it was built with."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from memories_core.errors import EmbedderMismatchError

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine
    from memories_core.interfaces import Embedder

__all__ = ["CLIError", "embedder_spec"]


_EMBEDDERS = "minilm (default), hashing, or hashing-<dimension> (dimension 8 or more)"


_MINILM_NAME = "sentence-transformers:all-MiniLM-L6-v2"


class CLIError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def embedder_spec(value: str) -> str:
    """Check an ``--embedder`` value while the arguments are parsed.

    Rule: ``minilm``, ``hashing`` or ``hashing-<n>`` with an integer ``n >= 8`` (the smallest
    dimension :class:`~memories_core.embedders.HashingEmbedder` accepts); anything else is a
    usage error, reported by argparse like any bad argument.

    Raises:
        argparse.ArgumentTypeError: on any other value.
    """
    spec = value.strip().lower()
    if spec in ("minilm", "hashing"):
        return spec
    dimension = spec.removeprefix("hashing-")
    if spec.startswith("hashing-") and dimension.isdigit() and int(dimension) >= 8:
        return f"hashing-{int(dimension)}"
    raise argparse.ArgumentTypeError(f"unknown embedder {value!r}: use {_EMBEDDERS}")


def _embedder(spec: str) -> Embedder:
    if spec == "minilm":
        from memories_core.embedders import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder()
    from memories_core.embedders import HashingEmbedder

    dimension = spec.removeprefix("hashing").lstrip("-")
    return HashingEmbedder(int(dimension)) if dimension else HashingEmbedder()


def _spec_of(name: str | None) -> str | None:
    """The ``--embedder`` value that opens a memory built with the embedder ``name``."""
    if name == _MINILM_NAME:
        return "minilm"
    if name and name.startswith("hashing-"):
        try:
            return embedder_spec(name)
        except argparse.ArgumentTypeError:
            return None
    return None


def _mismatch(exc: EmbedderMismatchError) -> CLIError:
    """The mismatch in command-line terms: which ``--embedder`` opens the memory."""
    stored = getattr(exc, "stored", None)
    given = getattr(exc, "given", None)
    spec = _spec_of(stored)
    what = (
        f"this memory was built with embedder {stored!r}, not {given!r}"
        if stored and given
        else str(exc)
    )
    if spec is not None:
        hint = f"run again with --embedder {spec}"
    else:
        hint = (
            "this command line opens memories built with minilm or hashing embedders; "
            "open this one from Python with the embedder it was built with"
        )
    return CLIError(
        f"{what}\nhint: {hint}. To move a memory to another embedder, export each user and "
        "import the files into a new --path with the new --embedder (records are re-embedded)."
    )


@contextmanager
def _no_model_progress_bars() -> Iterator[None]:
    """Silence the progress bars of Hugging Face libraries for one command (``-q``).

    Loading the MiniLM embedder draws a "Loading weights" bar (transformers) and, on a first
    download, hub bars; both libraries offer a switch, turned back on afterwards so that a
    process that calls :func:`main` keeps its own setting.
    """
    restore: list[Callable[[], None]] = []
    try:
        from huggingface_hub.utils import (
            are_progress_bars_disabled,
            disable_progress_bars,
            enable_progress_bars,
        )
        from transformers.utils import logging as transformers_logging
    except ImportError:  # no MiniLM without them: nothing draws bars
        yield
        return
    if not are_progress_bars_disabled():
        disable_progress_bars()
        restore.append(enable_progress_bars)
    if transformers_logging.is_progress_bar_enabled():
        transformers_logging.disable_progress_bar()
        restore.append(transformers_logging.enable_progress_bar)
    try:
        yield
    finally:
        for undo in restore:
            undo()


def _open(args: argparse.Namespace, *, create: bool = False) -> MemoryEngine:
    from memories_core.engine import MemoryEngine

    target = str(args.path)
    if target.startswith(("postgres://", "postgresql://")):
        return _open_postgres(target, args, create=create)
    path = Path(target)
    if path.exists() and not path.is_dir():
        raise CLIError(f"{path} is a file; --path names the folder of a memory")
    if not create and not (path / "records.sqlite3").exists():
        raise CLIError(f"no memory at {path} (expected {path / 'records.sqlite3'})")
    try:
        return MemoryEngine(path=path, embedder=_embedder(args.embedder))
    except EmbedderMismatchError as exc:
        raise _mismatch(exc) from exc


def _open_postgres(dsn: str, args: argparse.Namespace, *, create: bool) -> MemoryEngine:
    """A memory in PostgreSQL: records in ``--schema``, vectors in pgvector or a Chroma server."""
    from memories_core.backends.postgres import postgres_storage
    from memories_core.engine import MemoryEngine

    embedder = _embedder(args.embedder)
    if not create and not _postgres_schema_exists(dsn, args.schema):
        raise CLIError(f"no memory in schema {args.schema!r} of that database")
    parts = postgres_storage(
        dsn,
        dimension=embedder.dimension,
        schema=args.schema,
        artifacts_path=args.artifacts,
        chroma_host=args.chroma_host,
        chroma_port=args.chroma_port,
    )
    try:
        return MemoryEngine(**parts, embedder=embedder)
    except BaseException as exc:
        parts["store"].close()
        close = getattr(parts["index"], "close", None)
        if callable(close):
            close()
        if isinstance(exc, EmbedderMismatchError):
            raise _mismatch(exc) from exc
        raise


def _postgres_schema_exists(dsn: str, schema: str) -> bool:
    from memories_core.backends.pg_common import redact_dsn
    from memories_core.errors import BackendError

    try:
        import psycopg
    except ImportError as exc:
        raise CLIError("a PostgreSQL memory needs: pip install 'llm-memories[postgres]'") from exc
    try:
        with psycopg.connect(dsn, connect_timeout=30) as conn:
            row = conn.execute(
                "SELECT 1 FROM pg_namespace AS n JOIN pg_class AS c ON c.relnamespace = n.oid "
                "WHERE n.nspname = %s AND c.relname = 'records'",
                (schema,),
            ).fetchone()
    except psycopg.Error as exc:
        raise BackendError(
            f"cannot connect to PostgreSQL at {redact_dsn(dsn)} ({type(exc).__name__})"
        ) from None
    return row is not None
