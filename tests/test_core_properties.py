"""Properties that must hold for the whole core (issue: Foundation, "Must hold")."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from datetime import timezone
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        **kwargs,
    )


def test_core_imports_no_framework_and_loads_heavy_modules_lazily() -> None:
    result = run_python(
        """
        import sys
        import memories_core
        from memories_core import HistoryMemory, SummaryMemory, Scope, Turn
        import memories_core.backends, memories_core.embedders, memories_core.llms
        import memories_core.parsing, memories_core.retrieval, memories_core.mechanisms
        heavy = [m for m in ("chromadb", "sentence_transformers", "torch") if m in sys.modules]
        print("heavy:", heavy)
        from memories_core.embedders import HashingEmbedder
        memory = HistoryMemory(embedder=HashingEmbedder())
        memory.save([Turn("user", "hello world")], Scope("u"))
        assert memory.recall("hello", Scope("u")).records
        frameworks = sorted({m.split(".")[0] for m in sys.modules
                             if m.split(".")[0] in ("langchain", "langchain_core", "langgraph",
                                                    "llama_index", "langchain_classic")})
        print("frameworks:", frameworks)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "heavy: []" in result.stdout
    assert "frameworks: []" in result.stdout


users = st.sampled_from(["ann", "bob", "cy", "dee"])
words = st.sampled_from(["cat", "dog", "tea", "jazz", "paris", "chess", "rain", "bread"])
action = st.one_of(
    st.tuples(st.just("save"), users, st.lists(words, min_size=1, max_size=4)),
    st.tuples(st.just("recall"), users, st.lists(words, min_size=1, max_size=3)),
    st.tuples(st.just("delete"), users, st.just([])),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(action, min_size=1, max_size=30))
def test_no_user_ever_sees_another_users_memories(
    actions: list[tuple[str, str, list[str]]],
) -> None:
    memory = HistoryMemory(embedder=HashingEmbedder(dimension=64))
    saved: dict[str, set[str]] = {}
    for kind, user, ws in actions:
        scope = Scope(user)
        if kind == "save":
            text = f"{user} says " + " ".join(ws)
            memory.save([Turn("user", text)], scope)
            saved.setdefault(user, set()).add(f"user: {text}")
        elif kind == "recall":
            recall = memory.recall(" ".join(ws), scope, k=50)
            for hit in recall.records:
                assert hit.record.user_id == user
                assert hit.record.text in saved.get(user, set())
            assert f"{user} says" in recall.context or not recall.records
        else:
            memory.delete_user(user)
            saved.pop(user, None)
            assert memory.store.list(user_id=user) == []
            assert memory.index.count(user) == 0
            assert user not in memory.store.users()


CRASHING_WRITER = """
import sys
from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
memory = HistoryMemory(path=sys.argv[1], embedder=HashingEmbedder())
i = 0
while True:
    memory.save([Turn("user", f"numbered fact {i}")], Scope("u"))
    print(i, flush=True)
    i += 1
"""


def test_a_crash_mid_save_loses_at_most_the_turn_being_saved(tmp_path: Path) -> None:
    path = tmp_path / "mem"
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASHING_WRITER, str(path)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.stdout is not None
    last = -1
    for line in proc.stdout:
        last = int(line)
        if last >= 40:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    with HistoryMemory(path=path, embedder=HashingEmbedder()) as memory:
        numbers = sorted(int(t.content.rsplit(" ", 1)[1]) for t in memory.turns(Scope("u")))
        # Every acknowledged save is there; at most the one in flight is extra.
        assert numbers[: last + 1] == list(range(last + 1))
        assert len(numbers) in (last + 1, last + 2)
        assert numbers == list(range(len(numbers)))
        # The vector index heals: the newest turn is findable.
        assert (
            f"numbered fact {numbers[-1]}"
            in memory.recall(f"numbered fact {numbers[-1]}", Scope("u"), k=1).context
        )


def test_index_failure_during_save_keeps_the_turn_and_heals() -> None:
    memory = HistoryMemory(embedder=HashingEmbedder())
    original = memory.index.add
    calls = {"n": 0}

    def failing_add(*args: object, **kwargs: object) -> None:
        calls["n"] += 1
        raise RuntimeError("index is down")

    memory.index.add = failing_add  # type: ignore[method-assign]
    memory.save([Turn("user", "the wifi password is on the fridge")], Scope("u"))
    assert calls["n"] == 1
    assert memory.usage.failures["index"] == 1
    assert [t.content for t in memory.turns(Scope("u"))] == ["the wifi password is on the fridge"]
    memory.index.add = original  # type: ignore[method-assign]
    assert "fridge" in memory.recall("wifi password", Scope("u")).context


@given(
    strength=st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
    count=st.integers(min_value=0, max_value=10**6),
    recalled=st.none() | st.datetimes(timezones=st.just(timezone.utc)),
    tier=st.none() | st.sampled_from(["stm", "ltm"]),
    archived=st.booleans(),
    attrs=st.dictionaries(st.sampled_from(["a", "b"]), st.integers()),
)
def test_record_state_json_round_trips(
    strength: float, count: int, recalled: object, tier: str | None, archived: bool, attrs: dict
) -> None:
    from memories_core.types import RecordState

    state = RecordState(
        strength=strength,
        recall_count=count,
        last_recalled_at=recalled,  # type: ignore[arg-type]
        tier=tier,
        archived=archived,
        attrs=attrs,
    )
    assert RecordState.from_json(state.to_json()) == state
