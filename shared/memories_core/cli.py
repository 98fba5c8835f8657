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
import json
import shutil
import sys
import zipfile
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from memories_core.errors import EmbedderMismatchError, MemoriesError

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine
    from memories_core.interfaces import Embedder

__all__ = ["build_parser", "main"]

#: Characters of a record id that ``show`` and ``search`` print; ``forget --record`` takes
#: any unique prefix of at least :data:`MIN_ID_PREFIX` characters, or the whole id.
ID_WIDTH = 12
MIN_ID_PREFIX = 4
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


def _short(text: str, width: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _table(rows: list[list[str]], headers: list[str], out: TextIO) -> None:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    print(line.rstrip(), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)


def _disk(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _disk_line(engine: MemoryEngine) -> str:
    if engine.path is not None:
        return _size(_disk(engine.path))
    disk_bytes = getattr(engine.store, "disk_bytes", None)
    if callable(disk_bytes):
        return f"{_size(disk_bytes())} (PostgreSQL tables and indexes)"
    return "in memory"


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"  # pragma: no cover


# -- commands -------------------------------------------------------------------------------


def _users(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    rows = [[user, str(len(engine.records(user)))] for user in sorted(engine.users())]
    _table(rows, ["user", "records"], out)
    return 0


def _id(record_id: str, args: argparse.Namespace) -> str:
    return record_id if args.full_ids else record_id[:ID_WIDTH]


def _show(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    where = {"kind": args.kind} if args.kind else None
    records = sorted(engine.records(args.user, where=where), key=lambda r: r.created_at)[::-1]
    rows = [
        [
            r.created_at.strftime("%Y-%m-%d %H:%M"),
            r.kind,
            _id(r.id, args),
            "archived" if r.state.archived else "",
            _short(r.text, args.width),
        ]
        for r in records[: args.limit]
    ]
    _table(rows, ["created", "kind", "id", "state", "text"], out)
    if len(records) > args.limit:
        print(f"({args.limit} of {len(records)} records shown; --limit N for more)", file=out)
    return 0


def _search(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    hits = engine.search(args.query, args.user, k=args.k, kinds=[args.kind] if args.kind else None)
    rows = [
        [f"{h.score:.3f}", h.record.kind, _id(h.record.id, args), _short(h.record.text, args.width)]
        for h in hits
    ]
    _table(rows, ["score", "kind", "id", "text"], out)
    return 0


def _export(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    from memories_core.portable import export_user

    if args.user not in engine.users():
        raise CLIError(f"no user {args.user!r} in this memory")
    target = Path(args.file)
    if target.is_dir():
        raise CLIError(
            f"{target} is a folder; give the file to write, e.g. {target / 'memory.zip'}"
        )
    # The file is written beside its target and renamed into place; a failure must not
    # leave that partial file behind.
    partial = target.with_name(target.name + ".tmp")
    had_partial = partial.exists()
    try:
        written = export_user(engine, args.user, target)
    except BaseException:
        if not had_partial:
            partial.unlink(missing_ok=True)
        raise
    print(f"exported {args.user} to {written}", file=out)
    return 0


_MANIFEST_LIMIT = 1 << 20


def _check_memory_file(args: argparse.Namespace) -> None:
    """Refuse what is plainly not a memory file before a memory is opened or created.

    Rule: the file exists, is a zip archive and holds a JSON ``manifest.json`` of at most
    1 MiB naming its user. :func:`~memories_core.portable.import_user` validates the whole
    file afterwards; this check only keeps ``import`` of a wrong file from opening (or
    creating) the memory at ``--path`` at all.
    """
    file = Path(args.file)
    if file.is_dir():
        raise CLIError(f"{file} is a folder, not a memory file")
    if not file.is_file():
        raise CLIError(f"no file {file}")
    try:
        with zipfile.ZipFile(file) as archive:
            info = archive.getinfo("manifest.json")
            if info.file_size > _MANIFEST_LIMIT:
                raise CLIError(f"{file} is not a memory file: its manifest is too large")
            manifest = json.loads(archive.read(info))
    except KeyError:
        raise CLIError(f"{file} is not a memory file: it has no manifest.json") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError) as exc:
        raise CLIError(f"{file} is not a memory file ({type(exc).__name__}: {exc})") from None
    user = manifest.get("user_id") if isinstance(manifest, dict) else None
    if not isinstance(user, str) or not user:
        raise CLIError(f"{file} is not a memory file: its manifest names no user")
    args.file_user = user


def _import(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    from memories_core.portable import UserExistsError, import_user

    try:
        report = import_user(engine, args.file, on_conflict="merge" if args.merge else "refuse")
    except UserExistsError as exc:
        user = getattr(args, "file_user", "the file's user")
        raise CLIError(
            f"this memory holds user {user!r} already; add --merge to merge the file into "
            f"it, or erase the user first with: llm-memories --path {args.path} forget "
            f"{user} --yes"
        ) from exc
    how = "re-embedded" if report.reembedded else "vectors reused"
    print(
        f"imported {report.user_id}: {report.records} records ({report.skipped} already "
        f"present), {report.history} history entries, {report.jobs} jobs, "
        f"{report.artifacts} artifacts; {how}",
        file=out,
    )
    return 0


def _forget(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    if args.record:
        ids = _resolve_ids(engine, args.user, args.record)
        engine.delete_records(args.user, ids, reason=args.reason or "llm-memories forget")
        print(f"deleted {len(ids)} record(s) of {args.user}", file=out)
        return 0
    if not args.yes:
        raise CLIError(f"this erases everything of {args.user!r}; add --yes to confirm")
    engine.delete_user(args.user, vacuum=True)
    print(f"erased {args.user}", file=out)
    return 0


def _resolve_ids(engine: MemoryEngine, user: str, given: Sequence[str]) -> list[str]:
    """The ids of ``user``'s records that ``given`` names, or an error that deletes nothing.

    Rule: a value equal to one of the user's record ids names it; otherwise a value of at
    least :data:`MIN_ID_PREFIX` characters names the one record whose id starts with it (what
    ``show`` prints). No match, or several, is an error naming the values.
    """
    ids = [r.id for r in engine.records(user)]
    known = set(ids)
    chosen: list[str] = []
    missing: list[str] = []
    ambiguous: list[str] = []
    for value in given:
        if value in known:
            matches = [value]
        elif len(value) >= MIN_ID_PREFIX:
            matches = [i for i in ids if i.startswith(value)]
        else:
            matches = []
        if not matches:
            missing.append(value)
        elif len(matches) > 1:
            ambiguous.append(f"{value} ({len(matches)} records)")
        elif matches[0] not in chosen:
            chosen.append(matches[0])
    if missing:
        raise CLIError(f"{user} has no record {', '.join(missing)}; nothing deleted")
    if ambiguous:
        raise CLIError(
            f"{', '.join(ambiguous)} match several records of {user}; give more characters "
            "(show --full-ids prints whole ids); nothing deleted"
        )
    return chosen


def _reindex(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    count = engine.reindex(progress=not args.quiet)
    print(f"reindexed {count} records", file=out)
    return 0


def _attach_for_jobs(engine: MemoryEngine, args: argparse.Namespace) -> list[Any]:
    """Attach the mechanisms that own pending jobs (they run the jobs); returns them."""
    from memories_core import ConditionalMemory, HistoryMemory, SummaryMemory

    known: dict[str, Any] = {
        cls.mechanism_name: cls for cls in (HistoryMemory, SummaryMemory, ConditionalMemory)
    }
    wanted = sorted({job.mechanism for job in engine.pending(args.user)})
    llm = None
    if args.llm == "openai":
        from memories_core.errors import ConfigurationError
        from memories_core.llms import OpenAIChatLLM

        try:
            llm = OpenAIChatLLM(args.model, base_url=args.base_url)
        except ConfigurationError as exc:
            raise CLIError(
                "--llm openai needs an API key: set OPENAI_API_KEY, or give --base-url of a "
                "local OpenAI-compatible server"
            ) from exc
    attached = []
    for name in wanted:
        cls = known.get(name)
        if cls is not None and name not in engine.mechanisms:
            kwargs: dict[str, Any] = {"engine": engine}
            if llm is not None and cls is not HistoryMemory:
                kwargs["llm"] = llm
            attached.append(cls(**kwargs))
    return attached


_USAGE_KEY = "cli.llm_usage"


def _record_usage(engine: MemoryEngine, mechanisms: list[Any]) -> None:
    """Add the model usage of this run to what earlier runs of the command line recorded."""
    seen: dict[int, Any] = {}
    for mechanism in mechanisms:
        llm = mechanism.usage.llm
        if llm is not None:
            seen[id(getattr(mechanism, "llm", llm))] = llm
    if not seen:
        return
    total = dict(engine.store.get_state(_USAGE_KEY) or {})
    for usage in seen.values():
        for name in ("calls", "failures", "prompt_tokens", "completion_tokens"):
            total[name] = int(total.get(name, 0)) + int(getattr(usage, name))
    engine.store.set_state(_USAGE_KEY, total)


def _retry(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    pending = engine.pending(args.user)
    if not pending:
        print("no pending work", file=out)
        return 0
    mechanisms = _attach_for_jobs(engine, args)
    users = sorted({job.user_id for job in pending})
    from tqdm.auto import tqdm

    left = 0
    for user in tqdm(users, desc="users", disable=args.quiet or len(users) < 2, file=sys.stderr):
        left += engine.run_pending(user, force=True)
    done = len(pending) - left
    _record_usage(engine, mechanisms)
    print(f"ran pending work: {done} done, {left} still pending", file=out)
    return 0 if left == 0 else 1


def _usage_line(recorded: dict[str, int] | None) -> str:
    if not recorded:
        return "llm usage: none recorded (applications count theirs per process: memory.usage)"
    return (
        f"llm usage (recorded by retry-pending): {recorded.get('calls', 0)} calls, "
        f"{recorded.get('failures', 0)} failed, {recorded.get('prompt_tokens', 0)} prompt + "
        f"{recorded.get('completion_tokens', 0)} completion tokens"
    )


def _location(engine: MemoryEngine, args: argparse.Namespace) -> str:
    """Where the memory lives, as the user would write it (a DSN without its password)."""
    if engine.path is not None:
        return str(engine.path)
    from memories_core.backends.pg_common import redact_dsn

    vectors = (
        f"vectors in the Chroma server {args.chroma_host}:{args.chroma_port}"
        if args.chroma_host
        else "vectors in pgvector"
    )
    return f"{redact_dsn(str(args.path))}, schema {args.schema} ({vectors})"


def _stats(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    users = engine.users()
    kinds: Counter[str] = Counter()
    for user in users:
        kinds.update(r.kind for r in engine.records(user))
    jobs = engine.pending()
    by_mechanism = Counter(job.mechanism for job in jobs)
    failing = sum(1 for job in jobs if job.attempts)
    report = engine.verify()
    lines = [
        f"path: {_location(engine, args)}",
        f"embedder: {engine.embedder.name} (dimension {engine.embedder.dimension})",
        f"users: {len(users)}",
        f"records: {sum(kinds.values())}"
        + (f" ({', '.join(f'{k} {n}' for k, n in sorted(kinds.items()))})" if kinds else ""),
        f"disk: {_disk_line(engine)}",
        f"pending jobs: {len(jobs)}"
        + (f" ({', '.join(f'{m} {n}' for m, n in sorted(by_mechanism.items()))})" if jobs else "")
        + (f", {failing} failed at least once" if failing else ""),
        f"index: {'ok' if report.ok else 'needs repair (reindex)'}",
        _usage_line(engine.store.get_state(_USAGE_KEY)),
    ]
    print("\n".join(lines), file=out)
    return 0


# -- parser -------------------------------------------------------------------------------

_EPILOG = """examples:
  llm-memories --path ./memory users
  llm-memories --path ./memory show alice --limit 20
  llm-memories --path ./memory search alice "what does she eat?" -k 3
  llm-memories --path ./memory forget alice --record 3f2a9c1b
  llm-memories --path ./memory export alice alice.zip
  llm-memories --path ./other import alice.zip
  llm-memories --path postgresql://app@db/memories --schema prod stats

Options before the command (--path, --embedder, -q, ...) may also follow it."""


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
        type=int,
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
        "--limit", type=int, default=50, help="at most this many records (default: 50)"
    )
    show.add_argument("--width", type=int, default=80, help="text column width (default: 80)")
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
    search.add_argument("-k", type=int, default=5, help="number of results (default: 5)")
    search.add_argument("--kind", help="only records of this kind")
    search.add_argument("--width", type=int, default=80, help="text column width (default: 80)")
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
