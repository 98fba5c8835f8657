"""Answer-quality harness: LoCoMo scoring, sampling, ingest through the public path, resume."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from benchmark_scripts import load_script
from locomo_fixture import miso_bench, offline_bench, tiny_conversation, write_dataset
from memories_core import FixedClock, HistoryMemory, Scope, SummaryMemory
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.evaluation.harness import (
    IngestStats,
    QAItem,
    answer_question,
    dated_sessions,
    evidence_context,
    full_context,
    ingest_conversation,
    percentile,
    question_time,
    read_jsonl,
    rewind_state,
    score_answer,
    select_questions,
    write_json_atomic,
)
from memories_core.evaluation.locomo import LocomoConversation, LocomoQA
from memories_core.evaluation.qa import (
    NOT_MENTIONED,
    adversarial_options,
    bleu1,
    is_abstention,
    judge_messages,
    locomo_f1,
    multi_answer_f1,
    normalise_answer,
    parse_judge,
    reader_messages,
    resolve_option,
    token_f1,
)
from memories_core.llms.scripted import ScriptedLLM


# --------------------------------------------------------------------------- scoring
def test_normalisation_drops_case_punctuation_articles_and_commas() -> None:
    assert normalise_answer("The Eiffel Tower, and a café!") == "eiffel tower café"


def test_token_f1_stems_and_ignores_articles() -> None:
    assert token_f1("She went hiking", "hikes") == pytest.approx(2 * (1 / 3) / (1 / 3 + 1))
    assert token_f1("the painting", "Painting") == 1.0
    assert token_f1("blue", "red") == 0.0
    assert token_f1("", "red") == 0.0


def test_multi_hop_scores_each_gold_item_by_its_best_prediction() -> None:
    # gold items: "pottery", "camping"; predictions: "camping", "painting"
    assert multi_answer_f1("camping, painting", "pottery, camping") == 0.5
    assert locomo_f1("camping, painting", "pottery, camping", 1) == 0.5


def test_open_domain_keeps_the_first_alternative() -> None:
    assert locomo_f1("Likely yes", "Likely yes; because she said so", 3) == 1.0
    assert locomo_f1("because she said so", "Likely yes; because she said so", 3) == 0.0


def test_adversarial_rewards_abstaining_only() -> None:
    assert locomo_f1(NOT_MENTIONED, "a red car", 5) == 1.0
    assert locomo_f1("No information available.", "a red car", 5) == 1.0
    assert locomo_f1("a red car", "a red car", 5) == 0.0
    assert is_abstention("The conversation does not mention it")


def test_unknown_category_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        locomo_f1("x", "x", 7)


def test_bleu1_clips_counts_and_penalises_brevity() -> None:
    assert bleu1("red red red", "red car") == pytest.approx(1 / 3)
    short = bleu1("red", "red car parked outside")
    assert 0 < short < 1
    assert bleu1("red car parked outside", "red car parked outside") == 1.0
    assert bleu1("", "red") == 0.0


def test_adversarial_options_are_fixed_per_question_and_seed() -> None:
    first = adversarial_options("conv:1", "a red car", seed=3)
    assert sorted(first) == sorted([NOT_MENTIONED, "a red car"])
    assert adversarial_options("conv:1", "a red car", seed=3) == first
    orders = {tuple(adversarial_options(f"conv:{i}", "x")) for i in range(40)}
    assert len(orders) == 2  # both orders occur: the option is not always last


def test_judge_labels() -> None:
    assert parse_judge("CORRECT") is True
    assert parse_judge("The answer is WRONG.") is False
    assert parse_judge("incorrect") is False
    assert parse_judge("maybe") is None
    messages = judge_messages("When?", "7 May 2023", "May 7th")
    assert "7 May 2023" in messages[-1].content and "May 7th" in messages[-1].content


def test_reader_prompt_carries_memory_date_question_and_options() -> None:
    when = datetime(2023, 5, 9, tzinfo=timezone.utc)
    messages = reader_messages("Where?", "Ann: I live in Lyon", now=when, options=["a", "b"])
    body = messages[-1].content
    assert "Ann: I live in Lyon" in body and "09 May 2023" in body
    assert "(a) a" in body and "(b) b" in body
    assert "(none)" in reader_messages("Where?", "")[-1].content


def test_sessions_are_dated_and_cut() -> None:
    conversation = tiny_conversation()
    dated = dated_sessions(conversation, 2)
    assert list(dated) == [1, 2]
    first, second = dated[1][0][1], dated[1][1][1]
    assert (second - first).total_seconds() == 30
    assert question_time(conversation, 2).date().isoformat() == "2023-05-16"


def test_question_selection_keeps_answerable_questions_and_is_seeded() -> None:
    conversation = tiny_conversation()
    kept = select_questions([conversation], sessions=2)
    assert [item.qa.question for item in kept] == [
        "What is Ann's cat called?",
        "What did Bob paint?",
        "What is Ann's car?",
    ]
    assert len(select_questions([conversation])) == 5  # no session cut: all questions
    one = select_questions([conversation], limit=2, seed=1)
    assert one == select_questions([conversation], limit=2, seed=1)
    assert len(one) == 2
    other = tiny_conversation()
    other = LocomoConversation("conv-u", other.speakers, other.turns, other.qa, other.session_times)
    spread = select_questions([conversation, other], limit=4, seed=0)
    assert sorted(item.conversation for item in spread) == ["conv-t"] * 2 + ["conv-u"] * 2


def test_full_context_keeps_the_most_recent_part_that_fits() -> None:
    conversation = tiny_conversation()
    whole = full_context(conversation, budget_tokens=10_000, count_tokens=len)
    assert "Miso" in whole and "violin" in whole and "08 May 2023" in whole
    cut = full_context(conversation, budget_tokens=120, count_tokens=len)
    assert "violin" in cut and "adopted" not in cut
    assert len(cut) <= 130


def test_evidence_context_is_the_gold_turns_with_dates() -> None:
    conversation = tiny_conversation()
    text = evidence_context(conversation, conversation.qa[1])
    assert "Bob: I painted a sunset last weekend." in text
    assert "15 May 2023" in text and "Miso" not in text


# --------------------------------------------------------------------------- ingest + answer
def test_ingest_saves_exchanges_with_the_session_clock(tmp_path: Path) -> None:
    conversation = tiny_conversation()
    clock = FixedClock(datetime(2024, 1, 1, tzinfo=timezone.utc))
    memory = HistoryMemory(path=tmp_path / "m", embedder=HashingEmbedder(dimension=64), clock=clock)
    ticks: list[int] = []
    stats = ingest_conversation(
        memory, conversation, clock, user_id="conv-t", progress=ticks.append
    )
    assert (stats.turns, stats.saves, stats.sessions) == (8, 4, 3)
    assert sum(ticks) == 8 and len(stats.save_ms) == 4
    assert stats.store_bytes > 0
    turns = memory.engine.records("conv-t", where={"kind": "turn"})
    assert len(turns) == 8
    by_text = {r.text: r for r in turns}
    violin = next(r for text, r in by_text.items() if "violin" in text)
    assert violin.created_at.date().isoformat() == "2023-06-01"
    assert violin.session_id == "session_3"
    roles = {str(r.metadata.get("role")) for r in turns}
    assert roles == {"user", "assistant"}
    # another user sees none of it
    assert not memory.recall("cat", Scope("someone-else")).records
    memory.close()


def test_ingest_counts_finished_jobs_by_run_across_a_resume(tmp_path: Path) -> None:
    conversation = tiny_conversation()
    clock = FixedClock(datetime(2024, 1, 1, tzinfo=timezone.utc))
    # The first session's summary and its repair are garbage; it succeeds on its retry.
    writer = ScriptedLLM(["@@@", "@@@ again"], default="Ann has a cat named Miso.")
    engine = MemoryEngine(path=tmp_path / "m", embedder=HashingEmbedder(dimension=64), clock=clock)
    memory = SummaryMemory(engine=engine, llm=writer)
    first = ingest_conversation(
        memory, conversation, clock, user_id="conv-t", sessions=2, writer=writer
    )
    assert first.finished_after == {"1": 1, "2": 1}
    assert first.failures == {"summary": 1}
    memory.close()
    # A resumed process starts its own counters at zero; the resumed part's are carried.
    engine = MemoryEngine(path=tmp_path / "m", embedder=HashingEmbedder(dimension=64), clock=clock)
    memory = SummaryMemory(engine=engine, llm=writer)
    resumed = IngestStats.from_json(json.loads(json.dumps(first.to_json())))
    stats = ingest_conversation(
        memory, conversation, clock, user_id="conv-t", writer=writer, resume=resumed
    )
    assert stats.sessions == 3
    assert stats.finished_after == {"1": 2, "2": 1}
    assert stats.failures == {}
    memory.close()


@pytest.mark.parametrize(
    ("second_role", "senders"), [("assistant", {"Ann"}), ("message", {"Ann", "Bob"})]
)
def test_emg_reads_the_second_speakers_turns_only_as_received_messages(
    tmp_path: Path, second_role: str, senders: set[str]
) -> None:
    # EMG-RAG skips an assistant's replies; LoCoMo's second speaker is a person whose
    # messages a phone assistant reads (appendix A.1), which the harness can say.
    from memories_core import EMGMemory
    from memories_core.prompts.rule_following import rule_following_reply

    clock = FixedClock(datetime(2024, 1, 1, tzinfo=timezone.utc))
    memory = EMGMemory(
        path=tmp_path / "m",
        embedder=HashingEmbedder(dimension=64),
        clock=clock,
        llm=ScriptedLLM(default=rule_following_reply),
    )
    ingest_conversation(
        memory, tiny_conversation(), clock, user_id="conv-t", second_role=second_role
    )
    turns = memory.engine.records("conv-t", where={"kind": "turn"})
    assert {str(r.metadata.get("role")) for r in turns} == {"user", second_role}
    sources = {
        str(t.metadata.get("speaker"))
        for m in memory.memories("conv-t")
        for t in memory.engine.get("conv-t", list(m.source_ids))
    }
    assert sources == senders
    memory.close()


def test_answer_question_recalls_reads_and_scores(tmp_path: Path) -> None:
    conversation = tiny_conversation()
    clock = FixedClock(datetime(2024, 1, 1, tzinfo=timezone.utc))
    memory = HistoryMemory(path=tmp_path / "m", embedder=HashingEmbedder(dimension=64), clock=clock)
    ingest_conversation(memory, conversation, clock, user_id="conv-t")
    reader = ScriptedLLM.from_rules(
        [(r"(?s)Choose one option", NOT_MENTIONED), (r"cat called", "Miso")], default="dunno"
    )
    judge = ScriptedLLM(["CORRECT"], default="WRONG")

    def recall(question: str) -> tuple[str, int]:
        found = memory.recall(question, Scope("conv-t"), k=3)
        return found.context, len(found.records)

    items = select_questions([conversation], sessions=3)
    first = answer_question(items[0], reader=reader, recall=recall, now=clock.now(), judge=judge)
    assert first.prediction == "Miso" and first.f1 == 1.0 and first.judge is True
    assert first.records == 3 and first.context_chars > 0
    assert "Miso" in reader.calls[0][-1].content  # the recalled turn reached the reader
    adversarial = next(item for item in items if item.qa.category == 5)
    scored = answer_question(adversarial, reader=reader, recall=recall, now=clock.now())
    assert scored.f1 == 1.0 and scored.judge is None
    wrong = answer_question(items[1], reader=reader, recall=recall, now=clock.now(), judge=judge)
    assert wrong.f1 == 0.0 and wrong.judge is False
    memory.close()


def test_stats_and_files_round_trip(tmp_path: Path) -> None:
    stats = IngestStats(turns=3, save_ms=[1.0, 2.0])
    write_json_atomic(tmp_path / "a" / "s.json", stats.to_json())
    back = IngestStats.from_json(json.loads((tmp_path / "a" / "s.json").read_text()))
    assert back == stats
    log = tmp_path / "answers.jsonl"
    log.write_text('{"id": "a"}\n{"id": "b"}\n{"id": "c', encoding="utf-8")  # torn last line
    assert [row["id"] for row in read_jsonl(log)] == ["a", "b"]
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 95) == 5.0


def _dpem_forgetting(path: Path, said: Sequence[str]) -> Any:
    """A DPeM memory at theta 3 whose STM is refreshed every round, one exchange per text."""
    from memories_core import DualProcessMemory, Turn
    from memories_core.prompts.dpem import dpem_reply

    memory = DualProcessMemory(
        path=path,
        llm=ScriptedLLM(default=dpem_reply),
        embedder=HashingEmbedder(),
        theta=3,
        stm_refresh_rounds=1,
    )
    for text in said:
        memory.save([Turn("user", text), Turn("assistant", "Noted.")], Scope("ann"))
        memory.flush("ann")
    return memory


def test_benchmark_runs_resumes_and_prints_the_last_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []

    def reader(messages: object) -> str:
        text = messages[-1].content  # type: ignore[index]
        if "CORRECT or WRONG" in messages[0].content:  # type: ignore[index]
            calls.append("judge")
            return "CORRECT"
        calls.append(text)
        if "Choose one option" in text:
            return NOT_MENTIONED
        return "Miso" if "Miso" in text else "sunset" if "sunset" in text else "dunno"

    bench = offline_bench(monkeypatch, ScriptedLLM([], default=reader))
    data = write_dataset(tmp_path / "locomo.json")
    argv = [
        "--data",
        str(data),
        "--mechanisms",
        "none,gold,full,history",
        "--out",
        str(tmp_path / "out"),
        "--sessions",
        "2",
        "-q",
    ]
    assert bench.main(argv) == 0  # type: ignore[attr-defined]
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("best memory F1 ")
    assert "(history) vs no memory F1 " in out[-1] and "vs full context F1 " in out[-1]
    result = json.loads((tmp_path / "out" / "locomo_qa.json").read_text())
    rows = {row["mechanism"]: row for row in result["rows"]}
    assert rows["none"]["questions"] == 3  # 2 answerable in sessions 1-2, plus the adversarial
    assert rows["gold"]["f1"] > rows["none"]["f1"]
    assert rows["history"]["save_ms_p50"] >= 0 and rows["history"]["store_bytes"] > 0
    assert (tmp_path / "out" / "locomo_qa.png").is_file()
    # paths are written relative to the repository, never as this machine's absolute paths
    assert not [a for a in result["meta"]["command"].split() if a.startswith("/")]
    asked = len(calls)
    # resume: nothing is ingested or answered again
    assert bench.main([*argv, "--resume"]) == 0  # type: ignore[attr-defined]
    assert len(calls) == asked
    again = json.loads((tmp_path / "out" / "locomo_qa.json").read_text())
    assert [r["f1"] for r in again["rows"]] == [r["f1"] for r in result["rows"]]
    assert all(r["judge"] is None for r in again["rows"])
    # a judge added on resume judges the kept answers (not the adversarial one, which is
    # scored by abstention) without answering again, and only once
    assert bench.main([*argv, "--resume", "--judge-model", "judge"]) == 0  # type: ignore[attr-defined]
    assert calls[asked:] == ["judge"] * 2 * 4
    judged = json.loads((tmp_path / "out" / "locomo_qa.json").read_text())
    assert all(r["judge"] is not None for r in judged["rows"])
    assert [r["f1"] for r in judged["rows"]] == [r["f1"] for r in result["rows"]]
    assert bench.main([*argv, "--resume", "--judge-model", "judge"]) == 0  # type: ignore[attr-defined]
    assert len(calls) == asked + 8


def test_a_letter_choice_is_scored_as_its_option() -> None:
    options = ["a red car", NOT_MENTIONED]
    assert resolve_option("(b)", options) == NOT_MENTIONED
    assert resolve_option("b", options) == NOT_MENTIONED
    assert resolve_option("A.", options) == "a red car"
    assert resolve_option("(b) Not mentioned in the conversation", options) == NOT_MENTIONED
    assert resolve_option("a red car", options) == "a red car"
    assert resolve_option("a new bicycle and a dog", options) == "a new bicycle and a dog"
    assert resolve_option("(c)", options) == "(c)"
    item = QAItem("conv:9", "conv", LocomoQA("What car?", "a red car", 5, ()))
    letter = "abcdefgh"[adversarial_options("conv:9", "a red car").index(NOT_MENTIONED)]
    assert score_answer(item, f"({letter})") == (1.0, 0.0)
    single = QAItem("conv:1", "conv", LocomoQA("Pet?", "Miso", 4, ()))
    assert score_answer(single, "Miso") == (1.0, 1.0)


def test_llm_written_rows_are_compared_with_raw_turns_per_category_and_cost() -> None:
    bench = load_script("locomo_qa")

    def row(name: str, f1: float, temporal: float, written: float, read: float) -> dict:
        return {
            "mechanism": name,
            "f1": f1,
            "questions": 10,
            "turns": 20,
            "write_tokens_per_turn": written,
            "reader_prompt_tokens": read,
            "by_category": {"temporal": {"n": 4, "f1": temporal}},
        }

    rows = [
        row("none", 0.1, 0.0, 0.0, 100.0),
        row("history", 0.3, 0.4, 0.0, 200.0),
        row("summary", 0.25, 0.5, 50.0, 300.0),  # 300 + 50 * 20 / 10 = 400 tokens/q
    ]
    text = bench.versus_raw_turns(rows)
    summary = next(line for line in text.splitlines() if line.startswith("| summary"))
    cells = [cell.strip() for cell in summary.strip("|").split("|")]
    assert cells[1] == "-0.050"  # loses overall
    assert "+0.100" in cells  # wins on temporal questions
    assert cells[-1] == "2.0x"
    assert bench.versus_raw_turns(rows[:2]) == ""


@pytest.mark.parametrize(("budget", "fallbacks"), [("0.2", 1), ("0", 0)])
def test_recall_budget_decides_whether_a_slow_reflection_is_measured_or_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: str, fallbacks: int
) -> None:
    reflections: list[str] = []

    def model(messages: object) -> str:
        system = messages[0].content  # type: ignore[index]
        if "candidate memories contain enough information" in system:
            reflections.append(system)
            time.sleep(1.0)  # slower than a 0.2 s recall budget
            return "<Memory>: Ann's cat is Miso."
        text = messages[-1].content  # type: ignore[index]
        return "Miso" if "Miso" in text else "dunno"

    bench = offline_bench(monkeypatch, ScriptedLLM([], default=model))
    data = write_dataset(tmp_path / "locomo.json")
    argv = ["--data", str(data), "--mechanisms", "reflective", "--out", str(tmp_path / "out")]
    argv += ["--sessions", "1", "--recall-budget", budget, "-q"]
    assert bench.main(argv) == 0  # type: ignore[attr-defined]
    row = json.loads((tmp_path / "out" / "locomo_qa.json").read_text())["rows"][0]
    assert reflections, "the reflection step ran"
    assert row["recall_fallbacks"] == fallbacks * row["questions"]
    answers = (tmp_path / "out" / "state" / "reflective").glob("*/answers.jsonl")
    logged = [json.loads(line) for path in answers for line in path.read_text().splitlines()]
    assert [a["recall_fallbacks"] for a in logged] == [fallbacks] * row["questions"]


def test_a_judge_that_is_the_reader_is_loaded_once_and_named_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = load_script("locomo_qa")
    loads: list[tuple[object, ...]] = []

    def reader(messages: object) -> str:
        if "CORRECT or WRONG" in messages[0].content:  # type: ignore[index]
            return "CORRECT"
        return "Miso" if "Miso" in messages[-1].content else "dunno"  # type: ignore[index]

    llm = ScriptedLLM([], default=reader)

    class OtherJudge(ScriptedLLM):
        @property
        def name(self) -> str:
            return "other-judge"

    other = OtherJudge([], default="CORRECT")

    def make_llm(*args: object, **kwargs: object) -> ScriptedLLM:
        loads.append(args)
        return other if args[1] == "other-judge" else llm

    monkeypatch.setattr(bench, "make_llm", make_llm)
    data = write_dataset(tmp_path / "locomo.json")
    out = tmp_path / "out"
    argv = ["--data", str(data), "--mechanisms", "gold", "--out", str(out), "-q"]
    assert bench.main([*argv, "--judge-llm", "local"]) == 0
    assert len(loads) == 1  # the judge is the reader's instance, not a second model
    result = json.loads((out / "locomo_qa.json").read_text())
    assert result["meta"]["judge_is_reader"] is True
    assert result["rows"][0]["judge"] is not None
    assert "(the reader itself)" in (out / "locomo_qa.md").read_text()
    # another judge model is loaded on its own, and the table does not call it the reader
    assert bench.main([*argv, "--judge-model", "other-judge"]) == 0
    assert len(loads) == 3
    assert "(the reader itself)" not in (out / "locomo_qa.md").read_text()


def test_kept_answers_rebuild_the_table_without_the_memory_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[str] = []
    bench, data = miso_bench(monkeypatch, tmp_path, calls)
    out = tmp_path / "out"
    argv = ["--data", str(data), "--mechanisms", "history", "--out", str(out), "--sessions", "2"]
    assert bench.main([*argv, "-q"]) == 0  # type: ignore[attr-defined]
    first = json.loads((out / "locomo_qa.json").read_text())["rows"][0]
    asked = len(calls)
    # on another machine only answers.jsonl and ingest.json arrive: the row is rebuilt as is
    for memory in (out / "state" / "history").glob("*/memory"):
        shutil.rmtree(memory)
    assert bench.main([*argv, "--resume", "-q"]) == 0  # type: ignore[attr-defined]
    assert len(calls) == asked
    again = json.loads((out / "locomo_qa.json").read_text())["rows"][0]
    assert again["f1"] == first["f1"] and again["store_bytes"] == first["store_bytes"]
    # the row's cost is what its kept ingest and answers took, not this invocation's wall
    assert again["answer_s"] == first["answer_s"] > 0 and again["ingest_s"] == first["ingest_s"]
    assert "ingests and answers, kept ones included" in (out / "locomo_qa.md").read_text()
    assert not list((out / "state" / "history").glob("*/memory"))
    # with an answer missing, the memory it needs is ingested again (not read as empty)
    answers = next((out / "state" / "history").glob("*/answers.jsonl"))
    kept = answers.read_text().splitlines()
    answers.write_text("\n".join(kept[:-1]) + "\n")
    assert bench.main([*argv, "--resume", "-q"]) == 0  # type: ignore[attr-defined]
    assert len(calls) == asked + 1
    assert json.loads((out / "locomo_qa.json").read_text())["rows"][0]["f1"] == first["f1"]
    capsys.readouterr()


def test_a_copied_ingest_is_answered_again_without_ingesting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before/after scripts answer a kept ingest again: same records, fresh answers."""
    calls: list[str] = []
    bench, data = miso_bench(monkeypatch, tmp_path, calls)
    source, copy = tmp_path / "source", tmp_path / "copy"
    argv = ["--data", str(data), "--mechanisms", "history", "--sessions", "2", "-q"]
    assert bench.main([*argv, "--out", str(source)]) == 0  # type: ignore[attr-defined]
    first = json.loads((source / "locomo_qa.json").read_text())["rows"][0]
    asked = len(calls)
    folders = bench.copy_ingest(source, copy, "history")  # type: ignore[attr-defined]
    assert [f.name for f in folders] == [p.name for p in (source / "state" / "history").iterdir()]
    assert all((f / "memory").is_dir() and not (f / "answers.jsonl").exists() for f in folders)
    saves = []
    monkeypatch.setattr(HistoryMemory, "save", lambda *a, **k: saves.append(a))
    assert bench.main([*argv, "--resume", "--out", str(copy)]) == 0  # type: ignore[attr-defined]
    again = json.loads((copy / "locomo_qa.json").read_text())["rows"][0]
    assert saves == [] and len(calls) == 2 * asked  # answered again, nothing ingested
    assert again["f1"] == first["f1"] and again["ingest_s"] == first["ingest_s"]
    # copied again (a resumed before/after): the copy and its answers are kept
    assert bench.copy_ingest(source, copy, "history") == folders  # type: ignore[attr-defined]
    assert all((f / "answers.jsonl").is_file() for f in folders)
    with pytest.raises(SystemExit, match="no memory folder or memory file"):
        shutil.rmtree(folders[0] / "memory")
        bench.copy_ingest(copy, tmp_path / "third", "history")  # type: ignore[attr-defined]
    # the source's memory folders gone (another machine): its memory files are restored
    for kept in (source / "state" / "history").iterdir():
        shutil.rmtree(kept / "memory")
    restored = tmp_path / "restored"
    with pytest.raises(SystemExit, match="needs the embedder"):
        bench.copy_ingest(source, restored, "history")  # type: ignore[attr-defined]
    embedder = HashingEmbedder(dimension=64)
    folders = bench.copy_ingest(source, restored, "history", embedder=embedder)  # type: ignore[attr-defined]
    assert folders and all((f / "memory").is_dir() for f in folders)
    assert bench.main([*argv, "--resume", "--out", str(restored)]) == 0  # type: ignore[attr-defined]
    third = json.loads((restored / "locomo_qa.json").read_text())["rows"][0]
    assert saves == [] and len(calls) == 3 * asked  # answered from the restored records
    assert third["f1"] == first["f1"] and third["ingest_s"] == first["ingest_s"]
    capsys.readouterr()


def test_memochat_variants_answer_the_kept_ingest_with_the_earlier_and_todays_recall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """variant_qa re-answers a kept MemoChat ingest: fused recall fills k, choice reproduces."""
    from memories_core.prompts.memochat import rule_following_reply

    bench, data = miso_bench(monkeypatch, tmp_path, [], first=rule_following_reply)  # type: ignore[arg-type]
    variant = load_script("variant_qa")
    source, out = tmp_path / "source", tmp_path / "fused"
    argv = ["--data", str(data), "--sessions", "2", "--recall-budget", "0", "-q"]
    assert bench.main([*argv, "--mechanisms", "memochat", "--out", str(source)]) == 0  # type: ignore[attr-defined]
    after = json.loads((source / "locomo_qa.json").read_text())["rows"][0]
    assert (
        variant.main(
            ["--variant", "memochat-fused", "--source", str(source), "--out", str(out), "--", *argv]
        )
        == 0
    )
    before = json.loads((out / "locomo_qa.json").read_text())["rows"][0]
    assert before["mechanism"] == after["mechanism"] == "memochat"
    assert before["ingest_s"] == after["ingest_s"]  # the same ingest, not written again
    # the stand-in model chooses few memos (NOTO when no word is shared); fused recall adds
    # dense and lexical hits up to k, so the reader sees more context per question
    assert before["context_chars"] > after["context_chars"]
    # the same copies answered with today's recall give the source run's row again
    choice = tmp_path / "choice"
    args = ["--variant", "memochat-choice", "--source", str(source), "--out", str(choice)]
    assert variant.main([*args, "--", *argv]) == 0
    again = json.loads((choice / "locomo_qa.json").read_text())["rows"][0]
    assert again["ingest_s"] == after["ingest_s"]
    assert (again["f1"], again["context_chars"]) == (after["f1"], after["context_chars"])
    capsys.readouterr()


def test_conditional_no_keys_variant_deletes_only_the_notes_keys(tmp_path: Path) -> None:
    """The variant's preparation leaves the rendered records and the turns' own keys."""
    from memories_core import ConditionalMemory, Turn

    notes = ["Ann is allergic to peanuts.", "Ann adopted a cat named Miso."]
    replies = []
    for note in notes:
        replies += ["<Decision>: yes", f"<Context>: NaN <Summary>: a chat <Note>: {note}"]
    memory = ConditionalMemory(
        path=tmp_path / "memory", llm=ScriptedLLM(replies), embedder=HashingEmbedder()
    )
    for note in notes:
        memory.save([Turn("user", note)], Scope("ann", "s1"))
    memory.flush("ann")
    records = {r.id for r in memory.records(Scope("ann"))}
    memory.close()
    variant = load_script("variant_qa")
    assert variant.drop_note_keys(tmp_path / "memory", "ann", HashingEmbedder()) == (2, 2)
    engine = MemoryEngine(path=tmp_path / "memory", embedder=HashingEmbedder())
    try:
        left = engine.records("ann", where={"kind": "search_key"})
        assert len(left) == 2 and not [k for k in left if k.metadata["key_for"] in records]
        assert {r.id for r in engine.records("ann", where={"kind": "conditional"})} == records
    finally:
        engine.close()
    assert variant.drop_note_keys(tmp_path / "memory", "ann", HashingEmbedder()) == (2, 0)


@pytest.mark.parametrize("variant_name", ["dpem-keep-all", "dpem-all-ltm"])
def test_dpem_variants_put_back_what_stm_refreshes_dropped(
    tmp_path: Path, variant_name: str
) -> None:
    from memories_core import DualProcessMemory, Turn
    from memories_core.prompts.dpem import dpem_reply

    said = [
        "I have type 2 diabetes.",
        "My cat Miso learned to open doors.",
        "I started learning the violin.",
        "I work night shifts as a nurse in Lyon.",
    ]
    memory = DualProcessMemory(
        path=tmp_path / "memory",
        llm=ScriptedLLM(default=dpem_reply),
        embedder=HashingEmbedder(),
        theta=3,
        stm_refresh_rounds=1,
    )
    seen: set[str] = set()
    for text in said:
        memory.save([Turn("user", text), Turn("assistant", "Noted.")], Scope("ann"))
        memory.flush("ann")
        seen |= {item.text for item in memory.stm("ann")}
    kept = {item.text for item in memory.stm("ann")}
    assert kept < seen  # the refreshes dropped the earlier rounds' items
    memory.close()
    variant = load_script("variant_qa")
    prepare = variant.VARIANTS[variant_name].prepare
    assert prepare(tmp_path / "memory", "ann", HashingEmbedder()) == (len(kept), len(seen - kept))
    memory = DualProcessMemory(
        path=tmp_path / "memory", llm=ScriptedLLM(default=dpem_reply), embedder=HashingEmbedder()
    )
    try:
        stm = {item.text for item in memory.stm("ann")}
        ltm = {item.text for item in memory.ltm("ann")}
        if variant_name == "dpem-keep-all":
            assert stm == seen and not ltm
        else:
            assert ltm == seen and not stm
        assert "violin" in memory.recall("learning the violin", Scope("ann"), k=3).context
        assert not memory.recall("what instrument", Scope("bob"), k=3).records
    finally:
        memory.close()


def test_dpem_replay_reproduces_the_recorded_memory_and_runs_other_settings(
    tmp_path: Path,
) -> None:
    import shutil as copier

    from memories_core import DualProcessMemory

    said = ["I have type 2 diabetes.", "My cat Miso opens doors.", "I play the violin."]
    memory = _dpem_forgetting(tmp_path / "memory", said * 2)  # each recurs 3 rounds later
    recorded = sorted(item.text for item in memory.stm("ann"))
    assert not memory.ltm("ann")
    memory.close()
    copier.copytree(tmp_path / "memory", tmp_path / "other")
    variant = load_script("variant_qa")
    same = {"theta": 3, "stm_refresh_rounds": 1}
    assert variant.replay_dpem(tmp_path / "memory", "ann", HashingEmbedder(), settings=same)[1]
    wide = {"stm_refresh_rounds": 100, "theta": 2}
    variant.replay_dpem(tmp_path / "other", "ann", HashingEmbedder(), settings=wide)
    with pytest.raises(SystemExit):
        variant.dpem_settings("theta=one")
    assert variant.dpem_settings("theta=2, stm_capacity=8") == {"theta": 2, "stm_capacity": 8}
    again = DualProcessMemory(path=tmp_path / "memory", llm=None, embedder=HashingEmbedder())
    other = DualProcessMemory(path=tmp_path / "other", llm=None, embedder=HashingEmbedder())
    try:
        assert sorted(item.text for item in again.stm("ann")) == recorded
        # Without the refresh every item is still there when it recurs, and is promoted.
        assert {item.count for item in other.ltm("ann")} == {2}
        assert len(other.ltm("ann")) == len(said) and not other.stm("ann")
    finally:
        again.close()
        other.close()


def test_dpem_stm_cut_variant_replays_first_when_given_settings(tmp_path: Path) -> None:
    """``--dpem`` with the STM cut: the copy is replayed, then recalled through the cut."""

    said = ["I have type 2 diabetes.", "My cat Miso opens doors.", "I play the violin."]
    memory = _dpem_forgetting(tmp_path / "memory", said)
    assert len(memory.stm("ann")) < len(said)  # the refreshes dropped the earlier items
    memory.close()
    variant = load_script("variant_qa")
    assert variant.resolve_variant("dpem-stm-cut").prepare is None  # no replay unless asked
    assert variant.resolve_variant("dpem-replay").prepare is not None
    with pytest.raises(SystemExit, match="--dpem applies to"):
        variant.resolve_variant("dpem-keep-all", "theta=3")
    with pytest.raises(SystemExit, match="--dpem"):
        variant.resolve_variant("dpem-stm-cut", "theta=three")
    cut = variant.resolve_variant("dpem-stm-cut", "theta=3,stm_refresh_rounds=100")
    assert cut.factory is variant.dpem_stm_cut
    cut.prepare(tmp_path / "memory", "ann", HashingEmbedder())
    common = {"path": tmp_path / "memory", "embedder": HashingEmbedder()}
    replayed = cut.factory(common, None, None)
    try:
        assert len(replayed.stm("ann")) == len(said)  # no refresh dropped them this time
        assert replayed.stm_cut > 0
        near = replayed.recall("I play the violin", Scope("ann"), k=3).records
        assert near and all("violin" in r.record.text for r in near)
        far = replayed.recall("zzzz qqqq", Scope("ann"), k=3).records
        assert not far  # nothing in STM is close enough, and LTM is empty
    finally:
        replayed.close()


def test_rewind_state_puts_recalled_records_back_as_they_were_before_the_questions(
    tmp_path: Path,
) -> None:
    """MemoryBank reinforces what it recalls; the rewind undoes exactly the later changes."""
    from memories_core import MemoryBankMemory, Turn
    from memories_core.prompts.memorybank import memorybank_reply

    ingest, asked = (
        datetime(2024, 3, 1, tzinfo=timezone.utc),
        datetime(2024, 3, 5, tzinfo=timezone.utc),
    )
    clock = FixedClock(ingest)
    memory = MemoryBankMemory(
        path=tmp_path / "m",
        clock=clock,
        llm=ScriptedLLM([], default=memorybank_reply),
        embedder=HashingEmbedder(),
    )
    memory.save([Turn("user", "I adopted a cat named Miso", timestamp=ingest)], Scope("ann", "s1"))
    memory.save([Turn("user", "I love hiking in the rain", timestamp=ingest)], Scope("ann", "s1"))
    engine = memory.engine
    first = engine.records("ann")[0].id
    engine.update_state("ann", {first: {"tier": "kept", "attrs": {"old": 1}}}, at=ingest)
    before = {r.id: r.state for r in engine.records("ann")}
    clock.set(asked)
    for query in ("what is my cat called", "cat Miso", "hiking"):
        memory.recall(query, Scope("ann"), now=asked)
    engine.update_state("ann", {first: {"attrs": {"new": 2}}}, at=asked)
    changed = [r.id for r in engine.records("ann") if r.state != before[r.id]]
    assert changed  # the recalls reinforced something

    assert rewind_state(engine, "ann", asked) == len(changed)
    assert {r.id: r.state for r in engine.records("ann")} == before  # tier and attrs kept too
    assert rewind_state(engine, "ann", asked) == 0  # rewinding again changes nothing
    engine.edit_text("ann", first, "I adopted a dog", reason="edited")
    with pytest.raises(ValueError, match="not state changes"):
        rewind_state(engine, "ann", ingest)
    memory.close()


def test_memorybank_decay_variant_answers_from_the_state_the_ingest_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The source run's reinforcement is undone in the copy before the variant answers."""
    from memories_core.prompts.memorybank import memorybank_reply

    def writer(messages: object) -> str | None:
        reply = memorybank_reply(messages)  # type: ignore[arg-type]
        return None if reply.startswith("I can only answer") else reply

    bench, data = miso_bench(monkeypatch, tmp_path, [], first=writer)
    variant = load_script("variant_qa")
    source, out = tmp_path / "source", tmp_path / "decay"
    argv = ["--data", str(data), "--sessions", "2", "-q"]
    assert bench.main([*argv, "--mechanisms", "memorybank", "--out", str(source)]) == 0  # type: ignore[attr-defined]
    args = ["--variant", "memorybank-decay", "--source", str(source), "--out", str(out)]
    assert variant.main([*args, "--", *argv]) == 0
    row = json.loads((out / "locomo_qa.json").read_text())["rows"][0]
    assert row["mechanism"] == "memorybank" and row["questions"] > 0
    (folder,) = (out / "state" / "memorybank").iterdir()
    engine = MemoryEngine(path=folder / "memory", embedder=HashingEmbedder(dimension=64))
    try:
        history = engine.history(folder.name)
    finally:
        engine.close()
    rewound = [c for c in history if (c.reason or "").startswith("rewound")]
    recalled = [c for c in history if c.reason == "recalled"]
    assert rewound and all(c.new["recall_count"] == 0 for c in rewound if "recall_count" in c.new)
    # the source's recalls come before the rewind, the variant's own after it
    first_rewind = min(c.seq for c in rewound)
    assert any(c.seq < first_rewind for c in recalled) and any(
        c.seq > first_rewind for c in recalled
    )
    capsys.readouterr()


def test_full_row_gives_the_whole_window_the_reader_has() -> None:
    bench = load_script("locomo_qa")

    class Windowed(ScriptedLLM):
        context_tokens = 16384

    reserve = bench.FULL_RESERVE_TOKENS
    assert bench.full_budget(Windowed([]), None) == 16384 - reserve
    assert bench.full_budget(Windowed([]), 3000) == 3000
    # a reader that does not say its window (an OpenAI model) gets the documented default
    default = bench.FULL_DEFAULT_TOKENS
    assert bench.full_budget(ScriptedLLM([]), None) == default


def test_a_rebuilt_table_names_the_reader_as_it_ran(tmp_path: Path) -> None:
    bench = load_script("locomo_qa")

    class Local:
        name = "local:Model"

        def __init__(self, loaded: bool) -> None:
            self.loaded = loaded
            self.quantized = "int8-decode" if loaded else "none"  # known once loaded

    ran = bench.reader_label(Local(loaded=True), tmp_path)
    assert ran == "local:Model (int8 weights for decoding)"
    # rebuilt from kept answers, nothing loaded: the kept label, not "none"
    assert bench.reader_label(Local(loaded=False), tmp_path) == ran
    other = tmp_path / "other"
    assert bench.reader_label(Local(loaded=False), other) == "local:Model"


def test_answers_in_batches_match_answers_one_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--answer-batch: recall per question in turn, one reader batch, the same answers."""
    calls: list[str] = []
    bench, data = miso_bench(monkeypatch, tmp_path, calls)
    llm = bench.make_llm()  # type: ignore[attr-defined]
    sizes: list[int] = []
    plain = llm.generate_batch

    def counted(conversations: Any, **options: Any) -> Any:
        sizes.append(len(conversations))
        return plain(conversations, **options)

    monkeypatch.setattr(llm, "generate_batch", counted)
    argv = ["--data", str(data), "--mechanisms", "history", "--sessions", "2", "-q"]
    assert bench.main([*argv, "--out", str(tmp_path / "one")]) == 0  # type: ignore[attr-defined]
    assert sizes == []
    # the same records for both (ids break ranking ties): the first run's ingest, copied
    bench.copy_ingest(tmp_path / "one", tmp_path / "two", "history")  # type: ignore[attr-defined]
    argv += ["--answer-batch", "2", "--resume"]
    assert bench.main([*argv, "--out", str(tmp_path / "two")]) == 0  # type: ignore[attr-defined]
    one, two = (
        [
            json.loads(line)
            for path in sorted((tmp_path / run).glob("state/*/*/answers.jsonl"))
            for line in path.read_text().splitlines()
        ]
        for run in ("one", "two")
    )
    # three questions: a batch of two, then the last one alone (no batch of one)
    assert sizes == [2] and len(two) == len(one) == 3
    for a, b in zip(
        one, two, strict=True
    ):  # same recalls (MemoryBank reinforces on recall), same answers
        assert (a["id"], a["prediction"], a["records"], a["context_chars"]) == (
            b["id"],
            b["prediction"],
            b["records"],
            b["context_chars"],
        )
        assert b["reader_prompt_tokens"] == a["reader_prompt_tokens"] > 0
    with pytest.raises(SystemExit):
        bench.parse_args(["--answer-batch", "0"])  # type: ignore[attr-defined]
    capsys.readouterr()


def test_answer_batch_script_answers_one_ingest_at_each_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """benchmarks/answer_batch.py: one ingest and one reader for every size, answers compared."""
    pytest.importorskip("matplotlib")
    calls: list[str] = []
    bench, data = miso_bench(monkeypatch, tmp_path, calls)
    loads: list[tuple[Any, ...]] = []
    reader = bench.make_llm()  # type: ignore[attr-defined]
    monkeypatch.setattr(bench, "make_llm", lambda *spec: loads.append(spec) or reader)
    saves: list[object] = []
    plain_save = HistoryMemory.save

    def counted(self: HistoryMemory, *args: Any, **kwargs: Any) -> Any:
        saves.append(args)
        return plain_save(self, *args, **kwargs)

    monkeypatch.setattr(HistoryMemory, "save", counted)
    script = load_script("answer_batch")
    rest = ["--", "--data", str(data), "--sessions", "2"]
    assert script.main(["--sizes", "1", "--out", str(tmp_path / "alone"), *rest]) == 0
    one_ingest = len(saves)
    out = tmp_path / "batches"
    assert script.main(["--sizes", "1,2", "--out", str(out), *rest]) == 0
    assert one_ingest > 0 and len(saves) == 2 * one_ingest  # size 2 answered a copy
    assert len(loads) == 2  # one reader per invocation, shared by its sizes
    report = json.loads((out / "answer_batch.json").read_text())
    one, two = report["rows"]
    assert (one["batch"], two["batch"]) == (1, 2)
    assert one["questions"] == two["questions"] == two["same_as_first"] == 3
    assert one["f1"] == two["f1"] and one["speedup"] == 1.0
    assert (out / "answer_batch.png").is_file()
    assert "| 2 | 3 |" in (out / "answer_batch.md").read_text()
    capsys.readouterr()
