"""What EMG-RAG's selected memories serve (§4.4): answers, autofilled forms, reminders.

Each application takes the selection (or the memories) it works on, so it runs on any
selector; ``EMGMemory.answer``, ``autofill`` and ``reminders`` select and then call these.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from memories_core.errors import InvalidInputError, ParseError
from memories_core.mechanisms.emg.schema import Answer, Reminder, Selection
from memories_core.prompts.emg import (
    ANSWER,
    AUTOFILL,
    AnswerInput,
    AutofillInput,
    MemoryLine,
)
from memories_core.prompts.spec import PromptSpec, run_spec
from memories_core.types import MemoryRecord, ScoredRecord, ensure_utc

if TYPE_CHECKING:
    from memories_core.interfaces import LLM

__all__ = ["answer", "autofill", "check_fields", "memory_line", "reminders", "render"]


def memory_line(record: MemoryRecord) -> MemoryLine:
    """A memory as the prompts show it: its statement and its triple."""
    meta = record.metadata
    return MemoryLine(
        record.text,
        str(meta.get("subject") or ""),
        str(meta.get("relation") or ""),
        str(meta.get("object") or ""),
    )


def render(
    hits: Sequence[ScoredRecord], dated: Callable[[str, datetime], str] | None = None
) -> str:
    """The recall context: one :func:`memory_line` per hit.

    ``dated`` puts each line after its memory's time (``MemoryBase.dated``: when it was
    received, the record time); ``None``: the bare lines.
    """
    lines = ((memory_line(h.record).render(), h.record.created_at) for h in hits)
    return "\n".join(text if dated is None else dated(text, when) for text, when in lines)


def answer(
    selection: Selection,
    llm: LLM,
    when: datetime,
    spec: PromptSpec[AnswerInput, str] = ANSWER,
) -> Answer:
    """Answer ``selection.question`` from its memories (§4.3 ``LLM(Q ⊕ M)``, §4.4).

    ``spec``: the answer prompt as the caller runs it (``EMGMemory`` passes its override).

    Raises:
        LLMError: if the model fails; ParseError: if its answer is empty or markup.
    """
    lines = tuple(memory_line(h.record) for h in selection.memories)
    text = run_spec(llm, spec, AnswerInput(selection.question, lines, when))
    return Answer(selection.question, text, selection.memories)


def check_fields(fields: Sequence[str]) -> list[str]:
    """The form's field names.

    Raises:
        InvalidInputError: if ``fields`` is a string or holds an empty or non-string name.
    """
    if isinstance(fields, str) or not all(isinstance(f, str) and f.strip() for f in fields):
        raise InvalidInputError("fields must be a list of non-empty field names")
    return list(fields)


def autofill(
    fields: Sequence[str],
    select: Callable[[str], Selection],
    llm: LLM,
    spec: PromptSpec[AutofillInput, str | None] = AUTOFILL,
) -> dict[str, str | None]:
    """Fill form fields from the user's memories (§4.4 autofill forms).

    Each field becomes the question "What is the user's <field>?", answered by ``select``;
    the model gives the value. A value no memory holds, or an unusable answer, gives ``None``
    (documented graceful fallback); an outage raises ``LLMError``. ``spec``: the autofill
    prompt as the caller runs it (``EMGMemory`` passes its override).

    Raises:
        InvalidInputError: on bad ``fields`` (see :func:`check_fields`).
    """
    out: dict[str, str | None] = {}
    for name in check_fields(fields):
        chosen = select(f"What is the user's {name}?")
        lines = tuple(memory_line(h.record) for h in chosen.memories)
        try:
            out[name] = run_spec(llm, spec, AutofillInput(name, lines))
        except ParseError:
            out[name] = None
    return out


def reminders(
    memories: Iterable[MemoryRecord], when: datetime, horizon: timedelta
) -> list[Reminder]:
    """Upcoming events and expiries in ``(when, when + horizon]`` (§4.4 reminders).

    ``memories`` should be those valid at ``when``. Events come from the memories' extracted
    event times (absolute, A.1); a memory valid until a time inside the horizon gives an
    "expires" reminder. Soonest first.

    Raises:
        InvalidInputError: if ``horizon`` is not positive.
    """
    if horizon <= timedelta(0):
        raise InvalidInputError("horizon must be positive")
    end = when + horizon
    out: list[Reminder] = []
    for record in memories:
        raw = record.metadata.get("when")
        if raw:
            at = ensure_utc(datetime.fromisoformat(str(raw)))
            if when < at <= end:
                out.append(Reminder(at, "event", record.text, record.id))
        until = record.state.valid_until
        if until is not None and when < until <= end:
            out.append(Reminder(until, "expires", record.text, record.id))
    return sorted(out, key=lambda r: (r.at, r.text))
