"""Every memory row of the answer-quality harness runs end to end, and resumes for free.

A row of the 150-question table takes hours of the offline model; a mechanism that failed
in its ingest or its recall after an hour would cost that hour. Here each LLM-written row is
ingested, answered and resumed on the small LoCoMo-shaped dataset with a model that follows
every prompt of the package (the mechanisms' rule-following stand-ins), and the row must
come out whole: every question answered from a non-empty recall (MemoChat's may be empty by
the model's choice), no writing call failed, no derivation left pending, and a resumed run
asks the model nothing again.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from benchmark_scripts import load_script
from locomo_fixture import miso_bench, tiny_conversation
from memories_core.prompts import memochat
from memories_core.prompts.dpem import dpem_reply
from memories_core.prompts.emg.questions import emg_reply
from memories_core.prompts.memorybank import memorybank_reply
from memories_core.prompts.rule_following import rule_following_reply
from memories_core.types import ChatMessage, Scope

#: Every memory row of the harness whose writing or recall asks the model (``history`` and
#: ``late`` ask nothing of it and run in ``test_answer_quality``): a row added to the harness
#: is tested here without being listed.
MODEL_ROWS = tuple(
    name for name in load_script("locomo_qa").MECHANISMS if name not in ("history", "late")
)


def every_prompt(messages: Sequence[ChatMessage]) -> str | None:
    """A stand-in that answers each mechanism's prompts; ``None`` for the reader's."""
    chosen = memochat.rule_following_reply(messages)
    if chosen is not None:
        return chosen
    for reply in (dpem_reply, memorybank_reply, emg_reply, rule_following_reply):
        text = reply(messages)
        if not text.startswith("I can only answer"):
            return text
    return None


def _row_bench(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, row: str, *, sessions: int
) -> tuple[Any, list[str], list[str]]:
    """The offline harness on the small dataset, answering every prompt by rule.

    Returns the harness module, the reader's prompts so far, and the arguments of one row
    (``--out`` left to the caller).
    """
    asked: list[str] = []
    bench, data = miso_bench(monkeypatch, tmp_path, asked, first=every_prompt)  # type: ignore[arg-type]
    argv = ["--data", str(data), "--sessions", str(sessions), "--recall-budget", "0", "-q"]
    return bench, asked, [*argv, "--mechanisms", row]


@pytest.mark.parametrize("row", MODEL_ROWS)
def test_each_model_row_ingests_answers_and_resumes(
    row: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bench, asked, argv = _row_bench(monkeypatch, tmp_path, row, sessions=2)
    out = tmp_path / "out"
    argv += ["--out", str(out)]
    assert bench.main(argv) == 0
    result = json.loads((out / "locomo_qa.json").read_text())
    (summary,) = result["rows"]
    assert summary["mechanism"] == row
    assert summary["questions"] == 3  # 2 answerable in sessions 1-2, plus the adversarial
    assert summary["write_llm_failures"] == 0
    assert summary["write_capped"] == 0  # the stand-in reports no token counts
    assert summary["pending_jobs_after_ingest"] == 0
    assert summary["turns"] > 0 and summary["store_bytes"] > 0
    answers = [
        json.loads(line)
        for line in (out / "state" / row / "conv-t" / "answers.jsonl").read_text().splitlines()
    ]
    assert len(answers) == 3
    if row == "memochat":
        # Recall is the model's memo choice, possibly none of the others (the stand-in's
        # rule: an option shares a content word with the question): the choice must have run.
        assert all(a["recall_llm_calls"] == 1 for a in answers)
    else:
        assert all(a["records"] > 0 for a in answers), [a["records"] for a in answers]
    readers = len(asked)
    assert readers == 3  # one reader prompt per question
    # Resumed: the kept ingest and answers are reused; the model is not asked again.
    assert bench.main([*argv, "--resume"]) == 0
    assert len(asked) == readers
    again = json.loads((out / "locomo_qa.json").read_text())["rows"][0]
    assert again["f1"] == summary["f1"]
    capsys.readouterr()


class Interrupted(Exception):
    """Stands for a run stopped in the middle of an ingest (a kill, a machine reset)."""


class StopsAtSession:
    """A memory whose ``end_session`` of one session raises (everything else passes)."""

    def __init__(self, memory: object, session: str) -> None:
        self._memory, self._session = memory, session

    def end_session(self, scope: Scope) -> None:
        if scope.session_id == self._session:
            raise Interrupted(scope.session_id)
        self._memory.end_session(scope)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self._memory, name)


@pytest.mark.parametrize("row", ["summary", "memorybank", "dpem", "multiview"])
def test_an_interrupted_ingest_resumes_from_its_last_session(
    row: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The second run saves only the sessions after the checkpoint and answers as one run."""
    bench, asked, argv = _row_bench(monkeypatch, tmp_path, row, sessions=3)
    plain = bench.make_memory
    assert bench.main([*argv, "--out", str(tmp_path / "whole")]) == 0
    whole = json.loads((tmp_path / "whole" / "locomo_qa.json").read_text())["rows"][0]

    opened: list[object] = []

    def stopping(*args: object, **kwargs: object) -> object:
        opened.append(plain(*args, **kwargs))
        return StopsAtSession(opened[-1], "session_3")

    out = tmp_path / "resumed"
    with pytest.raises(Interrupted):
        bench.main([*argv, "--out", str(out)], factory=stopping)
    folder = out / "state" / row / "conv-t"
    checkpoint = json.loads((folder / "checkpoint.json").read_text())
    assert checkpoint["stats"]["sessions"] == 2
    saved = checkpoint["stats"]["saves"]
    # The process is gone and so is the memory folder (a machine reset): the checkpoint
    # files alone resume the ingest.
    for memory in opened:
        memory.close()  # type: ignore[attr-defined]
    shutil.rmtree(folder / "memory")
    assert bench.main([*argv, "--out", str(out), "--resume"]) == 0
    resumed = json.loads((out / "locomo_qa.json").read_text())["rows"][0]
    ingest = json.loads((folder / "ingest.json").read_text())
    assert ingest["sessions"] == 3 and ingest["saves"] > saved
    assert not (folder / "checkpoint.json").exists()
    assert not list(folder.glob("checkpoint-s*.memories.zip"))
    assert (folder / "memory.memories.zip").is_file()  # the finished ingest's memory file
    same = ("f1", "questions", "turns", "write_llm_calls_per_turn", "pending_jobs_after_ingest")
    for key in same:
        assert resumed[key] == whole[key], key
    # Answers left to make on a machine without the memory folder: the memory file is
    # restored, nothing is ingested again, and the answers are the same.
    shutil.rmtree(folder / "memory")
    answers = folder / "answers.jsonl"
    kept = answers.read_text().splitlines()
    answers.write_text(kept[0] + "\n")
    readers = len(asked)
    recorded = (folder / "ingest.json").read_text()
    assert bench.main([*argv, "--out", str(out), "--resume"]) == 0
    assert len(asked) == readers + len(kept) - 1
    assert (folder / "ingest.json").read_text() == recorded  # not ingested again
    again = json.loads((out / "locomo_qa.json").read_text())["rows"][0]
    assert again["f1"] == whole["f1"]
    capsys.readouterr()


def test_the_checkpoints_time_is_not_counted_as_the_memorys(tmp_path: Path) -> None:
    """``wall_s`` is the memory's ingest time: the per-session hook's own time is left out."""
    from datetime import datetime, timezone

    from memories_core import FixedClock, HistoryMemory
    from memories_core.embedders import HashingEmbedder
    from memories_core.evaluation.harness import ingest_conversation

    clock = FixedClock(datetime(2024, 1, 1, tzinfo=timezone.utc))
    memory = HistoryMemory(path=tmp_path / "m", embedder=HashingEmbedder(dimension=64), clock=clock)
    slept: list[float] = []

    def slow_checkpoint(stats: object) -> None:
        time.sleep(0.5)
        slept.append(0.5)

    stats = ingest_conversation(
        memory, tiny_conversation(), clock, user_id="conv-t", on_session=slow_checkpoint
    )
    memory.close()
    assert len(slept) == stats.sessions == 3
    assert stats.wall_s < sum(slept)


def test_each_checkpoint_counts_the_jobs_left_pending_and_the_failures(tmp_path: Path) -> None:
    """A checkpoint's stats say what is still pending, not only the finished ingest's."""
    from datetime import datetime, timezone

    from memories_core import ConditionalMemory, FixedClock
    from memories_core.embedders import HashingEmbedder
    from memories_core.evaluation.harness import ingest_conversation
    from memories_core.llms import ScriptedLLM

    clock = FixedClock(datetime(2024, 1, 1, tzinfo=timezone.utc))
    memory = ConditionalMemory(
        llm=ScriptedLLM(default=lambda messages: "@@@ not an answer"),
        embedder=HashingEmbedder(dimension=64),
        clock=clock,
    )
    seen: list[tuple[int, int, dict[str, int]]] = []

    def checkpoint(stats: Any) -> None:
        seen.append((stats.sessions, stats.pending_jobs, dict(stats.failures)))

    stats = ingest_conversation(
        memory, tiny_conversation(), clock, user_id="conv-t", on_session=checkpoint
    )
    memory.close()
    assert [s for s, _, _ in seen] == [1, 2, 3]
    first_pending, first_failures = seen[0][1], seen[0][2]
    assert first_pending > 0 and sum(first_failures.values()) > 0
    assert seen[-1][1] == stats.pending_jobs >= first_pending


def _emg_variant(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, variant: str
) -> tuple[Path, Path, list[str], int]:
    """An EMG row on the small dataset, then ``variant`` answering its kept ingest again.

    Returns the row's and the variant's ``--out``, the reader's prompts of both, and how many
    of them the row asked.
    """

    bench, asked, argv = _row_bench(monkeypatch, tmp_path, "emg", sessions=2)
    source, out = tmp_path / "source", tmp_path / variant
    assert bench.main([*argv, "--out", str(source)]) == 0
    row_prompts = len(asked)
    rest = [a for a in argv if a not in ("--mechanisms", "emg")]
    args = ["--variant", variant, "--source", str(source), "--out", str(out)]
    assert load_script("variant_qa").main([*args, "--", *rest]) == 0
    return source, out, asked, row_prompts


def test_emg_undated_variant_answers_the_kept_ingest_without_dates(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same EMG ingest answered again: the reader's memories lose only their dates."""
    import re

    source, out, asked, n = _emg_variant(monkeypatch, tmp_path, "emg-undated")
    dated, undated = asked[:n], asked[n:]
    assert len(undated) == len(dated) == 3
    stamp = re.compile(r"\[\d{1,2} [A-Z][a-z]+ \d{4}")  # "[8 May 2023, 13:56] ..."
    assert all(stamp.search(p) for p in dated)
    assert not any(stamp.search(p) for p in undated)
    before = json.loads((source / "locomo_qa.json").read_text())["rows"][0]
    after = json.loads((out / "locomo_qa.json").read_text())["rows"][0]
    assert after["ingest_s"] == before["ingest_s"]  # the same ingest, not written again
    assert after["context_chars"] < before["context_chars"]
    capsys.readouterr()


def test_emg_top3_variant_gives_the_reader_the_top_three_memories(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same EMG ingest answered again with the untrained selection's top three memories."""
    source, out, _, _ = _emg_variant(monkeypatch, tmp_path, "emg-top3")

    def records(folder: Path) -> list[int]:
        rows = (folder / "state" / "emg").glob("*/answers.jsonl")
        return [json.loads(line)["records"] for f in rows for line in f.read_text().splitlines()]

    assert records(source) == [1, 1, 1]
    assert records(out) == [3, 3, 3]
    capsys.readouterr()


def test_ingest_stats_kept_before_capped_replies_were_counted_leave_them_unknown() -> None:
    from memories_core.evaluation.harness import IngestStats

    counted = IngestStats(llm_calls=4, llm_capped=1)
    assert IngestStats.from_json(counted.to_json()) == counted
    old = counted.to_json()
    del old["llm_capped"]
    assert IngestStats.from_json(old).llm_capped is None  # unknown, not zero
    assert IngestStats.from_json({"turns": 3}).llm_capped == 0  # no model call: none capped


def test_dpem_cv_replays_each_setting_answers_it_and_cross_validates(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two conversations' DPeM ingests, two executive settings, one fold per conversation."""

    bench, asked, argv = _row_bench(monkeypatch, tmp_path, "dpem", sessions=2)
    data = Path(argv[argv.index("--data") + 1])
    (sample,) = json.loads(data.read_text())
    data.write_text(json.dumps([sample, {**sample, "sample_id": "conv-u"}]))
    source = tmp_path / "source"
    assert bench.main([*argv, "--out", str(source)]) == 0
    row_prompts = len(asked)
    load_script("variant_qa")  # bound to this test's harness module
    cv_module = load_script("dpem_cv")

    rest = [a for a in argv if a not in ("--mechanisms", "dpem")]
    out = tmp_path / "cv"
    points = ["--point", "theta-3=theta=3", "--point", "theta-1=theta=1"]
    assert cv_module.main(["--source", str(source), "--out", str(out), *points, "--", *rest]) == 0
    assert len(asked) == row_prompts + 2 * 2 * 3  # 2 points x 2 conversations x 3 questions
    result = json.loads((out / "dpem_cv.json").read_text())
    assert result["conversations"] == ["conv-t", "conv-u"]
    assert set(result["cv"]["folds"]) == {"conv-t", "conv-u"} and result["cv"]["n"] == 6
    assert (out / "dpem_cv.png").stat().st_size > 0
    assert "held-out conversation" in (out / "dpem_cv.md").read_text()
    # The recorded rounds are kept beside each replay; every item counts once, and with
    # no rephrasing in the stand-in's items none recurs at the library's threshold.
    rec = result["recurrences"]
    assert rec["items"] > 0 and rec["recurring"]["88"] == 0
    assert rec["recurring"]["60"] <= rec["items"]
    kept = json.loads(
        (out / "theta-3" / "state" / "dpem" / "conv-u" / "recorded_rounds.json").read_text()
    )
    assert sum(len(entry["items"]) for entry in kept) * 2 == rec["items"]

    from memories_core import DualProcessMemory
    from memories_core.embedders import HashingEmbedder

    def tiers(point: str) -> tuple[int, int]:
        memory = DualProcessMemory(
            path=out / point / "state" / "dpem" / "conv-u" / "memory",
            llm=None,
            embedder=HashingEmbedder(dimension=64),
        )
        try:
            return len(memory.stm("conv-u")), len(memory.ltm("conv-u"))
        finally:
            memory.close()

    stm, ltm = tiers("theta-3")
    assert stm > 0 and ltm == 0  # nothing recurs three times in two short sessions
    assert tiers("theta-1") == (0, stm)  # every item promoted on its first round
    # Again: every point resumes from its answers; nothing is asked or replayed again.
    assert cv_module.main(["--source", str(source), "--out", str(out), *points, "--", *rest]) == 0
    assert len(asked) == row_prompts + 12 and tiers("theta-1") == (0, stm)
    with pytest.raises(SystemExit, match="NAME=SETTINGS"):
        cv_module.parse_points(["../x=theta=1"])
    with pytest.raises(SystemExit, match="--dpem"):
        cv_module.parse_points(["x=theta=one"])
    capsys.readouterr()
