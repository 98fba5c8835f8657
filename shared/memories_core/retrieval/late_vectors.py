"""Late-interaction token vectors at save time, their rebuild, and their memory-file rows.

A memory whose pipeline holds a
:class:`~memories_core.retrieval.late_interaction.LateInteractionReranker` gets one more set
of hooks on its engine (:func:`attach_token_vectors`, named ``"<memory>.late"``): every
save's transaction also writes one pending job naming the turns it stored, and the engine's
worker (or ``save`` itself with ``derive="inline"``) runs it: the turns are encoded,
batched per save, outside the save's transaction and locks, and their vectors written to
the record store (:class:`~memories_core.token_vectors.TokenVectorStore`). A job that fails
(the model missing) is retried with backoff like any derivation; recall meanwhile encodes
what it needs itself. Only turns get a job; records derived later get their vectors on the
first recall that ranks them, which writes them back.

:func:`rebuild_token_vectors` re-encodes every user's records after an encoder change
(vectors of another encoder are never scored) and drops the old rows. Where the new encoder
derives its vectors from the old ones (the projecting encoder from the unprojected rows of
earlier releases: :func:`derive_stored`), a row is derived instead, without the model:
100k records took 40 s where encoding them takes about 36 minutes (BENCHMARKS.md, "Token
vectors at 128 dimensions"). Recall derives the rows its pool lacks the same way.

A memory file carries the stored vectors too (:mod:`memories_core.token_vectors`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memories_core.errors import InvalidInputError, MemoriesError
from memories_core.interfaces import MechanismHooks
from memories_core.token_vectors import (
    TokenVectors,
    TokenVectorStore,
    encoder_tag,
    quantize,
    text_digest,
)
from memories_core.types import Job, JobSpec, MemoryRecord

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine
    from memories_core.retrieval.late_encoder import LateInteractionEncoder
    from memories_core.retrieval.late_interaction import LateInteractionReranker
    from memories_core.retrieval.pipeline import Pipeline

__all__ = [
    "JOB_KIND",
    "attach_token_vectors",
    "derive_stored",
    "engine_backend",
    "late_stages",
    "read_stored",
    "rebuild_token_vectors",
    "write_stored",
]

logger = logging.getLogger(__name__)

#: Kind of the pending job that encodes a save's turns.
JOB_KIND = "token_vectors"


def read_stored(
    store: TokenVectorStore, user_id: str, ids: Sequence[str], tag: str
) -> Mapping[str, TokenVectors]:
    """The store's rows of ``ids``; a store that fails is skipped (the records are encoded)."""
    try:
        return store.token_vectors(user_id, ids, encoder=tag)
    except (MemoriesError, ValueError):
        logger.warning("reading stored token vectors failed; encoding instead", exc_info=True)
        return {}


def write_stored(store: TokenVectorStore, user_id: str, rows: Sequence[TokenVectors]) -> None:
    """Write freshly made rows back; a failure only costs a later re-encode."""
    try:
        store.put_token_vectors(user_id, rows)
    except MemoriesError:
        logger.warning("storing token vectors failed; they stay in the cache", exc_info=True)


def derive_stored(
    encoder: LateInteractionEncoder,
    store: TokenVectorStore,
    user_id: str,
    ids: Sequence[str],
    texts: Sequence[str],
    digests: Sequence[str],
    wanted: Sequence[int],
) -> dict[int, TokenVectors]:
    """Rows of ``encoder`` made from stored rows of the encoder it derives from.

    A :class:`~memories_core.retrieval.late_encoder.DerivingEncoder` (the projecting
    :class:`~memories_core.retrieval.late_encoder.OnnxLateInteractionEncoder`) turns the
    stored rows of its ``derives_from`` name into its own. A row is used only if its
    digest is that of the same text under that name (an edited record is encoded again),
    and its output is checked like an encoding's. Nothing is written here: the caller
    stores what it keeps.

    Args:
        encoder: The reranker's encoder.
        store: The user's record store.
        user_id: Owner of the records.
        ids: Record ids, one per text.
        texts: The texts the vectors are of (with context, after the record before).
        digests: ``text_digest(encoder.name, text)`` of each text (the derived rows' own).
        wanted: Positions in ``ids`` that lack rows of ``encoder``.

    Returns:
        Position -> derived row, for the positions whose source row exists and matches.
    """
    from memories_core.retrieval.late_encoder import DerivingEncoder

    if not wanted or not isinstance(encoder, DerivingEncoder):
        return {}
    source = encoder.derives_from
    if source is None:
        return {}
    tag = encoder_tag(encoder.name)
    rows = read_stored(store, user_id, [ids[i] for i in wanted], encoder_tag(source))
    made: dict[int, TokenVectors] = {}
    for i in wanted:
        row = rows.get(ids[i])
        if row is None or row.digest != text_digest(source, texts[i]):
            continue
        try:
            made[i] = quantize(ids[i], tag, digests[i], encoder.derive(row.floats()))
        except (MemoriesError, ValueError):
            logger.warning("a stored row could not be derived from; encoding it", exc_info=True)
    return made


def late_stages(pipeline: Pipeline | None) -> list[LateInteractionReranker]:
    """The late-interaction rerankers of ``pipeline`` (none for ``None``)."""
    # No stage can be one unless its module was imported: building a memory without the
    # reranker does not import it (and its ONNX helpers).
    module = sys.modules.get("memories_core.retrieval.late_interaction")
    if pipeline is None or module is None:
        return []
    kind = module.LateInteractionReranker
    return [stage for stage in pipeline.rerankers if isinstance(stage, kind)]


def attach_token_vectors(
    engine: MemoryEngine, name: str, pipeline: Pipeline | None, kinds: Sequence[str]
) -> bool:
    """Encode the turns of every save in a pending job, if ``pipeline`` has a late stage.

    Args:
        engine: The memory's engine.
        name: The memory's name on it (the hooks are attached as ``"<name>.late"``).
        pipeline: The memory's recall pipeline.
        kinds: The record kinds the memory recalls (no job unless ``"turn"`` is one).

    Returns:
        Whether the hooks were attached (``False``: no late stage, turns not recalled, or
        a store that keeps no token vectors).
    """
    stages = late_stages(pipeline)
    if not stages or "turn" not in kinds or not isinstance(engine.store, TokenVectorStore):
        return False
    job_name = f"{name}.late"

    def on_turns(records: Sequence[MemoryRecord]) -> list[JobSpec]:
        ids = [r.id for r in records if r.kind == "turn"]
        if not ids:
            return []
        return [JobSpec(job_name, JOB_KIND, f"tv:{ids[0]}", {"ids": ids})]

    def run_job(job: Job) -> None:
        ids = job.payload.get("ids")
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise InvalidInputError("a token-vector job names its records in payload['ids']")
        records = engine.store.get(ids, user_id=job.user_id)
        if records:
            backend = engine_backend(engine)
            for stage in stages:
                # Turns just saved: no rows of an earlier encoder to derive from.
                stage.prefetch(backend, job.user_id, records, derive=False)
        return None

    engine.attach(MechanismHooks(name=job_name, on_turns=on_turns, run_job=run_job))
    return True


def engine_backend(engine: MemoryEngine) -> Any:
    """A recall backend over ``engine``'s store (with the token vectors), index and embedder.

    What :meth:`~memories_core.retrieval.late_interaction.LateInteractionReranker.prefetch`
    and :meth:`~memories_core.retrieval.late_interaction.LateInteractionReranker.pair_texts`
    take to link neighbours and find the store.
    """
    from memories_core.retrieval.store_backend import StoreBackend

    return StoreBackend(engine.store, engine.index, engine.embedder, clock=engine.clock)


def rebuild_token_vectors(
    memory: Any, *, users: Sequence[str] | None = None, progress: bool = True
) -> int:
    """Give every record of ``users`` (default: all) vectors of the memory's current encoder.

    For an encoder change (a new model or settings: stored vectors of another encoder are
    never scored, so until this runs each recall encodes its pool). Records whose stored
    vectors match are skipped, so an interrupted rebuild resumes where it stopped; a
    record whose row of the encoder's source matches its text is derived from it
    (:func:`derive_stored`) rather than encoded; when a user is done, rows of other
    encoders are deleted.

    Args:
        memory: A memory with a late-interaction pipeline (``memory.pipeline``,
            ``memory.engine``).
        users: Whose records (default: every user of the engine).
        progress: Show a ``tqdm`` bar over the records.

    Returns:
        How many records got new vectors (encoded or derived).

    Raises:
        InvalidInputError: if the memory's pipeline has no late-interaction stage.
    """
    from tqdm.auto import tqdm

    from memories_core.retrieval.keys import SEARCH_KEY_KIND

    stages = late_stages(getattr(memory, "pipeline", None))
    if not stages:
        raise InvalidInputError("this memory's pipeline has no late-interaction stage")
    engine: MemoryEngine = memory.engine
    targets = list(users) if users is not None else list(engine.users())
    store = engine.store if isinstance(engine.store, TokenVectorStore) else None
    backend = engine_backend(engine)
    encoded = 0
    plan = {u: [r for r in engine.records(u) if r.kind != SEARCH_KEY_KIND] for u in targets}
    with tqdm(
        total=sum(map(len, plan.values())), desc="late-interaction vectors", disable=not progress
    ) as bar:
        for user_id, records in plan.items():
            for start in range(0, len(records), 256):
                part = records[start : start + 256]
                for stage in stages:
                    encoded += stage.prefetch(backend, user_id, part)
                bar.update(len(part))
            if store is not None and len(stages) == 1:
                store.delete_token_vectors(user_id, keep_encoder=stages[0].encoder_tag)
    return encoded
