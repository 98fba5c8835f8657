"""Answer-quality scoring for long-conversation QA (LoCoMo), and the prompts around it.

Scores (Maharana et al., 2024, "Evaluating Very Long-Term Conversational Memory of LLM
Agents", §4.1 and its released evaluation):

* **Token F1** on normalised answers: lower case, no punctuation, no articles (``a``, ``an``,
  ``the``) nor ``and``, commas removed, whitespace collapsed, every token Porter-stemmed.
* Per category: **multi-hop** (1) answers list several items, so the gold answer is split on
  commas and each part takes its best F1 against the comma-separated parts of the prediction
  (mean over gold parts); **open-domain** (3) keeps only the gold answer's first
  ``;``-separated alternative; **temporal** (2) and **single-hop** (4) use plain token F1;
  **adversarial** (5) questions have no answer in the conversation, so the reader is offered
  "not mentioned" as an option and scores 1 when it abstains, 0 otherwise.
* **BLEU-1**: clipped unigram precision of the normalised tokens with the brevity penalty
  (Papineni et al., 2002, with n = 1), as mem0 and Zep report beside F1.
* **LLM judge** (optional): CORRECT / WRONG against the gold answer, lenient on wording and
  on date formats, in the style mem0 (Chhikara et al., 2025, §4.1) and Zep published. A
  judge result is reported only when a judge model actually ran.

The reader prompt asks for a short phrase, with the date of the conversation's end, so that
dates can be resolved ("last year") the way LoCoMo's own QA prompt does.
"""

from __future__ import annotations

import random
import re
import string
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from memories_core.errors import MissingExtraError
from memories_core.types import ChatMessage

__all__ = [
    "NOT_MENTIONED",
    "adversarial_options",
    "answer_tokens",
    "bleu1",
    "is_abstention",
    "judge_messages",
    "locomo_f1",
    "multi_answer_f1",
    "normalise_answer",
    "parse_judge",
    "reader_messages",
    "resolve_option",
    "token_f1",
]

#: The option an adversarial question's reader is offered (LoCoMo §4.1).
NOT_MENTIONED = "Not mentioned in the conversation"

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
# Phrases that mean "the memory does not say": LoCoMo's two, plus the ones readers write.
_ABSTAIN = (
    "not mentioned",
    "no information available",
    "no information",
    "not enough information",
    "not specified",
    "does not mention",
    "doesn't mention",
    "unknown",
    "cannot be determined",
    "can't be determined",
)


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    try:
        from nltk.stem import PorterStemmer
    except ImportError as exc:  # pragma: no cover - nltk comes with the eval/dev extras
        raise MissingExtraError("nltk", "eval") from exc
    return PorterStemmer()


def normalise_answer(text: str) -> str:
    """LoCoMo's answer normalisation: lower case, no punctuation, articles or ``and``.

    Commas are removed first (they separate list items, which :func:`multi_answer_f1`
    handles before normalising).
    """
    text = str(text).replace(",", "").lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_tokens(text: str) -> list[str]:
    """Normalised, Porter-stemmed tokens of an answer."""
    stem = _stemmer().stem
    return [stem(word) for word in normalise_answer(text).split()]


def token_f1(prediction: str, gold: str) -> float:
    """Harmonic mean of token precision and recall after normalisation and stemming."""
    predicted = answer_tokens(prediction)
    wanted = answer_tokens(gold)
    same = sum((Counter(predicted) & Counter(wanted)).values())
    if same == 0:
        return 0.0
    precision = same / len(predicted)
    recall = same / len(wanted)
    return 2 * precision * recall / (precision + recall)


def multi_answer_f1(prediction: str, gold: str) -> float:
    """Multi-hop F1: each comma-separated gold item scored by its best predicted item."""
    predicted = [part.strip() for part in str(prediction).split(",")]
    wanted = [part.strip() for part in str(gold).split(",")]
    scores = [max(token_f1(p, g) for p in predicted) for g in wanted]
    return sum(scores) / len(scores)


def is_abstention(text: str) -> bool:
    """Whether a reader's answer says the memory holds no answer."""
    lowered = str(text).lower()
    return any(phrase in lowered for phrase in _ABSTAIN)


def locomo_f1(prediction: str, gold: str, category: int) -> float:
    """LoCoMo's per-category answer score in ``[0, 1]`` (see the module docstring).

    Raises:
        ValueError: for a category outside 1-5.
    """
    if category == 5:
        return 1.0 if is_abstention(prediction) else 0.0
    if category == 1:
        return multi_answer_f1(prediction, gold)
    if category == 3:
        return token_f1(prediction, str(gold).split(";")[0].strip())
    if category in (2, 4):
        return token_f1(prediction, gold)
    raise ValueError(f"LoCoMo categories are 1-5, got {category!r}")


def bleu1(prediction: str, gold: str) -> float:
    """Sentence BLEU-1 on normalised tokens (clipped unigram precision x brevity penalty).

    0.0 when the prediction is empty; no smoothing is needed for n = 1.
    """
    predicted = normalise_answer(prediction).split()
    wanted = normalise_answer(gold).split()
    if not predicted or not wanted:
        return 0.0
    clipped = sum((Counter(predicted) & Counter(wanted)).values())
    precision = clipped / len(predicted)
    if len(predicted) >= len(wanted):
        return precision
    import math

    return precision * math.exp(1 - len(wanted) / len(predicted))


def adversarial_options(question_id: str, wrong: str, *, seed: int = 0) -> list[str]:
    """The two options of an adversarial question, in a fixed order per question and seed.

    LoCoMo offers "not mentioned" beside the misleading answer, in random order; the order
    here is drawn from ``(seed, question_id)`` so reruns and resumed runs ask the same thing.
    """
    options = [NOT_MENTIONED, str(wrong)]
    random.Random(f"{seed}:{question_id}").shuffle(options)
    return options


_LETTER = re.compile(r"^\s*\(?([a-h])\)?(?:[.:)]|\s|$)", re.IGNORECASE)


def resolve_option(prediction: str, options: Sequence[str]) -> str:
    """The option a reader chose by letter ("(b)", "a", "b) ..."), else the reply unchanged.

    Readers asked to pick among lettered options often answer with the letter alone; the
    answer is scored on the option's text, as the reader meant it.
    """
    text = str(prediction).strip()
    match = _LETTER.match(text)
    if match is None:
        return text
    index = "abcdefgh".index(match.group(1).lower())
    rest = text[match.end() :].strip()
    if index >= len(options) or (rest and len(rest.split()) > 1 and not _mentions(rest, options)):
        return text  # a sentence that merely starts with "a": not a letter choice
    return options[index]


def _mentions(rest: str, options: Sequence[str]) -> bool:
    lowered = rest.lower()
    return any(option.lower()[:20] in lowered for option in options)


def reader_messages(
    question: str,
    memory: str,
    *,
    now: datetime | None = None,
    options: Sequence[str] | None = None,
) -> list[ChatMessage]:
    """The reader's prompt: memories, the date, the question, "answer in a short phrase".

    Args:
        question: The question.
        memory: What the memory recalled, rendered as the adapters render it (may be empty).
        now: When the question is asked (lets the reader resolve relative dates).
        options: For adversarial questions, the options to choose from.
    """
    system = (
        "You answer questions about a long conversation between two people, using only the "
        "memories given. Reply with a short phrase (a few words, a name, a date or a list), "
        "not a sentence. Resolve relative dates against the dates in the memories. If the "
        f"memories do not contain the answer, reply exactly: {NOT_MENTIONED}."
    )
    parts = [f"Memories:\n{memory.strip() or '(none)'}"]
    if now is not None:
        parts.append(f"Today is {now.strftime('%d %B %Y')}.")
    parts.append(f"Question: {question.strip()}")
    if options:
        letters = "abcdefgh"
        listed = " ".join(f"({letters[i]}) {option}" for i, option in enumerate(options))
        parts.append(f"Choose one option and reply with its text: {listed}")
    parts.append("Short answer:")
    return [ChatMessage("system", system), ChatMessage("user", "\n\n".join(parts))]


def judge_messages(question: str, gold: str, answer: str) -> list[ChatMessage]:
    """An LLM judge's prompt: label the answer CORRECT or WRONG against the gold answer.

    Lenient as mem0's and Zep's judges are: an answer that names the same thing, the same
    date in another format, or the gold answer with more detail is correct; one that misses
    the point or contradicts the gold answer is wrong.
    """
    instructions = (
        "You grade an answer to a question about a conversation. Compare it with the gold "
        "answer. Be generous about wording: if the answer refers to the same thing, person, "
        "place or time as the gold answer (a date in another format, a relative date that "
        "resolves to it, or the gold answer plus extra detail), it is CORRECT. If it misses "
        "the gold answer, contradicts it, or says the information is not available when the "
        "gold answer gives it, it is WRONG. Reply with one word: CORRECT or WRONG."
    )
    body = (
        f"Question: {question.strip()}\nGold answer: {str(gold).strip()}\n"
        f"Answer to grade: {str(answer).strip() or '(empty)'}\nLabel:"
    )
    return [ChatMessage("system", instructions), ChatMessage("user", body)]


def parse_judge(text: str) -> bool | None:
    """``True`` for CORRECT, ``False`` for WRONG, ``None`` if the judge said neither."""
    upper = str(text).upper()
    correct = re.search(r"\bCORRECT\b", upper)
    wrong = re.search(r"\b(WRONG|INCORRECT)\b", upper)
    if correct and not wrong:
        return True
    if wrong and not correct:
        return False
    if correct and wrong:  # both words: the first one is the label
        return correct.start() < wrong.start()
    return None
