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
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from memories_core.errors import EmbedderMismatchError, MemoriesError

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine
    from memories_core.interfaces import Embedder

__all__ = ["build_parser", "main"]


class CLIError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


def _embedder(spec: str) -> Embedder:
    if spec == "minilm":
        from memories_core.embedders import SentenceTransformerEmbedder

        return SentenceTransformerEmbedder()
    if spec == "hashing" or spec.startswith("hashing-"):
        from memories_core.embedders import HashingEmbedder

        dimension = spec.removeprefix("hashing").lstrip("-")
        return HashingEmbedder(int(dimension)) if dimension else HashingEmbedder()
    raise CLIError(f"unknown embedder {spec!r}: use minilm, hashing or hashing-<dimension>")


def _open(args: argparse.Namespace, *, create: bool = False) -> MemoryEngine:
    from memories_core.engine import MemoryEngine

    target = str(args.path)
    if target.startswith(("postgres://", "postgresql://")):
        return _open_postgres(target, args, create=create)
    path = Path(target)
    if not create and not (path / "records.sqlite3").exists():
        raise CLIError(f"no memory at {path} (expected {path / 'records.sqlite3'})")
    try:
        return MemoryEngine(path=path, embedder=_embedder(args.embedder))
    except EmbedderMismatchError as exc:
        raise CLIError(
            f"{exc}\nhint: pass the embedder the memory was built with, e.g. "
            "--embedder hashing (hashing-<dimension>) or --embedder minilm"
        ) from exc


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
            raise CLIError(
                f"{exc}\nhint: pass the embedder the memory was built with, e.g. "
                "--embedder hashing (hashing-<dimension>) or --embedder minilm"
            ) from exc
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


def _show(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    where = {"kind": args.kind} if args.kind else None
    records = sorted(engine.records(args.user, where=where), key=lambda r: r.created_at)[::-1]
    rows = [
        [
            r.created_at.strftime("%Y-%m-%d %H:%M"),
            r.kind,
            r.id[:12],
            "archived" if r.state.archived else "",
            _short(r.text, args.width),
        ]
        for r in records[: args.limit]
    ]
    _table(rows, ["created", "kind", "id", "state", "text"], out)
    return 0


def _search(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    hits = engine.search(args.query, args.user, k=args.k, kinds=[args.kind] if args.kind else None)
    rows = [
        [f"{h.score:.3f}", h.record.kind, h.record.id[:12], _short(h.record.text, args.width)]
        for h in hits
    ]
    _table(rows, ["score", "kind", "id", "text"], out)
    return 0


def _export(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    from memories_core.portable import export_user

    if args.user not in engine.users():
        raise CLIError(f"no user {args.user!r} in this memory")
    written = export_user(engine, args.user, args.file)
    print(f"exported {args.user} to {written}", file=out)
    return 0


def _import(engine: MemoryEngine, args: argparse.Namespace, out: TextIO) -> int:
    from memories_core.portable import import_user

    report = import_user(engine, args.file, on_conflict="merge" if args.merge else "refuse")
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
        found = engine.get(args.user, args.record)
        missing = sorted(set(args.record) - {r.id for r in found})
        if missing:
            raise CLIError(f"{args.user} has no record {', '.join(missing)}; nothing deleted")
        engine.delete_records(args.user, args.record, reason=args.reason or "llm-memories forget")
        print(f"deleted {len(found)} record(s) of {args.user}", file=out)
        return 0
    if not args.yes:
        raise CLIError(f"this erases everything of {args.user!r}; add --yes to confirm")
    engine.delete_user(args.user, vacuum=True)
    print(f"erased {args.user}", file=out)
    return 0


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
        from memories_core.llms import OpenAIChatLLM

        llm = OpenAIChatLLM(args.model, base_url=args.base_url)
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
        f"path: {engine.path if engine.path is not None else engine.store!r}",
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``llm-memories``."""
    parser = argparse.ArgumentParser(
        prog="llm-memories", description="Inspect and operate an llm-memories memory."
    )
    parser.add_argument(
        "--path",
        required=True,
        help="folder of the memory (MemoryEngine path), or a PostgreSQL DSN "
        "(postgresql://user@host/db; the password from PGPASSWORD or ~/.pgpass)",
    )
    parser.add_argument(
        "--schema", default="llm_memories", help="with a DSN: schema of the memory's tables"
    )
    parser.add_argument(
        "--artifacts", help="with a DSN: folder of artifact bytes shared by the workers"
    )
    parser.add_argument(
        "--chroma-host", help="with a DSN: vectors in this Chroma server instead of pgvector"
    )
    parser.add_argument("--chroma-port", type=int, default=8000)
    parser.add_argument(
        "--embedder",
        default="minilm",
        help="embedder the memory was built with: minilm (default), hashing, hashing-<dim>",
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("users", help="list users").set_defaults(run=_users)
    show = commands.add_parser("show", help="a user's records, newest first")
    show.add_argument("user")
    show.add_argument("--kind", help="only records of this kind (turn, summary, memory, ...)")
    show.add_argument("--limit", type=int, default=50)
    show.add_argument("--width", type=int, default=80, help="text column width")
    show.set_defaults(run=_show)
    search = commands.add_parser("search", help="search a user's memories")
    search.add_argument("user")
    search.add_argument("query")
    search.add_argument("-k", type=int, default=5)
    search.add_argument("--kind")
    search.add_argument("--width", type=int, default=80)
    search.set_defaults(run=_search)
    export = commands.add_parser("export", help="write a user's portable memory file")
    export.add_argument("user")
    export.add_argument("file")
    export.set_defaults(run=_export)
    imp = commands.add_parser("import", help="import a portable memory file")
    imp.add_argument("file")
    imp.add_argument("--merge", action="store_true", help="merge into an existing user")
    imp.set_defaults(run=_import, create=True)
    forget = commands.add_parser("forget", help="erase a user, or some of their records")
    forget.add_argument("user")
    forget.add_argument("--record", action="append", help="a record id (repeatable)")
    forget.add_argument("--reason")
    forget.add_argument("--yes", action="store_true", help="confirm erasing the whole user")
    forget.set_defaults(run=_forget)
    commands.add_parser("reindex", help="rebuild the vector index").set_defaults(run=_reindex)
    retry = commands.add_parser("retry-pending", help="run pending derivations now")
    retry.add_argument("user", nargs="?")
    retry.add_argument("--llm", choices=["default", "openai"], default="default")
    retry.add_argument("--model", default="gpt-4o-mini")
    retry.add_argument("--base-url")
    retry.set_defaults(run=_retry)
    commands.add_parser("stats", help="records, users, disk, pending work").set_defaults(run=_stats)
    return parser


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None) -> int:
    """Run ``llm-memories`` with ``argv``; returns the exit status.

    Args:
        argv: Arguments (default: ``sys.argv[1:]``).
        out: Where results are printed (default: standard output).
    """
    stream = out or sys.stdout
    args = build_parser().parse_args(argv)
    try:
        engine = _open(args, create=getattr(args, "create", False))
        try:
            return int(args.run(engine, args, stream))
        finally:
            engine.close()
    except (CLIError, MemoriesError) as exc:
        print(f"llm-memories: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
