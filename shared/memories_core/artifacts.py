"""Per-user artifacts (LoRA adapters, selection policies): files with a registry.

An artifact is a named folder of files that belongs to one user (MaLP keeps one LoRA adapter
per user, EMG-RAG one selection policy per memory store). Bytes live under the memory's
``artifacts/`` folder; the registry (name, size, checksum) lives in the record store, so
``delete_user`` and export reach both.

Writes are atomic: files go to a temporary folder, are flushed to disk, the folder is renamed
into place under a fresh name, and only then does the registry point at it (one transaction);
the previous version is removed afterwards. A crash at any point leaves either the old or the
new version registered, plus at worst an unregistered folder that the next open removes.
Folder names are hashes: neither the user id nor the artifact name appears on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memories_core.errors import InvalidInputError
from memories_core.types import check_owner_id, new_id

if TYPE_CHECKING:
    from memories_core.interfaces import Clock, EngineStore

__all__ = ["ArtifactInfo", "ArtifactStore", "StagedArtifact", "check_artifact_name"]


@dataclass(frozen=True)
class ArtifactInfo:
    """A registered artifact.

    Attributes:
        user_id: Owner.
        name: Name given by the mechanism (e.g. ``"malp/lora"``).
        path: Folder holding its files (read-only use; replaced atomically on update).
        size: Total bytes.
        sha256: Checksum over its files (names and bytes).
        created_at: When this version was written.
        meta: Free JSON metadata given at write time.
    """

    user_id: str
    name: str
    path: Path
    size: int
    sha256: str
    created_at: datetime
    meta: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class StagedArtifact:
    """An artifact's files written in place but not registered yet (:meth:`ArtifactStore.stage`).

    Attributes:
        folder: The folder, relative to the store's root.
        size: Total bytes.
        sha256: Checksum over its files (names and bytes).
    """

    folder: str
    size: int
    sha256: str


def _hash(text: str, length: int = 32) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def check_artifact_name(name: Any) -> str:
    """Validate an artifact name: a non-empty string of at most 200 characters, without NUL.

    Raises:
        InvalidInputError: otherwise.
    """
    if not isinstance(name, str) or not name.strip() or len(name) > 200 or "\x00" in name:
        raise InvalidInputError(
            "artifact name must be a non-empty string of at most 200 chars, without NUL"
        )
    return name


_check_name = check_artifact_name


def _check_file_name(name: str) -> str:
    parts = Path(name).parts
    if not name or Path(name).is_absolute() or ".." in parts or name.startswith("."):
        raise InvalidInputError(f"artifact file name {name!r} must be a relative path")
    return name


class ArtifactStore:
    """Per-user artifact folders with an atomic write and a registry in the record store.

    Args:
        store: The record store holding the registry (its ``*_artifact*`` methods).
        root: Folder for the bytes; ``None`` uses a private temporary folder removed by
            :meth:`close` (in-memory memories).
        clock: Time of writes.
        keep_younger_than: Seconds; unregistered folders modified more recently are not
            removed on open (a shared folder: another process may be writing one).
    """

    def __init__(
        self,
        store: EngineStore,
        root: Path | None,
        clock: Clock,
        *,
        keep_younger_than: float = 0.0,
    ) -> None:
        self._store = store
        self._clock = clock
        self._keep_younger_than = keep_younger_than
        self._temp: tempfile.TemporaryDirectory[str] | None = None
        if root is None:
            self._temp = tempfile.TemporaryDirectory(prefix="llm-memories-artifacts-")
            root = Path(self._temp.name)
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._remove_unregistered()

    def put(
        self,
        user_id: str,
        name: str,
        files: Mapping[str, bytes] | Path | str,
        *,
        meta: Mapping[str, Any] | None = None,
    ) -> ArtifactInfo:
        """Write (or replace) an artifact atomically.

        Args:
            user_id: Owner.
            name: Artifact name.
            files: ``{relative file name: bytes}``, or a file or folder to copy.
            meta: JSON metadata kept in the registry.

        Raises:
            InvalidInputError: on a bad name, an absolute or escaping file name, or a missing
                source path.
        """
        staged = self.stage(user_id, name, files)
        old = self._row(user_id, name)
        self._store.register_artifact(
            user_id,
            name,
            folder=staged.folder,
            size=staged.size,
            sha256=staged.sha256,
            at=self._clock.now(),
            meta=meta,
        )
        if old is not None:
            shutil.rmtree(self.root / old["folder"], ignore_errors=True)
        info = self.get(user_id, name)
        assert info is not None  # registered just above
        return info

    def stage(
        self, user_id: str, name: str, files: Mapping[str, bytes] | Path | str
    ) -> StagedArtifact:
        """Write an artifact's files under a fresh folder without registering them.

        The caller registers the folder (``register_artifact`` of the record store, e.g. in
        a transaction with other writes) or removes it with :meth:`discard`; a folder left
        unregistered by a crash is removed by the next open.

        Raises:
            InvalidInputError: on a bad name, an absolute or escaping file name, or a missing
                source path.
        """
        check_owner_id(user_id)
        _check_name(name)
        user_dir = self.root / _hash(user_id)
        user_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=user_dir))
        try:
            self._fill(staging, files)
            size, digest = _digest(staging)
            folder = f"{_hash(user_id)}/{_hash(name, 16)}.{new_id()[:12]}"
            os.replace(staging, self.root / folder)
            _fsync_dir(user_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return StagedArtifact(folder=folder, size=size, sha256=digest)

    def discard(self, staged: StagedArtifact) -> None:
        """Remove a staged folder that was not registered (and its user's folder if empty)."""
        folder = self.root / staged.folder
        shutil.rmtree(folder, ignore_errors=True)
        with contextlib.suppress(OSError):  # not empty: the user has other artifacts
            folder.parent.rmdir()

    def get(self, user_id: str, name: str) -> ArtifactInfo | None:
        """The artifact, or ``None`` if ``user_id`` has none of that name."""
        row = self._row(user_id, name)
        return None if row is None else self._info(row)

    def read(self, user_id: str, name: str, file: str) -> bytes:
        """The bytes of one file of an artifact.

        Raises:
            InvalidInputError: if the artifact or file does not exist.
        """
        info = self.get(user_id, name)
        if info is None:
            raise InvalidInputError(f"no artifact {name!r} for this user")
        target = info.path / _check_file_name(file)
        if not target.is_file():
            raise InvalidInputError(f"artifact {name!r} has no file {file!r}")
        return target.read_bytes()

    def list(self, user_id: str) -> list[ArtifactInfo]:
        """``user_id``'s artifacts, by name."""
        check_owner_id(user_id)
        return [self._info(row) for row in self._store.artifact_rows(user_id)]

    def delete(self, user_id: str, name: str) -> bool:
        """Delete one artifact; returns whether it existed."""
        row = self._row(user_id, name)
        if row is None:
            return False
        self._store.unregister_artifact(user_id, name)
        shutil.rmtree(self.root / row["folder"], ignore_errors=True)
        return True

    def delete_user(self, user_id: str) -> None:
        """Delete every artifact of ``user_id`` (files first; the registry goes with the purge)."""
        shutil.rmtree(self.root / _hash(user_id), ignore_errors=True)

    def close(self) -> None:
        """Remove the temporary folder of an in-memory store."""
        if self._temp is not None:
            self._temp.cleanup()
            self._temp = None

    # -- internals --------------------------------------------------------------------------

    def _row(self, user_id: str, name: str) -> dict[str, Any] | None:
        check_owner_id(user_id)
        _check_name(name)
        return next((r for r in self._store.artifact_rows(user_id) if r["name"] == name), None)

    def _info(self, row: Mapping[str, Any]) -> ArtifactInfo:
        return ArtifactInfo(
            user_id=row["user_id"],
            name=row["name"],
            path=self.root / row["folder"],
            size=row["size"],
            sha256=row["sha256"],
            created_at=row["created_at"],
            meta=row["meta"],
        )

    @staticmethod
    def _fill(staging: Path, files: Mapping[str, bytes] | Path | str) -> None:
        if isinstance(files, (str, Path)):
            source = Path(files)
            if source.is_dir():
                shutil.copytree(source, staging, dirs_exist_ok=True)
            elif source.is_file():
                shutil.copy2(source, staging / source.name)
            else:
                raise InvalidInputError(f"artifact source {source} does not exist")
        else:
            for file, data in files.items():
                if not isinstance(data, bytes):
                    raise InvalidInputError(f"artifact file {file!r} must be bytes")
                target = staging / _check_file_name(file)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        for path in staging.rglob("*"):
            if path.is_file():
                with path.open("rb") as handle:
                    os.fsync(handle.fileno())

    def _remove_unregistered(self) -> None:
        """Remove folders no registry entry points at (left by a crash mid-write)."""
        registered = {row["folder"] for row in self._store.artifact_rows()}
        cutoff = time.time() - self._keep_younger_than
        for user_dir in self.root.iterdir() if self.root.exists() else []:
            if not user_dir.is_dir():
                continue
            for folder in user_dir.iterdir():
                if f"{user_dir.name}/{folder.name}" in registered:
                    continue
                if self._keep_younger_than > 0 and _mtime(folder) > cutoff:
                    continue
                shutil.rmtree(folder, ignore_errors=True)
            if not any(user_dir.iterdir()):
                with contextlib.suppress(OSError):  # another process may have written one
                    user_dir.rmdir()


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _digest(folder: Path) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        size += len(data)
        digest.update(path.relative_to(folder).as_posix().encode("utf-8") + b"\0")
        digest.update(hashlib.sha256(data).digest())
    return size, digest.hexdigest()


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
