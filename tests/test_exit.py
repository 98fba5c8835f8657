"""A process that uses a memory and ends without ``close()`` exits cleanly.

Background threads (the engine's derivation worker, the query accelerator's export,
Chroma's open check) are daemons; one still inside onnxruntime or torch when the interpreter
finalizes made the C++ runtime abort the process ("terminate called without an active
exception", exit code 134), one inside Chroma crashed it (SIGSEGV), after the script's last
line had run. These tests run such scripts in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memories_core import Scope
from reranker_scenarios import needs_bundled
from test_query_onnx import needs_exporter

ROOT = Path(__file__).resolve().parents[1]


def run_script(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=os.environ | env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
@needs_bundled
def test_a_script_that_saves_and_ends_without_close_exits_cleanly(tmp_path: Path) -> None:
    """The worker is still encoding token vectors when the script ends."""
    done = run_script(
        """
        from memories_core import HistoryMemory, Scope, Turn
        from memories_core.embedders import HashingEmbedder

        memory = HistoryMemory(embedder=HashingEmbedder())
        for n in range(20):
            memory.save([Turn("user", f"turn {n}: the garden, the lake and the long walk home")],
                        Scope("ana"))
        print("saved")
        """,
        LLM_MEMORIES_LATE_INTERACTION="auto",
    )
    assert "saved" in done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr


@pytest.mark.slow
@needs_exporter
def test_a_script_that_embeds_one_query_and_ends_exits_cleanly() -> None:
    """The first query starts the accelerator's export and check on a daemon thread."""
    done = run_script(
        """
        from memories_core.embedders import SentenceTransformerEmbedder

        print(SentenceTransformerEmbedder().embed_query("where is the lake?").shape)
        """
    )
    assert "(384,)" in done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr


@pytest.mark.slow
def test_a_script_that_opens_a_large_index_and_ends_during_its_open_check_exits_cleanly(
    tmp_path: Path,
) -> None:
    """Chroma's open check of a large collection runs on a daemon thread (8.5 s at 100k
    records); a script ending during it crashed with SIGSEGV (exit code -11)."""
    import numpy as np

    from memories_core.backends.chroma_index import ChromaIndex

    folder = tmp_path / "chroma"
    vectors = np.random.default_rng(0).normal(size=(3000, 32)).astype(np.float32)
    index = ChromaIndex(path=folder, exact_below=0)
    for start in range(0, len(vectors), 500):
        part = vectors[start : start + 500]
        ids = [f"r{start + i}" for i in range(len(part))]
        index.add(ids, part, [{"user_id": "u", "kind": "turn"}] * len(part))
    index.close()
    done = run_script(
        f"""
        import numpy as np
        from memories_core.backends.chroma_index import ChromaIndex
        from memories_core.backends.sqlite_store import SQLiteRecordStore
        from memories_core.embedders import HashingEmbedder
        from memories_core.engine import MemoryEngine

        index = ChromaIndex(path={str(folder)!r}, exact_below=0, open_check=3000)
        engine = MemoryEngine(
            store=SQLiteRecordStore(None), index=index, embedder=HashingEmbedder(dimension=32)
        )
        print(len(index.search(np.ones(32, dtype=np.float32), user_id="u", k=3)))
        """
    )
    assert done.stdout.strip() == "3"
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
def test_a_script_that_ends_while_a_local_model_derives_exits_cleanly(tmp_path: Path) -> None:
    """Past the exit wait the job's generation is cancelled: no thread is left in torch, and
    the job stays pending for the next run, with no failure counted."""
    pytest.importorskip("torch")
    done = run_script(
        f"""
        import time
        import memories_core.engine
        from memories_core import Scope, SummaryMemory, Turn
        from memories_core.embedders import HashingEmbedder
        from memories_core.llms import LocalLLM

        memories_core.engine.EXIT_TIMEOUT = 0.5  # the job in hand outlives the exit wait
        llm = LocalLLM(backend="transformers", n_threads=1, timeout=None)
        llm.load()  # so that the worker is generating, not loading, when the script ends
        memory = SummaryMemory(llm=llm, embedder=HashingEmbedder(), path={str(tmp_path)!r})
        scope = Scope("ana", session_id="s1")
        story = " ".join(f"On day {{n}} we walked to the lake and fed ducks." for n in range(60))
        memory.save([Turn("user", story), Turn("assistant", "What a lovely habit.")], scope)
        memory.end_session(scope)
        while memory.status("ana").running == 0:
            time.sleep(0.05)
        print("deriving")
        """
    )
    assert "deriving" in done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert "terminate called" not in done.stderr
    from memories_core import SummaryMemory
    from memories_core.embedders import HashingEmbedder
    from memories_core.llms import ScriptedLLM

    again = SummaryMemory(
        llm=ScriptedLLM(default="Ana feeds ducks."), embedder=HashingEmbedder(), path=tmp_path
    )
    try:
        (job,) = again.pending("ana")
        assert job.attempts == 0
        assert again.flush("ana") == 0
        assert [r.kind for r in again.records(Scope("ana"))] == ["summary"]
    finally:
        again.close()
