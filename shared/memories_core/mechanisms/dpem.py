"""DPeM: dual-process enhanced memory (Zhang et al., 2023, "DPeM Mechanism", Table 1).

Three memories, one table each, kept as engine records of one user with their **tier** and
**flag-table count** in the record's mutable state (:class:`~memories_core.types.RecordState`
``tier`` and ``attrs``), never re-embedded when they change:

* **working memory** (tier ``"working"``, kind :data:`NOTE_KIND`): the coordinator's notes of
  the latest iteration, at most ``working_capacity``; refreshed every iteration; no lookup.
* **short-term memory** (tier ``"stm"``, kind :data:`KNOWLEDGE_KIND`): typed knowledge items
  (``type -> item``) with their flag-table entry (``attrs.count``: in how many iterations the
  item or a near-duplicate of it appeared; ``attrs.rounds``: which); limited to
  ``stm_capacity``; refreshed every ``stm_refresh_rounds`` rounds; looked up by closest
  Levenshtein match (rapidfuzz), keeping only matches at or above a relevance cut
  (``stm_cut``; :data:`MEASURED_STM_CUT` was chosen by cross-validation, the default is off),
  so with a cut a query unrelated to every item finds nothing there.
* **long-term memory** (tier ``"ltm"``, same kind): items whose count reached ``theta``; it only
  grows; looked up by semantic similarity through the engine's fused retrieval.

One **iteration** ``d_i`` is one round of dialogue: one user turn and the replies to it,
however an adapter batches its saves (LangChain saves each exchange, a LlamaIndex memory
block flushes several at once, a save may even end with the user's turn and carry its reply
in the next one; all count the same rounds). Each save writes its turns and, in the same
transaction, one job per round it closes (key ``round:<n>``). A save that ends with a user
turn holds that round open for its reply: the replies that open the next save of the same
session join it, and it closes with them, or as it is when the next save starts with a user
turn, comes from another session, or the session ends. The job runs the dual process
outside every lock:

1. *Rehearsal / learning*: the coordinator takes notes ``nts = C(d_i)`` -> working memory.
2. *Rehearsal / summarizing*: the coordinator keeps the relevant notes as knowledge items.
3. *Executive / typing*: each item is typed ``user-specific`` or ``common-sense``.
4. *Executive / memorizing* (no model): each item is merged into the flag table -- a
   near-duplicate of an STM or LTM item (:func:`near_duplicate`, rapidfuzz, default threshold
   :data:`MERGE_THRESHOLD`) counts as a recurrence instead of a new item -- promoted to LTM at
   ``theta``, and STM is refreshed at the end of every period of ``stm_refresh_rounds`` rounds
   (items not seen during the period are dropped; their counts go with them).

The three model steps keep their results in the job's payload, so a retry repeats only the step
that failed; a garbled answer raises :class:`~memories_core.errors.ParseError` in the parser,
the job stays pending and the turns are already stored. Step 4 runs under the user's lock in
one transaction and is idempotent (a count is the number of *distinct* rounds an item was
seen in), so a crash between it and the job's completion cannot count an item twice.

The rendered context labels user-specific and common-sense knowledge separately (Figure 5); it
is the prompt ``p = Retriever(x)`` of MaLP's eq. (3) (:meth:`DualProcessMemory.prompt`); each
item is dated with when it was memorized (``show_dates=False``: the paper's undated items).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from memories_core.engine import (
    Derivation,
    JobFailed,
    check_k,
    check_query,
    check_scope,
    default_llm,
)
from memories_core.errors import ConfigurationError, LLMError, ParseError, check_count
from memories_core.grounding import find_ungrounded, log_rejection
from memories_core.mechanisms.base import MemoryBase, fit_recent
from memories_core.mechanisms.dpem_items import (
    LTM,
    MERGE_THRESHOLD,
    STM,
    WORKING,
    DPeMStats,
    KnowledgeItem,
    check_typed,
    knowledge_item,
    matching_item,
    near_duplicate,
    padded,
    processed_text,
    refreshed_stm,
    similarity,
)
from memories_core.mechanisms.dpem_rounds import (
    HeldRound,
    mark_processed,
    round_turns,
    split_save,
)
from memories_core.prompts.batch import run_spec_batch
from memories_core.prompts.dpem import (
    COMMON_SENSE,
    KNOWLEDGE,
    NOTES,
    TYPING,
    USER_SPECIFIC,
    KnowledgeInput,
    NotesInput,
    TypingInput,
)
from memories_core.prompts.spec import PromptSpec, run_spec
from memories_core.types import (
    Job,
    JobSpec,
    MemoryRecord,
    Recall,
    Scope,
    ScoredRecord,
    check_user_id,
    new_id,
)

if TYPE_CHECKING:
    from memories_core.interfaces import LLM
    from memories_core.retrieval import Pipeline

__all__ = [
    "DEFAULT_STM_CUT",
    "KNOWLEDGE_KIND",
    "MEASURED_STM_CUT",
    "MERGE_THRESHOLD",
    "NOTE_KIND",
    "DPeMStats",
    "DualProcessMemory",
    "KnowledgeItem",
    "near_duplicate",
    "similarity",
]

#: Record kind of knowledge items (STM and LTM).
KNOWLEDGE_KIND = "dpem_knowledge"
#: Record kind of working-memory notes.
NOTE_KIND = "dpem_note"
#: Relevance cut of the STM lookup per scorer (0-1) chosen by leave-one-conversation-out
#: cross-validation on LoCoMo (observations as STM items, questions as queries; the same cut
#: in every fold; BENCHMARKS.md, "DPeM: rounds by exchange, STM relevance cut"): held-out
#: precision 0.04 -> 0.22 and F1 0.07 -> 0.15 for Levenshtein, at the cost of recall
#: (0.30 -> 0.12). Opt in with ``stm_cut=MEASURED_STM_CUT[scorer]``.
MEASURED_STM_CUT: dict[str, float] = {"levenshtein": 0.35, "partial": 0.6}
#: Default cut per scorer: off (0). The measured cut drops facts a paraphrased query asks
#: about ("what is my secret code" against "My secret code is ..."). On answers it helps
#: wherever STM holds items (F1 0.114 -> 0.210 on LoCoMo at theta 3), but at the default
#: ``theta=1`` STM stays empty: an opt-in for ``theta`` 2 or more (BENCHMARKS.md, "DPeM:
#: the STM cut and dated items on answers").
DEFAULT_STM_CUT: dict[str, float] = {"levenshtein": 0.0, "partial": 0.0}

T = TypeVar("T")
StmScorer = Literal["levenshtein", "partial"]


class DualProcessMemory(MemoryBase):
    """DPeM (Zhang et al., 2023): working memory, STM and LTM; see the module docstring.

    Setup:
        Needs ``rapidfuzz`` (a core dependency). Give a capable ``llm`` as the coordinator;
        offline, ``ScriptedLLM(default=dpem_reply)`` (:mod:`memories_core.prompts.dpem`)
        answers the three prompts by rule.

    Key init args:
        llm: The coordinator ``C`` (default: the engine's model, else the bundled one). The
            engine's ``llm_for(scope)`` is *not* used for it: that serves the user's
            (possibly personalised) answering model.
        theta: Flag-table count at which an STM item moves to LTM. The paper leaves it
            open (Zhang et al., 2023, "Executive Process": "a predetermined threshold").
            Default 1, chosen on answers by leave-one-conversation-out on LoCoMo, both
            folds agreeing (BENCHMARKS.md, "DPeM: executive settings chosen on answers"):
            in conversation the coordinator rarely restates an item closely enough to
            count as a recurrence (none did in 201 rounds), so at 3 every item waited in
            STM until a refresh dropped it, and the edit-distance lookup missed the rest.
            At 1 every item is long-term from its first round and looked up by meaning;
            2 or more keeps the paper's two tiers for users who repeat themselves.
        stm_refresh_rounds: Length of an STM period in rounds; at its end items not seen
            during it are dropped.
        stm_capacity: Most items STM holds (least seen, then oldest, are dropped first).
        working_capacity: Most notes the working memory holds (and the coordinator takes).
        merge_threshold: :func:`similarity` at or above which a new item is a recurrence of a
            stored one.
        stm_scorer: ``"levenshtein"`` (the paper's closest match: normalised Levenshtein
            similarity to the whole item) or ``"partial"`` (best-matching substring,
            kinder to short queries against long items).
        stm_cut: Lowest STM lookup score (0-1) returned; ``None``: the scorer's
            :data:`DEFAULT_STM_CUT`. ``0`` returns the closest items whatever they score.
        k: Items recalled from each of STM and LTM by default.
        max_dialogue_chars: Longest dialogue given to one learning call (most recent kept).
        retries: Repair attempts of an unparsable coordinator answer within one job run.
        **kwargs: Engine or storage options of :class:`~memories_core.mechanisms.base.MemoryBase`.

    Instantiate, save, inspect, recall:
        .. code-block:: python

            from memories_core import DualProcessMemory, Scope, Turn
            from memories_core.embedders import HashingEmbedder
            from memories_core.llms import ScriptedLLM
            from memories_core.prompts.dpem import dpem_reply

            memory = DualProcessMemory(
                llm=ScriptedLLM(default=dpem_reply), embedder=HashingEmbedder(), theta=2
            )
            memory.save([Turn("user", "I have diabetes.")], Scope("ann"))
            print(memory.stm("ann"), memory.flag_table("ann"))
            print(memory.recall("red spots on my skin", Scope("ann")).context)

    Raises:
        ConfigurationError: on a non-positive ``theta``, period, capacity, or a threshold
            outside 0-100.
    """

    mechanism_name: ClassVar[str] = "dpem"
    prompt_specs: ClassVar[tuple[PromptSpec[Any, Any], ...]] = (NOTES, KNOWLEDGE, TYPING)
    recall_kinds: ClassVar[tuple[str, ...]] = (KNOWLEDGE_KIND,)
    index_turns: ClassVar[bool] = False

    def __init__(
        self,
        *,
        llm: LLM | None = None,
        theta: int = 1,
        stm_refresh_rounds: int = 6,
        stm_capacity: int = 64,
        working_capacity: int = 16,
        merge_threshold: float = MERGE_THRESHOLD,
        stm_scorer: StmScorer = "levenshtein",
        stm_cut: float | None = None,
        k: int = 5,
        max_dialogue_chars: int = 6000,
        retries: int = 1,
        **kwargs: Any,
    ) -> None:
        theta = check_count("theta", theta)
        stm_refresh_rounds = check_count("stm_refresh_rounds", stm_refresh_rounds)
        stm_capacity = check_count("stm_capacity", stm_capacity)
        working_capacity = check_count("working_capacity", working_capacity)
        max_dialogue_chars = check_count("max_dialogue_chars", max_dialogue_chars)
        if not 0 < float(merge_threshold) <= 100:
            raise ConfigurationError(f"merge_threshold must be in (0, 100], got {merge_threshold}")
        if stm_scorer not in ("levenshtein", "partial"):
            raise ConfigurationError(
                f"stm_scorer must be 'levenshtein' or 'partial', not {stm_scorer!r}"
            )
        cut = DEFAULT_STM_CUT[stm_scorer] if stm_cut is None else stm_cut
        if isinstance(cut, bool) or not isinstance(cut, int | float) or not 0 <= cut <= 1:
            raise ConfigurationError(f"stm_cut must be a number from 0 to 1, got {stm_cut!r}")
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 3:
            raise ConfigurationError(f"retries must be an int from 0 to 3, got {retries!r}")
        engine = kwargs.get("engine")
        if llm is None and (engine is None or engine.llm is None):
            llm = default_llm()
        self.theta = theta
        self.stm_refresh_rounds = stm_refresh_rounds
        self.stm_capacity = stm_capacity
        self.working_capacity = working_capacity
        self.merge_threshold = float(merge_threshold)
        self.stm_scorer: StmScorer = stm_scorer
        self.stm_cut = float(cut)
        self.max_dialogue_chars = max_dialogue_chars
        self.retries = retries
        super().__init__(k=k, llm=llm, **kwargs)
        if self.pipeline is None:
            self.pipeline = self.ltm_pipeline()

    def ltm_pipeline(self) -> Pipeline:
        """The LTM retriever ``R_s``: the engine's dense + lexical fusion, no context spreading.

        Knowledge items are not a dialogue: spreading a hit to its neighbours in time (the
        engine's default reranker for turns) would only add unrelated items and cost a scan
        of the user's records per hit.
        """
        from memories_core.retrieval import ContextSpreading

        base = (self.fusion or self.engine.retriever.fusion).pipeline()
        kept = tuple(r for r in base.rerankers if not isinstance(r, ContextSpreading))
        return dataclasses.replace(base, rerankers=kept)

    # ------------------------------------------------------------------ state keys
    @property
    def _round_key(self) -> str:
        return f"{self.name}.round"

    @property
    def _log_key(self) -> str:
        return f"{self.name}.log"

    @property
    def _held_key(self) -> str:
        return f"{self.name}.held"

    def rounds(self, user_id: str) -> int:
        """Closed iterations (rounds) of ``user_id`` so far; a held round is not counted."""
        value = self.store.get_state(self._round_key, user_id=check_user_id(user_id))
        return int(value or 0)

    def _log(self, user_id: str) -> dict[str, Any]:
        value = self.store.get_state(self._log_key, user_id=user_id) or {}
        return {
            str(k): [int(x) for x in v] if isinstance(v, list) else int(v)
            for k, v in dict(value).items()
        }

    # ------------------------------------------------------------------ inspection
    def working(self, user_id: str) -> list[KnowledgeItem]:
        """The working memory: the coordinator's notes of the latest iteration (Table 1)."""
        return self._tier(user_id, NOTE_KIND, WORKING)

    def stm(self, user_id: str) -> list[KnowledgeItem]:
        """Short-term memory: typed items with their counts, oldest first."""
        return self._tier(user_id, KNOWLEDGE_KIND, STM)

    def ltm(self, user_id: str) -> list[KnowledgeItem]:
        """Long-term memory: items promoted at ``theta``, oldest first; it only grows."""
        return self._tier(user_id, KNOWLEDGE_KIND, LTM)

    def flag_table(self, user_id: str) -> dict[str, int]:
        """Item text -> recurrence count, for every STM and LTM item."""
        return {item.text: item.count for item in [*self.stm(user_id), *self.ltm(user_id)]}

    def stats(self, user_id: str) -> DPeMStats:
        """Sizes of the three memories and the counts of merges, promotions and refreshes."""
        log = self._log(check_user_id(user_id))
        return DPeMStats(
            rounds=self.rounds(user_id),
            processed=log.get("processed", 0),
            working=len(self.working(user_id)),
            stm=len(self.stm(user_id)),
            ltm=len(self.ltm(user_id)),
            merges=log.get("merges", 0),
            promotions=log.get("promotions", 0),
            refreshes=log.get("refreshes", 0),
            dropped=log.get("dropped", 0),
        )

    def _tier(self, user_id: str, kind: str, tier: str) -> list[KnowledgeItem]:
        found = self.engine.records(check_user_id(user_id), where={"kind": kind, "tier": tier})
        return [knowledge_item(r) for r in found if not r.state.archived]

    # ------------------------------------------------------------------ recall
    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """Look up STM (closest Levenshtein match) and LTM (fused semantic search).

        Up to ``k`` items from each tier; the records interleave the two rankings (LTM first)
        and are cut to ``k``; the context groups them as user-specific and common-sense
        knowledge (Figure 5).

        Raises:
            InvalidInputError: on an empty query or a bad ``k``.
            MissingUserError: if ``scope`` has no user.
        """
        scope = check_scope(scope)
        query = check_query(query)
        want = check_k(self.default_k if k is None else k)
        ltm = self.engine.search(
            query,
            scope.user_id,
            k=want,
            kinds=[KNOWLEDGE_KIND],
            where={"tier": LTM},
            now=now,
            fusion=self.fusion,
            pipeline=self.pipeline,
        )
        stm = self.stm_lookup(query, scope.user_id, k=want)
        merged: list[ScoredRecord] = []
        seen: set[str] = set()
        for pair in zip(*padded(ltm, stm), strict=True):
            for hit in pair:
                if hit is not None and hit.record.id not in seen:
                    seen.add(hit.record.id)
                    merged.append(hit)
        merged = merged[:want]
        return Recall(query=query, records=tuple(merged), context=self._render(merged))

    def stm_lookup(self, query: str, user_id: str, *, k: int = 5) -> list[ScoredRecord]:
        """STM items closest to ``query`` (retriever ``R_c``), best first; score in 0-1.

        ``stm_scorer="levenshtein"``: normalised Levenshtein similarity of the processed
        (lower-cased, punctuation-free) texts; ties keep the order of storage. Items scoring
        below ``stm_cut`` are left out, so the result may be empty.
        """
        query = check_query(query)
        k = check_k(k)
        from rapidfuzz import fuzz, process
        from rapidfuzz.distance import Levenshtein

        records = [
            r
            for r in self.engine.records(
                check_user_id(user_id), where={"kind": KNOWLEDGE_KIND, "tier": STM}
            )
            if not r.state.archived
        ]
        if not records:
            return []
        scorer: Callable[..., float] = (
            Levenshtein.normalized_similarity
            if self.stm_scorer == "levenshtein"
            else lambda a, b, **kw: fuzz.partial_ratio(a, b, **kw) / 100.0
        )
        ranked = process.extract(
            query,
            [r.text for r in records],
            scorer=scorer,
            processor=processed_text,
            limit=min(k, len(records)),
        )
        ranked = sorted(ranked, key=lambda hit: (-hit[1], hit[2]))
        return [
            ScoredRecord(records[index], float(score))
            for _, score, index in ranked
            if score >= self.stm_cut
        ]

    def prompt(self, query: str, scope: Scope, *, k: int | None = None) -> str:
        """The memory prompt ``p = Retriever(x)`` of MaLP's eq. (3): the recall's context."""
        return self.recall(query, scope, k=k).context

    def _render(self, hits: Sequence[ScoredRecord]) -> str:
        groups: dict[str, list[str]] = {USER_SPECIFIC: [], COMMON_SENSE: []}
        for hit in hits:
            kind = str(hit.record.state.attrs.get("type", hit.record.metadata.get("type", "")))
            line = self._dated(hit.record.text, hit.record.created_at)
            groups[kind if kind in groups else USER_SPECIFIC].append(f"- {line}")
        parts = []
        if groups[USER_SPECIFIC]:
            parts.append("User-specific knowledge:\n" + "\n".join(groups[USER_SPECIFIC]))
        if groups[COMMON_SENSE]:
            parts.append("Common-sense knowledge:\n" + "\n".join(groups[COMMON_SENSE]))
        return "\n".join(parts)

    # ------------------------------------------------------------------ jobs
    def _turn_jobs(self, records: Sequence[MemoryRecord]) -> Iterable[JobSpec]:
        """One iteration job per round the save closes (inside the write transaction).

        A last exchange that ends with a user turn is held for its reply
        (:func:`~memories_core.mechanisms.dpem_rounds.split_save`).
        """
        if not records:
            return []
        user_id = records[0].user_id
        held = self._held(user_id)
        closed, still_open = split_save(records, held)
        if still_open is not None or held is not None:
            state = None if still_open is None else still_open.to_state()
            self.engine.set_user_state(user_id, self._held_key, state)
        return self._round_specs(user_id, closed)

    def _session_jobs(self, user_id: str, session_id: str) -> Iterable[JobSpec]:
        """The session's held round, closed: its reply will not come (inside the transaction)."""
        held = self._held(user_id)
        if held is None or held.session != session_id:
            return []
        self.engine.set_user_state(user_id, self._held_key, None)
        return self._round_specs(user_id, [list(held.turns)])

    def _round_specs(self, user_id: str, rounds: Sequence[Sequence[str]]) -> list[JobSpec]:
        """Number ``rounds`` (lists of turn ids) after the user's last and make their jobs."""
        round_no = self.rounds(user_id)
        specs = []
        for turn_ids in rounds:
            round_no += 1
            payload = {"round": round_no, "turn_ids": list(turn_ids)}
            specs.append(JobSpec(self.name, "iteration", f"round:{round_no}", payload))
        if specs:
            self.engine.set_user_state(user_id, self._round_key, round_no)
        return specs

    def _held(self, user_id: str) -> HeldRound | None:
        """The round held open for its reply, if any."""
        return HeldRound.from_state(self.store.get_state(self._held_key, user_id=user_id))

    def _coordinator(self) -> LLM:
        llm = self.llm if self.llm is not None else self.engine.llm
        if llm is None:
            raise ConfigurationError("DualProcessMemory needs a coordinator llm")
        return llm

    def _ask(self, spec: PromptSpec[Any, T], inputs: Any, label: str) -> T:
        try:
            return run_spec(
                self._coordinator(), self.prompt_spec(spec), inputs, retries=self.retries
            )
        except (LLMError, ParseError) as exc:
            raise _failed(label, exc) from exc

    def _run_job(self, job: Job) -> None:
        user_id = job.user_id
        round_no = int(job.payload["round"])
        turns = self.engine.get(user_id, list(round_turns(job)))
        if not turns:
            return None  # the turns were cleared meanwhile: nothing to learn from
        dialogue = self._dialogue(turns)
        payload: dict[str, Any] = dict(job.payload)
        self._step(job, payload, "notes", dialogue)
        notes = tuple(str(n) for n in payload["notes"])
        if not self._write_working(job, round_no, notes):
            return None  # the job is gone (its user deleted meanwhile): nothing more to write
        self._step(job, payload, "knowledge", dialogue)
        self._step(job, payload, "types", dialogue)
        knowledge = tuple(str(k) for k in payload["knowledge"])
        typed = list(zip(knowledge, (str(t) for t in payload["types"]), strict=True))
        # A new item keeps the turns of the round that first stated it (its provenance).
        self.memorize(user_id, round_no, typed, sources=round_turns(job), job=job)
        return None

    def _dialogue(self, turns: Sequence[MemoryRecord]) -> list[str]:
        return fit_recent([r.text[:2000] for r in turns], self.max_dialogue_chars)

    def _request(
        self, stage: str, payload: dict[str, Any], dialogue: Sequence[str]
    ) -> tuple[PromptSpec[Any, Any], Any] | None:
        """The call a round's ``stage`` makes (``None``: nothing to ask, an empty input).

        Each step reads only its own round (its dialogue, or the step before it), so the
        same step of several rounds can be asked together (:meth:`_prepare_jobs`).
        """
        if stage == "notes":
            return NOTES, NotesInput(tuple(dialogue), self.working_capacity)
        if stage == "knowledge":
            notes = tuple(str(n) for n in payload["notes"])
            return (KNOWLEDGE, KnowledgeInput(notes)) if notes else None
        knowledge = tuple(str(k) for k in payload["knowledge"])
        return (TYPING, TypingInput(knowledge)) if knowledge else None

    def _keep(
        self, job: Job, payload: dict[str, Any], stage: str, answer: Any, dialogue: Sequence[str]
    ) -> None:
        """Keep a step's answer in the job's payload, so a retry does not ask again."""
        if stage == "notes":
            payload[stage] = self._grounded(answer, dialogue, "note")[: self.working_capacity]
        elif stage == "knowledge":
            payload[stage] = self._grounded(answer, dialogue, "knowledge")
        else:
            payload[stage] = [str(t) for t in answer]
        self.engine.update_job(job, payload)

    def _step(self, job: Job, payload: dict[str, Any], stage: str, dialogue: list[str]) -> None:
        if stage in payload:
            return
        request = self._request(stage, payload, dialogue)
        answer = () if request is None else self._ask(request[0], request[1], _LABELS[stage])
        self._keep(job, payload, stage, answer, dialogue)

    def _prepare_jobs(self, jobs: Sequence[Job]) -> dict[str, BaseException]:
        """Ask each model step of several rounds together, one batch per step.

        The rounds' notes are asked in one batch, then their knowledge items, then the
        items' types (the three steps of the module docstring); the answers are kept in
        each job's payload, and :meth:`_run_job` then only writes, round by round in order
        (working memory, flag table). A round whose answer still does not parse is returned
        as failed, as its own run would have failed.

        Raises:
            LLMError: if the model is down (the answers so far are kept).
        """
        work = []
        for job in jobs:
            turns = self.engine.get(job.user_id, list(round_turns(job)))
            if turns:
                work.append((job, dict(job.payload), self._dialogue(turns)))
        failed: dict[str, BaseException] = {}
        for stage in ("notes", "knowledge", "types"):
            asks = []
            for job, payload, dialogue in work:
                if job.id in failed or stage in payload:
                    continue
                request = self._request(stage, payload, dialogue)
                if request is None:
                    self._keep(job, payload, stage, (), dialogue)
                else:
                    asks.append((job, payload, dialogue, request))
            if not asks:
                continue
            spec = self.prompt_spec(asks[0][3][0])
            answers = run_spec_batch(
                self._coordinator(), spec, [a[3][1] for a in asks], retries=self.retries
            )
            for (job, payload, dialogue, _), answer in zip(asks, answers, strict=True):
                if isinstance(answer, ParseError):
                    failed[job.id] = _failed(_LABELS[stage], answer)
                else:
                    self._keep(job, payload, stage, answer, dialogue)
        return failed

    def _grounded(self, items: Sequence[str], dialogue: Sequence[str], what: str) -> list[str]:
        """The items grounded in the round's ``dialogue`` (:mod:`memories_core.grounding`).

        An item that copies an instruction from the dialogue is dropped, logged and counted
        in ``usage.failures["grounding"]``; the turns themselves stay stored.
        """
        kept = []
        for item in items:
            rejection = find_ungrounded({what: str(item)}, dialogue)
            if rejection is None:
                kept.append(str(item))
                continue
            log_rejection(self.name, what, rejection)
            self.engine.count_failure("grounding")
        return kept

    def _write_working(self, job: Job, round_no: int, notes: Sequence[str]) -> bool:
        """Replace the working memory with this iteration's notes (unless a newer one ran).

        One engine write (:meth:`~memories_core.engine.MemoryEngine.write_derivation`): the
        old notes are replaced with their search keys, and nothing is written once the job
        is gone (its user deleted while the model ran). Returns whether the job is alive.
        """
        user_id = job.user_id
        now = self.clock.now()
        with self.engine.user_lock(user_id), self.engine.transaction():
            current = self.engine.records(user_id, where={"kind": NOTE_KIND})
            if any(int(r.state.attrs.get("round", 0)) > round_no for r in current):
                return True
            sources = round_turns(job)
            records = [
                MemoryRecord(
                    new_id(),
                    user_id,
                    NOTE_KIND,
                    note,
                    now,
                    metadata={"round": round_no},
                    source_ids=sources,
                )
                for note in notes[: self.working_capacity]
            ]
            return self.engine.write_derivation(
                user_id,
                Derivation(
                    add=records,
                    replace=[r.id for r in current],
                    state={r.id: {"tier": WORKING, "attrs": {"round": round_no}} for r in records},
                    reason=f"dpem: notes of round {round_no}",
                    index=False,
                ),
                job=job,
            )

    def memorize(
        self,
        user_id: str,
        round_no: int,
        typed: Sequence[tuple[str, str]],
        *,
        sources: Sequence[str] = (),
        job: Job | None = None,
    ) -> None:
        """Executive process: merge a round's typed knowledge, promote at ``theta``, refresh STM.

        Zhang et al., 2023, "Executive Process". The coordinator's jobs call it with each
        round's items; called directly, it files typed knowledge from elsewhere, e.g. a
        recorded run's items replayed under other settings. Rounds are memorized in
        increasing order.

        The new items and the flag-table changes are one engine write
        (:meth:`~memories_core.engine.MemoryEngine.write_derivation`, indexed after the
        user's lock is released).

        Args:
            user_id: Whose memory.
            round_no: The round (exchange) the items come from, counted from 1.
            typed: ``(item, type)`` pairs; a type is ``"user-specific"`` or
                ``"common-sense"``.
            sources: Ids of the turns that stated the items (their provenance).
            job: The round's job, if a job runs it: nothing is written once it is gone.

        Raises:
            InvalidInputError: on a bad user id, round number, item or type.
        """
        check_typed(check_user_id(user_id), round_no, typed)
        now = self.clock.now()
        with self.engine.user_lock(user_id), self.engine.transaction():
            log = self._log(user_id)
            stored = [
                r
                for r in self.engine.records(user_id, where={"kind": KNOWLEDGE_KIND})
                if r.state.tier in (STM, LTM)
            ]
            tiers = {r.id: str(r.state.tier) for r in stored}
            rounds = {r.id: {int(x) for x in r.state.attrs.get("rounds", [])} for r in stored}
            texts = {r.id: r.text for r in stored}
            types = {r.id: str(r.state.attrs.get("type", COMMON_SENSE)) for r in stored}
            fresh: dict[str, MemoryRecord] = {}
            touched: set[str] = set()
            for text, kind in typed:
                match = matching_item(text, texts, self.merge_threshold)
                if match is None:
                    record = MemoryRecord(
                        new_id(),
                        user_id,
                        KNOWLEDGE_KIND,
                        text,
                        now,
                        metadata={"type": kind},
                        source_ids=tuple(sources),
                    )
                    fresh[record.id] = record
                    texts[record.id] = text
                    tiers[record.id] = STM
                    rounds[record.id] = {round_no}
                    types[record.id] = kind
                    touched.add(record.id)
                elif round_no not in rounds[match]:
                    rounds[match].add(round_no)
                    touched.add(match)
                    log["merges"] = log.get("merges", 0) + 1
            for item in touched:
                if tiers[item] == STM and len(rounds[item]) >= self.theta:
                    tiers[item] = LTM
                    log["promotions"] = log.get("promotions", 0) + 1
            dropped = refreshed_stm(
                round_no,
                tiers,
                rounds,
                log,
                period=self.stm_refresh_rounds,
                capacity=self.stm_capacity,
            )
            for item in dropped:
                touched.discard(item)
                fresh.pop(item, None)
            changes = {
                item: {
                    "tier": tiers[item],
                    "attrs": {
                        "count": len(rounds[item]),
                        "rounds": sorted(rounds[item]),
                        "type": types[item],
                    },
                }
                for item in touched
            }
            written = self.engine.write_derivation(
                user_id,
                Derivation(
                    add=list(fresh.values()),
                    state=changes,
                    reason=f"dpem: memorized round {round_no}",
                ),
                job=job,
                index=False,
            )
            if not written:
                return
            stale = [item for item in dropped if item not in fresh and item in tiers]
            if stale:
                self.engine.delete_records(user_id, stale, reason=f"dpem: STM refresh {round_no}")
            if mark_processed(log, round_no):
                log["processed"] = log.get("processed", 0) + 1
            log["last_round"] = max(log.get("last_round", 0), round_no)
            self.engine.set_user_state(user_id, self._log_key, log)
        if fresh:
            self.engine.index_pending()


#: Each model step's name in ``usage.failures``.
_LABELS = {"notes": "notes", "knowledge": "knowledge", "types": "typing"}


def _failed(label: str, error: Exception) -> JobFailed:
    """A coordinator step's failure (its cause set, as ``raise ... from`` sets it)."""
    failure = JobFailed(label, f"DPeM {label} failed: {error}")
    failure.__cause__ = error
    return failure
