"""The EMG-RAG memory: one class that saves, edits, selects, trains and serves (§4.1-4.4).

:class:`EMGMemory` is the front of the package: it holds the settings and delegates each concern
to its part (:mod:`.edits`, :mod:`.selection`, :mod:`.training`, :mod:`.jobs`,
:mod:`.questions`, :mod:`.applications`, :mod:`.export`, :mod:`.drawing`); the package
docstring (:mod:`memories_core.mechanisms.emg`) describes the whole mechanism.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import memories_core.mechanisms.emg.applications as applications
import memories_core.mechanisms.emg.drawing as drawing
import memories_core.mechanisms.emg.export as export
import memories_core.mechanisms.emg.jobs as jobs
import memories_core.mechanisms.emg.questions as questions
import memories_core.mechanisms.emg.training as training
from memories_core.engine import Derivation, JobFailed, check_query, check_scope, default_llm
from memories_core.errors import ConfigurationError, LLMError, ParseError
from memories_core.mechanisms.base import MemoryBase, turn_from_record
from memories_core.mechanisms.emg.archive import PolicyArchive
from memories_core.mechanisms.emg.batching import (
    EXTRACTED,
    extract_input,
    extracted_from_payload,
    prepare_extractions,
)
from memories_core.mechanisms.emg.edits import GraphEditor
from memories_core.mechanisms.emg.embeddings import EmbeddingCache
from memories_core.mechanisms.emg.policy import ALL_FEATURES, SelectionPolicy
from memories_core.mechanisms.emg.schema import (
    MEMORY_KIND,
    POLICY_JOBS,
    SKIPPED_ROLES,
    Answer,
    Edit,
    PolicyStatus,
    Reminder,
    Selection,
    TrainingExample,
    TrainingReport,
    TrainingRun,
)
from memories_core.mechanisms.emg.selection import Selector
from memories_core.mechanisms.emg.taxonomy import build_taxonomy, labels_of
from memories_core.prompts.emg import (
    ANSWER,
    AUTOFILL,
    EXTRACT,
    QUESTIONS,
    ExtractedMemory,
    MemoryLine,
)
from memories_core.prompts.spec import PromptSpec, run_spec
from memories_core.types import (
    Job,
    JobSpec,
    MemoryRecord,
    Recall,
    Scope,
    ScoredRecord,
    StateChange,
    Turn,
    check_user_id,
    ensure_utc,
)

if TYPE_CHECKING:
    from memories_core.interfaces import LLM
    from memories_core.retrieval import Pipeline, RecallBackend, RecallRequest
    from memories_core.retrieval.fusion import Ranking

__all__ = ["EMGMemory", "EMGSource"]


class EMGMemory(MemoryBase):
    """EMG-RAG: see the package docstring (Wang et al., 2024, §4.1-4.4).

    Setup:
        Nothing to install (networkx, numpy; torch only to train the policy; matplotlib only
        to draw). Give a real ``llm`` for real extraction; offline,
        ``ScriptedLLM(default=emg_reply)`` (:mod:`memories_core.prompts.emg`) answers the
        prompts by rule.

    Key init args:
        llm: Extracts memories and answers (default: the engine's, else the bundled model).
        k: Memories a :meth:`recall` returns by default.
        activate: Activated nodes per question (K, Table 6: 3).
        pool: Nearest memories the walk may visit.
        max_select: Most memories one selection returns.
        min_select: Fewest (the best-scored visited memories fill a short selection).
        threshold: Cosine at which the threshold fallback includes a memory.
        relation_match: Cosine of relation names at which two relations are the same.
        subclasses: Extra subclasses per type, added to Table 7's.
        retries: Repair attempts of an unparsable extraction before the fallback.
        decode: How a trained policy's decisions become the selected set (:meth:`select`):
            ``"expected_f1"`` (default; variable size, the prefix of the walked memories by
            ``P(required)`` with the highest expected F1) or ``"greedy"`` (the paper's
            include/stop walk, Eq. 2). The threshold fallback always walks greedily.
        fallback: Selection while no policy is trained: ``"top1"`` (default; the activation
            ranking's best ``max(min_select, 1)`` memories) or ``"threshold"``.
        recall_mode: ``"selection"`` (default: :meth:`recall` returns the selection, at most
            ``k``) or ``"fused"`` (walk + dense + lexical, cut to ``k``).
        train_after: Generated examples in the store before the policy is trained
            automatically, and again after each further ``train_after`` (``None``: never;
            no job is enqueued). See :meth:`run_training`.
        questions_every: New memories of a user per question-generation job.
        session_size: Consecutive memories shown together to the question writer (A.1).
        questions_per_session: Question-answer pairs asked per session.
        training: Settings of the automatic training (:meth:`train_policy` arguments).
        prompts: System instructions instead of the defaults, by prompt name:
            ``emg.extract``, ``emg.answer`` (:meth:`answer`, and the answers an LLM reward
            scores in :meth:`train_policy`), ``emg.autofill`` and ``emg.questions``
            (:meth:`generate_questions`); checked at construction (each must keep the JSON
            field names its default names). Reminders use no prompt.
        **kwargs: Engine or storage options of :class:`~memories_core.mechanisms.base.MemoryBase`.

    Instantiate, save, ask:
        .. code-block:: python

            from memories_core import EMGMemory, Scope, Turn
            from memories_core.embedders import HashingEmbedder
            from memories_core.llms import ScriptedLLM
            from memories_core.prompts.emg import emg_reply

            memory = EMGMemory(llm=ScriptedLLM(default=emg_reply), embedder=HashingEmbedder())
            memory.save([Turn("user", "I booked the EK349 flight.")], Scope("ann"))
            print(memory.answer("Which flight did I book?", Scope("ann")).text)

    Raises:
        ConfigurationError: on a bad ``activate``, ``pool``, ``threshold``, ``fallback``,
            ``recall_mode``, ``train_after`` or subclass.
    """

    mechanism_name: ClassVar[str] = "emg"
    prompt_specs: ClassVar[tuple[PromptSpec[Any, Any], ...]] = (
        EXTRACT,
        ANSWER,
        AUTOFILL,
        QUESTIONS,
    )
    recall_kinds: ClassVar[tuple[str, ...]] = (MEMORY_KIND,)
    index_turns: ClassVar[bool] = False

    def __init__(
        self,
        *,
        llm: LLM | None = None,
        k: int = 5,
        activate: int = 3,
        pool: int = 50,
        max_select: int = 10,
        min_select: int = 1,
        threshold: float = 0.35,
        relation_match: float = 0.9,
        subclasses: Mapping[str, Sequence[str]] | None = None,
        retries: int = 1,
        decode: Literal["greedy", "expected_f1"] = "expected_f1",
        fallback: Literal["top1", "threshold"] = "top1",
        recall_mode: Literal["selection", "fused"] = "selection",
        train_after: int | None = 50,
        questions_every: int = 20,
        session_size: int = 8,
        questions_per_session: int = 3,
        training: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if decode not in ("greedy", "expected_f1"):
            raise ConfigurationError("decode must be 'expected_f1' or 'greedy'")
        if fallback not in ("top1", "threshold"):
            raise ConfigurationError("fallback must be 'top1' or 'threshold'")
        if recall_mode not in ("selection", "fused"):
            raise ConfigurationError("recall_mode must be 'selection' or 'fused'")
        if train_after is not None and train_after < 1:
            raise ConfigurationError("train_after must be None or at least 1")
        if questions_every < 1 or session_size < 1 or questions_per_session < 1:
            raise ConfigurationError(
                "questions_every, session_size and questions_per_session must be at least 1"
            )
        self.decode: str = decode
        self.fallback: str = fallback
        self.recall_mode: str = recall_mode
        self.train_after = train_after
        self.questions_every = questions_every
        self.session_size = session_size
        self.questions_per_session = questions_per_session
        self.training: dict[str, Any] = dict(training or {})
        if not 1 <= activate <= pool:
            raise ConfigurationError("activate must be between 1 and pool")
        if not 0 <= min_select <= max_select:
            raise ConfigurationError("need 0 <= min_select <= max_select")
        if not -1 <= threshold <= 1 or not -1 <= relation_match <= 1:
            raise ConfigurationError("threshold and relation_match are cosines in [-1, 1]")
        self.taxonomy: dict[str, tuple[str, ...]] = build_taxonomy(subclasses)
        self.subclass_labels: tuple[str, ...] = labels_of(self.taxonomy)
        engine = kwargs.get("engine")
        if llm is None and (engine is None or engine.llm is None):
            llm = default_llm()
        self.activate = activate
        self.pool = pool
        self.max_select = max_select
        self.min_select = min_select
        self.threshold = threshold
        self.relation_match = relation_match
        self.retries = retries
        super().__init__(k=k, llm=llm, **kwargs)
        #: Embeddings of names, relations and memories, shared by the editor and the walk.
        self.embeddings = EmbeddingCache(self.embedder)
        #: Plans and writes the graph edits (§4.2); reads this memory's settings.
        self.editor = GraphEditor(self.engine, self.embeddings, self)
        #: Builds walk environments and selects (§4.3); reads this memory's settings.
        self.selector = Selector(self.engine, self.embeddings, self)
        #: The policies and training examples (artifacts).
        self.archive = PolicyArchive(self.engine)
        if self.pipeline is None:
            self.pipeline = self.recall_pipeline()

    # ------------------------------------------------------------------ configuration
    def recall_pipeline(self) -> Pipeline:
        """The recall pipeline of :attr:`recall_mode`.

        ``"selection"``: the graph walk's selection only (:class:`EMGSource`), so
        :meth:`recall` and every generic adapter return the policy's variable-size set (at
        most ``k``). ``"fused"``: the walk fused with dense and lexical search, cut to ``k``.
        """
        from memories_core.retrieval import DenseSource, LexicalSource, Pipeline

        if self.recall_mode == "selection":
            return Pipeline(sources=(EMGSource(self, weight=1.0),), rerankers=())
        return Pipeline(
            sources=(EMGSource(self), DenseSource(weight=0.2), LexicalSource(weight=0.3)),
            rerankers=(),
        )

    # ------------------------------------------------------------------ writing (§4.2)
    def ingest(
        self, text: str, scope: Scope, *, source: str = "notification", at: datetime | None = None
    ) -> None:
        """Store raw text that is not a chat turn (an app notification, OCR'd screenshot text).

        It is kept as a turn whose role is ``source`` and extracted like a user turn (A.1).
        """
        self.save([Turn(source, text, timestamp=at)], scope)

    def _turn_jobs(self, records: Sequence[MemoryRecord]) -> Iterable[JobSpec]:
        return [
            JobSpec(self.name, "extract", f"turn:{r.id}", {"turn_id": r.id})
            for r in records
            if str(r.metadata.get("role", "user")).lower() not in SKIPPED_ROLES
        ]

    def _run_job(self, job: Job) -> Derivation | None:
        """Extract a turn's memories (A.1 step 2) and plan their edits (one derivation).

        An unparsable answer stores the text as one memory without edges under its nearest
        subclass (documented fallback); an LLM outage leaves the job pending.
        """
        user_id = job.user_id
        found = self.engine.get(user_id, [str(job.payload["turn_id"])])
        if not found:
            return None
        turn = found[0]
        memories: list[ExtractedMemory] | None
        if EXTRACTED in job.payload:  # extracted in a batch (_prepare_jobs)
            memories = extracted_from_payload(job.payload[EXTRACTED])
        else:
            llm = self._llm(Scope(user_id))
            try:
                memories = run_spec(
                    llm, self.prompt_spec(EXTRACT), extract_input(self, turn), retries=self.retries
                )
            except LLMError as exc:
                raise JobFailed("extract", f"extraction of turn {turn.id} failed: {exc}") from exc
            except ParseError:
                memories = None  # documented fallback: stored under its nearest subclass
        # The fallback memory is the text as said, with who said it when that is known.
        said = turn_from_record(turn)
        text = f"{said.speaker}: {said.content}" if said.speaker else said.content
        plan = self.editor.plan(user_id, memories, text, turn.created_at, (turn.id,))
        return self.editor.derivation(user_id, plan)

    def _prepare_jobs(self, jobs: Sequence[Job]) -> dict[str, BaseException]:
        """Extract several turns' memories in one batch (see :func:`prepare_extractions`)."""
        return prepare_extractions(self, jobs)

    def add_memories(
        self,
        user_id: str,
        memories: Sequence[ExtractedMemory],
        *,
        at: datetime | None = None,
        source_ids: Sequence[str] = (),
        edit: bool = True,
        metadata: Mapping[str, Any] | None = None,
    ) -> list[Edit]:
        """Edit the graph with memories extracted elsewhere (no model call), atomically.

        The same insertion / deletion / replacement rules as for extracted turns (§4.2).
        ``edit=False`` inserts every memory without comparing it with the graph (a bulk load
        of facts that are known not to replace each other, e.g. a benchmark's observations);
        ``metadata`` is added to every new memory's metadata.

        Returns:
            The edits made, in order.
        """
        return self.editor.add_memories(
            user_id, memories, at=at, source_ids=source_ids, edit=edit, metadata=metadata
        )

    def add_text(
        self, user_id: str, text: str, *, at: datetime | None = None, source_ids: Sequence[str] = ()
    ) -> list[Edit]:
        """Store a statement as one memory without edges, under its nearest subclass.

        This is the extraction fallback (no model call), also for bulk loads (benchmarks).
        """
        return self.editor.add_text(user_id, text, at=at, source_ids=source_ids)

    # ------------------------------------------------------------------ reading the graph
    def edits(self, user_id: str) -> list[StateChange]:
        """The user's graph edits from the update history (old, new, when, why), oldest first."""
        return self.editor.history(user_id)

    def memories(
        self, user_id: str, *, now: datetime | None = None, include_expired: bool = False
    ) -> list[MemoryRecord]:
        """The user's memories as of ``now`` (all with ``include_expired``), oldest first.

        As of ``now``: formed at or before it, not archived, and inside their validity.
        """
        return export.memories_of(self.engine, user_id, now=now, include_expired=include_expired)

    def triples(self, user_id: str, *, now: datetime | None = None) -> set[tuple[str, str, str]]:
        """The live ``(subject, relation, object)`` edges of the user's graph at ``now``."""
        return export.triples(self.engine, user_id, now=now)

    def to_networkx(self, user_id: str) -> Any:
        """The user's graph as a ``networkx.MultiDiGraph`` (see ``GraphStore.to_networkx``)."""
        return export.to_networkx(self.engine, user_id)

    def export_graph(
        self,
        user_id: str,
        path: str | Path | None = None,
        *,
        format: Literal["json", "graphml"] = "json",
        now: datetime | None = None,
    ) -> str:
        """Export one user's graph for inspection; returns the text (and writes ``path``).

        JSON: ``{"nodes": [...], "edges": [...]}`` (node-link form); GraphML: attribute
        values that are dicts are JSON strings. Each relation edge carries its memory's text
        and ``live`` (whether it is valid at ``now``).
        """
        return export.export_graph(self.engine, user_id, path, format=format, now=now)

    def draw(self, user_id: str, path: str | Path, *, now: datetime | None = None) -> Path:
        """Draw one user's graph as a PNG; expired edges dashed.

        Needs matplotlib (extra ``graph``), imported here.

        Raises:
            MissingExtraError: if matplotlib is not installed.
        """
        return drawing.draw(self.engine, user_id, path, now=now)

    # ------------------------------------------------------------------ selection (§4.3)
    def policy(self, user_id: str | None = None) -> SelectionPolicy | None:
        """The trained policy serving ``user_id`` (theirs, else the store's), or ``None``."""
        return self.archive.load(user_id)

    def save_policy(
        self,
        policy: SelectionPolicy,
        user_id: str | None = None,
        *,
        contributors: Sequence[str] = (),
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        """Save a policy for the whole store (``user_id=None``) or for one user (artifact).

        Args:
            policy: The weights.
            user_id: Owner of a per-user policy; ``None`` for the store's.
            contributors: Users whose examples trained it (kept in the artifact's metadata:
                deleting one of them drops this policy, see :meth:`policy_status`).
            settings: Training settings :meth:`retrain_policy` reuses.
        """
        self.archive.save(policy, user_id, contributors=contributors, settings=settings)

    def policy_status(self, user_id: str | None = None) -> PolicyStatus:
        """Whether the store's (or ``user_id``'s own) policy is trained, or stale.

        A policy is *stale* when a user whose examples trained it was deleted: the weights
        are dropped at once (they carry that user's influence), selection falls back to the
        next policy (the store's) or the untrained fallback, and :meth:`retrain_policy`
        trains it again from the remaining users' stored examples.
        """
        return self.archive.status(user_id)

    def select(
        self,
        question: str,
        scope: Scope | str,
        *,
        now: datetime | None = None,
        activate: int | None = None,
        policy: SelectionPolicy | Literal["auto"] | None = "auto",
        decode: Literal["greedy", "expected_f1"] | None = None,
    ) -> Selection:
        """Select the memories for a question by walking the graph (§4.3).

        The question is embedded once (the activation search and the state share the
        vector); its entities and relation are read without a model
        (:func:`~memories_core.prompts.emg.question_parts`).

        Args:
            question: The question.
            scope: Whose graph (a :class:`Scope` or a user id).
            now: Time of the question; memories not valid then are never visited.
            activate: Activated nodes (default: ``self.activate``).
            policy: A policy to use, ``None`` for the untrained fallback (``fallback``),
                ``"auto"`` for the user's or store's trained policy (fallback if none).
            decode: How a trained policy's ``P(include)`` becomes the set (default:
                ``self.decode``): ``"greedy"``, the include/stop walk of Eq. 2; or
                ``"expected_f1"``, every reachable memory scored, then the best-first prefix
                of highest expected F1 (:func:`~.policy.expected_f1_size`). The
                threshold fallback always walks greedily.

        Raises:
            InvalidInputError: on an empty question.
        """
        question = check_query(question)
        user_id = scope.user_id if isinstance(scope, Scope) else check_user_id(scope)
        when = ensure_utc(now) if now is not None else self.clock.now()
        chosen = self.policy(user_id) if policy == "auto" else policy
        return self.selector.select(
            question, user_id, when, activate=activate, policy=chosen, decode=decode
        )

    # ------------------------------------------------------------------ training
    def train_policy(
        self,
        examples: Sequence[TrainingExample],
        *,
        user_id: str | None = None,
        features: Sequence[str] = ALL_FEATURES,
        warm_epochs: int = 300,
        episodes: int = 3000,
        batch: int = 16,
        lr: float = 1e-3,
        warm_lr: float = 1e-2,
        balance: bool = False,
        reward_llm: LLM | None = None,
        now: datetime | None = None,
        seed: int = 0,
        progress: bool = True,
        save: bool = True,
    ) -> TrainingReport:
        """Train the selection policy: warm start (Eq. 5), then REINFORCE (Eq. 6).

        WS states come from walks that include every visited memory (the teacher explores
        the whole reachable neighbourhood), labelled by ``example.required``. PG samples
        walks from the policy; the return is the change in answer quality (Eq. 3-4):

        * with ``reward_llm`` and reference answers: ROUGE-L of the LLM's answer from the
          selected memories minus ROUGE-L of its answer from none (§4.3);
        * otherwise (offline): the F1 of the selected memories against the required ones,
          minus that of the empty selection (0): a retrieval-quality reward.

        Offline, the greedy walk's F1 on the same question is the baseline (self-critical);
        with an LLM reward a running mean is (no extra model calls). Each question's
        environment is built once.

        With ``save`` the policy is saved (store-wide, or ``user_id``'s), and each user's
        examples are kept as that user's artifact (``emg/training/...``), so they go with
        :meth:`delete_user`, which also drops the policies they trained (see
        :meth:`policy_status`, :meth:`retrain_policy`).

        Args:
            examples: Questions with required memory ids (and reference answers).
            user_id: Train ``user_id``'s own policy (online fine-tuning, §4.4) from their
                examples only, starting from the store's policy; default: the store's.
            features: State features (default every one; the paper's Eq. 1 is
                :data:`~.policy.PAPER_FEATURES`).
            warm_epochs: WS epochs (0 skips WS).
            episodes: PG episodes (A.4 uses 100; 0 skips PG).
            batch: PG episodes per Adam step.
            lr: PG learning rate (A.4: 0.001).
            warm_lr: WS learning rate.
            balance: Class-balanced BCE in WS (see :func:`.policy.warm_start`).
            reward_llm: Model whose answers are scored by ROUGE-L.
            now: Time of the questions.
            seed: Seed of initialisation, sampling and torch.
            progress: tqdm bars.
            save: Save the policy and the examples as artifacts.

        Raises:
            InvalidInputError: if there are no examples, a per-user policy gets another
                user's example, or no state could be collected.
        """
        return training.train_policy(
            self.selector,
            self.archive,
            examples,
            user_id=user_id,
            features=features,
            warm_epochs=warm_epochs,
            episodes=episodes,
            batch=batch,
            lr=lr,
            warm_lr=warm_lr,
            balance=balance,
            reward_llm=reward_llm,
            now=now,
            seed=seed,
            progress=progress,
            save=save,
            answer_spec=self.prompt_spec(ANSWER),
        )

    def retrain_policy(
        self, user_id: str | None = None, *, progress: bool = True
    ) -> TrainingReport | None:
        """Train the store's (or ``user_id``'s) policy again from the stored examples.

        The examples are those the contributing users still have (each user's
        ``emg/training/...`` artifact, which :meth:`delete_user` removes); required ids whose
        memories are gone are dropped. The settings are those the policy was trained with.
        Used after a contributor was deleted (:meth:`policy_status` ``stale``).

        Returns:
            The report, or ``None`` when no stored example is left (no policy is saved; the
            untrained fallback serves).
        """
        return training.retrain_policy(self.selector, self.archive, user_id, progress=progress)

    def train_and_check(
        self, examples: Sequence[TrainingExample], *, progress: bool = False
    ) -> TrainingReport:
        """Train the store's policy on generated questions; keep it only if it beats top-1.

        Every :data:`~.schema.HOLD_OUT`-th question (by a hash of its text; all of them when
        there are fewer) is held out; the policy is trained on the rest (``training``
        settings) and saved only if its mean selection F1 on the held-out questions is above
        that of the top-1 fallback. Generated questions are noisy (a small model, or the
        rule-based stand-in, writes them), so this check is what keeps an automatically
        trained user no worse than top-1 on the questions we can see.

        Returns:
            The report; ``kept`` says whether the policy was saved, ``held_out`` the check.
        """
        return training.train_and_check(
            self.selector,
            self.archive,
            examples,
            self.training,
            progress=progress,
            answer_spec=self.prompt_spec(ANSWER),
        )

    # ------------------------------------------------------------------ generated questions (A.1)
    @property
    def policy_jobs(self) -> str:
        """Mechanism name of the question-generation and training jobs (``<name>/policy``).

        They are engine jobs (stored, retried with backoff, listed by ``engine.pending``)
        that no save runs: :meth:`run_training` runs them, from a worker or a schedule.
        """
        return self.name + POLICY_JOBS

    def generate_questions(
        self,
        user_id: str,
        *,
        memories: Sequence[MemoryRecord] | None = None,
        session_size: int | None = None,
        per_session: int | None = None,
        max_sessions: int | None = None,
        llm: LLM | None = None,
        now: datetime | None = None,
        progress: bool = False,
    ) -> tuple[list[TrainingExample], int, int]:
        """Write training questions from a user's own memories (appendix A.1, step 3).

        The memories (default: every memory valid at ``now``) are ordered by time and cut
        into sessions of ``session_size`` consecutive memories; the model writes up to
        ``per_session`` question-answer pairs per session with the memories each answer
        needs (:data:`~memories_core.prompts.emg.QUESTIONS`). A pair is kept only if its
        cited memories exist and hold its answer (:func:`~memories_core.prompts.emg.
        parse_questions`); a session whose reply stays unusable after one repair is skipped
        and counted in ``usage.failures`` (``"questions"``).

        Args:
            user_id: Whose memories.
            memories: The memories to ask about (default: all valid at ``now``).
            session_size: Memories per session (default: ``self.session_size``).
            per_session: Pairs asked per session (default: ``self.questions_per_session``).
            max_sessions: Most sessions sent to the model (the most recent ones).
            llm: The writer (default: the user's model, :meth:`_llm`).
            now: Validity time of the default memories.
            progress: tqdm bar over the sessions.

        Returns:
            ``(examples, sessions, rejected)``: the validated examples (with reference
            answers), the sessions sent, and how many gave no usable pair.

        Raises:
            LLMError: if the model fails (nothing is kept of this call).
        """
        check_user_id(user_id)
        when = ensure_utc(now) if now is not None else self.clock.now()
        pool = list(memories) if memories is not None else self.memories(user_id, now=when)
        return questions.generate_questions(
            user_id,
            pool,
            llm or self._llm(Scope(user_id)),
            session_size=session_size or self.session_size,
            per_session=per_session or self.questions_per_session,
            max_sessions=max_sessions,
            retries=self.retries,
            on_rejected=lambda: self.engine.count_failure("questions"),
            progress=progress,
            spec=self.prompt_spec(QUESTIONS),
        )

    def generated_examples(self, user_id: str) -> list[TrainingExample]:
        """The questions generated so far from ``user_id``'s memories (their artifact)."""
        return self.archive.generated(user_id)

    def schedule_training(self, user_id: str) -> int:
        """Enqueue a question-generation job if ``user_id`` has enough new memories.

        A job is due each time the user's memory count passes another multiple of
        ``questions_every`` (the job key holds that multiple, so a job exists once). Called
        after every :meth:`save`; cheap (one count, at most one job row) and never runs a
        model. Nothing happens when ``train_after`` is ``None``.

        Returns:
            How many jobs were enqueued (0 or 1).
        """
        return jobs.schedule_training(self, user_id)

    def save(self, turns: Sequence[Turn], scope: Scope) -> None:
        """Store turns and extract memories (see :class:`MemoryBase`), then schedule.

        Question generation is only enqueued (:meth:`schedule_training`), never run here.
        """
        super().save(turns, scope)
        if self.train_after is not None:
            self.schedule_training(check_scope(scope).user_id)

    def run_training(self, user_id: str | None = None, *, progress: bool = False) -> TrainingRun:
        """Run the due question-generation and training jobs (of one user, or all).

        The automatic training loop (appendix A.1 step 3, then §4.3's training): a
        ``questions`` job generates questions from the user's memories not asked about yet
        (:meth:`generate_questions`) and keeps them as the user's artifact
        (:data:`~.schema.TRAINING_GENERATED`, deleted with the user); when the store holds
        ``train_after`` generated examples, and again each time another ``train_after``
        accumulate, a ``train`` job trains the store's policy on every user's generated
        examples (:meth:`train_and_check` with the ``training`` settings given at
        construction; the users are its contributors).
        Saves and recalls never run these jobs: call this from a worker, a schedule or a
        quiet moment. A failed job (model down) stays pending with a backoff.

        Returns:
            What ran (:class:`TrainingRun`).
        """
        return jobs.run_training(self, user_id, progress=progress)

    # ------------------------------------------------------------------ recall and applications
    def recall(
        self, query: str, scope: Scope, *, k: int | None = None, now: datetime | None = None
    ) -> Recall:
        """The selection, at most ``k`` (``recall_mode="fused"``: fused with dense + lexical).

        Raises:
            InvalidInputError: on an empty query or a bad ``k``.
            MissingUserError: if ``scope`` has no user.
        """
        scope = check_scope(scope)
        hits = self._search(query, scope, k=self.default_k if k is None else k, now=now)
        return Recall(query=query, records=tuple(hits), context=self._render(hits))

    def _render(self, hits: Sequence[ScoredRecord]) -> str:
        """One memory a line: statement and triple, after when it was received.

        The time is the memory's record time (the message it was extracted from, appendix
        A.1's received time), shown as every mechanism shows dates (:attr:`show_dates`).
        """
        return applications.render(hits, self._dated)

    @staticmethod
    def _line(record: MemoryRecord) -> MemoryLine:
        return applications.memory_line(record)

    def answer(self, question: str, scope: Scope, *, now: datetime | None = None) -> Answer:
        """Answer a question from the selected memories (§4.3 ``LLM(Q ⊕ M)``, §4.4).

        Raises:
            InvalidInputError: on an empty question.
            LLMError: if the model fails; ParseError: if its answer is empty or markup.
        """
        scope = check_scope(scope)
        when = ensure_utc(now) if now is not None else self.clock.now()
        chosen = self.select(question, scope, now=when)
        return applications.answer(chosen, self._llm(scope), when, self.prompt_spec(ANSWER))

    async def aanswer(self, question: str, scope: Scope, *, now: datetime | None = None) -> Answer:
        """Async twin of :meth:`answer`."""
        return await asyncio.to_thread(self.answer, question, scope, now=now)

    def autofill(
        self, fields: Sequence[str], scope: Scope, *, now: datetime | None = None
    ) -> dict[str, str | None]:
        """Fill form fields from the user's memories (§4.4 autofill forms).

        Each field becomes the question "What is the user's <field>?"; its memories are
        selected and the model gives the value. A value no memory holds, or an unusable
        answer, gives ``None`` (documented graceful fallback); an outage raises ``LLMError``.
        """
        scope = check_scope(scope)
        applications.check_fields(fields)
        when = ensure_utc(now) if now is not None else self.clock.now()
        return applications.autofill(
            fields,
            lambda question: self.select(question, scope, now=when),
            self._llm(scope),
            self.prompt_spec(AUTOFILL),
        )

    def reminders(
        self,
        scope: Scope,
        now: datetime | None = None,
        horizon: timedelta = timedelta(days=7),
    ) -> list[Reminder]:
        """Upcoming events and expiries in ``(now, now + horizon]`` (§4.4 reminders).

        Events come from the memories' extracted event times (absolute, A.1); memories not
        valid at ``now`` (expired, replaced) are left out; a memory valid until a time inside
        the horizon gives an "expires" reminder. Soonest first.
        """
        scope = check_scope(scope)
        when = ensure_utc(now) if now is not None else self.clock.now()
        return applications.reminders(self.memories(scope.user_id, now=when), when, horizon)

    def _on_delete_user(self, user_id: str) -> None:
        """Forget what the user left in this process and in shared policies.

        Drops cached embeddings (they may hold the user's texts), the user's cached policy,
        and every policy the user's examples trained (marked stale, see
        :meth:`policy_status`). The user's own artifacts (their policy, their stored
        examples) are removed by the engine.
        """
        self.embeddings.clear()
        self.archive.forget(user_id)
        self.archive.drop_trained_by(user_id)


@dataclass(frozen=True)
class EMGSource:
    """The graph walk as a candidate source of the retrieval pipeline (§4.3).

    Candidates are the memories the agent selects, scored by ``P(include)`` (or cosine).
    """

    memory: EMGMemory
    weight: float = 0.5
    name: str = "emg"

    def candidates(self, request: RecallRequest, backend: RecallBackend, depth: int) -> Ranking:
        """Run the selection for ``request.query`` and return it as a ranking."""
        chosen = self.memory.select(request.query, request.user_id, now=request.now)
        return [(h.record.id, h.score) for h in chosen.memories][:depth]
