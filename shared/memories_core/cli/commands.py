"""The commands: each reads its arguments, works on an open engine and prints to ``out``."""

from __future__ import annotations

import argparse
import json
import sys
import zipfile
import zlib
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from memories_core.cli.opening import CLIError
from memories_core.types import check_user_id

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine

__all__ = ["ID_WIDTH", "MIN_ID_PREFIX"]


#: Characters of a record id that ``show`` and ``search`` print; ``forget --record`` takes
#: any unique prefix of at least :data:`MIN_ID_PREFIX` characters, or the whole id.
ID_WIDTH = 12


MIN_ID_PREFIX = 4


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
    check_user_id(args.user)  # a bad id is refused before confirmation is asked for
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
    from memories_core.engine import is_parked

    jobs = engine.pending()
    by_mechanism = Counter(job.mechanism for job in jobs)
    failing = sum(1 for job in jobs if job.attempts)
    parked = sum(1 for job in jobs if is_parked(job))
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
        + (f", {failing} failed at least once" if failing else "")
        + (f", {parked} parked (retry-pending runs them)" if parked else ""),
        f"index: {'ok' if report.ok else 'needs repair (reindex)'}",
        _usage_line(engine.store.get_state(_USAGE_KEY)),
    ]
    print("\n".join(lines), file=out)
    return 0
