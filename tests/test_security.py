"""Reserved user ids, metadata the index cannot hold, and no pickle anywhere in the package."""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

import memories_core
from memories_core import EMGMemory, FixedClock, HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.errors import InvalidInputError, MissingUserError
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.emg import POLICY_ARTIFACT, STORE_OWNER
from memories_core.types import MemoryRecord, check_user_id, is_reserved_user_id, new_id

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("user_id", ["__emg_store__", "__x__", "____", "__store__"])
def test_the_librarys_namespace_is_no_user_id(user_id: str) -> None:
    assert is_reserved_user_id(user_id)
    with pytest.raises(InvalidInputError, match="reserved"):
        check_user_id(user_id)
    with pytest.raises(InvalidInputError, match="reserved"):
        Scope(user_id)


@pytest.mark.parametrize("user_id", ["__ann", "ann__", "_ann_", "a__b", "__", "___"])
def test_ids_outside_the_namespace_stay_valid(user_id: str) -> None:
    assert not is_reserved_user_id(user_id)
    assert check_user_id(user_id) == user_id
    assert Scope("ann", session_id="__session__").session_id == "__session__"


def test_nobody_can_save_import_or_delete_as_the_emg_store_owner(tmp_path: Path) -> None:
    memory = EMGMemory(
        path=tmp_path / "m",
        llm=ScriptedLLM(default="[]"),
        embedder=HashingEmbedder(dimension=64),
        clock=FixedClock(T0),
    )
    try:
        engine = memory.engine
        # The library still keeps store-wide data under its own owner.
        engine.artifacts.put(STORE_OWNER, POLICY_ARTIFACT, {"policy.json": b"{}"})
        with pytest.raises(InvalidInputError, match="reserved"):
            memory.save([Turn("user", "take over")], Scope(STORE_OWNER))
        with pytest.raises(InvalidInputError, match="reserved"):
            memory.delete_user(STORE_OWNER)
        with pytest.raises(InvalidInputError, match="reserved"):
            engine.delete_user(STORE_OWNER)
        with pytest.raises(InvalidInputError, match="reserved"):
            engine.records(STORE_OWNER)
        record = MemoryRecord(new_id(), STORE_OWNER, "note", "planted", T0)
        with pytest.raises(InvalidInputError, match="reserved"):
            engine.add_records([record])
        assert engine.artifacts.get(STORE_OWNER, POLICY_ARTIFACT) is not None
        assert engine.users() == []
    finally:
        memory.close()


def test_an_integer_beyond_64_bits_is_refused_at_save_and_search_keeps_working(
    tmp_path: Path,
) -> None:
    # On disk: the embedded Chroma index, which refuses such integers.
    memory = HistoryMemory(
        path=tmp_path / "m", embedder=HashingEmbedder(dimension=64), clock=FixedClock(T0)
    )
    memory.save([Turn("user", "bob likes sailing")], Scope("bob"))
    for value in (2**70, -(2**63) - 1, 2**63):
        with pytest.raises(InvalidInputError, match="64-bit"):
            memory.save([Turn("user", "ann likes kayaking", metadata={"n": value})], Scope("ann"))
        with pytest.raises(InvalidInputError, match="64-bit"):
            Turn("user", "nested", metadata={"deep": {"list": [value]}})
    assert memory.engine.records("ann") == []
    edge = Turn("user", "ann likes kayaking", metadata={"n": 2**63 - 1, "m": -(2**63)})
    memory.save([edge], Scope("ann"))
    # A record written by a mechanism (not through save) with such a value is still indexed:
    # the vector index gets the scalars it can hold, the record keeps its metadata.
    engine = memory.engine
    big = MemoryRecord(new_id(), "ann", "note", "ann rows a canoe", T0, metadata={"n": 2**70})
    engine.add_records([big])
    assert engine.store.index_states("ann")[big.id] == "indexed"
    assert engine.get("ann", [big.id])[0].metadata["n"] == 2**70
    assert big.id in [s.record.id for s in engine.search("canoe", "ann", k=3)]
    assert "sailing" in memory.recall("sailing", Scope("bob")).context
    memory.close()


def test_a_missing_user_is_still_a_missing_user_error() -> None:
    with pytest.raises(MissingUserError):
        check_user_id("  ")


def test_no_module_of_the_package_can_unpickle() -> None:
    """Artifacts, vectors and memory files are read as JSON, safetensors or plain arrays."""
    root = Path(memories_core.__file__).parent
    risky = re.compile(
        r"pickle\.loads?\(|torch\.load\(|weights_only\s*=\s*False|allow_pickle\s*=\s*True"
        r"|joblib\.load|shelve\.|marshal\.loads?"
    )
    found = [
        f"{path.relative_to(root)}:{number}"
        for path in sorted(root.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if risky.search(line)
    ]
    assert found == []


def test_a_memory_engine_refuses_reserved_ids_everywhere_a_user_is_named() -> None:
    with MemoryEngine(embedder=HashingEmbedder(dimension=32)) as engine:
        for call in (
            lambda: engine.history("__emg_store__"),
            lambda: engine.pending("__emg_store__"),
            lambda: engine.search("x", "__emg_store__", k=3),
        ):
            with pytest.raises(InvalidInputError, match="reserved"):
                call()
