"""Scoring memos against a question: dense and BM25 signals, the vote and option selection."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    from memories_core.interfaces import Embedder

__all__ = [
    "DEFAULT_ANSWER_PENALTY",
    "DEFAULT_BM25_SATURATION",
    "DEFAULT_DENSE_WEIGHT",
    "DEFAULT_SMOOTHING",
    "DEFAULT_THRESHOLD",
    "option_scores",
    "select_options",
    "vote",
]


#: Selector defaults, chosen by cross-validation over MemoChat's two sources (BENCHMARKS.md).
DEFAULT_THRESHOLD = 0.05


DEFAULT_DENSE_WEIGHT = 0.6


DEFAULT_BM25_SATURATION = 0.5


DEFAULT_SMOOTHING = 0.3


#: Selector default: score taken off an option whose whole title an answer names (BENCHMARKS.md).
DEFAULT_ANSWER_PENALTY = 0.75


_WORD = re.compile(r"[^\W_]+", re.UNICODE)


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


_STOP = frozenset(
    re.findall(
        r"\w+",
        "a an the and or of to in on at for with is are was were be been i you he she it we they "
        "me my your his her its our their this that these those do does did not no yes what which "
        "who how why when where there here so as by from if but about can could would should will "
        "just have has had am user bot assistant ok okay oh well yeah really very",
    )
)


def _tokens(text: str) -> list[str]:
    return [w for w in (m.lower() for m in _WORD.findall(text)) if w not in _STOP]


def _normalise(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return np.asarray(vectors / np.maximum(norms, 1e-9), dtype=np.float32)


def _bm25(query: Sequence[str], docs: Sequence[Sequence[str]]) -> npt.NDArray[np.float64]:
    """Okapi BM25 (k1 = 1.2, b = 0.75) of one query against a small set of options."""
    n = len(docs)
    average = sum(len(d) for d in docs) / max(n, 1) or 1.0
    frequency: Counter[str] = Counter(w for d in docs for w in set(d))
    scores = np.zeros(n)
    for i, doc in enumerate(docs):
        counts = Counter(doc)
        for word in set(query):
            tf = counts.get(word, 0)
            if tf:
                idf = math.log(1 + (n - frequency[word] + 0.5) / (frequency[word] + 0.5))
                scores[i] += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(doc) / average))
    return scores


# ------------------------------------------------------------------------------ LLM-free
def option_scores(
    query: str,
    options: Sequence[str],
    embedder: Embedder,
    *,
    dense_weight: float = DEFAULT_DENSE_WEIGHT,
    bm25_saturation: float = DEFAULT_BM25_SATURATION,
    smoothing: float = DEFAULT_SMOOTHING,
    answer_penalty: float = DEFAULT_ANSWER_PENALTY,
) -> tuple[list[str], npt.NDArray[np.float64]]:
    """Every query sentence's score for every option (what :func:`select_options` votes on).

    The query is split into sentences (a MemoChat query mixes lines of several topics,
    Table 7). Each sentence scores each option by a fused dense + lexical score,
    ``dense_weight * cosine + (1 - dense_weight) * bm25 / (bm25 + bm25_saturation)``; the
    answer rule (see :func:`select_options`) lowers some scores; then the scores are smoothed
    with the neighbouring sentences (weight ``smoothing``, since neighbouring lines usually
    share a topic).

    Args:
        query: The query sentence(s); not empty.
        options: ``"topic. summary"`` texts; at least one.
        embedder: Embeds sentences and options.
        dense_weight: Weight of the cosine similarity in the fused score.
        bm25_saturation: BM25 scores ``s`` enter as ``s / (s + bm25_saturation)``.
        smoothing: Weight of each neighbouring sentence's scores.
        answer_penalty: Score taken off an option an answer sentence names whole.

    Returns:
        The sentences and a ``(sentences, options)`` score matrix.
    """
    sentences = [s for s in _SENTENCE.split(query.strip()) if s.strip()] or [query]
    vectors = _normalise(embedder.embed_documents([*sentences, *options]))
    cosine = vectors[: len(sentences)] @ vectors[len(sentences) :].T
    docs = [_tokens(o) for o in options]
    lexical = np.array([_bm25(_tokens(s), docs) for s in sentences])
    scores = dense_weight * cosine + (1 - dense_weight) * lexical / (lexical + bm25_saturation)
    if answer_penalty:
        for i in range(1, len(sentences)):
            if sentences[i - 1].rstrip().endswith("?") and not sentences[i].rstrip().endswith("?"):
                said = set(_tokens(sentences[i]))
                for j, doc in enumerate(docs):
                    if doc and set(doc) <= said:
                        scores[i, j] -= answer_penalty
    if len(sentences) > 1 and smoothing:
        padded = np.vstack([np.zeros_like(scores[:1]), scores, np.zeros_like(scores[:1])])
        scores = (scores + smoothing * (padded[:-2] + padded[2:])) / (1 + 2 * smoothing)
    return sentences, np.asarray(scores, dtype=np.float64)


def vote(scores: npt.NDArray[np.float64], threshold: float = DEFAULT_THRESHOLD) -> list[int]:
    """Each row (query sentence) votes for its best column (option) if it reaches ``threshold``.

    Returns:
        The options voted for (0-based, sorted); empty means none of the others (NOTO).
    """
    return sorted({int(row.argmax()) for row in scores if row.size and row.max() >= threshold})


def select_options(
    query: str,
    options: Sequence[str],
    embedder: Embedder,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    dense_weight: float = DEFAULT_DENSE_WEIGHT,
    bm25_saturation: float = DEFAULT_BM25_SATURATION,
    smoothing: float = DEFAULT_SMOOTHING,
    answer_penalty: float = DEFAULT_ANSWER_PENALTY,
) -> list[int]:
    """The LLM-free memo selector: which options ``query`` relates to (0-based, sorted).

    The query's sentences score the options (:func:`option_scores`: fused dense + BM25,
    answer rule, smoothing with the neighbouring sentences) and each sentence votes for its
    best option if that option's score reaches ``threshold`` (:func:`vote`). No vote means
    none of the others (NOTO, Table 7's option).

    *Answer rule*: a sentence that answers the question just before it (it follows a
    sentence ending in ``?`` and is not a question itself) and names every content word of
    an option (``"who directed it? Sam Wood"`` against the option ``"Sam Wood"``) is about
    what the question asked after, which the question's pronoun points at ("it": the film),
    not about the person or thing it names; that option's score there is lowered by
    ``answer_penalty`` before smoothing. Options with summaries rarely have every word named.

    Defaults come from cross-validation over MemoChat's two test sources (BENCHMARKS.md,
    "MemoChat"); the answer rule never fires on options that carry summaries, so only
    TopiOCQA-style bare-title options can inform its penalty (split-half cross-validation
    within that source, same section).

    Args:
        query: The query sentence(s).
        options: ``"topic. summary"`` texts.
        embedder: Embeds sentences and options (the memory's embedder).
        threshold: Lowest fused score that counts as related.
        dense_weight: Weight of the cosine similarity in the fused score.
        bm25_saturation: BM25 scores ``s`` enter as ``s / (s + bm25_saturation)``.
        smoothing: Weight of each neighbouring sentence's scores.
        answer_penalty: Score taken off an option an answer sentence names whole.

    Returns:
        Indices into ``options``; empty when none is related.
    """
    if not options or not query.strip():
        return []
    _, scores = option_scores(
        query,
        options,
        embedder,
        dense_weight=dense_weight,
        bm25_saturation=bm25_saturation,
        smoothing=smoothing,
        answer_penalty=answer_penalty,
    )
    return vote(scores, threshold)
