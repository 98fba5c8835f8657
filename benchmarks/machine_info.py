"""What every benchmark shares: the machine and code description written beside its
figures, its command line, the datasets folder, a folder's size, and the figure writer."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

#: Packages whose versions a benchmark's machine record names (read from their metadata,
#: so nothing heavy is imported to name them).
VERSIONED = ("torch", "sentence-transformers", "chromadb", "langchain-core", "numpy", "onnxruntime")


def machine() -> dict[str, Any]:
    """The machine a benchmark ran on, for its JSON and the Markdown beside its figures.

    Keys: ``nproc`` (the CPUs this process may use, as ``nproc`` counts them), ``cpu``,
    ``ram`` (text) and ``ram_gib``, ``load_avg_1min_at_start``, ``code`` (:func:`repo_state`),
    ``python``, ``sqlite``, ``os`` and ``versions`` (of :data:`VERSIONED`, ``n/a`` where
    one is not installed).
    """
    from importlib import metadata
    from sqlite3 import sqlite_version

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    ram_gib = float("nan")
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                ram_gib = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "n/a"
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return {
        "nproc": len(usable) if usable is not None else os.cpu_count(),
        "cpu": cpu,
        "ram": f"{ram_gib:.1f} GiB" if ram_gib == ram_gib else "?",
        "ram_gib": ram_gib,
        "load_avg_1min_at_start": round(load, 2),
        "code": repo_state(),
        "python": platform.python_version(),
        "sqlite": sqlite_version,
        "os": f"{platform.system()} {platform.release()}",
        "versions": versions,
    }


def machine_line(info: dict[str, Any] | None = None) -> str:
    """One sentence naming the machine of ``info`` (default: :func:`machine` now)."""
    m = machine() if info is None else info
    return (
        f"{m['os']}, {m['cpu']}, {m['nproc']} CPUs (shared; 1-minute load average "
        f"{m['load_avg_1min_at_start']} at start), {m['ram']} RAM, Python {m['python']}, "
        f"SQLite {m['sqlite']}"
    )


def datasets_dir() -> Path:
    """The shared datasets folder: ``shared/datasets`` in the nearest folder above the scripts.

    Next to the repository in a checkout (``../shared/datasets``), and still found from a
    clone or worktree nested deeper below the shared folder. Where none exists, the one next
    to the repository (a script then says the file is missing).
    """
    here = Path(__file__).resolve().parent
    for parent in here.parents:
        if (parent / "shared" / "datasets").is_dir():
            return parent / "shared" / "datasets"
    return here.parents[1] / "shared" / "datasets"


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under ``folder`` (a store's size on disk)."""
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def save_figure(fig: Any, path: Path, dpi: int = 120) -> None:
    """Lay out a matplotlib figure, write it to ``path`` and close it (a run draws many)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


def repo_state() -> str:
    """The measured package's commit and uncommitted library files: the tree is shared and moves.

    The package is the ``memories_core`` that is imported (a run may put another checkout,
    e.g. a worktree pinned at a commit, first on ``PYTHONPATH``); when that is not the
    checkout these scripts come from, the scripts' commit follows in brackets.
    """
    scripts = Path(__file__).resolve().parent.parent
    package = _package_root()
    if package is None or package == scripts:
        return _checkout_state(scripts)
    return f"{_checkout_state(package)} (benchmark scripts at {_checkout_state(scripts)})"


def _package_root() -> Path | None:
    """The checkout holding the imported ``memories_core`` (``None``: not importable)."""
    try:
        import memories_core
    except ImportError:
        return None
    return Path(memories_core.__file__).resolve().parent.parent.parent


def _checkout_state(root: Path) -> str:
    """``root``'s HEAD commit and its uncommitted library files (``unknown`` outside git)."""
    import subprocess

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--",
                "shared",
                "langchain_memories",
                "llamaindex_memories",
            ],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.split("\n")
    except OSError:
        return "unknown"
    if not head:
        return "unknown"
    changed = [line[3:] for line in dirty if line.strip()]
    return f"{head}" + (f" + uncommitted changes in {', '.join(changed)}" if changed else "")


def portable_path(path: str | os.PathLike[str]) -> str:
    """``path`` as a result file should record it: relative to the repository root.

    Absolute paths on the benchmarking machine mean nothing elsewhere; ``../shared/datasets``
    does (it is where every benchmark's default data lives). A path in the system's
    temporary folder becomes ``<tmp>/...`` (a scratch copy; only its tail says anything),
    and one elsewhere outside the repository ``<local>/<name>``.
    """
    import tempfile

    text = os.fspath(path)
    if not os.path.isabs(text):
        return text
    root = Path(__file__).resolve().parents[1]
    resolved = os.path.realpath(text)
    # The repository and its sibling ``shared`` folder first: a clone may itself live in
    # the temporary folder (a CI checkout), and its data paths must still read ``../shared``.
    for known in (str(root), str(root.parent / "shared")):
        if resolved == known or resolved.startswith(known + os.sep):
            return os.path.relpath(resolved, root)
    scratch = os.path.realpath(tempfile.gettempdir())
    if resolved == scratch or resolved.startswith(scratch + os.sep):
        return "<tmp>" + resolved[len(scratch) :]
    # Anywhere else on this machine (a kept store, a work folder): only its name says anything.
    return "<local>/" + os.path.basename(resolved)


#: Options whose value is a database address: recorded as ``<dsn>`` (it names this machine's
#: sockets or hosts, and may hold credentials).
DSN_OPTIONS = ("--dsn", "--postgres-dsn")


def run_header(info: dict[str, Any], command: str) -> str:
    """A result's opening sentence: the machine (:func:`machine`), code and command."""
    return (
        f"Machine: {info['nproc']} CPU cores ({info['cpu']}), {info['ram']} RAM, load average "
        f"{info['load_avg_1min_at_start']} when the run started; code {info['code']}. "
        f"Command: `{command}`."
    )


def nice_command_line(script: str, argv: list[str]) -> str:
    """:func:`command_line`, prefixed with the process's ``nice`` level when it has one."""
    nice = os.nice(0)
    return (f"nice -n {nice} " if nice > 0 else "") + command_line(script, argv)


def command_line(script: str, argv: list[str]) -> str:
    """The command that produced a result, with paths as :func:`portable_path` writes them.

    The value of a DSN option (:data:`DSN_OPTIONS`, as ``--dsn X`` or ``--dsn=X``) is
    written as ``<dsn>``.
    """
    import shlex

    words: list[str] = []
    hide = False
    for arg in argv:
        if hide:
            words.append("<dsn>")
            hide = False
        elif arg in DSN_OPTIONS:
            words.append(arg)
            hide = True
        elif arg.split("=", 1)[0] in DSN_OPTIONS and "=" in arg:
            words.append(arg.split("=", 1)[0] + "=<dsn>")
        else:
            words.append(shlex.quote(portable_path(arg)))
    return " ".join(["python", script, *words])
