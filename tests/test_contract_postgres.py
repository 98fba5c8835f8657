"""The contract suite on the networked backends: PostgreSQL + pgvector, PostgreSQL + Chroma server.

The embedded combinations (SQLite + embedded Chroma on disk, SQLite + numpy in memory) run
in ``tests/test_contract*.py``; this module runs **every mechanism's** contract class from
those modules again (issue 15, Build 7), unchanged, with the record store in PostgreSQL and
the vectors in pgvector or in a Chroma server started with ``chroma run``: each class here is
``(_OnPostgres or _OnPostgresAndChroma, <the mechanism's contract class>)``, generated at the
end of the module (names ``Test<...>PostgresContract`` / ``Test<...>PostgresChromaContract``).

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
from memories_core.backends import postgres_storage
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import LLM, Mechanism
from memories_core.testing import BAD_INPUT_CASES, MechanismContract, chroma_server

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


class _OnPostgres(MechanismContract):
    """Runs every contract test of the class it is mixed into on PostgreSQL + pgvector."""

    # A server has no in-memory variant: "memory" would only be another schema name.
    storages: ClassVar[tuple[str, ...]] = ("disk",)
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


#: The one case of each parametrised axis that every mechanism runs on the Chroma combination.
_REPRESENTATIVE = {"case": next(iter(BAD_INPUT_CASES)), "garbage": "mixed"}


@pytest.mark.server
class _OnPostgresAndChroma(_OnPostgres):
    """Runs the contract tests of the class it is mixed into on PostgreSQL + Chroma server.

    Every test runs; of the two parametrised tests (34 bad inputs, 9 garbage replies: the
    mechanism's validation and parsing, which the vector store does not change) a class with
    ``all_cases = False`` runs one representative (the first bad input, the ``mixed`` garbage)
    and skips the rest, with a reason, to keep CI time in bounds. They all run on
    PostgreSQL + pgvector.
    """

    vectors: ClassVar[str] = "chroma"
    all_cases: ClassVar[bool] = True

    @pytest.fixture(autouse=True)
    def _servers(
        self, request: pytest.FixtureRequest, postgres_dsn: str, chroma_server_port: int
    ) -> None:
        assert os.environ[_CHROMA_PORT_ENV] == str(chroma_server_port)
        params = getattr(getattr(request.node, "callspec", None), "params", {})
        for axis, kept in _REPRESENTATIVE.items():
            if not self.all_cases and axis in params and params[axis] != kept:
                pytest.skip(f"{axis} {params[axis]!r} runs on Postgres + pgvector (CI time)")


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
#: Mechanisms that run every parametrised case on PostgreSQL + Chroma server too.
ALL_CASES_ON_CHROMA = (
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
        if _mixin is _OnPostgresAndChroma and _contract not in ALL_CASES_ON_CHROMA:
            _attrs["all_cases"] = False
        _cls = type(_name, (_mixin, _contract), _attrs)
        globals()[_name] = _cls
