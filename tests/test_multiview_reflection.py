from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from memories_core import ConfigurationError, HistoryMemory, Scope, Turn
from memories_core.clock import FixedClock
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.multiview import MultiViewMemory
from memories_core.mechanisms.reflection import SelfReflectiveMemory, SelfReflectiveRetrieval
from memories_core.prompts.reflection import build_reflection_messages, parse_reflection
from memories_core.prompts.rule_following import rule_following_reply

S = Scope("vi", session_id="s1")


def test_multiview_renders_labelled_sections_with_per_view_k() -> None:
    llm = ScriptedLLM(default=rule_following_reply)
    memory = MultiViewMemory.from_defaults(
        llm=llm, embedder=HashingEmbedder(), views=("conditional", "summary", "history")
    )
    assert memory.k == {"conditional": 3, "summary": 1, "history": 3}
    memory.save([Turn("user", "I keep two cats, Tom and Ada"), Turn("assistant", "Lovely")], S)
    memory.save([Turn("user", "Cats need their vaccines in May"), Turn("assistant", "Ok")], S)
    memory.views["summary"].end_session(S)  # type: ignore[attr-defined]
    recall = memory.recall("my cats", Scope("vi"))
    sections = recall.context.split("\n\n")
    assert sections[0].startswith("## Conditional memory (context and knowledge)\n")
    assert sections[1].startswith("## Summary memory (earlier sessions)\n")
    assert sections[2].startswith("## History memory (earlier utterances)\n")
    kinds = [h.record.kind for h in recall.records]
    assert kinds.count("summary") == 1 and kinds.count("conditional") == 2
    assert kinds.count("turn") == 3


def test_multiview_rejects_bad_configuration() -> None:
    with pytest.raises(ConfigurationError):
        MultiViewMemory({})
    history = HistoryMemory(embedder=HashingEmbedder())
    with pytest.raises(ConfigurationError):
        MultiViewMemory({"history": history}, k={"summary": 1})


def test_reflection_prompt_snapshot_and_parser() -> None:
    messages = build_reflection_messages("my cat's name?", ["user: my cat is Tom"])
    assert messages[1].content == (
        "<candidate_memory>\n- user: my cat is Tom\n</candidate_memory>\n\n"
        "<user_input>\nmy cat's name?\n</user_input>"
    )
    assert parse_reflection("<Memory>: my cat is Tom", "q").memory == "my cat is Tom"
    verdict = parse_reflection("Not enough.\n<query>: vet, vaccine , May.", "q")
    assert verdict.keywords == ("vet", "vaccine", "May")
    assert not verdict.sufficient


def seeded_history() -> HistoryMemory:
    memory = HistoryMemory(embedder=HashingEmbedder())
    memory.save(
        [
            Turn("user", "My cat Tom needs a vaccine appointment"),
            Turn("user", "The vet clinic on Elm Street opens at 8"),
            Turn("user", "I bought a new bicycle"),
        ],
        S,
    )
    return memory


def llm_again() -> ScriptedLLM:
    return ScriptedLLM(["<Memory>: My cat Tom needs a vaccine appointment"])


def test_sufficient_candidates_are_selected_in_one_call() -> None:
    llm = ScriptedLLM(["<Memory>: My cat Tom needs a vaccine appointment"])
    memory = SelfReflectiveMemory(seeded_history(), llm)
    recall = memory.recall("what does Tom need?", S, k=3)
    assert [h.record.text for h in recall.records] == [
        "user: My cat Tom needs a vaccine appointment"
    ]
    # The reader gets the selected record as the base renders it, not the model's copy.
    assert recall.context.endswith("] user: My cat Tom needs a vaccine appointment")
    result = SelfReflectiveMemory(seeded_history(), llm_again()).reflect("what does Tom need?", S)
    assert (result.rounds, result.llm_calls) == (1, 1)


def test_the_model_sees_dated_candidates_and_the_reader_keeps_the_date() -> None:
    # A copy without the date (as the local model writes them) still selects the record,
    # and the reader's context keeps the date the record was said on.
    clock = FixedClock(datetime(2023, 5, 8, 13, 56, tzinfo=UTC))
    base = HistoryMemory(embedder=HashingEmbedder(), clock=clock)
    base.save([Turn("user", "I went to the LGBTQ support group yesterday")], S)
    clock.set(datetime(2023, 7, 21, tzinfo=UTC))
    base.save([Turn("user", "I bought a new bicycle")], S)
    llm = ScriptedLLM(["<Memory>: I went to the LGBTQ support group yesterday"])
    memory = SelfReflectiveMemory(base, llm)
    recall = memory.recall("When did I go to the support group?", S, k=2)
    shown = "\n".join(m.content for m in llm.calls[0])
    assert "8 May 2023" in shown and "21 July 2023" in shown
    assert [h.record.text for h in recall.records] == [
        "user: I went to the LGBTQ support group yesterday"
    ]
    assert "8 May 2023" in recall.context and "bicycle" not in recall.context
    result = SelfReflectiveMemory(
        base, ScriptedLLM(["<Memory>: I went to the LGBTQ support group yesterday"])
    ).reflect("When did I go to the support group?", S, k=2)
    assert result.memory == "I went to the LGBTQ support group yesterday"


def test_insufficient_candidates_extend_the_query_once() -> None:
    llm = ScriptedLLM(["<Query>: vet clinic, opening hours"])
    memory = SelfReflectiveMemory(seeded_history(), llm)
    result = memory.reflect("when can I take Tom", S, k=1)
    assert result.queries == [
        "when can I take Tom",
        "when can I take Tom vet clinic opening hours",
    ]
    assert result.llm_calls == 1
    assert result.keywords == ("vet clinic", "opening hours")
    assert any("Elm Street" in h.record.text for h in result.items)


def test_garbled_reflection_falls_back_to_the_candidates() -> None:
    llm = ScriptedLLM(["???", "no idea"])
    memory = SelfReflectiveMemory(seeded_history(), llm)
    result = memory.reflect("bicycle", S, k=1)
    assert any("bicycle" in h.record.text for h in result.items)
    assert result.failed
    assert memory.reflection.failures.snapshot().failures == 1


def test_more_rounds_are_bounded() -> None:
    llm = ScriptedLLM(default="<Query>: more")
    searched: list[str] = []

    def search(q: str) -> list[str]:
        searched.append(q)
        return ["x"]

    result = SelfReflectiveRetrieval(llm, max_rounds=3).run("start", search, str)
    assert llm.usage.calls == 3 and len(searched) == 4
    assert result.rounds == 4


async def test_async_reflection_passes_scope_through() -> None:
    llm = ScriptedLLM(["<Memory>: The vet clinic on Elm Street opens at 8"])
    memory = SelfReflectiveMemory(seeded_history(), llm)
    recall = await memory.arecall("vet opening", S)
    assert all(h.record.user_id == "vi" for h in recall.records)
    other = await SelfReflectiveMemory(seeded_history(), ScriptedLLM(default="<Query>: x")).arecall(
        "vet", Scope("nobody")
    )
    assert other.records == ()


def test_multiview_reports_its_views_pending_work_and_folder(tmp_path: Path) -> None:
    """Pending derivations of every view reach status()/pending() and the adapters' status."""
    from langchain_memories import MemoryRetriever
    from llamaindex_memories import MemoryBlock

    down = ScriptedLLM()  # no reply: every model call fails, the jobs wait for a retry
    memory = MultiViewMemory.from_defaults(
        llm=down, embedder=HashingEmbedder(), views=("conditional", "summary"), path=tmp_path
    )
    try:
        assert memory.path == tmp_path
        memory.save([Turn("user", "I keep two cats, Tom and Ada"), Turn("assistant", "Ok")], S)
        memory.end_session(S)
        jobs = memory.pending("vi")
        assert {job.mechanism for job in jobs} == {"conditional", "summary"}
        status = memory.status("vi")
        assert status.pending + status.failed == len(jobs) > 0
        assert {mechanism for mechanism, _ in status.jobs} == {"conditional", "summary"}
        assert memory.status("someone-else").idle  # another user's work is not shown
        for adapter in (
            MemoryRetriever(memory=memory, user_id="vi"),
            MemoryBlock(memory=memory, user_id="vi"),
        ):
            shown = adapter.status()
            assert shown is not None and shown.jobs == status.jobs
        for view in memory.views.values():
            view.llm = ScriptedLLM(default=rule_following_reply)  # type: ignore[attr-defined]
        assert memory.retry_pending("vi") == 0
        assert memory.pending("vi") == [] and memory.status("vi").idle
    finally:
        memory.close()
    assert (
        MultiViewMemory(
            {
                "a": HistoryMemory(embedder=HashingEmbedder()),
                "b": HistoryMemory(embedder=HashingEmbedder()),
            }
        ).path
        is None
    )
