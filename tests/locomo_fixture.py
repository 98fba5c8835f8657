"""A tiny LoCoMo conversation for the answer-quality tests, and the offline harness on it.

Shared by the tests of ``benchmarks/locomo_qa.py`` and the scripts built on it
(``variant_qa``, ``compare_answers``): the conversation as the loader returns it, the same
conversation written as a LoCoMo file, and the harness with a scripted model and the hashing
embedder.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from benchmark_scripts import load_script
from memories_core.embedders import HashingEmbedder
from memories_core.evaluation.locomo import LocomoConversation, LocomoQA, LocomoTurn
from memories_core.llms.scripted import ScriptedLLM


def turn(session: int, index: int, speaker: str, text: str) -> LocomoTurn:
    return LocomoTurn(f"D{session}:{index}", session, speaker, text)


def tiny_conversation() -> LocomoConversation:
    turns = [
        turn(1, 1, "Ann", "I adopted a cat named Miso."),
        turn(1, 2, "Bob", "Lovely! I bought a blue bicycle."),
        turn(1, 3, "Ann", "I work as a nurse in Lyon."),
        turn(1, 4, "Bob", "Nice."),
        turn(2, 1, "Ann", "Miso learned to open doors."),
        turn(2, 2, "Bob", "I painted a sunset last weekend."),
        turn(3, 1, "Ann", "I started learning the violin."),
        turn(3, 2, "Bob", "Great, I ran a marathon."),
    ]
    qa = (
        LocomoQA("What is Ann's cat called?", "Miso", 4, ("D1:1",)),
        LocomoQA("What did Bob paint?", "a sunset", 4, ("D2:2",)),
        LocomoQA("What instrument is Ann learning?", "violin", 4, ("D3:1",)),
        LocomoQA("What is Ann's car?", "a red car", 5, ("D1:3",)),
        LocomoQA("No evidence question", "x", 2, ()),
    )
    times = {
        1: "1:56 pm on 8 May, 2023",
        2: "10:00 am on 15 May, 2023",
        3: "9:00 am on 1 June, 2023",
    }
    return LocomoConversation("conv-t", ("Ann", "Bob"), tuple(turns), qa, times)


def write_locomo(path: Path, conversation: LocomoConversation) -> Path:
    """``conversation`` written as a LoCoMo file (one sample), as the loader reads it back."""
    sessions = sorted({t.session for t in conversation.turns})
    sample = {
        "sample_id": conversation.sample_id,
        "conversation": {
            "speaker_a": conversation.speakers[0],
            "speaker_b": conversation.speakers[1],
            **{
                f"session_{n}": [
                    {"speaker": t.speaker, "dia_id": t.dia_id, "text": t.text}
                    for t in conversation.turns
                    if t.session == n
                ]
                for n in sessions
            },
            **{f"session_{n}_date_time": v for n, v in conversation.session_times.items()},
        },
        "qa": [
            {
                "question": q.question,
                "answer": q.answer,
                "category": q.category,
                "evidence": list(q.evidence),
            }
            if q.category != 5
            else {
                "question": q.question,
                "adversarial_answer": q.answer,
                "category": 5,
                "evidence": list(q.evidence),
            }
            for q in conversation.qa
        ],
    }
    path.write_text(json.dumps([sample]), encoding="utf-8")
    return path


def write_dataset(path: Path) -> Path:
    """:func:`tiny_conversation` as a LoCoMo file."""
    return write_locomo(path, tiny_conversation())


def offline_bench(monkeypatch: pytest.MonkeyPatch, llm: ScriptedLLM) -> object:
    """The benchmark module with ``llm`` as reader/writer and the hashing embedder."""
    bench = load_script("locomo_qa")
    monkeypatch.setattr(bench, "make_llm", lambda *a, **k: llm)
    monkeypatch.setattr(
        "memories_core.embedders.SentenceTransformerEmbedder", lambda: HashingEmbedder(dimension=64)
    )
    return bench


def miso_bench(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    calls: list[str],
    first: Callable[[object], str | None] | None = None,
) -> tuple[object, Path]:
    """The offline benchmark whose reader answers "Miso" when its prompt says it, and data.

    ``first`` answers the prompts it knows (a mechanism's writing or choice) before the reader;
    the reader's prompts are appended to ``calls``.
    """

    def reader(messages: object) -> str:
        known = first(messages) if first is not None else None
        if known is not None:
            return known
        text = messages[-1].content  # type: ignore[index]
        calls.append(text)
        return "Miso" if "Miso" in text else "dunno"

    bench = offline_bench(monkeypatch, ScriptedLLM([], default=reader))
    return bench, write_dataset(tmp_path / "locomo.json")
