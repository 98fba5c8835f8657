"""Selection policies and training examples, kept as engine artifacts.

A policy belongs to the store (:data:`~.schema.STORE_OWNER`) or to one user; its metadata lists
its *contributors*, the users whose examples trained it. The examples are kept per user, as
that user's artifact, so they go with the user. Deleting a contributor drops every policy they
trained (it carries their influence) and leaves a *stale* mark until the policy is retrained
from the remaining users' examples; meanwhile the untrained fallback serves.

Everything is JSON (never a pickle): the weights (:meth:`SelectionPolicy.to_json`) and the
examples (:func:`examples_json`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memories_core.mechanisms.emg.policy import SelectionPolicy
from memories_core.mechanisms.emg.schema import (
    POLICY_ARTIFACT,
    STALE_ARTIFACT,
    STORE_OWNER,
    TRAINING_GENERATED,
    TRAINING_OWN,
    TRAINING_STORE,
    PolicyStatus,
    TrainingExample,
)
from memories_core.types import check_user_id, ensure_utc

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine

__all__ = ["PolicyArchive", "examples_from_json", "examples_json"]


def examples_json(examples: Sequence[TrainingExample], at: datetime) -> str:
    """Examples (of one user) as JSON: ``{"at": ..., "examples": [...]}``."""
    return json.dumps(
        {
            "at": ensure_utc(at).isoformat(),
            "examples": [
                {"question": e.question, "required": sorted(e.required), "answer": e.answer}
                for e in examples
            ],
        }
    )


def examples_from_json(
    user_id: str, data: bytes | str
) -> tuple[list[TrainingExample], datetime | None]:
    """``user_id``'s examples read back from :func:`examples_json`, and when they were kept."""
    parsed = json.loads(data)
    at = parsed.get("at")
    return [
        TrainingExample(user_id, e["question"], frozenset(e["required"]), e.get("answer"))
        for e in parsed.get("examples", [])
    ], (datetime.fromisoformat(at) if at else None)


class PolicyArchive:
    """Reads and writes the policies and examples of one engine (its artifact store).

    Loaded policies are cached by the artifact's hash, so a selection does not parse the
    weights again while they are unchanged.
    """

    def __init__(self, engine: MemoryEngine) -> None:
        self.engine = engine
        self._policies: dict[str, tuple[str, SelectionPolicy]] = {}

    # ------------------------------------------------------------------ policies
    def load(self, user_id: str | None = None) -> SelectionPolicy | None:
        """The trained policy serving ``user_id`` (theirs, else the store's), or ``None``."""
        artifacts = self.engine.artifacts
        owners = [check_user_id(user_id), STORE_OWNER] if user_id is not None else [STORE_OWNER]
        for owner in owners:
            info = artifacts.get(owner, POLICY_ARTIFACT)
            if info is None:
                continue
            cached = self._policies.get(owner)
            if cached is not None and cached[0] == info.sha256:
                return cached[1]
            policy = SelectionPolicy.from_json(
                artifacts.read(owner, POLICY_ARTIFACT, "policy.json")
            )
            self._policies[owner] = (info.sha256, policy)
            return policy
        return None

    def save(
        self,
        policy: SelectionPolicy,
        user_id: str | None = None,
        *,
        contributors: Sequence[str] = (),
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        """Save a policy for the whole store (``user_id=None``) or for one user; clear staleness."""
        owner = STORE_OWNER if user_id is None else check_user_id(user_id)
        self.engine.put_artifact(
            owner,
            POLICY_ARTIFACT,
            {"policy.json": policy.to_json().encode("utf-8")},
            meta={
                "architecture": policy.architecture,
                "features": list(policy.features),
                "trained": policy.trained,
                "contributors": sorted(set(contributors)),
                "settings": dict(settings or {}),
            },
        )
        self.engine.artifacts.delete(owner, STALE_ARTIFACT)
        self._policies.pop(owner, None)

    def status(self, user_id: str | None = None) -> PolicyStatus:
        """Whether the store's (or ``user_id``'s own) policy is trained, or stale."""
        owner = STORE_OWNER if user_id is None else check_user_id(user_id)
        info = self.engine.artifacts.get(owner, POLICY_ARTIFACT)
        marker = self.engine.artifacts.get(owner, STALE_ARTIFACT)
        source = info if info is not None else marker
        return PolicyStatus(
            owner=owner,
            trained=info is not None,
            stale=marker is not None,
            contributors=tuple(source.meta.get("contributors", ())) if source else (),
        )

    def remove(self, owner: str) -> None:
        """Delete ``owner``'s policy and its stale mark (nothing is left to retrain)."""
        self.engine.artifacts.delete(owner, POLICY_ARTIFACT)
        self.engine.artifacts.delete(owner, STALE_ARTIFACT)
        self._policies.pop(owner, None)

    def forget(self, owner: str) -> None:
        """Drop ``owner``'s policy from the cache (not from the store)."""
        self._policies.pop(owner, None)

    def drop_trained_by(self, user_id: str) -> None:
        """Drop every policy ``user_id``'s examples trained; leave a stale mark (deletion).

        Per-user policies start from the store's weights, so they list the store's
        contributors too; they are looked for only while a store policy (or its mark)
        exists.
        """
        artifacts = self.engine.artifacts
        owners = [STORE_OWNER]
        if artifacts.get(STORE_OWNER, POLICY_ARTIFACT) or artifacts.get(
            STORE_OWNER, STALE_ARTIFACT
        ):
            owners += [u for u in self.engine.users() if u != user_id]
        for owner in owners:
            for name in (POLICY_ARTIFACT, STALE_ARTIFACT):
                info = artifacts.get(owner, name)
                if info is None or user_id not in info.meta.get("contributors", ()):
                    continue
                remaining = [c for c in info.meta.get("contributors", ()) if c != user_id]
                self.engine.put_artifact(
                    owner,
                    STALE_ARTIFACT,
                    {"stale.json": b'{"reason": "a contributing user was deleted"}'},
                    meta={"contributors": remaining, "settings": info.meta.get("settings", {})},
                )
                artifacts.delete(owner, POLICY_ARTIFACT)
                self._policies.pop(owner, None)
                break

    # ------------------------------------------------------------------ examples
    def save_trained(
        self,
        policy: SelectionPolicy,
        examples: Sequence[TrainingExample],
        user_id: str | None,
        when: datetime,
        contributors: Iterable[str],
        settings: Mapping[str, Any],
    ) -> None:
        """Save a trained policy, and each user's examples as that user's artifact."""
        name = TRAINING_STORE if user_id is None else TRAINING_OWN
        for uid in sorted({e.user_id for e in examples}):
            mine = [e for e in examples if e.user_id == uid]
            self.engine.put_artifact(
                uid,
                name,
                {"examples.json": examples_json(mine, when).encode("utf-8")},
                meta={"examples": len(mine)},
            )
        self.save(policy, user_id, contributors=sorted(contributors), settings=settings)

    def trained_examples(
        self, user_id: str, *, own: bool
    ) -> tuple[list[TrainingExample], datetime | None] | None:
        """The examples ``user_id`` gave the store's (or, ``own``, their own) policy."""
        name = TRAINING_OWN if own else TRAINING_STORE
        if self.engine.artifacts.get(user_id, name) is None:
            return None
        return examples_from_json(
            user_id, self.engine.artifacts.read(user_id, name, "examples.json")
        )

    def generated(self, user_id: str) -> list[TrainingExample]:
        """The questions generated so far from ``user_id``'s memories (their artifact)."""
        check_user_id(user_id)
        if self.engine.artifacts.get(user_id, TRAINING_GENERATED) is None:
            return []
        data = self.engine.artifacts.read(user_id, TRAINING_GENERATED, "examples.json")
        return examples_from_json(user_id, data)[0]

    def keep_generated(
        self,
        user_id: str,
        examples: Sequence[TrainingExample],
        seen: Iterable[str],
        at: datetime,
    ) -> int:
        """Add generated examples to the user's artifact (new questions only); total kept.

        ``seen`` lists the memories already shown to the writer, so the next job asks about
        the new ones only.
        """
        kept = {e.question.strip().lower(): e for e in self.generated(user_id)}
        for example in examples:
            kept.setdefault(example.question.strip().lower(), example)
        self.engine.put_artifact(
            user_id,
            TRAINING_GENERATED,
            {"examples.json": examples_json(list(kept.values()), at).encode()},
            meta={"examples": len(kept), "seen": sorted(set(seen))},
        )
        return len(kept)

    def seen(self, user_id: str) -> set[str]:
        """The memories of ``user_id`` already shown to the question writer."""
        info = self.engine.artifacts.get(user_id, TRAINING_GENERATED)
        return set(info.meta.get("seen", ())) if info is not None else set()

    def generated_total(self) -> int:
        """Generated examples kept in the store, over every user."""
        total = 0
        for uid in self.engine.users():
            info = self.engine.artifacts.get(uid, TRAINING_GENERATED)
            total += int(info.meta.get("examples", 0)) if info is not None else 0
        return total
