"""Servers for tests and benchmarks: a ``chroma run`` server on loopback."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["chroma_server"]


@contextlib.contextmanager
def chroma_server(folder: Path, *, timeout: float = 60.0) -> Iterator[int]:
    """A ``chroma run`` server on 127.0.0.1 (a free port), data in ``folder``, for the block.

    For tests and benchmarks of the Chroma server combination (``ChromaIndex(host=...)``):
    yields the port once the server answers its heartbeat; the server is killed at the end
    (its data is a throwaway folder). The server's output goes to ``folder/chroma.log``.

    Raises:
        RuntimeError: if the server exits or does not answer within ``timeout`` seconds.
    """
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    chroma = Path(sys.executable).with_name("chroma")
    command = [str(chroma), "run", "--path", str(folder / "db")]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    with (folder / "chroma.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"chroma run exited with {proc.returncode} (see {log.name})")
                try:
                    url = f"http://127.0.0.1:{port}/api/v2/heartbeat"
                    with urllib.request.urlopen(url, timeout=2) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"chroma server did not answer within {timeout:.0f} s")
                time.sleep(0.3)
            yield port
        finally:
            proc.kill()
            proc.wait(timeout=15)
