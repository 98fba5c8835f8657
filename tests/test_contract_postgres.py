"""The contract suite on the networked backends: PostgreSQL + pgvector, PostgreSQL + Chroma server.

The embedded combinations (SQLite + embedded Chroma on disk, SQLite + numpy in memory) run
in ``tests/test_contract.py``; this module runs the same suite with the record store in
PostgreSQL and the vectors in pgvector (HistoryMemory; MemoryBank, whose jobs, state updates and
``user_lock`` blocks exercise the store's transactions) or in a Chroma server started with
``chroma run`` (HistoryMemory).

A memory "path" maps to a schema named after it (so a reopen finds the same data, and the
crash test's child process too); ``path=None`` gets a fresh schema. The server comes from the
``postgres_dsn`` fixture (``tests/conftest.py``); the crash test's child reads its DSN from
``LLM_MEMORIES_TEST_DSN``.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from memories_core import HistoryMemory, MemoryBankMemory
from memories_core.backends import postgres_storage
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import LLM, Mechanism
from memories_core.testing import MechanismContract
from test_contract_memorybank import aware

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


class _OnPostgres(MechanismContract):
    """Runs every contract test against the session's PostgreSQL server."""

    # A server has no in-memory variant: "memory" would only be another schema name.
    storages: ClassVar[tuple[str, ...]] = ("disk",)

    @pytest.fixture(autouse=True)
    def _postgres(self, postgres_dsn: str) -> None:
        assert os.environ["LLM_MEMORIES_TEST_DSN"]


class TestHistoryMemoryPostgresContract(_OnPostgres):
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return HistoryMemory(**postgres_parts(path))


class TestMemoryBankPostgresContract(_OnPostgres):
    needs_llm = True
    derives_records = True
    end_session_derives = True
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return MemoryBankMemory(llm=aware(llm), **postgres_parts(path))


# -- PostgreSQL records + a Chroma server -----------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def chroma_server_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A ``chroma run`` server on loopback for the whole session."""
    import urllib.request

    folder = tmp_path_factory.mktemp("chroma-server")
    port = _free_port()
    chroma = Path(sys.executable).with_name("chroma")
    log = (folder / "chroma.log").open("w")
    command = [str(chroma), "run", "--path", str(folder / "db")]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.fail(f"chroma run exited with {proc.returncode}")
            try:
                url = f"http://127.0.0.1:{port}/api/v2/heartbeat"
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail("chroma server did not answer its heartbeat within 60 s")
            time.sleep(0.3)
        os.environ[_CHROMA_PORT_ENV] = str(port)
        yield port
    finally:
        # The server's data is a throwaway folder: no need to wait for a graceful stop.
        proc.kill()
        proc.wait(timeout=15)
        log.close()


@pytest.mark.server
class _OnPostgresAndChroma(MechanismContract):
    storages: ClassVar[tuple[str, ...]] = ("disk",)

    @pytest.fixture(autouse=True)
    def _servers(self, postgres_dsn: str, chroma_server_port: int) -> None:
        assert os.environ[_CHROMA_PORT_ENV] == str(chroma_server_port)


class TestHistoryMemoryPostgresChromaContract(_OnPostgresAndChroma):
    known_failures: ClassVar[dict[str, str]] = {}

    def make_memory(self, path: Path | None, llm: LLM) -> Mechanism:
        return HistoryMemory(**postgres_parts(path, vectors="chroma"))
