"""Shared test configuration.

Unit tests run with the network blocked (pytest-socket); only Unix sockets stay allowed.
Tests that start a real server on loopback opt in with ``@pytest.mark.server`` and the
``loopback`` fixture.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")


def pytest_runtest_setup(item: pytest.Item) -> None:
    import pytest_socket

    if item.get_closest_marker("server") is not None:
        pytest_socket.socket_allow_hosts(["127.0.0.1", "localhost", "::1"], allow_unix_socket=True)
    else:
        pytest_socket.disable_socket(allow_unix_socket=True)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    import pytest_socket

    pytest_socket.enable_socket()
