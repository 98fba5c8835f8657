"""Loader for LoCoMo (Maharana et al., 2024), the long-conversation memory benchmark.

LoCoMo's JSON (``data/locomo10.json`` in snap-research/LoCoMo) holds a list of samples, each
with a ``conversation`` (``speaker_a``, ``speaker_b``, ``session_<n>`` turn lists and their
``session_<n>_date_time``) and ``qa`` items whose ``evidence`` names the dialogue turns
(``"D<session>:<turn>"``) that support the answer.

Quirks handled here:

* sessions are counted from the ``session_<n>`` lists, not from the date keys;
* a few evidence strings are malformed (``"D8:6; D9:17"``, ``"D:11:26"``, ``"D30:05"``) and
  are normalised to ``D<s>:<t>``; unusable ones (a bare ``"D"``) are dropped;
* category 5 (adversarial) items carry ``adversarial_answer`` instead of ``answer``;
* some answers are integers; they are turned into strings.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = [
    "CATEGORY_NAMES",
    "LocomoConversation",
    "LocomoQA",
    "LocomoTurn",
    "load_locomo",
    "normalise_evidence",
]

#: LoCoMo's QA categories.
CATEGORY_NAMES: dict[int, str] = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}

_SESSION_KEY = re.compile(r"session_(\d+)")
_EVIDENCE = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")


@dataclass(frozen=True)
class LocomoTurn:
    """One dialogue turn.

    Attributes:
        dia_id: Normalised turn id ``D<session>:<turn>``.
        session: Session number (from ``session_<n>``).
        speaker: Who spoke.
        text: What was said.
        session_time: The session's ``date_time`` string as given (e.g. "1:56 pm on 8 May,
            2023"), or ``""``.
        image_caption: BLIP caption of a shared image, or ``""``.
    """

    dia_id: str
    session: int
    speaker: str
    text: str
    session_time: str = ""
    image_caption: str = ""

    def render(self) -> str:
        """``"speaker: text"``, the raw-turn form indexed by the benchmarks."""
        return f"{self.speaker}: {self.text}"


@dataclass(frozen=True)
class LocomoQA:
    """One question with its evidence.

    Attributes:
        question: The question.
        answer: The answer (the adversarial answer for category 5), as a string.
        category: 1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial.
        evidence: Normalised evidence turn ids.
    """

    question: str
    answer: str
    category: int
    evidence: tuple[str, ...] = ()

    @property
    def category_name(self) -> str:
        """Readable category name."""
        return CATEGORY_NAMES.get(self.category, str(self.category))


@dataclass(frozen=True)
class LocomoConversation:
    """One LoCoMo sample: a long two-person conversation and its questions."""

    sample_id: str
    speakers: tuple[str, str]
    turns: tuple[LocomoTurn, ...]
    qa: tuple[LocomoQA, ...]
    session_times: dict[int, str] = field(default_factory=dict)

    def session_datetime(self, session: int) -> datetime | None:
        """Parse a session's ``date_time`` (e.g. "1:56 pm on 8 May, 2023"), if possible."""
        text = self.session_times.get(session, "")
        for pattern in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y"):
            try:
                return datetime.strptime(text.strip(), pattern)
            except ValueError:
                continue
        return None


def normalise_evidence(raw: str) -> list[str]:
    """Turn one evidence string into zero or more ``D<s>:<t>`` ids.

    Examples:
        >>> normalise_evidence("D8:6; D9:17")
        ['D8:6', 'D9:17']
        >>> normalise_evidence("D:11:26"), normalise_evidence("D30:05"), normalise_evidence("D")
        (['D11:26'], ['D30:5'], [])
    """
    return [f"D{int(s)}:{int(t)}" for s, t in _EVIDENCE.findall(raw)]


def _iter_sessions(conversation: dict[str, Any]) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    numbered = []
    for key, value in conversation.items():
        match = _SESSION_KEY.fullmatch(key)
        if match and isinstance(value, list):
            numbered.append((int(match.group(1)), value))
    yield from sorted(numbered, key=lambda pair: pair[0])


def _parse_sample(sample: dict[str, Any]) -> LocomoConversation:
    conversation = sample["conversation"]
    times: dict[int, str] = {}
    turns: list[LocomoTurn] = []
    for number, items in _iter_sessions(conversation):
        times[number] = str(conversation.get(f"session_{number}_date_time", ""))
        for position, item in enumerate(items, start=1):
            ids = normalise_evidence(str(item.get("dia_id", "")))
            dia_id = ids[0] if ids else f"D{number}:{position}"
            turns.append(
                LocomoTurn(
                    dia_id=dia_id,
                    session=number,
                    speaker=str(item.get("speaker", "")),
                    text=str(item.get("text", "")),
                    session_time=times[number],
                    image_caption=str(item.get("blip_caption", "") or ""),
                )
            )
    qa: list[LocomoQA] = []
    for item in sample.get("qa", []):
        evidence: list[str] = []
        for raw in item.get("evidence", []) or []:
            for dia_id in normalise_evidence(str(raw)):
                if dia_id not in evidence:
                    evidence.append(dia_id)
        answer = item.get("answer", item.get("adversarial_answer", ""))
        qa.append(
            LocomoQA(
                question=str(item["question"]),
                answer=str(answer),
                category=int(item.get("category", 0)),
                evidence=tuple(evidence),
            )
        )
    return LocomoConversation(
        sample_id=str(sample.get("sample_id", "")),
        speakers=(str(conversation.get("speaker_a", "")), str(conversation.get("speaker_b", ""))),
        turns=tuple(turns),
        qa=tuple(qa),
        session_times=times,
    )


def load_locomo(path: str | Path) -> list[LocomoConversation]:
    """Load a LoCoMo JSON file (a list of samples, as in ``locomo10.json``).

    Args:
        path: The JSON file.

    Returns:
        One :class:`LocomoConversation` per sample, in file order.
    """
    with Path(path).open(encoding="utf-8") as handle:
        data = json.load(handle)
    if isinstance(data, dict):
        data = [data]
    return [_parse_sample(sample) for sample in data]
