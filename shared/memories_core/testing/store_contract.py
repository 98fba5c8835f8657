"""The contract every record store meets, as a reusable pytest suite (once per backend).

The mechanism contract (:class:`~memories_core.testing.MechanismContract`) checks a
mechanism's promises on the default backend; what a backend adds is the store, so its
promises are checked here once per store rather than once per mechanism and store:

* **isolation**: records of users with tricky ids (:data:`TRICKY_USER_IDS`) are listed, got
  and found by full-text search for their owner only; a batch naming another user's record
  id is refused;
* **erasure**: ``delete_user`` of some users keeps every other user's records and state;
* **typed errors**: a missing or blank user id raises a
  :class:`~memories_core.errors.MemoriesError`, and a refused batch stores nothing;
* **transactions**: a block that raises leaves nothing of its writes;
* **persistence**: records and state survive ``close`` and a reopen;
* **crash safety**: a writer process adding exchanges in transactions is SIGKILLed at points
  of its progress (:mod:`memories_core.testing.crash`); afterwards every acknowledged
  exchange is there exactly once, and no exchange is stored in part.

Usage: subclass :class:`StoreContract` at module level in a test module and implement
:meth:`StoreContract.make_store` (``path=None``: a fresh in-memory store or, for a server,
a fresh schema; a path: the store that path names, the same one on every call).

.. code-block:: python

    class TestSQLiteStoreContract(StoreContract):
        def make_store(self, path: Path | None) -> EngineStore:
            return SQLiteRecordStore(None if path is None else path / "records.sqlite3")
"""

from __future__ import annotations

import importlib
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

from memories_core.errors import MemoriesError
from memories_core.interfaces import EngineStore
from memories_core.testing._scenario import _BASE_TIME, _disk_only, _glob_key, _slow, _token
from memories_core.testing.cases import TRICKY_USER_IDS
from memories_core.testing.crash import CRASH_USERS, crash_number, kill_writer_repeatedly
from memories_core.types import MemoryRecord, new_id

__all__ = ["StoreContract", "run_store_crash_writer"]


def _record(user_id: str, text: str, *, minutes: int = 0, session: str = "s1") -> MemoryRecord:
    return MemoryRecord(
        id=new_id(),
        user_id=user_id,
        kind="turn",
        text=text,
        created_at=_BASE_TIME + timedelta(minutes=minutes),
        session_id=session,
        metadata={"role": "user"},
    )


def _numbers(records: Sequence[MemoryRecord], kind: str) -> Counter[int]:
    """How often each crash exchange occurs among ``records`` of ``kind``."""
    numbers = (crash_number(r.text) for r in records if r.kind == kind)
    return Counter(n for n in numbers if n is not None)


def _close(store: Any) -> None:
    close = getattr(store, "close", None)
    if callable(close):
        close()


class StoreContract:
    """Base class of a record store's contract tests; see the module docstring for usage.

    Storage-agnostic tests run once per entry of :attr:`storages`; the reopen and crash
    tests run on ``"disk"`` only.
    """

    #: Storages the storage-agnostic tests run on: ``"memory"`` (``path=None``), ``"disk"``.
    storages: ClassVar[tuple[str, ...]] = ("memory", "disk")
    #: Test name or id (or ``*`` pattern) -> reason; matching tests are ``xfail(strict=False)``.
    known_failures: ClassVar[Mapping[str, str]] = {}
    #: SIGKILLs of the crash test (each after a point of the writer's progress, not a time).
    crash_kills: ClassVar[int] = 6
    #: Marker put on the crash test (``None``: none), registered in this project's pytest.
    slow_marker: ClassVar[str | None] = "slow"

    # ------------------------------------------------------------------ to implement
    def make_store(self, path: Path | None) -> EngineStore:
        """Open the store under test (``path=None``: a fresh, empty one)."""
        raise NotImplementedError("subclasses of StoreContract implement make_store")

    # ------------------------------------------------------------------ pytest plumbing
    def pytest_generate_tests(self, metafunc: Any) -> None:
        """Parametrize over storages; apply :attr:`known_failures` and the slow marker."""
        import pytest

        function = metafunc.function
        if "storage" not in metafunc.fixturenames:
            return
        storages = ("disk",) if getattr(function, "_contract_disk_only", False) else self.storages
        extra: list[Any] = []
        if getattr(function, "_contract_slow", False) and self.slow_marker:
            extra.append(getattr(pytest.mark, self.slow_marker))
        params = []
        for storage in storages:
            test_id = f"{function.__name__}[{storage}]"
            reasons = [
                reason
                for key, reason in self.known_failures.items()
                if key == function.__name__ or _glob_key(key, test_id)
            ]
            marks = [*extra]
            if reasons:
                marks.append(pytest.mark.xfail(reason="; ".join(reasons), strict=False))
            params.append(pytest.param(storage, id=storage, marks=marks))
        metafunc.parametrize("storage", params)

    def _open(self, storage: str, tmp_path: Path) -> EngineStore:
        return self.make_store(tmp_path / "store" if storage == "disk" else None)

    # ------------------------------------------------------------------ 1. isolation
    def test_isolation_between_tricky_user_ids(self, storage: str, tmp_path: Path) -> None:
        """Each tricky user lists, gets and finds their own records and no one else's."""
        store = self._open(storage, tmp_path)
        try:
            secrets = {user: _token(f"sec{i:02d}x") for i, user in enumerate(TRICKY_USER_IDS)}
            mine: dict[str, set[str]] = {}
            for i, (user, secret) in enumerate(secrets.items()):
                records = [
                    _record(user, f"my secret code is {secret}", minutes=i),
                    _record(user, f"the weather was fine on day {i}", minutes=i),
                ]
                store.add(records)
                mine[user] = {r.id for r in records}
            every_id = [rid for ids in mine.values() for rid in ids]
            assert sorted(store.users()) == sorted(TRICKY_USER_IDS), "users() differs"
            for user, secret in secrets.items():
                listed = {r.id for r in store.list(user_id=user)}
                assert listed == mine[user], f"list(user_id={user!r}) is not exactly theirs"
                got = {r.id for r in store.get(every_id, user_id=user)}
                assert got == mine[user], f"get(user_id={user!r}) returned others' records"
                found = {rid for rid, _ in store.search_text(secret, user_id=user, k=50)}
                assert found and found <= mine[user], f"search_text for {user!r} is wrong"
                other = next(s for u, s in secrets.items() if u != user)
                leaked = store.search_text(other, user_id=user, k=50)
                assert not leaked, f"user {user!r} found another user's secret"
        finally:
            _close(store)

    def test_another_users_record_id_is_refused_and_nothing_is_stored(
        self, storage: str, tmp_path: Path
    ) -> None:
        """A batch reusing another user's record id raises a typed error, stores nothing."""
        store = self._open(storage, tmp_path)
        try:
            theirs = _record("alice", "alice's own record")
            store.add([theirs])
            fresh = _record("mallory", "a record of the batch")
            steal = MemoryRecord(theirs.id, "mallory", "turn", "steal", _BASE_TIME, session_id="s1")
            try:
                store.add([fresh, steal])
            except MemoriesError:
                pass
            else:
                raise AssertionError("a batch naming another user's record id was accepted")
            assert store.list(user_id="mallory") == [], "a refused batch stored records"
            kept = store.get([theirs.id], user_id="alice")
            assert [r.text for r in kept] == ["alice's own record"], "the owner's record changed"
        finally:
            _close(store)

    # ------------------------------------------------------------------ 2. erasure
    def test_delete_user_keeps_the_others(self, storage: str, tmp_path: Path) -> None:
        """``delete_user(u)`` forgets ``u``'s records and state only, even for look-alikes."""
        store = self._open(storage, tmp_path)
        try:
            for i, user in enumerate(TRICKY_USER_IDS):
                store.add([_record(user, f"kept fact {i}", minutes=i)])
                store.set_state("mood", {"n": i}, user_id=user)
            forgotten = {"a", "%", "x" * 299}
            for user in forgotten:
                store.delete_user(user)
            for i, user in enumerate(TRICKY_USER_IDS):
                texts = [r.text for r in store.list(user_id=user)]
                state = store.get_state("mood", user_id=user)
                if user in forgotten:
                    assert texts == [] and state is None, f"deleted user {user!r} remains"
                else:
                    assert texts == [f"kept fact {i}"], f"deleting lost {user!r}'s records"
                    assert state == {"n": i}, f"deleting lost {user!r}'s state"
            assert sorted(store.users()) == sorted(set(TRICKY_USER_IDS) - forgotten)
        finally:
            _close(store)

    # ------------------------------------------------------------------ 3. typed errors
    def test_blank_user_id_raises_typed_error(self, storage: str, tmp_path: Path) -> None:
        """Every per-user call refuses a missing or blank user id with a MemoriesError."""
        store = self._open(storage, tmp_path)
        calls: dict[str, Callable[[], object]] = {
            "get": lambda: store.get(["a"], user_id=""),
            "list": lambda: store.list(user_id=" "),
            "search_text": lambda: store.search_text("x", user_id="", k=1),
            "delete": lambda: store.delete(["a"], user_id=""),
            "delete_user": lambda: store.delete_user(""),
            "set_state": lambda: store.set_state("k", 1, user_id=""),
            "add": lambda: store.add([_record(" ", "no owner")]),
        }
        try:
            for name, call in calls.items():
                try:
                    call()
                except MemoriesError:
                    continue
                except Exception as exc:
                    raise AssertionError(
                        f"{name}: {type(exc).__name__} instead of a MemoriesError"
                    ) from exc
                raise AssertionError(f"{name} accepted a blank user id")
            assert store.users() == [], "a refused call stored something"
        finally:
            _close(store)

    # ------------------------------------------------------------------ 4. transactions
    def test_transaction_is_all_or_nothing(self, storage: str, tmp_path: Path) -> None:
        """A ``transaction()`` block that raises leaves none of its writes; one that ends, all."""
        store = self._open(storage, tmp_path)
        try:
            with store.transaction():
                store.add([_record("alice", "kept one")])
                store.set_state("n", 1, user_id="alice")
            try:
                with store.transaction():
                    store.add([_record("alice", "rolled back")])
                    store.set_state("n", 2, user_id="alice")
                    raise RuntimeError("abort")
            except RuntimeError:
                pass
            assert [r.text for r in store.list(user_id="alice")] == ["kept one"]
            assert store.get_state("n", user_id="alice") == 1
        finally:
            _close(store)

    # ------------------------------------------------------------------ 5. persistence
    @_disk_only
    def test_persists_across_reopen(self, storage: str, tmp_path: Path) -> None:
        """Records, full-text search and state survive ``close`` and a reopen."""
        secret = _token("keep")
        store = self._open(storage, tmp_path)
        try:
            store.add([_record("alice", f"my code is {secret}"), _record("bob", "bob's fact")])
            store.set_state("mood", "calm", user_id="alice")
        finally:
            _close(store)
        store = self._open(storage, tmp_path)
        try:
            assert [r.text for r in store.list(user_id="alice")] == [f"my code is {secret}"]
            assert store.search_text(secret, user_id="alice", k=5), "search lost after reopen"
            assert store.search_text(secret, user_id="bob", k=5) == []
            assert store.get_state("mood", user_id="alice") == "calm"
            store.add([_record("alice", "after the reopen")])  # keeps working
        finally:
            _close(store)

    # ------------------------------------------------------------------ 6. crash safety
    @_slow
    @_disk_only
    def test_kill_at_any_point_loses_nothing_acknowledged(
        self, storage: str, tmp_path: Path
    ) -> None:
        """SIGKILL a writer of two-record transactions: acknowledged ones stay, once, whole."""
        path = tmp_path / "store"
        cls = type(self)

        def command(start: int, seed: int) -> list[str]:
            return [
                sys.executable,
                "-c",
                "import sys; from memories_core.testing.store_contract import "
                "run_store_crash_writer; run_store_crash_writer(sys.argv[1:])",
                cls.__module__,
                cls.__qualname__,
                str(path),
                str(start),
                str(seed),
            ]

        runs = kill_writer_repeatedly(command, tmp_path, kills=self.crash_kills)
        store = self.make_store(path)
        try:
            for index, user in enumerate(CRASH_USERS):
                records = store.list(user_id=user)
                said = _numbers(records, "turn")
                noted = _numbers(records, "note")
                mine = {i for i in runs.acked if i % 2 == index}
                lost = sorted(i for i in mine if said[i] != 1)
                assert not lost, f"acknowledged saves lost or doubled ({runs.where}): {lost}"
                stray = sorted(i for i in said if i not in runs.acked | runs.in_flight)
                assert not stray, f"saves that were never made appeared ({runs.where}): {stray}"
                torn = sorted(i for i in set(said) | set(noted) if said[i] != noted[i])
                assert not torn, f"transactions stored in part ({runs.where}): {torn}"
                if mine:
                    last = max(mine)
                    stored = store.get_state("last", user_id=user)
                    assert stored is not None and stored >= last, (
                        f"state lags behind acknowledged save {last} ({runs.where})"
                    )
        finally:
            _close(store)


def run_store_crash_writer(argv: Sequence[str]) -> None:
    """Child process of the store crash test: add exchanges in transactions until killed.

    Args:
        argv: Module and qualified name of the :class:`StoreContract` subclass, the store's
            path, the first exchange number and a random seed (unused: kept for the shape
            of :func:`~memories_core.testing.crash.kill_writer_repeatedly`'s command).

    Each exchange ``n`` is one transaction of a turn, a note and a state update, printed as
    ``saving <n>`` before and ``ack <n>`` after it committed.
    """
    module_name, qualname, path, start, _seed = argv
    owner: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        owner = getattr(owner, part)
    contract: StoreContract = owner()
    print("opening", flush=True)
    store = contract.make_store(Path(path))
    print("open", flush=True)
    i = int(start)
    while True:
        user = CRASH_USERS[i % 2]
        turn = _record(user, f"crash fact {i}: box{i}x", minutes=i, session=f"s{i // 4}")
        note = MemoryRecord(
            new_id(), user, "note", f"crash fact {i}: noted", turn.created_at, source_ids=(turn.id,)
        )
        print(f"saving {i}", flush=True)
        with store.transaction():
            store.add([turn])
            store.add([note])
            store.set_state("last", i, user_id=user)
        print(f"ack {i}", flush=True)
        i += 1
