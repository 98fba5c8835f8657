"""One process per embedded folder: an OS file lock held from open to close.

Embedded Chroma (``chromadb.PersistentClient``) keeps each collection's HNSW graph in the
memory of the process that opened it and writes it back to the folder. Two processes on one
folder each write their own copy: measured here (chromadb 1.5.9, two processes upserting 3,000
vectors each into one collection) both writers reported success and the collection afterwards
failed every read with "Error getting embedding"; two processes creating a fresh folder at the
same moment failed with "table collections already exists". Nothing in Chroma refuses the
second process, so :class:`FolderLock` does: the first process to open a folder takes an
exclusive, non-blocking ``flock`` on ``<folder>/.llm-memories.lock`` and keeps it until the
last index on that folder in the process is closed (or the process ends, when the OS drops
it, so a killed worker never leaves a stale lock). Any other process gets
:class:`~memories_core.errors.StoreInUseError` at open, naming the server setup.

Several indexes on one folder *within* a process are fine (Chroma shares one in-process
system per folder), so the lock is reference-counted per process. A child created with
``fork`` drops the inherited descriptors (``os.register_at_fork``), so it does not keep its
parent's lock alive, and its own open of the folder is refused while the parent holds it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from memories_core.errors import BackendError, StoreInUseError

__all__ = ["LOCK_FILE", "FolderLock"]

#: Name of the lock file inside a locked folder (it holds the holder's process id).
LOCK_FILE = ".llm-memories.lock"

SERVER_SETUP = (
    "For several worker processes on one memory, use the server setup (docs/deploy.md): "
    "records in PostgreSQL, MemoryEngine(store=PostgresRecordStore(dsn), "
    "index=PgVectorIndex(dsn, dimension=...)), or vectors in a Chroma server, "
    "index=ChromaIndex(host=..., port=...)."
)


@dataclass
class _Held:
    pid: int
    fd: int
    count: int


_held: dict[str, _Held] = {}
_guard = threading.Lock()


def _try_lock(fd: int) -> bool:
    """Take an exclusive lock on ``fd`` without waiting; ``False`` if another holder has it."""
    if sys.platform == "win32":  # pragma: no cover - exercised on Windows only
        import msvcrt

        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True
    import fcntl

    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _holder(file: Path) -> int | None:
    try:
        text = file.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None


def _after_fork_in_child() -> None:
    # The child's copies of the descriptors share the parent's lock; closing them here does
    # not release it (the parent's descriptors still hold it) but stops the child from
    # keeping it alive after the parent closes, and from believing it holds the folder.
    for held in _held.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class FolderLock:
    """An exclusive lock of ``folder`` by this process, shared by every holder in it.

    Args:
        folder: The folder (created if missing).
        what: What lives there, for the error message (e.g. ``"embedded Chroma index"``).

    Raises:
        StoreInUseError: if another process holds the folder.
        BackendError: if the lock file cannot be created.
    """

    def __init__(self, folder: str | Path, *, what: str) -> None:
        path = Path(folder)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise BackendError(f"cannot create folder {path}: {exc}") from exc
        self.key = os.path.realpath(path)
        self._released = False
        file = Path(self.key) / LOCK_FILE
        with _guard:
            held = _held.get(self.key)
            if held is not None and held.pid == os.getpid():
                held.count += 1
                return
            try:
                fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise BackendError(f"cannot create lock file {file}: {exc}") from exc
            if not _try_lock(fd):
                os.close(fd)
                holder = _holder(file)
                who = f"process {holder}" if holder is not None else "another process"
                raise StoreInUseError(
                    f"the {what} at {path} is open in {who}; an embedded folder serves one "
                    f"process at a time. {SERVER_SETUP}",
                    path=str(path),
                    holder=holder,
                )
            try:
                os.ftruncate(fd, 0)
                os.write(fd, str(os.getpid()).encode("ascii"))
            except OSError:
                pass  # the pid is only for the message
            _held[self.key] = _Held(os.getpid(), fd, 1)

    def release(self) -> None:
        """Drop this holder; the OS lock goes with the process's last holder. Idempotent."""
        with _guard:
            if self._released:
                return
            self._released = True
            held = _held.get(self.key)
            if held is None or held.pid != os.getpid():
                return
            held.count -= 1
            if held.count == 0:
                del _held[self.key]
                os.close(held.fd)  # closing the descriptor releases the flock
