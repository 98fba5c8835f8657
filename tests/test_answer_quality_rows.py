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
from collections.abc import Sequence
from pathlib import Path

import pytest

from memories_core.prompts import memochat
from memories_core.prompts.dpem import dpem_reply
from memories_core.prompts.emg.questions import emg_reply
from memories_core.prompts.memorybank import memorybank_reply
from memories_core.prompts.rule_following import rule_following_reply
from memories_core.types import ChatMessage
from test_answer_quality import _miso_bench

#: The memory rows whose writing or recall asks the model (``history``/``late`` ask nothing
#: of it and run in ``test_answer_quality``).
MODEL_ROWS = (
    "summary",
    "conditional",
    "multiview",
    "reflective",
    "memorybank",
    "memochat",
    "dpem",
    "emg",
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


@pytest.mark.parametrize("row", MODEL_ROWS)
def test_each_model_row_ingests_answers_and_resumes(
    row: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    asked: list[str] = []
    bench, data = _miso_bench(monkeypatch, tmp_path, asked, first=every_prompt)  # type: ignore[arg-type]
    out = tmp_path / "out"
    argv = ["--data", str(data), "--sessions", "2", "--recall-budget", "0", "-q"]
    argv += ["--mechanisms", row, "--out", str(out)]
    assert bench.main(argv) == 0  # type: ignore[attr-defined]
    result = json.loads((out / "locomo_qa.json").read_text())
    (summary,) = result["rows"]
    assert summary["mechanism"] == row
    assert summary["questions"] == 3  # 2 answerable in sessions 1-2, plus the adversarial
    assert summary["write_llm_failures"] == 0
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
    assert bench.main([*argv, "--resume"]) == 0  # type: ignore[attr-defined]
    assert len(asked) == readers
    again = json.loads((out / "locomo_qa.json").read_text())["rows"][0]
    assert again["f1"] == summary["f1"]
    capsys.readouterr()
