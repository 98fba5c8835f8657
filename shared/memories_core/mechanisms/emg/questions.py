"""Training questions written from a user's own memories (appendix A.1, step 3).

No user labels questions, so a model writes them: the memories in time order, cut into
sessions of consecutive memories, each giving question-answer pairs with the memories they
need (:data:`~memories_core.prompts.emg.QUESTIONS`). A pair is kept only if its cited memories
exist and hold its answer (:func:`~memories_core.prompts.emg.parse_questions`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from memories_core.errors import ParseError
from memories_core.mechanisms.emg.applications import memory_line
from memories_core.mechanisms.emg.schema import MEMORY_KIND, TrainingExample
from memories_core.prompts.emg import QUESTIONS, GeneratedQuestion, QuestionsInput
from memories_core.prompts.spec import PromptSpec, run_spec
from memories_core.types import MemoryRecord

if TYPE_CHECKING:
    from memories_core.interfaces import LLM

__all__ = ["generate_questions", "sessions_of"]


def sessions_of(
    memories: Sequence[MemoryRecord],
    user_id: str,
    size: int,
    max_sessions: int | None = None,
) -> list[list[MemoryRecord]]:
    """``user_id``'s memories in time order, cut into sessions of ``size`` (the last ones kept).

    Records of other users or of other kinds are left out; equal times keep the given order.
    """
    pool = [r for r in memories if r.user_id == user_id and r.kind == MEMORY_KIND]
    pool.sort(key=lambda r: r.created_at)
    sessions = [pool[i : i + size] for i in range(0, len(pool), size)]
    if max_sessions is not None:
        sessions = sessions[-max_sessions:] if max_sessions > 0 else []
    return sessions


def generate_questions(
    user_id: str,
    memories: Sequence[MemoryRecord],
    llm: LLM,
    *,
    session_size: int,
    per_session: int,
    max_sessions: int | None = None,
    retries: int = 1,
    on_rejected: Callable[[], None] | None = None,
    progress: bool = False,
    spec: PromptSpec[QuestionsInput, list[GeneratedQuestion]] = QUESTIONS,
) -> tuple[list[TrainingExample], int, int]:
    """Have ``llm`` write question-answer pairs about ``user_id``'s ``memories``.

    ``spec``: the question-generation prompt as the caller runs it (``EMGMemory`` passes
    its ``emg.questions`` override).

    A session whose reply stays unusable after ``retries`` repairs is skipped, counted as
    rejected and reported to ``on_rejected``; a session that gives no pair is rejected too.

    Returns:
        ``(examples, sessions, rejected)``: the validated examples (with reference answers),
        the sessions sent, and how many gave no usable pair.

    Raises:
        LLMError: if the model fails (nothing is kept of this call).
    """
    from tqdm.auto import tqdm

    sessions = sessions_of(memories, user_id, session_size, max_sessions)
    out: list[TrainingExample] = []
    rejected = 0
    for session in tqdm(sessions, desc="EMG questions", disable=not progress):
        inputs = QuestionsInput(
            tuple(memory_line(r) for r in session),
            tuple(r.created_at for r in session),
            per_session,
        )
        try:
            pairs = run_spec(llm, spec, inputs, retries=retries)
        except ParseError:
            if on_rejected is not None:
                on_rejected()
            rejected += 1
            continue
        if not pairs:
            rejected += 1
        for pair in pairs:
            required = frozenset(session[i].id for i in pair.memories)
            out.append(TrainingExample(user_id, pair.question, required, pair.answer))
    return out, len(sessions), rejected
