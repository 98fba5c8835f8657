"""benchmarks/compare_answers.py: kept answers paired by question, with a sign test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmark_scripts import load_script
from locomo_fixture import tiny_conversation, write_dataset


def _script() -> Any:
    return load_script("compare_answers")


def _keep(folder: Path, mechanism: str, answers: dict[str, tuple[int, float, int]]) -> None:
    """Answers as locomo_qa keeps them: id -> (category, F1, records)."""
    for question, (category, f1, records) in answers.items():
        conversation = question.split(":")[0]
        path = folder / "state" / mechanism / conversation / "answers.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        row = {
            "id": question,
            "category": category,
            "f1": f1,
            "records": records,
            "context_chars": 100 * records,
            "recall_ms": 1000.0 * records,
        }
        with path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")


def test_sign_test_is_exact_and_two_sided() -> None:
    sign_test = _script().sign_test
    assert sign_test(0, 0) == 1.0
    assert sign_test(1, 0) == 1.0
    assert sign_test(5, 0) == pytest.approx(2 / 32)
    # 5 better, 10 worse: 2 * P(X <= 5), X ~ Bin(15, 1/2) = 2 * 4944 / 32768
    assert sign_test(5, 10) == pytest.approx(2 * 4944 / 32768)
    assert sign_test(10, 5) == sign_test(5, 10)


def test_runs_are_compared_on_the_questions_they_share(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script()
    a, b, ref = tmp_path / "a", tmp_path / "b", tmp_path / "ref"
    _keep(a, "memochat", {"c1:0": (2, 0.0, 3), "c1:1": (4, 1.0, 3), "c2:0": (5, 0.5, 3)})
    _keep(b, "memochat", {"c1:0": (2, 1.0, 0), "c1:1": (4, 1.0, 1), "c2:0": (5, 0.0, 2)})
    # the reference answered more questions (a larger draw): only the shared ones count
    _keep(ref, "none", {"c1:0": (2, 0.0, 0), "c1:1": (4, 0.0, 0), "c2:0": (5, 1.0, 0)})
    _keep(ref, "none", {"c2:7": (1, 1.0, 0)})
    out = tmp_path / "out"
    argv = ["--base", "a", "--out", str(out), "--stored"]
    for spec in (f"a={a}:memochat", f"b={b}:memochat", f"none={ref}:none"):
        argv += ["--run", spec]
    assert script.main(argv) == 0
    result = json.loads((out / "compare.json").read_text())
    assert result["questions"] == 3 and result["ids"] == ["c1:0", "c1:1", "c2:0"]
    runs = result["runs"]
    assert runs["a"]["f1"] == pytest.approx(0.5) and "better" not in runs["a"]
    assert runs["b"]["f1"] == pytest.approx(2 / 3)
    assert (runs["b"]["better"], runs["b"]["worse"]) == (1, 1)
    assert runs["b"]["conversations"] == {"c1": 1.0, "c2": 0.0}
    assert runs["b"]["categories"] == {"temporal": 1.0, "single-hop": 1.0, "adversarial": 0.0}
    assert runs["b"]["empty_contexts"] == 1 and runs["b"]["recall_s_p50"] == pytest.approx(1.0)
    assert runs["none"]["questions"] == 3 and runs["none"]["left_out"] == 1
    assert runs["none"]["f1"] == pytest.approx(1 / 3)
    printed = capsys.readouterr().out
    assert printed == (out / "compare.md").read_text() + "\n"
    assert "| b | 0.667 |" in printed and "1 / 1 (1.00)" in printed


def test_bad_runs_are_refused(tmp_path: Path) -> None:
    script = _script()
    with pytest.raises(SystemExit, match="LABEL=FOLDER:MECHANISM"):
        script.main(["--stored", "--run", "no-mechanism"])
    with pytest.raises(SystemExit, match="no kept memochat answers"):
        script.main(["--stored", "--run", f"a={tmp_path}:memochat"])
    _keep(tmp_path / "a", "x", {"c1:0": (1, 1.0, 1)})
    _keep(tmp_path / "b", "x", {"c1:1": (1, 1.0, 1)})
    runs = ["--stored", "--run", f"a={tmp_path / 'a'}:x", "--run", f"b={tmp_path / 'b'}:x"]
    with pytest.raises(SystemExit, match="share no question"):
        script.main(runs)
    with pytest.raises(SystemExit, match="is not one of"):
        script.main([*runs, "--base", "c"])
    with pytest.raises(SystemExit, match="labels must differ"):
        script.main(
            ["--stored", "--run", f"a={tmp_path / 'a'}:x", "--run", f"a={tmp_path / 'a'}:x"]
        )


def test_answers_are_scored_again_from_their_replies_unless_stored(tmp_path: Path) -> None:

    script = _script()
    data = write_dataset(tmp_path / "locomo.json")  # question 0: "Miso", question 1: "a sunset"
    c = tiny_conversation().sample_id
    run = tmp_path / "run"
    # the figures as an older scorer wrote them: both wrong for the replies kept beside them
    for question, reply, stale in ((f"{c}:0", "Miso.", 0.0), (f"{c}:1", "Bob", 0.0)):
        path = run / "state" / "history" / c / "answers.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        row = {"id": question, "category": 4, "prediction": reply, "f1": stale, "records": 1}
        with path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
    spec = ["--run", f"h={run}:history"]
    assert script.main([*spec, "--data", str(data), "--out", str(tmp_path / "scored")]) == 0
    scored = json.loads((tmp_path / "scored" / "compare.json").read_text())["runs"]["h"]
    assert scored["f1"] == pytest.approx(0.5) and scored["categories"] == {"single-hop": 0.5}
    assert script.main([*spec, "--stored", "--out", str(tmp_path / "kept")]) == 0
    stored = json.loads((tmp_path / "kept" / "compare.json").read_text())["runs"]["h"]
    assert stored["f1"] == 0.0 and stored["conversations"] == {c: 0.0}
    answers = script.rescore(script.load_answers(run, "history"), script.load_items(data))
    assert (answers[f"{c}:0"]["f1"], answers[f"{c}:1"]["f1"]) == (1.0, 0.0)
    # a run asked from another file is refused, not scored against the wrong gold answers
    other = tmp_path / "other"
    _keep(other, "history", {"c9:0": (4, 1.0, 1)})
    with pytest.raises(SystemExit, match="not a question of --data"):
        script.main(["--run", f"o={other}:history", "--data", str(data)])
    # an answer kept without its reply is refused, not scored as an empty one
    bare = tmp_path / "bare"
    _keep(bare, "history", {f"{c}:0": (4, 1.0, 1)})
    with pytest.raises(SystemExit, match="no reply to score"):
        script.main(["--run", f"b={bare}:history", "--data", str(data)])
    with pytest.raises(SystemExit, match="no such file"):
        script.main(["--run", f"h={run}:history", "--data", str(tmp_path / "missing.json")])
