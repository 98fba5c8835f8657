"""A memory file is untrusted input: hostile files are refused with a typed error and no trace.

The suite itself is :mod:`memories_core.testing.hostile`; it runs here on SQLite (on disk,
artifacts in files) and on PostgreSQL with pgvector.
"""

from __future__ import annotations

import json
import tracemalloc
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from memories_core import FixedClock, HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.errors import BackendError, InvalidInputError
from memories_core.portable import (
    ImportLimits,
    MemoryFileError,
    UserExistsError,
    export_user,
    import_user,
)
from memories_core.testing.hostile import _bomb, _trace, check_hostile_imports, pickle_payload
from memories_core.types import GraphEdge, GraphNode, JobSpec, MemoryRecord, new_id

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)
DIM = 64


def make_engine(path: Path | None) -> MemoryEngine:
    return MemoryEngine(path=path, embedder=HashingEmbedder(dimension=DIM), clock=FixedClock(T0))


def fill(engine: MemoryEngine, user: str) -> None:
    """Every part of the file format: turns, a note with state and history, graph, job, artifact."""
    memory = HistoryMemory(engine=engine, name=f"history-{new_id()[:6]}")
    memory.save([Turn("user", f"{user} loves Thai food"), Turn("assistant", "Noted")], Scope(user))
    note = MemoryRecord(new_id(), user, "note", f"{user}'s flight leaves at 9", T0)
    engine.add_records([note])
    engine.update_state(
        user, {note.id: {"strength": 2.5, "valid_until": T0 + timedelta(days=3)}}, reason="x"
    )
    engine.edit_text(user, note.id, f"{user}'s flight leaves at 10", reason="correction")
    engine.store.put_graph(
        user,
        nodes=[GraphNode("a", "person", user), GraphNode("b", "food", "thai")],
        edges=[GraphEdge("e1", "a", "b", "likes", record_id=note.id, data={"w": 0.5})],
    )
    engine.artifacts.put(user, "policy", {"weights.bin": b"\x01" * 64, "sub/c.json": b"{}"})
    engine.enqueue(user, [JobSpec("absent-mechanism", "derive", f"k-{user}", {"p": 1})])


def good_file(tmp_path: Path) -> Path:
    source = make_engine(tmp_path / "source")
    try:
        fill(source, "ann")
        return export_user(source, "ann", tmp_path / "ann.memories.zip")
    finally:
        source.close()


def test_hostile_files_are_refused_without_a_trace_on_sqlite(tmp_path: Path) -> None:
    good = good_file(tmp_path)
    target = make_engine(tmp_path / "target")
    try:
        target.save([Turn("user", "bob's own words")], Scope("bob"))
        work = tmp_path / "work"
        work.mkdir()
        refused = check_hostile_imports(target, good, work, other_user="bob")
        assert refused > 100
        assert [r.text for r in target.records("bob")] == ["user: bob's own words"]
        assert sorted(target.users()) == ["ann", "bob"]
    finally:
        target.close()


def test_hostile_files_are_refused_without_a_trace_on_postgres(
    tmp_path: Path, postgres_dsn: str, pg_schema: str
) -> None:
    from memories_core.backends.pgvector_index import PgVectorIndex
    from memories_core.backends.postgres import PostgresRecordStore

    good = good_file(tmp_path)
    target = MemoryEngine(
        store=PostgresRecordStore(
            postgres_dsn, schema=pg_schema, artifacts_path=tmp_path / "artifacts"
        ),
        index=PgVectorIndex(postgres_dsn, dimension=DIM, schema=pg_schema),
        embedder=HashingEmbedder(dimension=DIM),
        clock=FixedClock(T0),
    )
    try:
        target.save([Turn("user", "bob's own words")], Scope("bob"))
        work = tmp_path / "work"
        work.mkdir()
        assert check_hostile_imports(target, good, work, other_user="bob") > 100
        assert [r.text for r in target.records("bob")] == ["user: bob's own words"]
    finally:
        target.close()


def test_a_zip_bomb_is_refused_before_it_is_read(tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.memories.zip"
    bomb.write_bytes(_bomb())
    assert bomb.stat().st_size < 1024 * 1024
    with make_engine(None) as engine:
        tracemalloc.start()
        try:
            with pytest.raises(MemoryFileError, match="fold"):
                import_user(engine, bomb)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 10 * 1024 * 1024  # nowhere near the 300 MB it expands to
        assert engine.users() == []


def test_a_write_that_fails_midway_leaves_nothing_and_a_retry_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = good_file(tmp_path)
    with make_engine(tmp_path / "target") as target:
        before = _trace(target, ["ann"])
        put_graph = target.store.put_graph

        def broken(*args: Any, **kwargs: Any) -> None:
            raise BackendError("disk full")

        # Records, state and history are written before the graph: all are rolled back.
        monkeypatch.setattr(target.store, "put_graph", broken)
        with pytest.raises(BackendError, match="disk full"):
            import_user(target, good)
        assert _trace(target, ["ann"]) == before
        monkeypatch.setattr(target.store, "put_graph", put_graph)
        report = import_user(target, good)
        assert report.records == 3 and report.artifacts == 1 and not report.reembedded
        assert len(target.records("ann")) == 3 and target.artifacts.get("ann", "policy")
        with pytest.raises(UserExistsError):
            import_user(target, good)


def test_a_file_for_another_user_is_refused_when_the_importer_names_its_user(
    tmp_path: Path,
) -> None:
    good = good_file(tmp_path)
    with make_engine(None) as target:
        with pytest.raises(MemoryFileError, match="holds user 'ann'"):
            import_user(target, good, user_id="bob")
        assert target.users() == []
        assert import_user(target, good, user_id="ann").records == 3
        with pytest.raises(InvalidInputError, match="reserved"):
            import_user(target, good, user_id="__emg_store__")


def test_a_training_checkpoint_is_never_exported_nor_imported(tmp_path: Path) -> None:
    """Only a checkpoint the store wrote itself may be resumed (MaLP's ``*.checkpoint``)."""
    marker = tmp_path / "unpickled.marker"
    with make_engine(tmp_path / "source") as source:
        fill(source, "ann")
        source.artifacts.put("ann", "malp/lora.checkpoint", {"trainer.json": b"{}"})
        exported = export_user(source, "ann", tmp_path / "ann.zip")
    with zipfile.ZipFile(exported) as archive:
        members = {n: archive.read(n) for n in archive.namelist()}
    listing = json.loads(members["artifacts.json"])
    assert [a["name"] for a in listing] == ["policy"]
    # A hand-made file that carries one (with a pickle payload) imports without it.
    listing.append({**listing[0], "name": "malp/lora.checkpoint", "folder": "1"})
    members["artifacts.json"] = json.dumps(listing).encode()
    members["artifacts/1/optimizer.pt"] = pickle_payload(marker)
    manifest = json.loads(members["manifest.json"])
    manifest["counts"]["artifacts"] += 1
    members["manifest.json"] = json.dumps(manifest).encode()
    crafted = tmp_path / "crafted.zip"
    with zipfile.ZipFile(crafted, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with make_engine(tmp_path / "target") as target:
        report = import_user(target, crafted)
        assert report.dropped == ("malp/lora.checkpoint",) and report.artifacts == 1
        assert target.artifacts.get("ann", "malp/lora.checkpoint") is None
        assert target.artifacts.get("ann", "policy") is not None
    assert not marker.exists()


def test_limits_are_checked(tmp_path: Path) -> None:
    good = good_file(tmp_path)
    with make_engine(None) as target:
        with pytest.raises(MemoryFileError, match="members"):
            import_user(target, good, limits=ImportLimits(max_members=2))
        with pytest.raises(MemoryFileError, match="rows"):
            import_user(target, good, limits=ImportLimits(max_records=1))
        with pytest.raises(InvalidInputError):
            ImportLimits(max_ratio=0)
        with pytest.raises(InvalidInputError):
            import_user(target, good, limits={"max_members": 2})  # type: ignore[arg-type]
        assert target.users() == []
