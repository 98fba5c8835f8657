"""Editing a user's memory graph: insertion, deletion, replacement (§4.2).

Each new memory is placed in its partition (the subclass the model gave, else the nearest
partition centre); the memories of that partition with the same subject are compared with it
by relation (same name, or relation-name embeddings at least ``relation_match`` apart), and the
top-1 by embedding decides:

* same relation, same object: a duplicate, nothing is written (the same slot told in other
  words is a second memory of it, neither a duplicate nor a replacement);
* same relation, another object: **replacement**. The new memory is added; the old one's
  validity ends (``valid_until`` = the new message's time) and it keeps
  ``attrs.replaced_by``. Nothing is destroyed: the old record, its edge and its history stay;
* a new relation with an end of validity: **deletion** (inserted with ``valid_until``);
* otherwise **insertion**.

:meth:`GraphEditor.plan` decides the edits against the committed graph without writing;
:meth:`GraphEditor.derivation` turns a plan into one engine write (records, graph nodes and
edges, partition centres, state changes with their reasons), committed in one transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from memories_core.engine import Derivation
from memories_core.errors import InvalidInputError
from memories_core.mechanisms.emg.embeddings import EmbeddingCache
from memories_core.mechanisms.emg.schema import (
    MEMORY_KIND,
    REASON,
    ROOT,
    Edit,
    cosine,
    entity_id,
    iso,
    norm,
)
from memories_core.mechanisms.emg.taxonomy import (
    build_taxonomy,
    labels_of,
    nearest_subclass,
    skeleton,
    subclass_text,
)
from memories_core.prompts.emg import MEMORY_TYPES, ExtractedMemory
from memories_core.types import (
    GraphEdge,
    GraphNode,
    MemoryRecord,
    StateChange,
    check_user_id,
    clean_text,
    ensure_utc,
    new_id,
)

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine

__all__ = ["EditConfig", "EditSettings", "GraphEditor", "Plan"]


class EditSettings(Protocol):
    """What the editor reads at each edit (``EMGMemory`` itself provides it)."""

    @property
    def taxonomy(self) -> Mapping[str, Sequence[str]]:
        """Subclasses per memory type."""
        ...

    @property
    def subclass_labels(self) -> tuple[str, ...]:
        """Every ``"<Type>/<Subclass>"``."""
        ...

    @property
    def relation_match(self) -> float:
        """Cosine of relation names at which two relations are the same."""
        ...


@dataclass
class EditConfig:
    """Editor settings for use without an ``EMGMemory`` (see :meth:`build`)."""

    taxonomy: dict[str, tuple[str, ...]]
    subclass_labels: tuple[str, ...]
    relation_match: float = 0.9

    @classmethod
    def build(
        cls,
        subclasses: Mapping[str, Sequence[str]] | None = None,
        relation_match: float = 0.9,
    ) -> EditConfig:
        """Table 7's taxonomy with ``subclasses`` added (:func:`.taxonomy.build_taxonomy`)."""
        taxonomy = build_taxonomy(subclasses)
        return cls(taxonomy, labels_of(taxonomy), relation_match)


@dataclass
class Plan:
    """The writes one batch of new memories makes, decided before anything is written.

    Attributes:
        records: New memories.
        nodes: New entity nodes by id; edges: new ``contains`` and relation edges.
        changes: State changes ``(record id, fields, reason)`` (edit ops, validity ends).
        edge_updates: ``(edge id, data)`` merged into existing edges (a replaced memory's end).
        centres: Embeddings of the new memories per partition (running means, §4.2).
        edits: The edits, in order.
        at: When the edits happened (the message's time).
    """

    records: list[MemoryRecord] = field(default_factory=list)
    nodes: dict[str, GraphNode] = field(default_factory=dict)
    edges: list[GraphEdge] = field(default_factory=list)
    changes: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)
    edge_updates: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    centres: dict[str, list[npt.NDArray[np.float32]]] = field(default_factory=dict)
    edits: list[Edit] = field(default_factory=list)
    at: datetime | None = None


class GraphEditor:
    """Plans and writes the edits of users' graphs (§4.2) on an engine.

    Args:
        engine: Holds the records, the graph and the update history.
        vectors: Embeddings of names, relations and memories.
        settings: Taxonomy and ``relation_match``, read at each edit.
    """

    def __init__(
        self, engine: MemoryEngine, vectors: EmbeddingCache, settings: EditSettings
    ) -> None:
        self.engine = engine
        self.vectors = vectors
        self.settings = settings

    # ------------------------------------------------------------------ entry points
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
        """Edit ``user_id``'s graph with ``memories`` atomically; returns the edits in order.

        ``edit=False`` inserts every memory without comparing it with the graph;
        ``metadata`` is added to every new memory's metadata.

        Raises:
            InvalidInputError: on a bad user id, a memory that is not an
                :class:`ExtractedMemory` or of an unknown type (nothing is written).
        """
        check_user_id(user_id)
        for memory in memories:
            if not isinstance(memory, ExtractedMemory):
                raise InvalidInputError("memories must be ExtractedMemory objects")
            if memory.type not in MEMORY_TYPES:
                raise InvalidInputError(f"unknown memory type {memory.type!r}")
        when = ensure_utc(at) if at is not None else self.engine.clock.now()
        with self.engine.user_lock(user_id):
            self.engine.finish_deletion(user_id)  # plan against what stays, not what goes
            plan = self.plan(user_id, list(memories), None, when, tuple(source_ids), edit, metadata)
            self.write(user_id, plan)
        self.engine.index_pending()
        return plan.edits

    def add_text(
        self, user_id: str, text: str, *, at: datetime | None = None, source_ids: Sequence[str] = ()
    ) -> list[Edit]:
        """Store a statement as one memory without edges, under its nearest subclass.

        Raises:
            InvalidInputError: on a bad user id or an empty text.
        """
        check_user_id(user_id)
        text = clean_text(text)
        when = ensure_utc(at) if at is not None else self.engine.clock.now()
        with self.engine.user_lock(user_id):
            self.engine.finish_deletion(user_id)  # plan against what stays, not what goes
            plan = self.plan(user_id, None, text, when, tuple(source_ids))
            self.write(user_id, plan)
        self.engine.index_pending()
        return plan.edits

    def write(self, user_id: str, plan: Plan) -> None:
        """Commit a plan through the engine's write rules, in one transaction (not indexed yet).

        :meth:`MemoryEngine.write_derivation`: the records must be ``user_id``'s, a deletion
        of the user left pending is finished first (so the new memories are not purged with
        the old ones), and the graph and state writes commit with the records or not at all.
        """
        self.engine.write_derivation(
            user_id, Derivation(add=plan.records, apply=self.applier(user_id, plan)), index=False
        )

    def derivation(self, user_id: str, plan: Plan) -> Derivation | None:
        """A plan as an engine derivation (``None`` when it writes nothing)."""
        if not plan.records and not plan.changes:
            return None
        return Derivation(add=plan.records, apply=self.applier(user_id, plan))

    def history(self, user_id: str) -> list[StateChange]:
        """The user's graph edits from the update history (old, new, when, why), oldest first."""
        return [
            c for c in self.engine.history(user_id) if (c.reason or "").startswith(REASON + " ")
        ]

    # ------------------------------------------------------------------ partitions
    def partition(self, memory: ExtractedMemory | None, text: str, user_id: str) -> str:
        """The partition of a memory: the model's subclass if known, else the nearest centre."""
        labels = self.settings.subclass_labels
        if memory is not None:
            wanted = norm(f"{memory.type}/{memory.subclass}")
            for label in labels:
                if norm(label) == wanted or (
                    label.startswith(memory.type + "/")
                    and norm(label.split("/", 1)[1]) == norm(memory.subclass)
                ):
                    return label
        centres = {
            n.label: n.data.get("centre")
            for n in self.engine.graph.nodes(user_id, kind="subclass")
            if n.data.get("centre")
        }
        vector = self.vectors.vectors([text])[0]
        best, best_sim = None, -2.0
        for label in labels:
            if memory is not None and not label.startswith(memory.type + "/"):
                continue
            centre = centres.get(label)
            target = (
                np.asarray(centre, dtype=np.float32)
                if centre
                else self.vectors.vectors([subclass_text(label)])[0]
            )
            sim = cosine(vector, target)
            if sim > best_sim:
                best, best_sim = label, sim
        assert best is not None
        return best

    # ------------------------------------------------------------------ planning
    def plan(
        self,
        user_id: str,
        memories: list[ExtractedMemory] | None,
        raw: str | None,
        at: datetime,
        source_ids: tuple[str, ...],
        edit: bool = True,
        metadata: Mapping[str, Any] | None = None,
    ) -> Plan:
        """Decide the edits of new memories against the committed graph (§4.2).

        ``memories=None`` stores ``raw`` as one memory without edges under its nearest
        subclass (the extraction fallback). A memory repeated within the batch is one
        duplicate edit.
        """
        out = Plan(at=at)
        if memories is None:
            assert raw is not None
            label = self.partition(None, raw, user_id)
            record = MemoryRecord(
                new_id(),
                user_id,
                MEMORY_KIND,
                raw,
                at,
                metadata={"type": label.split("/", 1)[0], "subclass": label, "fallback": True},
                source_ids=source_ids,
            )
            out.records.append(record)
            out.changes.append(
                (record.id, {"attrs": {"emg_op": "fallback"}}, f"{REASON} fallback: {raw[:200]}")
            )
            out.centres.setdefault(label, []).append(self.vectors.vectors([raw])[0])
            out.edits.append(Edit("fallback", raw, record.id))
            return out
        # One embedding call for the batch's statements, names and relations (then served from
        # the cache: the walk compares questions with them).
        self.vectors.vectors(
            list(
                dict.fromkeys(
                    t
                    for m in memories
                    for t in (m.text, m.subject, m.object, m.relation.replace("_", " "))
                    if entity_id(t) != ROOT
                )
            )
        )
        seen: set[tuple[str, str, str]] = set()
        for memory in memories:
            key = (entity_id(memory.subject), memory.relation, norm(memory.object))
            if key in seen:  # repeated in the same batch: one edit per memory all the same
                out.edits.append(Edit("duplicate", memory.text))
                continue
            seen.add(key)
            self._plan_one(user_id, memory, at, source_ids, out, edit, metadata or {})
        return out

    def _plan_one(
        self,
        user_id: str,
        memory: ExtractedMemory,
        at: datetime,
        source_ids: tuple[str, ...],
        out: Plan,
        edit: bool = True,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        label = self.partition(memory, memory.text, user_id)
        subject, obj = entity_id(memory.subject), entity_id(memory.object)
        match = self.matching(user_id, subject, memory, label, at) if edit else None
        if match is not None and norm(str(match.metadata.get("object", ""))) == norm(memory.object):
            if norm(match.text) == norm(memory.text):
                out.edits.append(Edit("duplicate", memory.text, None, match.id))
                return
            # The same subject, relation and object but other words: a second memory of
            # that slot (another detail), not a change of it, so neither a duplicate nor a
            # replacement (§4.2 replaces when the relation's value changed).
            match = None
        record = MemoryRecord(
            new_id(),
            user_id,
            MEMORY_KIND,
            memory.text,
            at,
            metadata={
                **dict(extra or {}),
                "type": memory.type,
                "subclass": label,
                "subject": memory.subject,
                "relation": memory.relation,
                "object": memory.object,
                "when": iso(memory.when),
            },
            source_ids=source_ids,
        )
        out.records.append(record)
        out.centres.setdefault(label, []).append(self.vectors.vectors([memory.text])[0])
        for node_id, name in ((subject, memory.subject), (obj, memory.object)):
            if node_id != ROOT and node_id not in out.nodes:
                home = nearest_subclass(self.vectors, self.settings.subclass_labels, name)
                out.nodes[node_id] = GraphNode(node_id, "entity", name, {"subclass": home})
                out.edges.append(
                    GraphEdge(f"c:{home}:{node_id}", f"sub:{home}", node_id, "contains")
                )
        out.edges.append(
            GraphEdge(
                f"e:{record.id}",
                subject,
                obj,
                memory.relation,
                record_id=record.id,
                data={
                    "subject": memory.subject,
                    "object": memory.object,
                    "when": iso(memory.when),
                    "valid_until": iso(memory.valid_until),
                },
            )
        )
        state: dict[str, Any] = {"attrs": {"emg_op": "insert", "subclass": label}}
        if match is not None:
            state["attrs"] = {"emg_op": "replace", "replaces": match.id, "subclass": label}
            old_end = match.state.valid_until
            end = at if old_end is None or old_end > at else old_end
            out.changes.append(
                (
                    match.id,
                    {"valid_until": end, "attrs": {"replaced_by": record.id}},
                    f"{REASON} replace: {match.text[:200]!r} -> {memory.text[:200]!r}",
                )
            )
            out.edge_updates.append((f"e:{match.id}", {"valid_until": iso(end)}))
            out.edits.append(Edit("replace", memory.text, record.id, match.id))
            reason = f"{REASON} replace: new memory {memory.text[:200]!r}"
        elif memory.valid_until is not None:
            state["attrs"] = {"emg_op": "delete", "subclass": label}
            out.edits.append(Edit("delete", memory.text, record.id))
            reason = (
                f"{REASON} delete: valid until {iso(memory.valid_until)}: {memory.text[:200]!r}"
            )
        else:
            out.edits.append(Edit("insert", memory.text, record.id))
            reason = f"{REASON} insert: {memory.text[:200]!r}"
        if memory.valid_until is not None:
            state["valid_until"] = memory.valid_until
        out.changes.append((record.id, state, reason))

    def matching(
        self, user_id: str, subject: str, memory: ExtractedMemory, label: str, at: datetime
    ) -> MemoryRecord | None:
        """Top-1 live memory of the partition with the same subject and relation (§4.2)."""
        edges = [
            e
            for e in self.engine.graph.edges(user_id, node_id=subject)
            if e.source == subject and e.record_id is not None
        ]
        if not edges:
            return None
        relations = sorted({e.relation for e in edges})
        same: set[str] = {memory.relation} if memory.relation in relations else set()
        others = [r for r in relations if r != memory.relation]
        relation_match = self.settings.relation_match
        if others and relation_match < 1:
            vectors = self.vectors.vectors(
                [memory.relation.replace("_", " ")] + [r.replace("_", " ") for r in others]
            )
            same |= {
                r
                for r, v in zip(others, vectors[1:], strict=True)
                if cosine(vectors[0], v) >= relation_match
            }
        ids = [e.record_id for e in edges if e.relation in same and e.record_id]
        if not ids:
            return None
        candidates = [
            r
            for r in self.engine.get(user_id, ids)
            if r.metadata.get("subclass") == label and r.state.is_live(at)
        ]
        if not candidates:
            return None
        same_text = [r for r in candidates if norm(r.text) == norm(memory.text)]
        if same_text:  # the memory itself, told again
            return same_text[0]
        vectors = self.vectors.vectors([memory.text] + [r.text for r in candidates])
        sims = [cosine(vectors[0], v) for v in vectors[1:]]
        return candidates[int(np.argmax(sims))]

    # ------------------------------------------------------------------ writing
    def applier(self, user_id: str, plan: Plan) -> Callable[[], None]:
        """The store writes of a plan; run inside the transaction that adds its records."""

        def apply() -> None:
            graph = self.engine.graph
            existing = {n.label: n for n in graph.nodes(user_id, kind="subclass")}
            nodes, edges = skeleton(user_id, self.settings.taxonomy)
            known = set(existing)
            nodes = [n for n in nodes if n.kind != "subclass" or n.label not in known]
            # Partition centres: running means of the memories' embeddings (§4.2).
            for label, vectors in plan.centres.items():
                node = existing.get(label)
                data = dict(node.data) if node is not None else {}
                count = int(data.get("count", 0))
                centre = np.asarray(data.get("centre") or np.zeros_like(vectors[0]), np.float64)
                total = centre * count + np.sum(np.asarray(vectors, np.float64), axis=0)
                count += len(vectors)
                data.update(count=count, centre=[round(float(x), 6) for x in total / count])
                nodes.append(GraphNode(f"sub:{label}", "subclass", label, data))
            graph.put(user_id, nodes=[*nodes, *plan.nodes.values()], edges=[*edges, *plan.edges])
            if plan.edge_updates:
                current = {
                    e.id: e
                    for eid, _ in plan.edge_updates
                    for e in graph.edges(user_id, record_id=eid[2:])
                }
                updated = [
                    GraphEdge(
                        e.id, e.source, e.target, e.relation, e.record_id, {**dict(e.data), **extra}
                    )
                    for eid, extra in plan.edge_updates
                    if (e := current.get(eid)) is not None
                ]
                if updated:
                    graph.put(user_id, edges=updated)
            now = plan.at or self.engine.clock.now()  # the edit happened when the message came
            for record_id, fields, reason in plan.changes:
                self.engine.update_state(user_id, {record_id: fields}, reason=reason, at=now)

        return apply
