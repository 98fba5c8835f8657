"""The argument parser: options shared by every command and each command's help."""

from __future__ import annotations

import argparse
from typing import Any

from memories_core.cli.commands import (
    ID_WIDTH,
    MIN_ID_PREFIX,
    _check_memory_file,
    _export,
    _forget,
    _import,
    _reindex,
    _retry,
    _search,
    _show,
    _stats,
    _users,
)
from memories_core.cli.opening import _EMBEDDERS, embedder_spec

__all__ = ["build_parser"]


_EPILOG = """examples:
  llm-memories --path ./memory users
  llm-memories --path ./memory show alice --limit 20
  llm-memories --path ./memory search alice "what does she eat?" -k 3
  llm-memories --path ./memory forget alice --record 3f2a9c1b
  llm-memories --path ./memory export alice alice.zip
  llm-memories --path ./other import alice.zip
  llm-memories --path postgresql://app@db/memories --schema prod stats

Options before the command (--path, --embedder, -q, ...) may also follow it."""


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (``--limit``, ``--width``, ``-k``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _memory_options(parser: argparse.ArgumentParser, *, defaults: bool) -> None:
    """The options that say which memory to open and how to print.

    The main parser holds their defaults; each command accepts them too (with no default,
    so that ``llm-memories show alice --path DIR`` and ``llm-memories --path DIR show alice``
    mean the same).
    """

    def default(value: Any) -> Any:
        return value if defaults else argparse.SUPPRESS

    group = parser.add_argument_group("memory options")
    group.add_argument(
        "--path",
        default=default(None),
        help="folder of the memory (what MemoryEngine(path=...) wrote), or a PostgreSQL DSN "
        "(postgresql://user@host/db; the password from PGPASSWORD or ~/.pgpass); required",
    )
    group.add_argument(
        "--embedder",
        type=embedder_spec,
        default=default("minilm"),
        help=f"embedder the memory was built with: {_EMBEDDERS}",
    )
    group.add_argument(
        "--schema",
        default=default("llm_memories"),
        help="with a DSN: schema of the memory's tables (default: llm_memories)",
    )
    group.add_argument(
        "--artifacts",
        default=default(None),
        help="with a DSN: folder of artifact bytes shared by the workers",
    )
    group.add_argument(
        "--chroma-host",
        default=default(None),
        help="with a DSN: keep vectors in this Chroma server instead of pgvector",
    )
    group.add_argument(
        "--chroma-port",
        type=positive_int,
        default=default(8000),
        help="with --chroma-host: its port (default: 8000)",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=default(False),
        help="no progress bars (also none from loading the MiniLM model)",
    )


def _command(
    commands: Any, name: str, summary: str, description: str, run: Any
) -> argparse.ArgumentParser:
    command: argparse.ArgumentParser = commands.add_parser(
        name,
        help=summary,
        description=description,
    )
    _memory_options(command, defaults=False)
    command.set_defaults(run=run)
    return command


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``llm-memories``."""
    parser = argparse.ArgumentParser(
        prog="llm-memories",
        description="Inspect and operate an llm-memories memory.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _memory_options(parser, defaults=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _command(
        commands, "users", "list users", "Every user of the memory and their record count.", _users
    )

    show = _command(
        commands,
        "show",
        "a user's records, newest first",
        "A user's records as a table, newest first. The id column shows the first "
        f"{ID_WIDTH} characters of each id; forget --record takes them (or any unique prefix).",
        _show,
    )
    show.add_argument("user", help="whose records to list")
    show.add_argument(
        "--kind", help="only records of this kind (turn, summary, memory, conditional, ...)"
    )
    show.add_argument(
        "--limit", type=positive_int, default=50, help="at most this many records (default: 50)"
    )
    show.add_argument(
        "--width", type=positive_int, default=80, help="text column width (default: 80)"
    )
    show.add_argument("--full-ids", action="store_true", help="print whole record ids")

    search = _command(
        commands,
        "search",
        "search a user's memories",
        "What a recall for QUERY would find in USER's memory, best first, with scores.",
        _search,
    )
    search.add_argument("user", help="whose memory to search")
    search.add_argument("query", help="the text to search for (quote it)")
    search.add_argument("-k", type=positive_int, default=5, help="number of results (default: 5)")
    search.add_argument("--kind", help="only records of this kind")
    search.add_argument(
        "--width", type=positive_int, default=80, help="text column width (default: 80)"
    )
    search.add_argument("--full-ids", action="store_true", help="print whole record ids")

    export = _command(
        commands,
        "export",
        "write a user's portable memory file",
        "Write everything USER's memory holds (records, history, pending work, graph, "
        "artifacts, vectors) to one zip file; import restores it into any memory.",
        _export,
    )
    export.add_argument("user", help="whose memory to export")
    export.add_argument("file", help="the file to write, e.g. alice.zip (not a folder)")

    imp = _command(
        commands,
        "import",
        "import a portable memory file",
        "Restore a file written by export. The file is checked before anything is written; "
        "a refused or failed import leaves the memory as it was (and creates none at a "
        "--path that held none). With another embedder than the file's, records are "
        "re-embedded.",
        _import,
    )
    imp.add_argument("file", help="the memory file written by export")
    imp.add_argument(
        "--merge",
        action="store_true",
        help="the user exists already: add what the file has and the memory lacks",
    )
    imp.set_defaults(create=True, prepare=_check_memory_file)

    forget = _command(
        commands,
        "forget",
        "erase a user, or some of their records",
        "Erase everything of USER (with --yes), or only the records given with --record. "
        "Erased records leave no bytes behind in the store.",
        _forget,
    )
    forget.add_argument("user", help="whose memory to erase from")
    forget.add_argument(
        "--record",
        action="append",
        metavar="ID",
        help=f"a record id, or a unique prefix of {MIN_ID_PREFIX}+ characters as show prints "
        "it (repeatable)",
    )
    forget.add_argument("--reason", help="note kept in the history with --record")
    forget.add_argument("--yes", action="store_true", help="confirm erasing the whole user")

    _command(
        commands,
        "reindex",
        "rebuild the vector index",
        "Re-embed every record and rebuild the vector index (after a crash or a repair "
        "hint from stats).",
        _reindex,
    )

    retry = _command(
        commands,
        "retry-pending",
        "run pending derivations now",
        "Run the derivations (summaries, conditional memories, ...) that are still "
        "pending, for one user or all, with the default offline model or an "
        "OpenAI-compatible one.",
        _retry,
    )
    retry.add_argument("user", nargs="?", help="only this user's pending work (default: all)")
    retry.add_argument(
        "--llm",
        choices=["default", "openai"],
        default="default",
        help="model that runs them: the package's offline default, or an OpenAI-compatible "
        "server (OPENAI_API_KEY)",
    )
    retry.add_argument("--model", default="gpt-4o-mini", help="with --llm openai: the model name")
    retry.add_argument("--base-url", help="with --llm openai: the server's base URL")

    _command(
        commands,
        "stats",
        "records, users, disk, pending work",
        "Records by kind, users, disk use, pending work, index health, model usage.",
        _stats,
    )
    return parser
