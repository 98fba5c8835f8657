"""Several turns' extractions in one batch (EMG-RAG, appendix A.1 step 2).

Extraction reads only the turn (its text, time, role and sender) and the subclass list, so
the extractions of several waiting turns go to the model together; the graph edits that
follow (§4.2) compare each turn's memories with the graph as it is then, so they stay in
each job's own run, turn by turn in order. The parsed memories are kept in the job's payload
between the two.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memories_core.errors import ParseError
from memories_core.mechanisms.base import turn_from_record
from memories_core.prompts.batch import by_model, run_spec_batch
from memories_core.prompts.emg import EXTRACT, ExtractedMemory, ExtractInput
from memories_core.types import Job, MemoryRecord, Scope

if TYPE_CHECKING:
    from memories_core.mechanisms.emg.memory import EMGMemory

__all__ = [
    "EXTRACTED",
    "extract_input",
    "extracted_from_payload",
    "extracted_to_payload",
    "prepare_extractions",
]

#: Payload key of a turn's extraction made in a batch (``None``: unparsable, the fallback).
EXTRACTED = "extracted"
_TIMES = ("when", "valid_until")


def extract_input(memory: EMGMemory, turn: MemoryRecord) -> ExtractInput:
    """The extraction prompt's input for a stored turn."""
    said = turn_from_record(turn)
    role = str(turn.metadata.get("role", "user"))
    return ExtractInput(
        said.content, turn.created_at, role, memory.subclass_labels, speaker=said.speaker or None
    )


def extracted_to_payload(memories: Sequence[ExtractedMemory] | None) -> list[dict[str, Any]] | None:
    """Parsed memories as JSON for a job's payload (times as ISO text)."""
    if memories is None:
        return None
    out = []
    for item in memories:
        row = dataclasses.asdict(item)
        for name in _TIMES:
            row[name] = None if row[name] is None else row[name].isoformat()
        out.append(row)
    return out


def extracted_from_payload(value: Any) -> list[ExtractedMemory] | None:
    """The memories :func:`extracted_to_payload` kept (``None``: the fallback).

    A payload is read back from the store: anything malformed counts as the fallback (the
    turn is stored as one memory under its nearest subclass), never as an error.
    """
    if not isinstance(value, list):
        return None
    out = []
    try:
        for row in value:
            parts: dict[str, Any] = {}
            for field in dataclasses.fields(ExtractedMemory):
                if field.name in _TIMES:
                    raw = row.get(field.name)
                    parts[field.name] = None if raw is None else datetime.fromisoformat(str(raw))
                else:
                    parts[field.name] = str(row[field.name])
            out.append(ExtractedMemory(**parts))
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return out


def prepare_extractions(memory: EMGMemory, jobs: Sequence[Job]) -> dict[str, BaseException]:
    """Extract the turns of several ``extract`` jobs in one batch per model.

    An unparsable answer is kept as the fallback (as a job's own run keeps it), so no job
    fails here.

    Raises:
        LLMError: if the model is down (the extractions so far are kept).
    """
    work: list[tuple[Job, dict[str, Any], ExtractInput]] = []
    for job in jobs:
        if job.kind != "extract" or EXTRACTED in job.payload:
            continue
        found = memory.engine.get(job.user_id, [str(job.payload["turn_id"])])
        if found:
            work.append((job, dict(job.payload), extract_input(memory, found[0])))
    spec = memory.prompt_spec(EXTRACT)
    for llm, group in by_model(work, lambda item: memory._llm(Scope(item[0].user_id))):
        inputs = [item for _, _, item in group]
        answers = run_spec_batch(llm, spec, inputs, retries=memory.retries)
        for (job, payload, _), answer in zip(group, answers, strict=True):
            payload[EXTRACTED] = extracted_to_payload(
                None if isinstance(answer, ParseError) else answer
            )
            memory.engine.update_job(job, payload)
    return {}
