"""Reachability of an embedded Chroma index: exact mirrors of small users, pins of large ones.

Embedded Chroma can leave records out of its HNSW graph (see :mod:`chroma_exact`). A user with
at most ``exact_below`` vectors is searched exactly over an in-process mirror; a larger
collection is sampled on its first open in a process, and records its graph cannot reach are
pinned (scored exactly and merged into every later search). On a persistent index the pinned
ids are also written to ``llm_memories_pins.json`` in the index folder (atomically), and
re-pinned when the collection is next opened, so a repair holds across restarts; deletes
remove their ids from that file. The file is untrusted input: anything malformed in it is
ignored (logged), never executed.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memories_core.backends.chroma_exact import _MIRRORS, Mirror, _key_of
from memories_core.backends.chroma_verify import _READ_BATCH
from memories_core.backends.numpy_index import PROBE_DEPTH
from memories_core.files import read_json_file, write_json_atomic

__all__ = ["ChromaReachability"]

logger = logging.getLogger("memories_core.backends.chroma_index")

#: File in a persistent index's folder holding each collection's pinned record ids.
PINS_FILE = "llm_memories_pins.json"
#: Largest pins file read (bytes); a bigger one is ignored as damaged.
_PINS_MAX_BYTES = 64 * 1024 * 1024
#: Sampled ids probed per step of a background open check (it checks for a close between steps).
_CHECK_CHUNK = 50
#: Seconds between two warnings about one collection's unreachable records.
_REPORT_EVERY_S = 60.0
#: Per collection: [lost, checked, monotonic time of the last warning] since that warning.
_REPORTS: dict[str, list[float]] = {}
_REPORTS_LOCK = threading.Lock()


def _warn_lost(lost: int, checked: int, name: str) -> None:
    logger.warning(
        "Chroma's HNSW graph cannot reach %d of %d checked records of collection %s; "
        "they are searched exactly from now on",
        lost,
        checked,
        name,
    )


class ChromaReachability:
    """Exact search of small collections and pinning of lost records (mixed into the index).

    Attributes used:
        _exact_below, _open_check, _local, _checked: the index's reachability settings.
        _guard, _all_ids, _probe_in: the index's access to a collection.
    """

    _exact_below: int
    _folder: Path | None
    _open_check: int
    _local: bool
    _checked: set[str]
    _open_check_background: bool
    _check_threads: list[threading.Thread]
    _closing: bool
    _lock: Any
    _guard: Callable[..., Any]
    _all_ids: Callable[[Any], set[str]]
    _probe_in: Callable[[Any, list[str], int], set[str]]

    def _exact(self, collection: Any) -> Mirror | None:
        """The collection's complete mirror (loaded if needed), or ``None`` if it is too large.

        A collection first found too large gets its open check (:meth:`_check_sample`).
        """
        if self._exact_below == 0:
            if self._local:
                self._check_on_open(collection)
            return None
        key = _key_of(collection)
        mirror = _MIRRORS.get(key)
        if mirror is not None:
            return mirror
        if not _MIRRORS.is_large(key):
            generation = _MIRRORS.generation(key)
            if int(self._guard(collection.count)) <= self._exact_below:
                mirror = self._load_mirror(collection)
                _MIRRORS.put(key, mirror, generation)
                return mirror
            _MIRRORS.mark_large(key, generation)
        self._check_on_open(collection)
        return None

    def _seed_mirror(self, collection: Any) -> None:
        """Give an empty collection its complete mirror before a write (writes keep it current).

        A user whose vectors were all written in this process is then searched exactly
        without reading every vector back from Chroma on the first search (``get`` reads
        about 1,000 vectors a second on a busy 2-core machine).
        """
        if self._exact_below == 0:
            return
        key = _key_of(collection)
        if _MIRRORS.get(key) is not None or _MIRRORS.is_large(key):
            return
        generation = _MIRRORS.generation(key)
        if int(self._guard(collection.count)) == 0:
            _MIRRORS.put(key, Mirror(), generation)

    def _load_mirror(self, collection: Any) -> Mirror:
        """Every vector and metadata of a collection, read in pages."""
        mirror = Mirror()
        offset = 0
        while True:
            got = self._guard(
                collection.get,
                include=["embeddings", "metadatas"],
                limit=_READ_BATCH,
                offset=offset,
            )
            page = [str(vid) for vid in got.get("ids") or []]
            if page:
                vectors = np.asarray(got["embeddings"], dtype=np.float32)
                metas = [dict(m or {}) for m in got.get("metadatas") or [{}] * len(page)]
                mirror.upsert(page, vectors, metas)
            if len(page) < _READ_BATCH:
                return mirror
            offset += len(page)

    def _check_on_open(self, collection: Any) -> None:
        """Sample a large collection's reachability once per instance (its first open here).

        The pins file is applied at once; the sampled probe runs in a background thread
        when ``open_check_background`` is set (:meth:`_check_in_background`), so the first
        search after a reopen does not wait for it (at 100k records it took 8.5 s).
        """
        key = _key_of(collection)
        if key not in self._checked:
            self._checked.add(key)
            self._restore_pins(collection)
            if not self._open_check:
                return
            if not self._open_check_background:
                self._check_sample(collection)
                return
            thread = threading.Thread(
                target=self._check_in_background,
                args=(collection,),
                name=f"llm-memories-chroma-check-{key[:8]}",
                daemon=True,
            )
            self._check_threads = [t for t in self._check_threads if t.is_alive()] + [thread]
            thread.start()

    def _check_in_background(self, collection: Any) -> None:
        """The open check off the search path, logged once.

        Listing and probing only read Chroma, so they run without the index lock and searches
        and writes go on meanwhile; ids a probe flags are probed again and pinned under the
        lock. It stops when the index closes; a failure (the collection dropped meanwhile,
        Chroma down) is logged and leaves the pins as they are.
        """
        name = getattr(collection, "name", "?")
        try:
            if self._closing:
                return
            sample = self._sample_ids(collection)
            lost: set[str] = set()
            for start in range(0, len(sample), _CHECK_CHUNK):
                if self._closing:
                    return
                # Read-only probes need no index lock (Chroma serves concurrent calls); the
                # few ids they flag are probed again and pinned under it.
                flagged = self._probe_in(
                    collection, sample[start : start + _CHECK_CHUNK], PROBE_DEPTH
                )
                if flagged:
                    with self._lock:
                        if self._closing:
                            return
                        lost |= self._pin_lost(collection, sorted(flagged), report=False)
        except Exception as exc:  # a repair in the background never raises into a user call
            logger.warning("reachability check of Chroma collection %s stopped: %s", name, exc)
            return
        if lost:
            _warn_lost(len(lost), len(sample), name)

    def wait_checks(self, timeout: float | None = None) -> bool:
        """Wait for the open checks running in the background; ``True`` if none is left.

        Args:
            timeout: Seconds to wait in all (``None``: until they finish).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in list(self._check_threads):
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
        self._check_threads = [t for t in self._check_threads if t.is_alive()]
        return not self._check_threads

    def _check_sample(self, collection: Any) -> None:
        """Probe up to ``open_check`` records sampled from the collection; pin the lost."""
        if not self._open_check:
            return
        self._pin_lost(collection, self._sample_ids(collection))

    def _sample_ids(self, collection: Any) -> list[str]:
        """Up to ``open_check`` of the collection's ids, drawn at random."""
        ids = sorted(self._all_ids(collection))
        return ids if len(ids) <= self._open_check else random.sample(ids, self._open_check)

    def _pin_lost(
        self, collection: Any, ids: Sequence[str], k: int = PROBE_DEPTH, *, report: bool = True
    ) -> set[str]:
        """Probe ``ids`` through the graph; pin (and, with ``report``, log) those it cannot reach.

        Returns the ids newly found: those pinned earlier are reachable through their pin.
        """
        if not ids:
            return set()
        pinned = _MIRRORS.pinned(_key_of(collection))
        held_before = set(pinned.ids) if pinned is not None else set()
        lost = self._probe_in(collection, list(dict.fromkeys(ids)), k) - held_before
        if lost:
            wanted = sorted(lost)
            got = self._guard(collection.get, ids=wanted, include=["embeddings", "metadatas"])
            held = [str(vid) for vid in got.get("ids") or []]
            if held:
                _MIRRORS.pin(
                    _key_of(collection),
                    held,
                    np.asarray(got["embeddings"], dtype=np.float32),
                    [dict(m or {}) for m in got["metadatas"]],
                )
                self._remember_pins(_key_of(collection), held)
        if report:
            self._report_lost(collection, len(lost), len(ids))
        return lost

    def _report_lost(self, collection: Any, lost: int, checked: int) -> None:
        """Log lost records, at most once a minute per collection (counts summed meanwhile).

        Every ``add`` probes what it wrote, so a bulk ingest would otherwise log a line per
        batch that loses one record. What is held back is logged with the next warning or
        when the index closes (:meth:`_flush_reports`).
        """
        key = _key_of(collection)
        with _REPORTS_LOCK:
            held = _REPORTS.setdefault(key, [0, 0, float("-inf")])
            held[0] += lost
            held[1] += checked
            now = time.monotonic()
            if not held[0] or now - held[2] < _REPORT_EVERY_S:
                return
            total_lost, total_checked = int(held[0]), int(held[1])
            _REPORTS[key] = [0, 0, now]
        _warn_lost(total_lost, total_checked, getattr(collection, "name", "?"))

    def _flush_reports(self, collections: Iterable[Any]) -> None:
        """Log the lost records held back for ``collections`` (on close)."""
        for collection in collections:
            with _REPORTS_LOCK:
                held = _REPORTS.pop(_key_of(collection), None)
            if held and held[0]:
                _warn_lost(int(held[0]), int(held[1]), getattr(collection, "name", "?"))

    def _probe_searched(self, collection: Any, wanted: list[str], k: int) -> set[str]:
        """Ids the graph cannot return; none for a user searched exactly.

        On a local store the ids found are also pinned, so search reaches them from now on.
        """
        if self._exact(collection) is not None:
            return set()
        if self._local:
            return self._pin_lost(collection, wanted, k)
        return self._probe_in(collection, wanted, k)

    # -- pins on disk ------------------------------------------------------------------------

    def _pins_path(self) -> Path | None:
        folder = getattr(self, "_folder", None)
        return Path(folder) / PINS_FILE if folder is not None else None

    def _read_pins(self) -> dict[str, list[str]]:
        """The pins file, validated: ``{collection key: [record id, ...]}``.

        Returns ``{}`` if the file is absent or malformed (a malformed file is logged and
        ignored).
        """
        path = self._pins_path()
        if path is None:
            return {}
        try:
            data = read_json_file(path, max_bytes=_PINS_MAX_BYTES)
            if data is None:
                return {}
            if not isinstance(data, dict) or not all(
                isinstance(k, str) and isinstance(v, list) and all(isinstance(i, str) for i in v)
                for k, v in data.items()
            ):
                raise ValueError("not a mapping of collection keys to id lists")
        except (OSError, ValueError) as exc:
            logger.warning("ignoring the damaged Chroma pins file %s: %s", path, exc)
            return {}
        return {str(k): [str(i) for i in v] for k, v in data.items()}

    def _write_pins(self, pins: dict[str, list[str]]) -> None:
        """Write the pins file atomically (temporary file, fsync, rename); remove it if empty."""
        path = self._pins_path()
        if path is None:
            return
        kept = {key: ids for key, ids in pins.items() if ids}
        if not kept:
            path.unlink(missing_ok=True)
            return
        write_json_atomic(path, kept, indent=None)

    def _remember_pins(self, key: str, ids: Iterable[str]) -> None:
        """Add ``ids`` to the collection's pinned ids on disk."""
        if self._pins_path() is None:
            return
        pins = self._read_pins()
        pins[key] = sorted({*pins.get(key, ()), *ids})
        self._write_pins(pins)

    def _forget_pins(self, key: str, ids: Iterable[str] | None = None) -> None:
        """Drop ``ids`` (all of the collection's when ``None``) from the pins file."""
        path = self._pins_path()
        if path is None or not path.is_file():
            return
        pins = self._read_pins()
        if key not in pins:
            return
        if ids is None:
            del pins[key]
        else:
            gone = set(ids)
            pins[key] = [i for i in pins[key] if i not in gone]
        self._write_pins(pins)

    def _restore_pins(self, collection: Any) -> None:
        """Re-pin the ids the pins file holds for ``collection`` (those it still stores)."""
        ids = self._read_pins().get(_key_of(collection))
        if not ids:
            return
        got = self._guard(collection.get, ids=ids, include=["embeddings", "metadatas"])
        held = [str(vid) for vid in got.get("ids") or []]
        if held:
            _MIRRORS.pin(
                _key_of(collection),
                held,
                np.asarray(got["embeddings"], dtype=np.float32),
                [dict(m or {}) for m in got["metadatas"]],
            )
