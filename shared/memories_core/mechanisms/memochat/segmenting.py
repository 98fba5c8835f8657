"""Cutting a conversation into topics: exchanges, depth boundaries and extractive memos."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

    from memories_core.interfaces import Embedder
from memories_core.mechanisms.memochat.signals import _normalise, _tokens

__all__ = [
    "DEFAULT_CONTINUATION_CUE",
    "DEFAULT_DEPTH_CUTOFF",
    "DEFAULT_SHIFT_CUE",
    "DEFAULT_WINDOW",
    "depth_boundaries",
    "exchanges",
    "extractive_memo",
    "gap_similarities",
    "segment_lines",
]


#: Segmenter defaults, chosen by cross-validation over MemoChat's two sources (BENCHMARKS.md):
#: exchanges on each side of a gap, the cutoff (mean + this * std of the depth scores), and
#: what a back-reference (shift cue) adds and a bare pronoun (continuation cue) takes off.
DEFAULT_WINDOW = 3


DEFAULT_DEPTH_CUTOFF = 1.0


DEFAULT_SHIFT_CUE = 0.4


DEFAULT_CONTINUATION_CUE = 0.2


# A user line that points back at something said earlier ("the hormone mentioned above",
# "the third one", "the latter") moves the talk to that thing; one that goes on with a bare
# pronoun ("is it also found in animals?") stays on the topic.
_SHIFT_CUE = re.compile(
    r"\b(mentioned|aforesaid|aforementioned|latter|former|above|(?:the|this|that)\s+"
    r"(?:first|second|third|fourth|fifth|last|other|next)\b)",
    re.I,
)


_CONTINUATION_CUE = re.compile(r"\b(it|its|they|them|their|he|she|his|her|him)\b", re.I)


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
