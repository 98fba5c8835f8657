"""A deterministic hashing embedder: no model, no download, identical in every process.

It is the test embedder of the whole project and a usable offline fallback. Each text is
turned into weighted sparse features that are hashed (with a sign, to cancel collisions on
average) into ``dimension`` buckets:

* stemmed lowercase words (weight 1.0; stop words 0.15, so "the" cannot make two texts look
  alike but a text made only of stop words still gets a vector),
* word bigrams over the content words (weight 0.6), which reward shared phrases,
* character trigrams of each content word with boundary marks (L2 weight 0.6 a word), which
  match spelling variants and inflections the stemmer misses.

Hashes come from :func:`hashlib.blake2b`, never Python's salted :func:`hash`, so vectors are
stable across processes and machines, and a stored index stays valid.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import threading

import numpy as np
import numpy.typing as npt

from memories_core.embedders.base import BaseEmbedder
from memories_core.errors import check_count

__all__ = ["HashingEmbedder"]

_WORD_RE = re.compile(r"\w+", re.UNICODE)

_WORD_WEIGHT = 1.0
_STOP_WEIGHT = 0.15
_BIGRAM_WEIGHT = 0.6
_TRIGRAMS_WEIGHT = 0.6

# Words so frequent that sharing them says nothing about two texts' topic. Kept as one
# wrapped string because a 150-line list literal would be harder to read.
_STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further
    had has have having he her here hers herself him himself his how i if in into is it its
    itself just me more most my myself no nor not now of off on once only or other our ours
    ourselves out over own same she should so some such than that the their theirs them
    themselves then there these they this those through to too under until up very was we were
    what when where which while who whom why will with would you your yours yourself yourselves
    s t d ll m re ve don doesn didn isn wasn aren weren won wouldn shouldn couldn
    """.split()  # noqa: SIM905
)

# Longest suffixes first; each entry is (suffix, replacement, shortest stem kept).
_SUFFIXES: tuple[tuple[str, str, int], ...] = (
    ("ational", "ate", 3),
    ("fulness", "ful", 3),
    ("iveness", "ive", 3),
    ("ization", "ize", 3),
    ("ations", "ate", 3),
    ("ation", "ate", 3),
    ("ments", "", 4),
    ("ment", "", 4),
    ("ness", "", 3),
    ("ings", "", 3),
    ("ing", "", 3),
    ("ies", "y", 2),
    ("ied", "y", 2),
    ("edly", "", 3),
    ("ed", "", 3),
    ("ly", "", 4),
    ("es", "", 3),
    ("s", "", 3),
)

# Bounded per-instance cache of word -> features; words repeat a lot (Zipf), so hashing each
# distinct word once is what makes 10k-text batches fast.
_CACHE_LIMIT = 200_000


def stem(word: str) -> str:
    """Strip common English suffixes so inflections share one feature.

    Deliberately light (not Porter): it only needs "loves", "loved", "loving" and "love" to
    meet, and must not merge unrelated words. A final "e" is dropped too, because "love"
    loses it in "loving"/"loved"; doubled final consonants ("running") are undoubled.

    Args:
        word: A lowercase word.

    Returns:
        The stem.
    """
    if len(word) <= 3 or not word.isalpha():
        return word
    stripped = False
    for suffix, replacement, min_stem in _SUFFIXES:
        if word.endswith(suffix):
            base = word[: -len(suffix)]
            if len(base) < min_stem:
                continue
            if suffix == "s" and base.endswith(("s", "u", "i")):
                # "class", "bus", "analysis": the s is not a plural mark.
                continue
            if suffix == "es" and not base.endswith(("s", "x", "z", "ch", "sh", "o")):
                # "likes" -> "like" + "s", handled by the plain "s" rule below.
                continue
            word = base + replacement
            stripped = True
            break
    if stripped and len(word) > 3 and word[-1] == word[-2] and word[-1] not in "lsz":
        word = word[:-1]
    if len(word) > 3 and word.endswith("e"):
        word = word[:-1]
    return word


@functools.lru_cache(maxsize=1 << 18)
def _hash(feature: str) -> int:
    """Return a stable 64-bit hash of ``feature``."""
    return int.from_bytes(hashlib.blake2b(feature.encode("utf-8"), digest_size=8).digest(), "big")


class HashingEmbedder(BaseEmbedder):
    """Deterministic bag-of-features embedder for tests and offline use (no model).

    Vectors depend only on the text and ``dimension``; they are the same in every process.
    Quality is lexical: it finds texts that share words, stems, phrases or word fragments,
    not paraphrases with no word in common.

    Args:
        dimension: Number of hash buckets (vector length). At least 8.

    Raises:
        ConfigurationError: if ``dimension`` is not an int of at least 8.

    Example:
        >>> emb = HashingEmbedder()
        >>> emb.name
        'hashing-256'
        >>> q = emb.embed_query("what food does the user like")
        >>> docs = emb.embed_documents(["I love spicy Thai food", "The train leaves at 9"])
        >>> bool(docs[0] @ q > docs[1] @ q)
        True
    """

    def __init__(self, dimension: int = 256) -> None:
        super().__init__()
        dimension = check_count("dimension", dimension, minimum=8)
        self._dimension = dimension
        self._word_cache: dict[str, tuple[str, bool, list[int], list[float]]] = {}
        self._cache_lock = threading.Lock()

    @property
    def name(self) -> str:
        """``hashing-<dimension>``."""
        return f"hashing-{self._dimension}"

    @property
    def dimension(self) -> int:
        """Vector length."""
        return self._dimension

    def _bucket(self, feature: str, weight: float) -> tuple[int, float]:
        """Map a feature to its signed bucket."""
        h = _hash(feature)
        # The top bit picks the sign; the rest the bucket, so the two are independent.
        sign = -1.0 if h >> 63 else 1.0
        return h % self._dimension, sign * weight

    def _word_features(self, word: str) -> tuple[str, bool, list[int], list[float]]:
        """Return ``(stem, is_stop_word, buckets, values)`` for one lowercase word."""
        cached = self._word_cache.get(word)
        if cached is not None:
            return cached
        stop = word in _STOP_WORDS
        stemmed = word if stop else stem(word)
        cols: list[int] = []
        vals: list[float] = []
        col, val = self._bucket("w:" + stemmed, _STOP_WEIGHT if stop else _WORD_WEIGHT)
        cols.append(col)
        vals.append(val)
        if not stop and len(word) > 2:
            padded = f"<{word}>"
            grams = {padded[i : i + 3] for i in range(len(padded) - 2)}
            # Spread a fixed weight over the word's trigrams so long words do not dominate.
            per_gram = _TRIGRAMS_WEIGHT / math.sqrt(len(grams))
            for gram in sorted(grams):
                col, val = self._bucket("c:" + gram, per_gram)
                cols.append(col)
                vals.append(val)
        entry = (stemmed, stop, cols, vals)
        with self._cache_lock:
            if len(self._word_cache) >= _CACHE_LIMIT:
                self._word_cache.clear()
            self._word_cache[word] = entry
        return entry

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        dim = self._dimension
        cols: list[int] = []
        vals: list[float] = []
        counts: list[int] = []
        for text in texts:
            before = len(cols)
            previous: str | None = None
            for match in _WORD_RE.finditer(text.lower()):
                stemmed, stop, wcols, wvals = self._word_features(match.group())
                cols.extend(wcols)
                vals.extend(wvals)
                if stop:
                    continue
                if previous is not None:
                    col, val = self._bucket(f"b:{previous} {stemmed}", _BIGRAM_WEIGHT)
                    cols.append(col)
                    vals.append(val)
                previous = stemmed
            counts.append(len(cols) - before)
        # One bincount over flat (row, col) positions sums all features of the batch at once;
        # much faster than np.add.at or per-row Python loops.
        rows = np.repeat(np.arange(len(texts), dtype=np.int64), counts)
        flat = rows * dim + np.asarray(cols, dtype=np.int64)
        summed = np.bincount(
            flat, weights=np.asarray(vals, dtype=np.float64), minlength=len(texts) * dim
        )
        return summed.reshape(len(texts), dim).astype(np.float32)
