"""The contract every memory mechanism meets, as a reusable pytest suite.

See :mod:`memories_core.testing` for what the suite checks and how to use it.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, ClassVar

from memories_core.clock import FixedClock
from memories_core.errors import MemoriesError
from memories_core.interfaces import LLM, Mechanism
from memories_core.testing._scenario import (
    _BASE_TIME,
    _K_FACTS,
    _SECRET_QUERY,
    _call_optional,
    _close,
    _derived,
    _disk_only,
    _duplicates,
    _every_storage,
    _exchange,
    _glob_key,
    _Outcome,
    _recall_text,
    _secret_exchange,
    _slow,
    _token,
)
from memories_core.testing.cases import (
    BAD_INPUT_CASES,
    GARBAGE_MARKERS,
    GARBAGE_REPLIES,
    TRICKY_USER_IDS,
)
from memories_core.testing.crash import (
    CRASH_USERS,
    crash_counts,
    crash_text,
    kill_writer_repeatedly,
)
from memories_core.testing.doubles import FlakyLLM, healthy_llm
from memories_core.types import Recall, Scope, Turn

__all__ = ["MechanismContract"]


class MechanismContract:
    """Base class of a mechanism's contract tests; see the module docstring for usage.

    Subclasses implement :meth:`make_memory` and set the flags; every ``test_*`` method is
    inherited and collected by pytest. Storage-agnostic tests run once per entry of
    :attr:`storages`; tests that need files (reopen, erasure, crashes) run on disk only,
    isolation on disk as well; the per-case tests (each bad input, each garbage reply) on
    :attr:`cases_storage`.
    """

    #: Whether the mechanism calls its LLM. If not, the suite checks that it never does.
    needs_llm: ClassVar[bool] = False
    #: Whether the mechanism writes records of its own (summaries, notes) from the turns.
    derives_records: ClassVar[bool] = False
    #: Whether derivation waits for ``end_session`` (else the suite never ends sessions
    #: before recalling, so derivation on save is what is checked).
    end_session_derives: ClassVar[bool] = False
    #: Storages the storage-agnostic tests run on: ``"memory"`` (``path=None``), ``"disk"``.
    #: One by default: what a storage adds is checked once per store by the store contract
    #: and by the disk tests here (reopen, erasure, crashes, and isolation, which runs on
    #: disk too); the engine's reference mechanism sets both.
    storages: ClassVar[tuple[str, ...]] = ("memory",)
    #: Storage the per-case tests (each bad input, each garbage reply) run on; ``None``: the
    #: first of :attr:`storages`. The cases check the mechanism's input validation and reply
    #: parsing, which do not depend on the storage; a store's own promises are checked once
    #: per backend by :class:`~memories_core.testing.StoreContract`.
    cases_storage: ClassVar[str | None] = None
    #: Run one representative of each per-case axis (the first bad input, the ``mixed``
    #: garbage replies) instead of all: for a mechanism's smoke run on a second backend,
    #: where every case already ran on the default backend.
    smoke: ClassVar[bool] = False
    #: Whether the mechanism persists under a path; if not, the disk-only tests are skipped.
    supports_disk: ClassVar[bool] = True
    #: Test name or id (or ``*`` pattern) -> reason; matching tests are ``xfail(strict=False)``.
    known_failures: ClassVar[Mapping[str, str]] = {}
    #: ``k`` used when the suite wants everything a user has.
    recall_k: ClassVar[int] = 1000
    #: Whether a recall fills ``k`` when enough records exist (``False`` for mechanisms whose
    #: model drops irrelevant records, e.g. self-reflective retrieval).
    fills_k: ClassVar[bool] = True
    #: SIGKILLs of the crash test, each after a point of the writer's progress (not a time).
    #: Each writer is a new process that opens the memory (seconds of CPU); the points are
    #: drawn anew on every run (``MEMORIES_CONTRACT_SEED`` replays one), so runs add up.
    crash_kills: ClassVar[int] = 4
    #: Deprecated and ignored: kills follow the writer's acknowledgements, not the clock, so
    #: the crash test has no time budget. Kept so that subclasses which set it still load.
    crash_seconds: ClassVar[float] = 18.0
    #: Marker put on the crash test (``None``: none), registered in this project's pytest.
    slow_marker: ClassVar[str | None] = "slow"

    # ------------------------------------------------------------------ to implement
    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        """Build the mechanism under test (``path=None``: in memory) around ``llm``."""
        raise NotImplementedError("subclasses of MechanismContract implement make_memory")

    # ------------------------------------------------------------------ hooks
    def make_llm(self) -> LLM:
        """A healthy model for the tests that are not about LLM failures."""
        return healthy_llm()

    def stored_turns(self, memory: Any, scope: Scope) -> list[list[Turn]] | None:
        """Every independent listing of ``scope``'s stored turns, or ``None`` if none exists.

        The default reads ``memory.turns(scope)``; a mechanism that keeps several copies of
        the turns (one per view) returns each, and one with no public listing returns
        ``None`` (turn checks then go through ``recall``).
        """
        turns = getattr(memory, "turns", None)
        if not callable(turns):
            return None
        return [list(turns(scope))]

    def retry(self, memory: Any, user_id: str) -> None:
        """Retry pending derivations (``retry_pending`` if the mechanism has it)."""
        _call_optional(memory, "retry_pending", user_id)

    # ------------------------------------------------------------------ pytest plumbing
    def pytest_generate_tests(self, metafunc: Any) -> None:
        """Parametrize over storages (and bad-input cases or garbage replies).

        Also applies :attr:`known_failures` and the slow marker, so that importing this module
        never needs pytest.
        """
        import pytest

        function = metafunc.function
        name = function.__name__
        if "storage" not in metafunc.fixturenames:
            return
        storages = self.storages
        if getattr(function, "_contract_every_storage", False) and self.supports_disk:
            storages = tuple(dict.fromkeys((*storages, "disk")))
        extra: list[Any] = []
        if getattr(function, "_contract_disk_only", False):
            storages = ("disk",)
            if not self.supports_disk:
                extra.append(pytest.mark.skip(reason="the mechanism does not persist to disk"))
        if getattr(function, "_contract_slow", False) and self.slow_marker:
            extra.append(getattr(pytest.mark, self.slow_marker))
        # A second axis: the bad-input case or the garbage reply, in the id after the storage.
        axes: Mapping[str, Sequence[str]] = {
            "case": tuple(BAD_INPUT_CASES),
            "garbage": (*GARBAGE_REPLIES, "mixed"),
        }
        if self.smoke:
            axes = {"case": (next(iter(BAD_INPUT_CASES)),), "garbage": ("mixed",)}
        second = next((arg for arg in axes if arg in metafunc.fixturenames), None)
        if second is None:
            metafunc.parametrize(
                "storage",
                [pytest.param(s, id=s, marks=[*extra, *self._xfail(name, s)]) for s in storages],
            )
            return
        # The cases check the mechanism's validation and parsing, which come before any
        # storage: one storage runs them (the store contract checks each storage).
        storages = (self.cases_storage or storages[0],)
        metafunc.parametrize(
            ("storage", second),
            [
                pytest.param(s, v, id=f"{s}-{v}", marks=[*extra, *self._xfail(name, f"{s}-{v}")])
                for s in storages
                for v in axes[second]
            ],
        )

    def _xfail(self, name: str, param_id: str) -> list[Any]:
        import pytest

        test_id = f"{name}[{param_id}]"
        reasons = [
            reason
            for key, reason in self.known_failures.items()
            if key == name or _glob_key(key, test_id)
        ]
        if not reasons:
            return []
        return [pytest.mark.xfail(reason="; ".join(reasons), strict=False)]

    # ------------------------------------------------------------------ shared steps
    def _open(self, storage: str, tmp_path: Path, llm: LLM | None = None, name: str = "m") -> Any:
        path = tmp_path / name if storage == "disk" else None
        return self.make_memory(path, llm if llm is not None else self.make_llm())

    def _settle(self, memory: Any, scope: Scope) -> None:
        """End the session if this mechanism derives only then."""
        if self.end_session_derives:
            memory.end_session(scope)

    def _recall(self, memory: Any, query: str, scope: Scope) -> Recall:
        recall = memory.recall(query, scope, k=self.recall_k)
        assert isinstance(recall, Recall), f"recall returned {type(recall).__name__}"
        return recall

    def _save_secret(self, memory: Any, user_id: str, secret: str, at: datetime) -> None:
        scope = Scope(user_id, "s1")
        memory.save(_secret_exchange(secret, at), scope)
        self._settle(memory, scope)

    def _assert_turns_once(self, memory: Any, scope: Scope, contents: Sequence[str]) -> None:
        listings = self.stored_turns(memory, scope)
        if listings is None:
            for content in contents:
                text = _recall_text(self._recall(memory, content, scope))
                assert content in text, f"turn {content!r} is lost"
            return
        for listing in listings:
            counts = Counter(t.content for t in listing)
            for content in contents:
                assert counts[content] == 1, (
                    f"turn {content!r} stored {counts[content]} times; stored: {sorted(counts)}"
                )

    # ------------------------------------------------------------------ 0. k
    def test_recall_returns_at_most_k_and_fills_k(self, storage: str, tmp_path: Path) -> None:
        """Five sessions with a fact each: ``k=1`` and ``k=3`` give 1 and 3 records."""
        memory = self._open(storage, tmp_path)
        try:
            for day, fact in enumerate(_K_FACTS):
                scope = Scope("k-user", f"s{day}")
                memory.save(_exchange(fact, "Noted.", _BASE_TIME + timedelta(days=day)), scope)
                self._settle(memory, scope)
            for k in (1, 3):
                got = len(memory.recall("where did I go hiking?", Scope("k-user"), k=k).records)
                assert got <= k, f"recall(k={k}) returned {got} records"
                if self.fills_k:
                    assert got == k, f"recall(k={k}) returned {got} records, 5 sessions stored"
        finally:
            _close(memory)

    # ------------------------------------------------------------------ 1. isolation
    @_every_storage
    def test_isolation_between_tricky_user_ids(self, storage: str, tmp_path: Path) -> None:
        """Each tricky user recalls their own secret and never another user's."""
        memory = self._open(storage, tmp_path)
        try:
            secrets = {user: _token(f"sec{i:02d}x") for i, user in enumerate(TRICKY_USER_IDS)}
            for i, (user, secret) in enumerate(secrets.items()):
                self._save_secret(memory, user, secret, _BASE_TIME + timedelta(minutes=i))
            for user, secret in secrets.items():
                text = _recall_text(self._recall(memory, _SECRET_QUERY, Scope(user)))
                assert secret in text, f"user {user!r} cannot recall their own secret"
                leaked = [u for u, s in secrets.items() if u != user and s in text]
                assert not leaked, f"user {user!r} recalled the secrets of {leaked!r}"
        finally:
            _close(memory)

    def test_clear_one_user_keeps_the_others(self, storage: str, tmp_path: Path) -> None:
        """``clear(Scope(u))`` forgets ``u`` only, even for ids that look alike."""
        self._forget_one_keeps_others(storage, tmp_path, lambda m, u: m.clear(Scope(u)))

    def test_delete_user_keeps_the_others(self, storage: str, tmp_path: Path) -> None:
        """``delete_user(u)`` forgets ``u`` only, even for ids that look alike."""
        self._forget_one_keeps_others(storage, tmp_path, lambda m, u: m.delete_user(u))

    def _forget_one_keeps_others(
        self, storage: str, tmp_path: Path, forget: Callable[[Any, str], None]
    ) -> None:
        memory = self._open(storage, tmp_path)
        try:
            secrets = {user: _token("keep") for user in TRICKY_USER_IDS}
            for i, (user, secret) in enumerate(secrets.items()):
                self._save_secret(memory, user, secret, _BASE_TIME + timedelta(minutes=i))
            forgotten = {"a", "%", "x" * 299}
            for user in forgotten:
                forget(memory, user)
            for user, secret in secrets.items():
                text = _recall_text(self._recall(memory, _SECRET_QUERY, Scope(user)))
                if user in forgotten:
                    assert secret not in text, f"forgotten user {user!r} still recalls"
                    listings = self.stored_turns(memory, Scope(user)) or []
                    assert all(not listing for listing in listings), f"{user!r} keeps turns"
                else:
                    assert secret in text, f"forgetting {sorted(forgotten)} lost {user!r}"
        finally:
            _close(memory)

    # ------------------------------------------------------------------ 2. persistence
    @_disk_only
    def test_persists_across_reopen(self, storage: str, tmp_path: Path) -> None:
        """Saved turns and derived records survive ``close`` and a reopen."""
        secret, other = _token("keep"), _token("other")
        memory = self._open(storage, tmp_path)
        try:
            self._save_secret(memory, "alice", secret, _BASE_TIME)
            self._save_secret(memory, "bob", other, _BASE_TIME)
        finally:
            _close(memory)
        memory = self._open(storage, tmp_path)
        try:
            text = _recall_text(self._recall(memory, _SECRET_QUERY, Scope("alice")))
            assert secret in text, "the secret is not recalled after a reopen"
            assert other not in text, "bob's secret leaked into alice's recall after a reopen"
            self._assert_turns_once(memory, Scope("alice"), [f"My secret code is {secret}."])
            # The reopened memory keeps working.
            self._save_secret(memory, "alice", _token("more"), _BASE_TIME + timedelta(hours=1))
        finally:
            _close(memory)

    # ------------------------------------------------------------------ 3. erasure
    @_disk_only
    def test_delete_user_leaves_no_trace_on_disk(self, storage: str, tmp_path: Path) -> None:
        """No byte of a deleted user remains in any file under the memory's directory."""
        marker = _token("zqmark")
        victim = f"victim-{marker}"
        keeper_secret = _token("keep")
        path = tmp_path / "m"
        memory: Any = self.make_memory(path, self.make_llm())
        try:
            scope = Scope(victim, f"session-{marker}")
            turns = [
                Turn(
                    "user",
                    f"My secret code is {marker}, remember it always.",
                    timestamp=_BASE_TIME,
                    metadata={"tag": marker, f"key{marker}": "value", "nested": [marker]},
                ),
                Turn("assistant", f"I will remember {marker}.", timestamp=_BASE_TIME),
            ]
            memory.save(turns, scope)
            memory.end_session(scope)
            self._recall(memory, f"secret code {marker}", Scope(victim))
            self._save_secret(memory, "keeper", keeper_secret, _BASE_TIME)
            memory.delete_user(victim)
            text = _recall_text(self._recall(memory, f"secret code {marker}", Scope(victim)))
            assert marker not in text, "the deleted user is still recalled"
        finally:
            _close(memory)
        needles = {marker.encode(), victim.encode()}
        found = [
            f"{file.relative_to(path)} holds {needle.decode()!r}"
            for file in sorted(path.rglob("*"))
            if file.is_file()
            for needle in needles
            if needle in file.read_bytes()
        ]
        assert not found, "delete_user left traces on disk: " + "; ".join(found)
        memory = self.make_memory(path, self.make_llm())
        try:
            text = _recall_text(self._recall(memory, _SECRET_QUERY, Scope("keeper")))
            assert keeper_secret in text, "delete_user of one user lost another user's memory"
            text = _recall_text(self._recall(memory, f"secret code {marker}", Scope(victim)))
            assert marker not in text, "the deleted user came back after a reopen"
        finally:
            _close(memory)

    # ------------------------------------------------------------------ 4. typed errors
    def test_bad_input_raises_typed_error_and_stores_nothing(
        self, storage: str, case: str, tmp_path: Path
    ) -> None:
        """Each :data:`BAD_INPUT_CASES` entry raises a MemoriesError and stores nothing."""
        memory = self._open(storage, tmp_path)
        try:
            secret = _token("good")
            self._save_secret(memory, "good-user", secret, _BASE_TIME)
            mallory = Scope("mallory", "s1")
            marker = _token("bad")
            text = f"My secret code is {marker}, remember it always."
            problem = ""
            try:
                BAD_INPUT_CASES[case](memory, mallory, text)
            except MemoriesError:
                pass
            except Exception as exc:
                problem = f"{case}: raised {type(exc).__name__}: {exc} instead of a MemoriesError"
            else:
                problem = f"{case}: accepted without an error"
            # Whatever happened to the bad input, another user's recall keeps working.
            found = _recall_text(self._recall(memory, _SECRET_QUERY, Scope("good-user")))
            assert secret in found, f"{case}: another user's recall is broken ({problem})"
            assert not problem, problem
            self._settle(memory, mallory)
            listings = self.stored_turns(memory, mallory) or []
            assert all(not listing for listing in listings), f"{case}: turns were stored"
            assert marker not in _recall_text(self._recall(memory, text, Scope("mallory"))), (
                f"{case}: the rejected input is recalled"
            )
        finally:
            _close(memory)

    def test_lone_surrogates_take_the_documented_fallback(
        self, storage: str, tmp_path: Path
    ) -> None:
        """A lone surrogate in a role, speaker or query is stored and searched as U+FFFD.

        No store or encoder can take one; the turn must not be lost (and the query must
        not fail) over it.
        """
        memory = self._open(storage, tmp_path)
        try:
            scope = Scope("ursula", "s1")
            secret = _token("sur")
            turns = [
                Turn("user", f"My secret code is {secret}.", speaker="Ur\udfffsula"),
                Turn("assistant\ud800", f"Noted, your code is {secret}."),
            ]
            assert (turns[0].speaker, turns[1].role) == ("Ur\ufffdsula", "assistant\ufffd")
            memory.save(turns, scope)
            self._settle(memory, scope)
            found = _recall_text(self._recall(memory, _SECRET_QUERY + " \udc80", scope))
            assert secret in found, "a query with a lone surrogate lost the user's turn"
            for listing in self.stored_turns(memory, scope) or []:
                kept = [(t.role, t.speaker) for t in listing if secret in t.content]
                assert kept == [("user", "Ur\ufffdsula"), ("assistant\ufffd", None)], kept
        finally:
            _close(memory)

    # ------------------------------------------------------------------ 5. async twins
    def test_async_twins_match_sync(self, storage: str, tmp_path: Path) -> None:
        """``asave``/``arecall``/``aclear``/``aend_session`` behave like their sync twins."""
        sync_memory = self._open(storage, tmp_path, name="sync")
        async_memory = self._open(storage, tmp_path, name="async")
        users = ("ann", "ben")
        secrets = {user: _token("twin") for user in users}

        def key(recall: Recall) -> tuple[list[str], str]:
            return [hit.record.text for hit in recall.records], recall.context

        async def drive_async() -> _Outcome:
            for i, user in enumerate(users):
                scope = Scope(user, "s1")
                await async_memory.asave(
                    _secret_exchange(secrets[user], _BASE_TIME + timedelta(minutes=i)), scope
                )
                if self.end_session_derives:
                    await async_memory.aend_session(scope)
            out = {u: key(await async_memory.arecall(_SECRET_QUERY, Scope(u), k=10)) for u in users}
            await async_memory.aclear(Scope("ann"))
            out["ann-cleared"] = key(await async_memory.arecall(_SECRET_QUERY, Scope("ann")))
            return out

        async def arecall_sync_memory() -> _Outcome:
            return {u: key(await sync_memory.arecall(_SECRET_QUERY, Scope(u), k=10)) for u in users}

        try:
            for i, user in enumerate(users):
                self._save_secret(
                    sync_memory, user, secrets[user], _BASE_TIME + timedelta(minutes=i)
                )
            expected = {u: key(sync_memory.recall(_SECRET_QUERY, Scope(u), k=10)) for u in users}
            assert secrets["ben"] in "\n".join(expected["ben"][0]), "sync recall misses ben"
            # A recall may change what the next one ranks first (MemoryBank reinforces what it
            # returns, Zhong et al. §2.3), so this second recall is compared as a set.
            again = asyncio.run(arecall_sync_memory())
            assert {u: sorted(again[u][0]) for u in users} == {
                u: sorted(expected[u][0]) for u in users
            }, "arecall differs from recall"
            sync_memory.clear(Scope("ann"))
            expected["ann-cleared"] = key(sync_memory.recall(_SECRET_QUERY, Scope("ann")))
            assert secrets["ann"] not in "\n".join(expected["ann-cleared"][0]), "clear failed"
            assert asyncio.run(drive_async()) == expected, "the async twins differ from sync"
        finally:
            _close(sync_memory)
            _close(async_memory)

    # ------------------------------------------------------------------ 6. LLM outages
    def test_failing_llm_never_loses_a_turn(self, storage: str, tmp_path: Path) -> None:
        """An LLM that raises loses no turn; after recovery a retry derives once."""
        self._outage(storage, tmp_path, "fail")

    def test_garbage_llm_never_loses_a_turn(
        self, storage: str, garbage: str, tmp_path: Path
    ) -> None:
        """An LLM answering garbage loses no turn, stores no garbage; a retry derives once.

        ``garbage`` names the :data:`GARBAGE_REPLIES` entry every call gets, or ``"mixed"``
        (the calls cycle through all of them, so e.g. a forged "yes" meets a forged record).
        """
        replies = None if garbage == "mixed" else [GARBAGE_REPLIES[garbage]]
        self._outage(storage, tmp_path, "garbage", replies)

    def _outage(
        self, storage: str, tmp_path: Path, mode: str, garbage: Sequence[str] | None = None
    ) -> None:
        llm = FlakyLLM(mode, garbage=garbage)
        memory = self._open(storage, tmp_path, llm=llm)
        try:
            scope = Scope("flaky", "s1")
            tokens = [_token("tea") for _ in range(3)]
            contents = [f"I always drink {token} tea in the morning" for token in tokens]
            for i, content in enumerate(contents):
                at = _BASE_TIME + timedelta(minutes=i)
                memory.save(_exchange(content, f"Noted, {tokens[i]} tea.", at), scope)
            memory.end_session(scope)
            self._assert_turns_once(memory, scope, contents)
            during = _recall_text(self._recall(memory, "what do I drink, tea", Scope("flaky")))
            self._assert_no_garbage(during, "during the outage")
            if not self.needs_llm:
                assert not llm.calls, "a mechanism declared needs_llm=False called its LLM"
            llm.mode = "ok"
            later = Scope("flaky", "s2")
            fresh = f"I always drink {_token('tea')} tea at night"
            memory.save(_exchange(fresh, "Noted.", _BASE_TIME + timedelta(hours=1)), later)
            for _ in range(2):  # a second retry must not derive anything again
                self.retry(memory, "flaky")
                memory.end_session(scope)
                memory.end_session(later)
            self._assert_turns_once(memory, scope, contents)
            self._assert_turns_once(memory, later, [fresh])
            everything = self._recall(memory, "what do I drink, tea", Scope("flaky"))
            duplicates = _duplicates(_derived(everything))
            assert not duplicates, f"derived records duplicated after a retry: {duplicates}"
            if self.derives_records:
                assert _derived(everything), "no record was derived after the LLM recovered"
            self._assert_no_garbage(_recall_text(everything), "after the LLM recovered")
            for content, token in zip(contents, tokens, strict=True):
                text = _recall_text(self._recall(memory, content, Scope("flaky")))
                assert token in text, f"{token} is not recalled after the LLM recovered"
        finally:
            _close(memory)

    @staticmethod
    def _assert_no_garbage(text: str, when: str) -> None:
        lowered = text.lower()
        found = [marker for marker in GARBAGE_MARKERS if marker in lowered]
        assert not found, f"garbage LLM output was recalled {when}: {found}"

    # ------------------------------------------------------------------ 7. crash safety
    @_slow
    @_disk_only
    def test_kill_at_any_point_loses_nothing_acknowledged(
        self, storage: str, tmp_path: Path
    ) -> None:
        """SIGKILL a writer at random points of its progress: acknowledged turns stay, once.

        Each kill follows the writer's own progress lines (:mod:`memories_core.testing.crash`):
        during open and recovery, mid-save, after an acknowledgement, inside a recall or a
        session end; never after a wall-clock delay, so a loaded machine cannot starve it.
        """
        path = tmp_path / "m"
        cls = type(self)

        def command(start: int, seed: int) -> list[str]:
            return [
                sys.executable,
                "-c",
                "import sys; from memories_core.testing import run_crash_writer; "
                "run_crash_writer(sys.argv[1:])",
                cls.__module__,
                cls.__qualname__,
                str(path),
                str(start),
                str(seed),
            ]

        runs = kill_writer_repeatedly(command, tmp_path, kills=self.crash_kills)
        self._check_after_crashes(path, runs.acked, runs.in_flight, runs.where)

    def _retry_after_leases(self, memory: Any, user_id: str) -> None:
        """Retry pending work as it runs once the killed writers' job leases have ended.

        A writer killed while running a job leaves the job claimed until its lease ends
        (:class:`~memories_core.engine.JobPolicy`); only then may another worker take it. The
        writers here are dead, so the retry runs on the engine's clock moved past one lease,
        which is when a real restart would run it. A memory without an engine is retried as is.
        """
        engine = getattr(memory, "engine", None)
        policy = getattr(engine, "policy", None)
        if engine is None or policy is None:
            self.retry(memory, user_id)
            return
        real = engine.clock
        engine.clock = FixedClock(real.now() + policy.lease + timedelta(seconds=1))
        try:
            self.retry(memory, user_id)
        finally:
            engine.clock = real

    def _check_after_crashes(
        self, path: Path, acked: set[int], in_flight: set[int], where: str
    ) -> None:
        memory: Any = self.make_memory(path, self.make_llm())
        try:
            for index, user in enumerate(CRASH_USERS):
                mine = {i for i in acked if i % 2 == index}
                if self.end_session_derives:
                    # A writer may die before it ends a session; the restarted app ends it
                    # (or its idle gap does), and that is when these mechanisms derive.
                    for session in sorted({f"s{i // 4}" for i in mine}):
                        memory.end_session(Scope(user, session))
                self._retry_after_leases(memory, user)
                listings = self.stored_turns(memory, Scope(user))
                if listings is None:
                    for i in sorted(mine):
                        text = _recall_text(self._recall(memory, crash_text(i), Scope(user)))
                        assert crash_text(i) in text, f"acknowledged turn {i} lost ({where})"
                for listing in listings or []:
                    said = crash_counts(listing, "user")
                    replied = crash_counts(listing, "assistant")
                    lost = sorted(i for i in mine if said[i] != 1)
                    assert not lost, (
                        f"acknowledged turns lost or duplicated after SIGKILL ({where}): "
                        f"{[(i, said[i]) for i in lost]}"
                    )
                    stray = sorted(i for i in said if i not in acked and i not in in_flight)
                    assert not stray, f"turns that were never saved appeared ({where}): {stray}"
                    twice = sorted(i for i in said if said[i] > 1)
                    assert not twice, f"turns stored twice after SIGKILL ({where}): {twice}"
                    torn = sorted(i for i in set(said) | set(replied) if said[i] != replied[i])
                    assert not torn, f"saves stored only in part ({where}): {torn}"
                everything = self._recall(memory, "crash fact box holds item", Scope(user))
                duplicates = _duplicates(_derived(everything))
                assert not duplicates, (
                    f"derived records duplicated after SIGKILL ({where}): {duplicates}"
                )
                if self.derives_records and mine:
                    assert _derived(everything), f"nothing derived for {user} ({where})"
        finally:
            _close(memory)
