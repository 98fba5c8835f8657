"""Prompts of EMG-RAG (Wang et al., 2024): memory extraction, answering and autofill.

* :data:`EXTRACT` (appendix A.1, step 2 "Memory Data Construction"): raw text (a conversation
  turn, an app notification, the OCR text of a screenshot) -> structured memories, each with
  a memory type and subclass of Table 7, the entities and the relation between them (for the
  Memory Graph Layer, §4.2), the event time and an optional end of validity. Relative dates
  ("next Monday", "tomorrow at 9") are resolved to absolute ones against the message time,
  as the paper's absolute date conversion does; :func:`resolve_date` repairs a relative phrase
  the model left in a date field.
* :data:`ANSWER` (§4.3 "LLM(Q ⊕ M)", §4.4 question answering): the question and the selected
  memories -> a short answer.
* :data:`AUTOFILL` (§4.4 autofill forms): a form field and the selected memories -> the
  field's value, or ``null`` when the memories do not hold it.
* :data:`QUESTIONS` (appendix A.1, step 3 "QA Pairs Construction"): one session of the
  user's memories (consecutive in time) -> question-answer pairs, each with the numbers of
  the memories its answer needs; questions that combine several memories are asked for
  first. The numbers are range-checked and the answer must be grounded in the cited
  memories (:func:`parse_questions`); they train the selection policy.

The instructions follow the paper's steps in our own words. Untrusted text (the raw text,
stored memories) is fenced and escaped (:func:`~memories_core.prompts.spec.fence`).

:func:`emg_reply` is a deterministic, rule-based stand-in that answers these prompts offline
(tests, the contract suite and benchmarks; ``ScriptedLLM(default=emg_reply)``). It splits the
text into sentences and guesses entities with capitalisation and keyword rules: it is not a
model, and never a judge of a prompt.
"""

from __future__ import annotations

from memories_core.prompts.emg.answer import (
    ANSWER,
    AUTOFILL,
    AnswerInput,
    AutofillInput,
    MemoryLine,
)
from memories_core.prompts.emg.answer import ANSWER_SYSTEM as ANSWER_SYSTEM
from memories_core.prompts.emg.answer import AUTOFILL_SYSTEM as AUTOFILL_SYSTEM
from memories_core.prompts.emg.answer import AutofillAnswer as AutofillAnswer
from memories_core.prompts.emg.answer import build_answer_messages as build_answer_messages
from memories_core.prompts.emg.answer import build_autofill_messages as build_autofill_messages
from memories_core.prompts.emg.answer import parse_answer as parse_answer
from memories_core.prompts.emg.answer import parse_autofill as parse_autofill
from memories_core.prompts.emg.dates import resolve_date
from memories_core.prompts.emg.extract import (
    EXTRACT,
    MEMORY_TYPES,
    TABLE7_SUBCLASSES,
    ExtractedMemory,
    ExtractInput,
    question_parts,
)
from memories_core.prompts.emg.extract import EXTRACT_SYSTEM as EXTRACT_SYSTEM
from memories_core.prompts.emg.extract import ExtractAnswer as ExtractAnswer
from memories_core.prompts.emg.extract import ExtractedMemoryModel as ExtractedMemoryModel
from memories_core.prompts.emg.extract import build_extract_messages as build_extract_messages
from memories_core.prompts.emg.extract import parse_extract as parse_extract
from memories_core.prompts.emg.questions import (
    QUESTIONS,
    GeneratedQuestion,
    QuestionsInput,
    emg_reply,
)
from memories_core.prompts.emg.questions import QUESTIONS_SYSTEM as QUESTIONS_SYSTEM
from memories_core.prompts.emg.questions import GeneratedPairModel as GeneratedPairModel
from memories_core.prompts.emg.questions import QuestionsAnswer as QuestionsAnswer
from memories_core.prompts.emg.questions import build_questions_messages as build_questions_messages
from memories_core.prompts.emg.questions import parse_questions as parse_questions

__all__ = [
    "ANSWER",
    "AUTOFILL",
    "EXTRACT",
    "MEMORY_TYPES",
    "QUESTIONS",
    "TABLE7_SUBCLASSES",
    "AnswerInput",
    "AutofillInput",
    "ExtractInput",
    "ExtractedMemory",
    "GeneratedQuestion",
    "MemoryLine",
    "QuestionsInput",
    "emg_reply",
    "question_parts",
    "resolve_date",
]
