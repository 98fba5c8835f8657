"""MemoChat (Lu et al., 2023): structured memos, memo retrieval and chat with memo.

The paper's pipeline (§3.2, Figure 3) is *memorization-retrieval-response*:

* **memo writing** (Table 6): recent dialogue lines are kept in a buffer; when it exceeds a
  budget (the released code: about 1,024 words or 10 lines), or the session ends, the LLM
  partitions the buffer into topics with ``topic``, ``summary``, ``start``, ``end`` over
  numbered lines, and memo
  entries ``{topic, summary, dialogs}`` are stored; the last two lines stay in the buffer;
* **memo retrieval** (Table 7): the LLM is shown the options ``(i) topic. summary`` plus a
  none-of-the-others option (NOTO, at a pseudo-random place among them as in §3.2) and
  answers ``N#M`` (``{"options": [N, M]}`` under schema-constrained decoding, where the model
  offers it);
* **chat with memo** (Table 8): the reply prompt holds the related evidences, the recent
  dialogs and the user input.

Here memos are records of the engine (kind ``"memo"``; text ``"topic. summary"``; metadata
``topic``, ``summary``, ``start``, ``end``; ``source_ids`` = the covered turns). The buffer is
the user's turns that no memo covers yet: a covered turn carries ``attrs[<name>_memo]`` in its
state, written in the transaction that stores the memo. A save that makes the buffer reach
the budget writes a ``write_memo`` job in its own transaction (a session end writes one that
keeps no line); an unparseable answer raises
:class:`~memories_core.engine.JobFailed`, so the job stays pending and is retried with
backoff: lines are never lost.

**Recall follows the model's choice.** With an LLM, :meth:`MemoChatMemory.recall` (what every
generic adapter calls) returns the memos the model chose (:meth:`MemoChatMemory.retrieve`),
each with the dialog lines it covers, and nothing else from the memo: a NOTO answer recalls
no memo. The lines no memo covers yet (the buffer, Table 8's recent dialogs; the model was
not asked about them) follow when they share a content word with the query, so a fact said
a moment ago is found before its memo is written, and an off-topic query recalls nothing.
If the model call fails or its answer cannot be read, the LLM-free selector chooses instead.
LLM-free, recall is the engine's fused search over memos and turns.

**Memos as search keys of the raw turns.** Recall searches memos and turns together; a memo
that ranks brings the dialog lines it covers (its turns are rendered under it), so a query
that matches a topic or a summary but none of the turns' words still finds those turns.
The memo-writing transaction also writes, for every covered turn, a record of kind
``"search_key"`` whose text is the memo's ``"topic. summary"`` and whose
``metadata["key_for"]`` is the turn's id (``metadata["memo_id"]`` the memo's; the key takes
the turn's session, so clearing that session or the user removes it with the turn). The
engine's plain recall can rank a turn by its keys; MemoChat's own searches name their kinds
(``memo``, ``turn``), so the keys never show up as results themselves.

**LLM-free mode** (``llm=None`` or ``mode="llm_free"``): TextTiling-style segmentation by the
embedding similarity of neighbouring exchanges with speaker-turn cues
(:func:`segment_lines`), an extractive topic and summary, and selection by a fused dense +
BM25 score with a threshold and an answer rule (:func:`select_options`). Same records, same
interfaces.
"""

from __future__ import annotations

import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from memories_core.engine import Derivation, JobFailed, check_k, check_query, check_scope
from memories_core.errors import ConfigurationError, LLMError, ParseError
from memories_core.grounding import find_ungrounded, log_rejection
from memories_core.llms.base import run_with_timeout
from memories_core.mechanisms.base import MemoryBase
from memories_core.mechanisms.reflection import DEFAULT_RECALL_BUDGET
from memories_core.prompts.memochat import (
    MEMO_RETRIEVAL,
    MEMO_WRITING,
    MemoSpan,
    RetrievalInput,
    WritingInput,
    build_chat_messages,
    noto_position,
)
from memories_core.prompts.spec import run_spec
from memories_core.types import Job, JobSpec, MemoryRecord, Recall, Scope, ScoredRecord, new_id

if TYPE_CHECKING:
    import numpy.typing as npt

    from memories_core.interfaces import LLM, Embedder
    from memories_core.retrieval import RecallBackend, RecallRequest
    from memories_core.retrieval.fusion import Ranking

__all__ = [
    "SEARCH_KEY_KIND",
    "LLMOptionSource",
    "MemoChatMemory",
    "MemoEntry",
    "extractive_memo",
    "option_scores",
    "segment_lines",
    "select_options",
    "vote",
]

logger = logging.getLogger(__name__)

#: Selector defaults, chosen by cross-validation over MemoChat's two sources (BENCHMARKS.md).
DEFAULT_THRESHOLD = 0.05
DEFAULT_DENSE_WEIGHT = 0.6
DEFAULT_BM25_SATURATION = 0.5
DEFAULT_SMOOTHING = 0.3
#: Selector default: score taken off an option whose whole title an answer names (BENCHMARKS.md).
DEFAULT_ANSWER_PENALTY = 0.75
#: Record kind of the extra search keys a memo gives the raw turns it covers.
SEARCH_KEY_KIND = "search_key"
#: Segmenter defaults, chosen by cross-validation over MemoChat's two sources (BENCHMARKS.md):
#: exchanges on each side of a gap, the cutoff (mean + this * std of the depth scores), and
#: what a back-reference (shift cue) adds and a bare pronoun (continuation cue) takes off.
DEFAULT_WINDOW = 3
DEFAULT_DEPTH_CUTOFF = 1.0
DEFAULT_SHIFT_CUE = 0.4
DEFAULT_CONTINUATION_CUE = 0.2

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# A user line that points back at something said earlier ("the hormone mentioned above",
# "the third one", "the latter") moves the talk to that thing; one that goes on with a bare
# pronoun ("is it also found in animals?") stays on the topic.
_SHIFT_CUE = re.compile(
    r"\b(mentioned|aforesaid|aforementioned|latter|former|above|(?:the|this|that)\s+"
    r"(?:first|second|third|fourth|fifth|last|other|next)\b)",
    re.I,
)
_CONTINUATION_CUE = re.compile(r"\b(it|its|they|them|their|he|she|his|her|him)\b", re.I)
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


def segment_lines(
    lines: Sequence[str],
    embedder: Embedder,
    *,
    window: int = DEFAULT_WINDOW,
    depth_cutoff: float = DEFAULT_DEPTH_CUTOFF,
    shift_cue: float = DEFAULT_SHIFT_CUE,
    continuation_cue: float = DEFAULT_CONTINUATION_CUE,
) -> list[tuple[int, int]]:
    """TextTiling-style topic segmentation by embedding similarity (LLM-free memo writing).

    Lines are grouped into exchanges: a line by the speaker of the first line (the user,
    in a chat) opens one, the replies that follow join it; topics change between exchanges
    (on MemoChat's writing items every reference topic starts at a user line). Each gap
    between two exchanges gets the cosine similarity of the mean embeddings of the
    ``window`` exchanges before and after it; a gap's *depth* is how far that similarity
    lies below the highest similarity on each side (Hearst's TextTiling, with embeddings
    for word counts). Gaps deeper than ``mean + depth_cutoff * std`` are boundaries.

    Speaker-turn cues move that cutoff per gap: when the line opening the next exchange
    points back at something said earlier (``"the hormone mentioned above"``, ``"the third
    one"``, ``"the latter"``: the user turns to a thing an answer named) its depth counts
    ``shift_cue`` more; when it goes on with a bare pronoun (``"is it also found in
    animals?"``) it counts ``continuation_cue`` less. A gap with no depth is never a boundary.

    Args:
        lines: ``"speaker: content"`` lines, oldest first.
        embedder: Embeds the exchanges.
        window: Exchanges on each side of a gap.
        depth_cutoff: Standard deviations above the mean depth a boundary needs.
        shift_cue: Depth added at a gap whose next exchange opens with a back-reference.
        continuation_cue: Depth taken off at a gap whose next exchange opens with a pronoun.

    Returns:
        1-based inclusive ``(start, end)`` ranges covering every line, in order.
    """
    n = len(lines)
    if n == 0:
        return []
    starts, units = exchanges(lines)
    if len(units) < 2:
        return [(1, n)]
    sims = gap_similarities(_normalise(embedder.embed_documents(units)), window)
    cuts = depth_boundaries(
        sims,
        lines,
        starts,
        depth_cutoff=depth_cutoff,
        shift_cue=shift_cue,
        continuation_cue=continuation_cue,
    )
    begins = [1, *cuts]
    return [(b, (begins[j + 1] - 1) if j + 1 < len(begins) else n) for j, b in enumerate(begins)]


def exchanges(lines: Sequence[str]) -> tuple[list[int], list[str]]:
    """Step 1 of :func:`segment_lines`: the exchanges of ``lines``.

    A line by the speaker of the first line opens an exchange and the replies after it join
    it. Returns the 0-based index of each exchange's first line and each exchange's text
    (the contents of its lines, speakers dropped).
    """
    opener = lines[0].split(":", 1)[0].strip().lower() if lines and ":" in lines[0] else None
    starts = [
        i
        for i, line in enumerate(lines)
        if i == 0 or (opener is None or line.split(":", 1)[0].strip().lower() == opener)
    ]
    ends = [*starts[1:], len(lines)]
    units = [
        " ".join(x.split(": ", 1)[-1] for x in lines[s:e])
        for s, e in zip(starts, ends, strict=True)
    ]
    return starts, units


def gap_similarities(vectors: npt.NDArray[np.float32], window: int) -> list[float]:
    """Step 2 of :func:`segment_lines`: the similarity at each gap between exchanges.

    The cosine of the mean vectors of the ``window`` exchanges on each side of the gap
    (TextTiling's block comparison, with embeddings for word counts).
    """
    sims = []
    for gap in range(1, len(vectors)):
        left = vectors[max(0, gap - window) : gap].mean(axis=0)
        right = vectors[gap : gap + window].mean(axis=0)
        sims.append(float(left @ right / max(np.linalg.norm(left) * np.linalg.norm(right), 1e-9)))
    return sims


def depth_boundaries(
    sims: Sequence[float],
    lines: Sequence[str],
    starts: Sequence[int],
    *,
    depth_cutoff: float,
    shift_cue: float,
    continuation_cue: float,
) -> list[int]:
    """Step 3 of :func:`segment_lines`: the 1-based first lines of every topic but the first.

    A gap's depth is how far its similarity lies below the highest on each side; a gap is a
    boundary when its depth, moved by the speaker-turn cues of the line that opens the next
    exchange, exceeds ``mean + depth_cutoff * std`` of the depths (and it has any depth).
    """
    if not sims:
        return []
    depths = [(max(sims[: i + 1]) - sim) + (max(sims[i:]) - sim) for i, sim in enumerate(sims)]
    cutoff = float(np.mean(depths) + depth_cutoff * np.std(depths))
    cuts = []
    for i, depth in enumerate(depths):
        opening = lines[starts[i + 1]].split(": ", 1)[-1]
        if _SHIFT_CUE.search(opening):
            depth_score = depth + shift_cue
        elif _CONTINUATION_CUE.search(opening):
            depth_score = depth - continuation_cue
        else:
            depth_score = depth
        if depth > 0 and depth_score > cutoff:
            cuts.append(starts[i + 1] + 1)
    return cuts


def extractive_memo(
    lines: Sequence[str], embedder: Embedder, *, skip: Sequence[int] = ()
) -> tuple[str, str]:
    """An extractive topic and summary of one segment (LLM-free memo writing).

    The topic is the segment's most frequent content words (up to three, by first use);
    the summary is its most central line (closest to the segment's mean embedding), cut to
    200 characters. Lines at the 0-based positions ``skip`` (lines an earlier memo already
    summarised) are not chosen unless no other line is left.
    """
    words = [w for line in lines for w in _tokens(line.split(": ", 1)[-1]) if len(w) > 2]
    counts = Counter(words)
    top = sorted(counts, key=lambda w: (-counts[w], words.index(w)))[:3]
    topic = " ".join(top) or "conversation"
    vectors = _normalise(embedder.embed_documents(list(lines)))
    centre = vectors.mean(axis=0)
    scores = vectors @ centre
    if len(skip) < len(lines):
        scores[list(skip)] = -np.inf
    best = lines[int(np.argmax(scores))]
    summary = " ".join(best.split())
    return topic, summary[:197] + "..." if len(summary) > 200 else summary


# ------------------------------------------------------------------------------ entries
@dataclass(frozen=True)
class MemoEntry:
    """One memo entry ``{topic, summary, dialogs}`` (§3.2) as recalled.

    Attributes:
        id: The memo record's id.
        topic: Topic phrase.
        summary: One or two sentences.
        dialogs: The covered dialogue lines ``"speaker: content"``, oldest first.
        created_at: When the last covered line was said.
        score: Retrieval score (1.0 for an LLM's choice).
    """

    id: str
    topic: str
    summary: str
    dialogs: tuple[str, ...] = ()
    created_at: datetime | None = None
    score: float = 0.0

    @property
    def option(self) -> str:
        """The option text shown for retrieval: ``"topic. summary"`` (Table 7)."""
        return f"{self.topic}. {self.summary}".strip()


@dataclass(frozen=True)
class LLMOptionSource:
    """A candidate source where an LLM chooses among memo options (Table 7).

    For composing a custom :class:`~memories_core.retrieval.Pipeline` (fused with other
    sources); :class:`MemoChatMemory` itself returns the model's choice unfused. Memo
    candidates are pre-selected by the engine's dense and lexical rankings (at most
    ``max_options``, so a memo that grows without bound still fits one prompt); the LLM is
    shown them as ``(i) topic. summary`` with a NOTO option and its ``N#M`` answer is parsed
    tolerantly. Chosen memos come back with score 1.0, in option order. A failed model call,
    an unparseable answer or a choice that takes longer than ``budget`` yields no candidates
    (the dense and lexical sources still answer) and is reported to ``on_failure``.

    Attributes:
        llm: The model choosing.
        max_options: Options in one prompt.
        weight: Fusion weight.
        name: Label.
        kind: Record kind of the options.
        budget: Seconds a recall waits for the choice (``None``: no limit).
        on_failure: Called with ``"memo_choice"`` when the choice failed or timed out (the
            memory counts it in ``usage.failures``).
    """

    llm: LLM
    max_options: int = 20
    weight: float = 1.0
    name: str = "llm_options"
    kind: str = "memo"
    budget: float | None = DEFAULT_RECALL_BUDGET
    on_failure: Callable[[str], None] | None = field(default=None, compare=False, repr=False)
    calls: list[int] = field(default_factory=list, compare=False, repr=False)

    def candidates(self, request: RecallRequest, backend: RecallBackend, depth: int) -> Ranking:
        """Ask the LLM which pre-selected memos the query relates to."""
        where: Any = {"kind": self.kind}
        if request.filter is not None:
            where = {"$and": [request.filter, where]}
        vector = backend.embed_query(request.query)
        dense = backend.dense(vector, user_id=request.user_id, depth=self.max_options, where=where)
        lexical = backend.lexical(
            request.query, user_id=request.user_id, depth=self.max_options, where=where
        )
        ids: list[str] = []
        for pair in zip(lexical, dense, strict=False):
            ids += [i for i, _ in pair if i not in ids]
        ids += [i for i, _ in [*lexical, *dense] if i not in ids]
        ids = ids[: self.max_options]
        if not ids:
            return []
        loaded = backend.load(ids, user_id=request.user_id)
        memos = [loaded[i] for i in ids if i in loaded]
        chosen = choose_memos(self.llm, request.query, [m.text for m in memos], budget=self.budget)
        self.calls.append(len(memos))
        if chosen is None:
            if self.on_failure is not None:
                self.on_failure("memo_choice")
            return []
        return [(memos[i].id, 1.0) for i in chosen]


def choose_memos(
    llm: LLM, query: str, options: Sequence[str], *, budget: float | None = None
) -> list[int] | None:
    """Ask ``llm`` which of ``options`` relate to ``query`` (0-based; ``None`` on failure).

    NOTO is shown at :func:`~memories_core.prompts.memochat.noto_position` (§3.2: a random
    place among the options, here reproducible); ``[]`` means the model chose NOTO.
    ``budget``: seconds to wait for the answer (a repair retry included); past it the
    choice has failed (``None``).
    """
    if not options:
        return []
    inputs = RetrievalInput(query, tuple(options), noto_at=noto_position(query, options))
    noto = inputs.noto()
    try:
        picked = run_with_timeout(
            lambda: run_spec(llm, MEMO_RETRIEVAL, inputs), budget, label="memo retrieval"
        )
    except (LLMError, ParseError) as exc:
        logger.warning("memo retrieval by the LLM failed: %s", exc)
        return None
    return [(p - 1) if p < noto else (p - 2) for p in picked]


# ------------------------------------------------------------------------------ memory
class MemoChatMemory(MemoryBase):
    """MemoChat's memo (Lu et al., 2023, §3.2): topic memos written from a buffer of lines.

    Example:
        >>> from memories_core import MemoChatMemory, Scope, Turn
        >>> from memories_core.embedders import HashingEmbedder
        >>> memory = MemoChatMemory(embedder=HashingEmbedder(), max_lines=4)
        >>> memory.save([Turn("user", "I study quantum entanglement."),
        ...              Turn("assistant", "Entangled particles share one state."),
        ...              Turn("user", "Bowing is polite in Japan."),
        ...              Turn("assistant", "Yes, business cards are given with two hands.")],
        ...             Scope("ann"))
        >>> len(memory.memos(Scope("ann"))) >= 1
        True

    Args:
        llm: Writes memos and chooses among them. ``None`` (and no engine model): the
            LLM-free mode.
        mode: ``"llm"``, ``"llm_free"`` or ``None`` (``"llm"`` if a model is available).
        max_lines: Buffer size (lines) that triggers memo writing (released code: 10).
        max_words: Buffer size (words) that triggers memo writing (released code: 1,024).
        keep_lines: Lines kept in the buffer after a memo is written (paper: 2).
        k: Records a recall returns by default.
        threshold: Threshold of the LLM-free selector (:func:`select_options`).
        max_options: Memo options shown to the LLM in one retrieval prompt.
        budget: Seconds a recall or :meth:`retrieve` waits for the LLM's memo choice
            (``None``: no limit). Past it, or when the choice fails, a recall keeps the dense
            and lexical candidates and :meth:`retrieve` chooses LLM-free; counted in
            ``usage.failures["memo_choice"]``.
        **kwargs: Engine or storage options of :class:`~memories_core.mechanisms.base.MemoryBase`.
    """

    mechanism_name: ClassVar[str] = "memochat"
    recall_kinds: ClassVar[tuple[str, ...]] = ("memo", "turn")
    index_turns: ClassVar[bool] = True

    def __init__(
        self,
        *,
        llm: LLM | None = None,
        mode: str | None = None,
        max_lines: int = 10,
        max_words: int = 1024,
        keep_lines: int = 2,
        k: int = 3,
        threshold: float = DEFAULT_THRESHOLD,
        max_options: int = 20,
        budget: float | None = DEFAULT_RECALL_BUDGET,
        **kwargs: Any,
    ) -> None:
        if mode not in (None, "llm", "llm_free"):
            raise ConfigurationError(f"mode must be 'llm' or 'llm_free', got {mode!r}")
        if not (isinstance(max_lines, int) and max_lines >= 2 and 0 <= keep_lines < max_lines):
            raise ConfigurationError("need max_lines >= 2 and 0 <= keep_lines < max_lines")
        if not (isinstance(max_words, int) and max_words >= 1):
            raise ConfigurationError("max_words must be a positive int")
        super().__init__(k=k, llm=llm, **kwargs)
        if mode is None:
            mode = "llm" if (llm is not None or self.engine.llm is not None) else "llm_free"
        if mode == "llm" and llm is None and self.engine.llm is None:
            raise ConfigurationError("mode='llm' needs an llm")
        self.mode = mode
        self.max_lines = max_lines
        self.max_words = max_words
        self.keep_lines = keep_lines
        self.threshold = threshold
        self.max_options = max_options
        self.budget = budget

    @property
    def _covered_key(self) -> str:
        return f"{self.name}_memo"

    @property
    def _kept_key(self) -> str:
        return f"{self.name}_kept"

    # ------------------------------------------------------------------ reading
    def buffer(self, scope: Scope) -> list[MemoryRecord]:
        """``scope.user_id``'s turns not covered by a memo yet, oldest first."""
        scope = check_scope(scope)
        return self._buffer(scope.user_id)

    def _buffer(self, user_id: str) -> list[MemoryRecord]:
        where = {"kind": "turn", f"attrs.{self._covered_key}": {"$exists": False}}
        return self.engine.records(user_id, where=where)

    def memos(self, scope: Scope) -> list[MemoEntry]:
        """Every memo entry of ``scope.user_id``, oldest first, with its dialogs."""
        scope = check_scope(scope)
        records = self.engine.records(scope.user_id, where={"kind": "memo"})
        return self._entries(scope.user_id, [(r, 0.0) for r in records])

    def _entries(
        self, user_id: str, pairs: Sequence[tuple[MemoryRecord, float]]
    ) -> list[MemoEntry]:
        wanted = [i for record, _ in pairs for i in record.source_ids]
        turns = {r.id: r for r in self.engine.get(user_id, wanted)} if wanted else {}
        out = []
        for record, score in pairs:
            meta = record.metadata
            dialogs = tuple(turns[i].text for i in record.source_ids if i in turns)
            out.append(
                MemoEntry(
                    record.id,
                    str(meta.get("topic", record.text)),
                    str(meta.get("summary", "")),
                    dialogs,
                    record.created_at,
                    score,
                )
            )
        return out

    def retrieve(self, query: str, scope: Scope, *, now: datetime | None = None) -> list[MemoEntry]:
        """Memo retrieval (§3.2, Table 7): the memo entries ``query`` relates to.

        With an LLM, memo candidates are pre-selected by the fused ranking and the LLM
        chooses among them (a NOTO answer returns ``[]``). LLM-free, or when the model call
        fails, cannot be read or misses its ``budget`` seconds, the fused selector
        :func:`select_options` chooses with this memory's threshold.

        Raises:
            InvalidInputError: on an empty query.
            MissingUserError: if ``scope`` has no user.
        """
        scope = check_scope(scope)
        check_query(query)
        chosen = self._chosen(query, scope, now)
        return self._entries(scope.user_id, [(h.record, h.score) for h in chosen])

    def _chosen(self, query: str, scope: Scope, now: datetime | None) -> list[ScoredRecord]:
        """The memos chosen for ``query``, in the pre-selection's order (best first).

        The fused search pre-selects up to ``max_options`` memos; the model (or, LLM-free or
        when the model fails, :func:`select_options`) chooses among them.
        """
        hits = self.engine.search(
            query,
            scope.user_id,
            k=self.max_options,
            kinds=("memo",),
            now=now,
            fusion=self.fusion,
            pipeline=self.pipeline,
        )
        if not hits:
            return []
        texts = [h.record.text for h in hits]
        chosen: list[int] | None = None
        if self.mode == "llm":
            chosen = choose_memos(self._llm(scope), query, texts, budget=self.budget)
            if chosen is None:
                # Documented fallback: a failed or late choice is made LLM-free.
                self.engine.count_failure("memo_choice")
        if chosen is None:
            chosen = select_options(query, texts, self.embedder, threshold=self.threshold)
        return [hits[i] for i in sorted(chosen)]

    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Up to ``k`` records for ``query``: with an LLM, the memos it chose (§3.2, Table 7).

        With an LLM: the memos :meth:`retrieve` chooses (possibly none: NOTO), then buffered
        lines (no memo covers them yet) that share a content word with the query, newest
        first among equals; the context shows each memo with its dialog lines. LLM-free: the
        engine's fused search over memos and turns.

        Raises:
            InvalidInputError: on an empty query or a bad ``k``.
            MissingUserError: if ``scope`` has no user.
        """
        if self.mode != "llm":
            return super().recall(query, scope, k=k, now=now)
        scope = check_scope(scope)
        check_query(query)
        want = check_k(self.default_k if k is None else k)
        hits = self._chosen(query, scope, now)[:want]
        if len(hits) < want:
            hits += self._buffered_hits(query, scope.user_id)[: want - len(hits)]
        return Recall(query=query, records=tuple(hits), context=self._render(hits))

    def _buffered_hits(self, query: str, user_id: str) -> list[ScoredRecord]:
        """Buffered lines sharing a content word with ``query``; score = share of its words."""
        wanted = set(_tokens(query))
        if not wanted:
            return []
        scored = []
        for age, record in enumerate(reversed(self._buffer(user_id))):
            shared = len(wanted & set(_tokens(record.text.split(": ", 1)[-1])))
            if shared:
                scored.append((shared / len(wanted), age, record))
        scored.sort(key=lambda item: (-item[0], item[1]))
        return [ScoredRecord(record, score) for score, _, record in scored]

    def respond(
        self,
        user_input: str,
        scope: Scope,
        *,
        llm: LLM | None = None,
        recent: int = 10,
        save: bool = True,
    ) -> str:
        """Chat with memo (§3.2, Table 8): retrieve evidences, reply, and save the exchange.

        Args:
            user_input: What the user says.
            scope: Whose memo.
            llm: The model replying (default: this memory's).
            recent: Recent dialog lines shown (from the end of the buffer).
            save: Save the user input and the reply as turns afterwards.

        Raises:
            ConfigurationError: without any model.
            LLMError: if the model call fails (nothing is saved then).
        """
        scope = check_scope(scope)
        model = llm or self._llm(scope)
        messages = self.chat_messages(user_input, scope, recent=recent)
        reply = model.generate(messages).strip()
        if save:
            from memories_core.types import Turn

            self.save([Turn("user", user_input), Turn("assistant", reply)], scope)
        return reply

    def chat_messages(self, user_input: str, scope: Scope, *, recent: int = 10) -> list[Any]:
        """The Table 8 prompt for ``user_input``: related evidences, recent dialogs, input."""
        scope = check_scope(scope)
        evidences = self.retrieve(user_input, scope)
        lines = [r.text for r in self._buffer(scope.user_id)][-recent:] if recent else []
        return build_chat_messages(user_input, evidences, lines)

    # ------------------------------------------------------------------ engine hooks
    def _turn_jobs(self, records: Sequence[MemoryRecord]) -> Iterable[JobSpec]:
        if not records:
            return ()
        user_id = records[0].user_id
        buffered = {r.id: r for r in self._buffer(user_id)}
        buffered.update({r.id: r for r in records})
        words = sum(len(r.text.split()) for r in buffered.values())
        if len(buffered) >= self.max_lines or words >= self.max_words:
            return [JobSpec(self.name, "write_memo", "buffer", {})]
        return ()

    def _session_jobs(self, user_id: str, session_id: str) -> Iterable[JobSpec]:
        """A session end writes the whole buffer into the memo (no line kept: the talk is over)."""
        return [JobSpec(self.name, "write_memo", f"flush:{session_id}", {"final": True})]

    def _chunk(self, buffer: Sequence[MemoryRecord]) -> list[MemoryRecord]:
        """The oldest lines that fit one writing prompt (a long outage grows the buffer)."""
        chunk: list[MemoryRecord] = []
        words = 0
        for record in buffer:
            size = len(record.text.split())
            if chunk and (len(chunk) >= 2 * self.max_lines or words + size > 2 * self.max_words):
                break
            chunk.append(record)
            words += size
        return chunk

    def _run_job(self, job: Job) -> Derivation | None:
        if job.kind != "write_memo":
            return None
        user_id = job.user_id
        keep = 0 if job.payload.get("final") else self.keep_lines
        buffer = self._buffer(user_id)
        chunk = self._chunk(buffer)
        if len(chunk) < len(buffer):
            keep = 0  # more lines follow this chunk: they give the next memo its context
        if len(chunk) <= keep:
            return None
        lines = [r.text for r in chunk]
        if self.mode == "llm":
            try:
                spans = run_spec(
                    self._llm(Scope(user_id)), MEMO_WRITING, WritingInput(tuple(lines))
                )
            except (LLMError, ParseError) as exc:
                raise JobFailed("memochat", f"memo writing failed: {exc}") from exc
        else:
            spans = []
            for start, end in segment_lines(lines, self.embedder):
                seen = [
                    i - start
                    for i in range(start, end + 1)
                    if chunk[i - 1].state.attrs.get(self._kept_key)
                ]
                topic, summary = extractive_memo(lines[start - 1 : end], self.embedder, skip=seen)
                spans.append(MemoSpan(topic, summary, start, end))
        memos = []
        owner: dict[str, str] = {}
        rejected: list[str] = []
        for span in spans:
            covered = chunk[span.start - 1 : span.end]
            earlier = [r.state.attrs.get(self._kept_key) for r in covered]
            if all(earlier):
                # Only lines kept from the previous memo: they are in it already.
                owner.update({r.id: str(m) for r, m in zip(covered, earlier, strict=True)})
                continue
            rejection = (
                find_ungrounded({"topic": span.topic, "summary": span.summary}, lines)
                if self.mode == "llm"
                else None
            )
            if rejection is not None:
                # No memo for these lines; they leave the buffer as turns (still recalled).
                rejected.append(log_rejection(self.name, "memo", rejection))
                self.engine.count_failure("grounding")
                owner.update({r.id: "" for r in covered})
                continue
            memos.append(
                MemoryRecord(
                    id=new_id(),
                    user_id=user_id,
                    kind="memo",
                    text=f"{span.topic}. {span.summary}".strip(),
                    created_at=covered[-1].created_at,
                    session_id=covered[-1].session_id,
                    metadata={
                        "topic": span.topic,
                        "summary": span.summary,
                        "start": span.start,
                        "end": span.end,
                        "mode": self.mode,
                    },
                    source_ids=tuple(r.id for r in covered),
                )
            )
        keys = [
            MemoryRecord(
                id=new_id(),
                user_id=user_id,
                kind=SEARCH_KEY_KIND,
                text=memo.text,
                created_at=turn.created_at,
                session_id=turn.session_id,
                metadata={"key_for": turn.id, "memo_id": memo.id, "mechanism": self.name},
                source_ids=(turn.id,),
            )
            for memo in memos
            for turn in chunk
            if turn.id in memo.source_ids
        ]
        settled = chunk[: len(chunk) - keep] if keep else chunk
        kept = chunk[len(settled) :]
        owner.update({r.id: m.id for m in memos for r in chunk if r.id in m.source_ids})
        state: dict[str, dict[str, Any]] = {
            r.id: {"attrs": {self._covered_key: owner[r.id]}} for r in settled
        }
        state.update({r.id: {"attrs": {self._kept_key: owner[r.id]}} for r in kept})
        reason = "; ".join(["memochat: written into a memo", *rejected])
        return Derivation(add=[*memos, *keys], state=state, reason=reason)

    # ------------------------------------------------------------------ recall
    def _render(self, hits: Sequence[ScoredRecord]) -> str:
        """Memos with their dialogs, then turns no shown memo covers (one block)."""
        memos = [h for h in hits if h.record.kind == "memo"]
        if not memos:
            return "\n".join(h.record.text for h in hits)
        user_id = memos[0].record.user_id
        entries = self._entries(user_id, [(h.record, h.score) for h in memos])
        shown = {i for h in memos for i in h.record.source_ids}
        blocks = []
        for entry in entries:
            dialogs = "\n".join(f"  {d}" for d in entry.dialogs)
            blocks.append(f"[memo] {entry.option}" + (f"\n{dialogs}" if dialogs else ""))
        blocks += [
            h.record.text for h in hits if h.record.kind != "memo" and h.record.id not in shown
        ]
        return "\n".join(blocks)
