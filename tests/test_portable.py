"""The portable memory file: exact round trip, one user only, merge or refuse, re-embedding."""

from __future__ import annotations

import json
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from memories_core import FixedClock, HistoryMemory, InvalidInputError, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.portable import UserExistsError, export_user, import_user, read_manifest
from memories_core.types import GraphEdge, GraphNode, JobSpec, MemoryRecord, new_id

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)


def make_engine(path: Path | None = None, dimension: int = 256) -> MemoryEngine:
    return MemoryEngine(
        path=path, embedder=HashingEmbedder(dimension=dimension), clock=FixedClock(T0)
    )


def fill(engine: MemoryEngine, user: str) -> None:
    memory = HistoryMemory(engine=engine, name=f"history-{user}-{new_id()[:6]}")
    memory.save([Turn("user", f"{user} loves Thai food"), Turn("assistant", "Noted")], Scope(user))
    note = MemoryRecord(new_id(), user, "note", f"{user}'s flight leaves at 9", T0)
    gone = MemoryRecord(new_id(), user, "note", f"{user} secret to delete", T0)
    engine.add_records([note, gone])
    engine.update_state(
        user,
        {note.id: {"strength": 2.5, "valid_until": T0 + timedelta(days=3), "attrs": {"x": 1}}},
        reason="recalled",
    )
    engine.edit_text(user, note.id, f"{user}'s flight leaves at 10", reason="correction")
    engine.delete_records(user, [gone.id], reason="asked")
    engine.store.put_graph(
        user,
        nodes=[GraphNode("a", "person", user), GraphNode("b", "food", "thai")],
        edges=[GraphEdge("e1", "a", "b", "likes", record_id=note.id, data={"w": 0.5})],
    )
    engine.artifacts.put(user, "policy", {"weights.bin": user.encode() * 10, "sub/c.json": b"{}"})
    engine.enqueue(user, [JobSpec("absent-mechanism", "derive", f"k-{user}", {"p": 1})])


def snapshot(engine: MemoryEngine, user: str) -> dict[str, Any]:
    artifacts = {
        info.name: (
            info.size,
            info.sha256,
            info.created_at,
            dict(info.meta),
            sorted(
                (p.relative_to(info.path).as_posix(), p.read_bytes())
                for p in info.path.rglob("*")
                if p.is_file()
            ),
        )
        for info in engine.artifacts.list(user)
    }
    return {
        "records": engine.records(user),
        "history": [(h.record_id, h.at, h.old, h.new, h.reason) for h in engine.history(user)],
        "nodes": engine.store.graph_nodes(user),
        "edges": engine.store.graph_edges(user),
        "artifacts": artifacts,
        "jobs": [
            (j.id, j.mechanism, j.kind, j.key, dict(j.payload), j.attempts, j.created_at)
            for j in engine.pending(user)
        ],
        "session": engine.open_session(user),
    }


@pytest.mark.parametrize("on_disk", [False, True])
def test_round_trip_is_exact(tmp_path: Path, on_disk: bool) -> None:
    source = make_engine(tmp_path / "a" if on_disk else None)
    fill(source, "alice")
    fill(source, "bob")
    file = export_user(source, "alice", tmp_path / "alice.memories.zip")
    target = make_engine(tmp_path / "b" if on_disk else None)
    embedded = target.embedder.usage.items
    report = import_user(target, file)
    assert not report.reembedded
    assert target.embedder.usage.items == embedded  # same embedder: vectors reused
    assert snapshot(target, "alice") == snapshot(source, "alice")
    assert target.users() == ["alice"]
    hits = target.search("Thai food", "alice", k=2)
    assert hits and "Thai" in hits[0].record.text
    assert target.verify().ok
    source.close()
    target.close()


def test_the_file_holds_nothing_of_another_user(tmp_path: Path) -> None:
    engine = make_engine()
    fill(engine, "alice")
    fill(engine, "bob")
    file = export_user(engine, "alice", tmp_path / "alice.zip")
    bob_ids = {r.id for r in engine.records("bob")}
    with zipfile.ZipFile(file) as archive:
        for name in archive.namelist():
            data = archive.read(name)
            assert b"bob" not in data, name
            for rid in bob_ids:
                assert rid.encode() not in data
    assert read_manifest(file)["user_id"] == "alice"


def test_import_refuses_or_merges(tmp_path: Path) -> None:
    engine = make_engine()
    fill(engine, "alice")
    file = export_user(engine, "alice", tmp_path / "alice.zip")
    before = snapshot(engine, "alice")
    with pytest.raises(UserExistsError):
        import_user(engine, file)
    assert snapshot(engine, "alice") == before
    report = import_user(engine, file, on_conflict="merge")
    assert report.records == 0 and report.skipped == len(before["records"])
    assert report.history == 0 and report.artifacts == 0
    assert snapshot(engine, "alice") == before

    other = make_engine()
    extra = MemoryRecord(new_id(), "alice", "note", "alice plays chess", T0)
    other.add_records([extra])
    import_user(other, file, on_conflict="merge")
    ids = {r.id for r in other.records("alice")}
    assert extra.id in ids and {r.id for r in before["records"]} <= ids


def test_another_embedder_re_embeds(tmp_path: Path) -> None:
    engine = make_engine()
    fill(engine, "alice")
    file = export_user(engine, "alice", tmp_path / "alice.zip")
    target = make_engine(dimension=64)
    report = import_user(target, file)
    assert report.reembedded
    assert target.embedder.usage.items > 0
    assert target.search("Thai food", "alice", k=1)[0].record.text.endswith("Thai food")
    assert target.verify().ok


def test_works_through_a_mechanism_and_rejects_bad_files(tmp_path: Path) -> None:
    memory = HistoryMemory(embedder=HashingEmbedder(), path=None)
    memory.save([Turn("user", "I am allergic to nuts")], Scope("u"))
    file = export_user(memory, "u", tmp_path / "u.zip")
    fresh = HistoryMemory(embedder=HashingEmbedder(), path=None)
    import_user(fresh, file)
    assert [t.content for t in fresh.turns(Scope("u"))] == ["I am allergic to nuts"]
    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as archive:
        archive.writestr("manifest.json", json.dumps({"format": "other"}))
    with pytest.raises(InvalidInputError):
        import_user(fresh, bad)
    newer = tmp_path / "newer.zip"
    with zipfile.ZipFile(newer, "w") as archive:
        archive.writestr(
            "manifest.json", json.dumps({"format": "llm-memories/user", "version": 99})
        )
    with pytest.raises(InvalidInputError, match="upgrade"):
        import_user(fresh, newer)
    with pytest.raises(InvalidInputError):
        import_user(fresh, file, on_conflict="replace")  # type: ignore[arg-type]
