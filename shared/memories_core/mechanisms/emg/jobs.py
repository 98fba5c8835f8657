"""The automatic training loop: question-generation and training jobs (A.1 step 3, §4.3).

After a save, when a user has another ``questions_every`` memories, a *pending job* is
enqueued under the mechanism name ``<name>/policy``; saves and recalls never run it.
:func:`run_training` (from a worker or a schedule) runs the due jobs: a ``questions`` job
generates questions from the user's memories not asked about yet and keeps them as the user's
artifact; when the store holds ``train_after`` generated examples (and again after each further
``train_after``) a ``train`` job trains the store's policy on every user's generated examples,
kept only if it beats top-1 on held-out questions
(:func:`~memories_core.mechanisms.emg.training.train_and_check`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING

from memories_core.engine import Derivation
from memories_core.errors import InvalidInputError, LLMError
from memories_core.mechanisms.emg.schema import (
    LAST_TRAINING,
    MEMORY_KIND,
    STORE_OWNER,
    TrainingExample,
    TrainingReport,
    TrainingRun,
)
from memories_core.types import Job, JobSpec, check_user_id

if TYPE_CHECKING:
    from memories_core.mechanisms.emg.memory import EMGMemory

__all__ = ["run_training", "schedule_training"]


def schedule_training(memory: EMGMemory, user_id: str) -> int:
    """Enqueue a question-generation job if ``user_id`` has enough new memories.

    A job is due each time the user's memory count passes another multiple of
    ``questions_every`` (the job key holds that multiple, so a job exists once). Cheap (one
    count, at most one job row); never runs a model. Nothing happens when ``train_after`` is
    ``None``.

    Returns:
        How many jobs were enqueued (0 or 1).
    """
    check_user_id(user_id)
    if memory.train_after is None:
        return 0
    count = len(memory.engine.records(user_id, where={"kind": MEMORY_KIND}))
    step = count // memory.questions_every
    if step < 1:
        return 0
    spec = JobSpec(memory.policy_jobs, "questions", f"questions:{step}", {"memories": count})
    return memory.engine.enqueue(user_id, [spec])


def run_training(
    memory: EMGMemory, user_id: str | None = None, *, progress: bool = False
) -> TrainingRun:
    """Run the due question-generation and training jobs (of one user, or all).

    A failed job (model down, no usable example) stays pending with a backoff; after a model
    failure no further job calls it in this run.
    """
    if user_id is not None:
        check_user_id(user_id)
    engine = memory.engine
    store, policy = engine.store, engine.policy
    clock = engine.clock
    questions = sessions = rejected = failed = 0
    trained: list[TrainingReport] = []
    down = False
    for kind in ("questions", "train"):  # a questions job may enqueue the train job
        now = clock.now()
        jobs = [
            j
            for j in engine.pending(user_id, mechanism=memory.policy_jobs)
            if j.kind == kind and j.next_attempt_at <= now
        ]
        for job in jobs:
            if down or not store.claim_job(job.id, now=clock.now(), lease=policy.lease):
                continue
            try:
                if kind == "questions":
                    made, sent, bad = _questions_job(memory, job, progress=progress)
                    questions, sessions = questions + made, sessions + sent
                    rejected += bad
                else:
                    report = _train_job(memory, progress=progress)
                    if report is not None:
                        trained.append(report)
            except (LLMError, InvalidInputError) as exc:
                engine.count_failure(kind)
                store.fail_job(
                    job.id,
                    error=f"{type(exc).__name__}: {exc}",
                    retry_at=policy.retry_at(clock.now(), job.attempts),
                )
                failed += 1
                down = isinstance(exc, LLMError)  # the model is down: stop calling it
                continue
            with store.transaction():
                store.finish_job(job.id)
    remaining = len(engine.pending(user_id, mechanism=memory.policy_jobs))
    return TrainingRun(questions, sessions, rejected, tuple(trained), failed, remaining)


def _questions_job(memory: EMGMemory, job: Job, *, progress: bool) -> tuple[int, int, int]:
    """Generate questions from the memories no earlier job asked about; maybe enqueue training.

    The questions are kept through the engine's write route, as a job's write: if the user
    was deleted while the model wrote them, nothing is kept (their artifact stays gone).
    """
    user_id = job.user_id
    archive = memory.archive
    asked = {rid for e in archive.generated(user_id) for rid in e.required}
    seen = archive.seen(user_id)
    fresh = [r for r in memory.memories(user_id) if r.id not in asked and r.id not in seen]
    examples, sent, rejected = memory.generate_questions(user_id, memories=fresh, progress=progress)
    asked_now = seen | {r.id for r in fresh}

    def keep() -> None:
        archive.keep_generated(user_id, examples, asked_now, memory.clock.now())

    kept = memory.engine.write_derivation(user_id, Derivation(apply=keep), job=job)
    if not kept:  # the user was deleted while the model wrote: keep nothing of theirs
        return 0, sent, rejected
    store_total = archive.generated_total()
    info = memory.engine.artifacts.get(STORE_OWNER, LAST_TRAINING)
    last = int(info.meta.get("generated_examples", 0)) if info else 0
    if memory.train_after is not None and store_total - last >= memory.train_after:
        step = store_total // memory.train_after
        spec = JobSpec(memory.policy_jobs, "train", f"train:{step}", {"examples": store_total})
        memory.engine.enqueue(user_id, [spec])
    return len(examples), sent, rejected


def _train_job(memory: EMGMemory, *, progress: bool) -> TrainingReport | None:
    """Train the store's policy on every user's generated examples still alive."""
    engine = memory.engine
    examples: list[TrainingExample] = []
    for uid in engine.users():
        if engine.store.is_deleting(uid):
            continue
        alive = {r.id for r in engine.records(uid, where={"kind": MEMORY_KIND})}
        for example in memory.archive.generated(uid):
            required = example.required & alive
            if required:
                examples.append(dataclasses.replace(example, required=frozenset(required)))
    if not examples:
        return None
    total = memory.archive.generated_total()
    report = memory.train_and_check(examples, progress=progress)
    engine.put_artifact(
        STORE_OWNER,
        LAST_TRAINING,
        {"last.json": json.dumps(dict(report.held_out)).encode()},
        meta={"generated_examples": total, "kept": report.kept, **report.held_out},
    )
    return report
