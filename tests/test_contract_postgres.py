"""Mechanisms and the record store on the networked backends: PostgreSQL + pgvector or Chroma.

Each mechanism's full contract runs on the default backend (``tests/test_contract*.py``:
SQLite in memory + numpy, SQLite file + embedded Chroma). Here, on PostgreSQL (vectors in
pgvector or in a Chroma server started with ``chroma run``):

* the **store contract** (:class:`~memories_core.testing.StoreContract`) checks the
  PostgreSQL record store once: isolation of tricky user ids, erasure, typed errors,
  transactions, reopen, and SIGKILLed writers;
* every mechanism's contract class runs as a **smoke**: k, isolation, reopen, erasure, an
  LLM outage, garbage replies (the mixed set) and one bad input, so that each mechanism is
  seen working on each backend. The per-user forgetting, async twins and the full tables of
  bad inputs and garbage replies check the mechanism or the store, not the pair, and run
  on the default backend and in the store contract. The crash test runs for the mechanisms
  in :data:`CRASH_ON_SERVERS`. Each class here is ``(_OnPostgres or _OnPostgresAndChroma,
  <the mechanism's contract class>)``, generated at the end of the module (names
  ``Test<...>PostgresContract`` / ``Test<...>PostgresChromaContract``).

How a mechanism that is built with ``path=`` lands on the servers: while the contract class's
own ``make_memory`` runs, the engine's default storage factories (what ``MemoryEngine`` opens
for a ``path`` when no ``store=``/``index=`` is given) are replaced by
:func:`postgres_parts`, so every engine the mechanism opens (MultiView opens one per view,
SelfReflective wraps a HistoryMemory) stores in PostgreSQL. A memory "path" maps to a schema
named after it (so a reopen finds the same data, and the crash test's child process too);
``path=None`` gets a fresh schema. One PostgreSQL server and one Chroma server serve the whole
session (``postgres_dsn`` in ``tests/conftest.py``, ``chroma_server_port`` here); the crash
test's child reads them from ``LLM_MEMORIES_TEST_DSN`` / ``LLM_MEMORIES_TEST_CHROMA_PORT``.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar
from unittest import mock

import pytest

# The modules, not their classes: a contract class imported by name would run here again.
import test_contract
import test_contract_dpem
import test_contract_emg
import test_contract_memochat
import test_contract_memorybank
from memories_core import engine as engine_module
from memories_core.backends import PostgresRecordStore, postgres_storage
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import LLM, EngineStore, Mechanism
from memories_core.testing import MechanismContract, StoreContract, chroma_server

_DIM = 64
# Schemas with this prefix are dropped at the end of the session (tests/conftest.py).
PG_SCHEMA_PREFIX = "lmt_"
_CHROMA_PORT_ENV = "LLM_MEMORIES_TEST_CHROMA_PORT"


def _name_for(path: Path | None) -> str:
    if path is None:
        return f"{PG_SCHEMA_PREFIX}{uuid.uuid4().hex[:20]}"
    return (
        PG_SCHEMA_PREFIX + hashlib.sha1(str(path).encode(), usedforsecurity=False).hexdigest()[:20]
    )


def postgres_parts(path: Path | None, *, vectors: str = "pgvector") -> dict[str, Any]:
    """``store=``, ``index=``, ``embedder=`` of a memory on the test server(s)."""
    chroma = vectors == "chroma"
    return {
        **postgres_storage(
            os.environ["LLM_MEMORIES_TEST_DSN"],
            dimension=_DIM,
            schema=_name_for(path),
            pool_size=2,
            artifacts_path=None if path is None else path / "artifacts",
            chroma_host="127.0.0.1" if chroma else None,
            chroma_port=int(os.environ[_CHROMA_PORT_ENV]) if chroma else 8000,
        ),
        "embedder": HashingEmbedder(dimension=_DIM),
    }


@contextmanager
def _networked_defaults(vectors: str) -> Iterator[None]:
    """While the block runs, a ``MemoryEngine`` opened with ``path=`` stores on the servers.

    The engine's two default factories (``_default_store``, ``_default_index``) are what it
    calls for a path without ``store=``/``index=``; here they return :func:`postgres_parts`
    of that path (the index built together with its store).
    """
    made: dict[Path | None, Any] = {}

    def store(path: Path | None) -> Any:
        parts = postgres_parts(path, vectors=vectors)
        made[path] = parts["index"]
        return parts["store"]

    def index(path: Path | None) -> Any:
        return made.pop(path)

    with (
        mock.patch.object(engine_module, "_default_store", store),
        mock.patch.object(engine_module, "_default_index", index),
    ):
        yield


#: Contract tests that check the mechanism or the store rather than the pair, and so run on
#: the default backend (and in the store contract) only: not generated on the servers.
NOT_ON_SERVERS = (
    "test_clear_one_user_keeps_the_others",
    "test_delete_user_keeps_the_others",
    "test_async_twins_match_sync",
    "test_kill_at_any_point_loses_nothing_acknowledged",
)


class _OnPostgres(MechanismContract):
    """Runs the smoke of the contract class it is mixed into on PostgreSQL + pgvector."""

    # A server has no in-memory variant: "memory" would only be another schema name.
    storages: ClassVar[tuple[str, ...]] = ("disk",)
    smoke: ClassVar[bool] = True
    vectors: ClassVar[str] = "pgvector"

    @pytest.fixture(autouse=True)
    def _postgres(self, postgres_dsn: str) -> None:
        assert os.environ["LLM_MEMORIES_TEST_DSN"]

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        with _networked_defaults(self.vectors):
            return super().make_memory(path, llm)


# -- PostgreSQL records + a Chroma server -----------------------------------------------------


@pytest.fixture(scope="session")
def chroma_server_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A ``chroma run`` server on loopback for the whole session."""
    with chroma_server(tmp_path_factory.mktemp("chroma-server")) as port:
        os.environ[_CHROMA_PORT_ENV] = str(port)
        yield port


@pytest.mark.server
class _OnPostgresAndChroma(_OnPostgres):
    """Runs the smoke of the contract class it is mixed into on PostgreSQL + Chroma server."""

    vectors: ClassVar[str] = "chroma"

    @pytest.fixture(autouse=True)
    def _servers(self, postgres_dsn: str, chroma_server_port: int) -> None:
        assert os.environ[_CHROMA_PORT_ENV] == str(chroma_server_port)


# -- the record store contract on PostgreSQL ---------------------------------------------------


class TestPostgresStoreContract(StoreContract):
    """The PostgreSQL record store meets the store contract (a path names a schema)."""

    storages: ClassVar[tuple[str, ...]] = ("disk",)

    @pytest.fixture(autouse=True)
    def _postgres(self, postgres_dsn: str) -> None:
        assert os.environ["LLM_MEMORIES_TEST_DSN"]

    def make_store(self, path: Path | None) -> EngineStore:
        return PostgresRecordStore(
            os.environ["LLM_MEMORIES_TEST_DSN"], schema=_name_for(path), pool_size=2
        )


# -- every mechanism's contract class, on both networked combinations --------------------------

#: The contract class of each mechanism (tests/test_contract*.py), reused as is.
CONTRACTS: tuple[type[MechanismContract], ...] = (
    test_contract.TestHistoryMemoryContract,
    test_contract.TestSummaryMemoryContract,
    test_contract.TestConditionalMemoryContract,
    test_contract.TestMultiViewMemoryContract,
    test_contract.TestSelfReflectiveMemoryContract,
    test_contract_memorybank.TestMemoryBankContract,
    test_contract_memochat.TestMemoChatContract,
    test_contract_memochat.TestMemoChatLLMFreeContract,
    test_contract_dpem.TestDualProcessMemoryContract,
    test_contract_emg.TestEMGContract,
)
#: Mechanisms whose crash test runs on the servers too: the plain engine (turns only) and one
#: that derives records from jobs at session end, so both job claims and turn writes are
#: killed mid-way on PostgreSQL (the store contract kills its own writers there as well).
CRASH_ON_SERVERS = (
    test_contract.TestHistoryMemoryContract,
    test_contract_memorybank.TestMemoryBankContract,
)
COMBINATIONS: dict[str, type[MechanismContract]] = {
    "Postgres": _OnPostgres,
    "PostgresChroma": _OnPostgresAndChroma,
}


def _networked_name(contract: type[MechanismContract], combination: str) -> str:
    """``TestMemoryBankContract`` -> ``TestMemoryBankPostgresContract`` (pytest -k postgres)."""
    stem = contract.__name__.removesuffix("Contract")
    return f"{stem}{combination}Contract"


for _contract in CONTRACTS:
    for _combination, _mixin in COMBINATIONS.items():
        _name = _networked_name(_contract, _combination)
        # Module-level and named: the crash test's child process imports it by name.
        _attrs: dict[str, Any] = {"__module__": __name__, "__qualname__": _name}
        for _test in NOT_ON_SERVERS:
            if _test == "test_kill_at_any_point_loses_nothing_acknowledged" and (
                _contract in CRASH_ON_SERVERS and _mixin is _OnPostgres
            ):
                continue
            _attrs[_test] = None  # not collected
        _cls = type(_name, (_mixin, _contract), _attrs)
        globals()[_name] = _cls
