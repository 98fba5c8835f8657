"""``llm-memories``: inspect and operate a memory from the command line.

Commands (each works on ``--path``, the folder a ``MemoryEngine(path=...)`` wrote, or a
PostgreSQL DSN with ``--schema``: records in
:class:`~memories_core.backends.postgres.PostgresRecordStore`, vectors in pgvector or, with
``--chroma-host``, a Chroma server):

* ``users``: every user with their record count;
* ``show USER [--kind K] [--limit N]``: the user's records as a table, newest first;
* ``search USER QUERY [-k N] [--kind K]``: what a recall would find;
* ``export USER FILE`` / ``import FILE [--merge]``: the portable memory file;
* ``forget USER --yes`` (everything of the user) or ``forget USER --record ID ...``;
* ``reindex``: rebuild the vector index (progress bar);
* ``retry-pending [USER] [--llm openai --model M --base-url URL]``: run pending derivations;
* ``stats``: records, users, disk, pending work, failures, model usage where recorded.

Opening a memory needs the embedder it was built with (``--embedder minilm``, the default,
or ``--embedder hashing`` / ``hashing-<dimension>``); another one is refused with a message
naming the stored one. No framework is imported.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TextIO

from memories_core.cli.commands import ID_WIDTH as ID_WIDTH
from memories_core.cli.commands import MIN_ID_PREFIX as MIN_ID_PREFIX
from memories_core.cli.opening import CLIError, _no_model_progress_bars, _open
from memories_core.cli.opening import embedder_spec as embedder_spec
from memories_core.cli.parser import build_parser
from memories_core.errors import MemoriesError

__all__ = ["build_parser", "main"]


def _created_by_import(args: argparse.Namespace) -> tuple[Path, bool] | None:
    """What a failed ``import`` must remove: ``(folder, remove_the_folder_itself)``.

    A folder that did not exist (the top-most missing ancestor of ``--path``) is removed
    whole; an empty folder is emptied. A folder that held anything is not touched.
    """
    if not getattr(args, "create", False) or str(args.path).startswith(
        ("postgres://", "postgresql://")
    ):
        return None
    path = Path(args.path).absolute()
    if path.is_dir():
        return (path, False) if not any(path.iterdir()) else None
    top = path
    while not top.parent.exists():
        top = top.parent
    return top, True


def _undo_creation(created: tuple[Path, bool]) -> None:
    folder, whole = created
    if whole:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for child in folder.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


def _run(args: argparse.Namespace, out: TextIO) -> int:
    prepare = getattr(args, "prepare", None)
    if prepare is not None:
        prepare(args)
    created = _created_by_import(args)
    done = False
    try:
        engine = _open(args, create=getattr(args, "create", False))
        try:
            code = int(args.run(engine, args, out))
        finally:
            engine.close()
        done = True
        return code
    finally:
        if not done and created is not None:
            _undo_creation(created)


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run ``llm-memories`` with ``argv``; returns the exit status.

    Exit status 0 on success, 1 when ``retry-pending`` leaves work pending, 2 on a usage
    error or a refused operation (the message goes to standard error, without a traceback),
    130 when interrupted.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).
        out: Where results are printed (default: standard output).
    """
    stream = out or sys.stdout
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.path:
        parser.error("the following arguments are required: --path")
    try:
        with ExitStack() as stack:
            if args.quiet and args.embedder == "minilm":
                stack.enter_context(_no_model_progress_bars())
            return _run(args, stream)
    except (CLIError, MemoriesError, OSError) as exc:
        print(f"llm-memories: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("llm-memories: interrupted", file=sys.stderr)
        return 130
