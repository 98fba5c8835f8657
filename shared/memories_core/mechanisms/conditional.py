"""Conditional memory (Yuan et al., §3.1 "Conditional Memory", Table 1, appendix C.2).

Not every utterance is worth remembering, and a memory is only useful with its context. For
each user turn the LLM first decides whether to remember it (memorisation *timing*, Table 17,
second step); only on "yes" does a second call write the memory *content* (Table 18): why the
user said it (``context``) and a note for the future (``knowledge``), stored as one record
``"Context: ... Knowledge: ..."`` linked to its source turns. The raw turns stay in the record
store either way. Recall returns the top-k records (paper: k=3, §5).

Two ways to run the decision:

* drop-in (:meth:`ConditionalMemory.save`): a separate decision call per user turn, because
  the chain's own prompt is not ours;
* single-call (:meth:`ConditionalMemory.respond`): one call writes the response and the hidden
  ``<Decision>`` (Table 17) and a second call, only on "yes", writes the record: at most two
  calls per utterance. The user sees only ``<Respond>``.

Failures never lose a turn: turns are stored first; a failed or garbled decision or record call
is counted in ``usage.failures`` (``"decision"``, ``"record"``), the turn stays pending and
:meth:`ConditionalMemory.retry_pending` (or the next save) derives it later.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

from memories_core.errors import LLMError, ParseError
from memories_core.interfaces import LLM
from memories_core.mechanisms.base import MemoryBase, _check_scope
from memories_core.parsing import generate_parsed
from memories_core.prompts.conditional import (
    build_decision_messages,
    build_record_messages,
    build_respond_and_decide_messages,
    parse_decision,
    parse_record,
    parse_respond_and_decision,
    render_record,
)
from memories_core.types import MemoryRecord, Recall, Scope, Turn, new_id

__all__ = ["ConditionalMemory", "ConditionalReply"]

logger = logging.getLogger(__name__)

_PENDING = "conditional.pending"


@dataclass(frozen=True)
class ConditionalReply:
    """Result of one single-call exchange (:meth:`ConditionalMemory.respond`).

    Attributes:
        response: What the user sees (the ``<Respond>`` part only).
        decision: Whether the user input was judged worth remembering (``None``: the model
            gave no readable decision; a separate decision call is made instead).
        recall: The memory recalled before answering.
        record: The conditional record written for this turn, if any.
    """

    response: str
    decision: bool | None
    recall: Recall
    record: MemoryRecord | None


class ConditionalMemory(MemoryBase):
    """Remember only what matters, with the context that makes it useful.

    Example:
        >>> from memories_core import ConditionalMemory, Scope, Turn
        >>> from memories_core.embedders import HashingEmbedder
        >>> from memories_core.llms import ScriptedLLM
        >>> llm = ScriptedLLM([
        ...     "<Decision>: yes",
        ...     "<Context>: NaN <Summary>: The user corrected how to capitalize. "
        ...     "<Note>: Capitalize means every letter in upper case for this user.",
        ... ])
        >>> memory = ConditionalMemory(llm=llm, embedder=HashingEmbedder())
        >>> memory.save([Turn("user", "No, capitalize means ALL letters upper case")], Scope("u"))
        >>> memory.recall("capitalize these words", Scope("u")).context
        'Context: The user corrected how to capitalize. Knowledge: Capitalize means ...'

    Args:
        llm: Makes the decisions and writes the records. Default: the bundled local model.
        k: Records recalled by default (paper: 3).
        context_turns: Turns of the ongoing session shown to the record call (Table 18's
            dialogue context), the user turn included.
        **kwargs: Storage options of :class:`~memories_core.mechanisms.base.MemoryBase`.
    """

    recall_kinds: ClassVar[tuple[str, ...]] = ("conditional",)
    index_turns: ClassVar[bool] = False

    def __init__(
        self, *, llm: LLM | None = None, k: int = 3, context_turns: int = 6, **kwargs: Any
    ) -> None:
        if llm is None:
            from memories_core.llms import LocalLLM

            llm = LocalLLM()
        super().__init__(k=k, llm=llm, **kwargs)
        self.writer: LLM = llm
        self.context_turns = context_turns

    # ------------------------------------------------------------------ mode (b)
    def respond(
        self,
        user_input: str,
        scope: Scope,
        *,
        llm: LLM | None = None,
        k: int | None = None,
        max_tokens: int | None = None,
        instructions: str | None = None,
    ) -> ConditionalReply:
        """Answer ``user_input`` and remember it if it matters, in at most two LLM calls.

        The user turn is stored first (pending a decision). The first call (Table 17) writes
        the response and the hidden decision; the response is stored; only on "yes" a second
        call writes the record. No repair retries happen here, to keep the bound: a garbled
        record, or an answer without a readable decision, leaves the turn pending for
        :meth:`retry_pending` (or the next :meth:`save`).

        Args:
            user_input: The user's message.
            scope: Who is talking.
            llm: The chat model that answers (default: this memory's LLM).
            k: Records recalled for the answer.
            max_tokens: Passed to the answering model.
            instructions: The application's own instructions (e.g. a chain's system
                message), added to the prompt before the two steps.

        Raises:
            LLMError: if the answering call fails; the user turn is already stored and stays
                pending for a decision.
            ParseError: if the answer holds no response text at all (the user turn is kept).
        """
        scope = _check_scope(scope)
        user_turn = Turn("user", user_input)
        recall = self.recall(user_turn.content, scope, k=k)
        history = [r.text for r in self._session_turns(scope, limit=self.context_turns)]
        with self._lock:
            (stored_user,) = self._store_turns([user_turn], scope)
            self._queue(scope.user_id, stored_user.id, None)
        messages = build_respond_and_decide_messages(
            user_turn.content, memory=recall.context, history=history, instructions=instructions
        )
        answer = (llm or self.writer).generate(messages, max_tokens=max_tokens)
        parsed = parse_respond_and_decision(answer, user_turn.content)
        record: MemoryRecord | bool | None = None
        with self._lock:
            self._store_turns([Turn("assistant", parsed.respond)], scope)
            if parsed.decision is not None:
                record = self._derive_one(scope.user_id, stored_user.id, parsed.decision, retries=0)
        written = record if isinstance(record, MemoryRecord) else None
        return ConditionalReply(parsed.respond, parsed.decision, recall, written)

    async def arespond(
        self,
        user_input: str,
        scope: Scope,
        *,
        llm: LLM | None = None,
        k: int | None = None,
        max_tokens: int | None = None,
        instructions: str | None = None,
    ) -> ConditionalReply:
        """Async twin of :meth:`respond`."""
        return await asyncio.to_thread(
            self.respond,
            user_input,
            scope,
            llm=llm,
            k=k,
            max_tokens=max_tokens,
            instructions=instructions,
        )

    # ------------------------------------------------------------------ mode (a)
    def _derive(self, records: list[MemoryRecord], scope: Scope) -> None:
        for record in records:
            if record.metadata.get("role") == "user":
                self._queue(scope.user_id, record.id, None)
        self._process_pending(scope.user_id)

    def retry_pending(self, user_id: str | None = None) -> int:
        """Retry every pending decision/record (of one user, or all); returns how many remain."""
        users = [_check_scope(Scope(user_id)).user_id] if user_id else self.store.users()
        with self._lock:
            return sum(self._process_pending(user) for user in users)

    def pending_turns(self, user_id: str) -> list[str]:
        """Ids of ``user_id``'s user turns whose decision or record is still to be derived."""
        user = _check_scope(Scope(user_id)).user_id
        return [item["turn_id"] for item in self.store.get_state(_PENDING, user_id=user) or []]

    # ------------------------------------------------------------------ internals
    def _queue(self, user_id: str, turn_id: str, decision: bool | None) -> None:
        pending = list(self.store.get_state(_PENDING, user_id=user_id) or [])
        pending.append({"turn_id": turn_id, "decision": decision})
        self.store.set_state(_PENDING, pending, user_id=user_id)

    def _process_pending(self, user_id: str) -> int:
        pending = list(self.store.get_state(_PENDING, user_id=user_id) or [])
        remaining = [
            item
            for item in pending
            if self._derive_one(user_id, item["turn_id"], item["decision"]) is False
        ]
        return len(remaining)

    def _derive_one(
        self, user_id: str, turn_id: str, decision: bool | None, *, retries: int = 1
    ) -> MemoryRecord | bool | None:
        """Decide and write one turn's record; update the pending list.

        Returns the new record, ``None`` when nothing is to be remembered, or ``False`` when
        a call failed and the turn stays pending.
        """
        found = self.store.get([turn_id], user_id=user_id)
        if not found:
            self._unqueue(user_id, turn_id, None)
            return None
        turn = found[0]
        context = self._context_before(turn)
        content = _content(turn)
        if decision is None:
            previous = next(
                (r for r in reversed(context) if r.metadata.get("role") == "assistant"), None
            )
            try:
                decision = generate_parsed(
                    self.writer,
                    build_decision_messages(
                        content, previous_reply=_content(previous) if previous else None
                    ),
                    lambda out: parse_decision(out, content),
                    retries=retries,
                )
            except (LLMError, ParseError):
                return self._fail("decision", user_id, turn_id, None)
        if not decision:
            self._unqueue(user_id, turn_id, None)
            return None
        dialogue = [r.text for r in context] + [turn.text]
        try:
            note = generate_parsed(
                self.writer,
                build_record_messages(dialogue, content),
                lambda out: parse_record(out, content),
                retries=retries,
            )
        except (LLMError, ParseError):
            return self._fail("record", user_id, turn_id, True)
        record = MemoryRecord(
            id=new_id(),
            user_id=user_id,
            kind="conditional",
            text=render_record(note),
            created_at=turn.created_at,
            session_id=turn.session_id,
            metadata={"context": note.summary, "knowledge": note.note, "turn_id": turn.id},
            source_ids=(turn.id, *(r.id for r in context)),
        )
        self._add_derived([record])
        self._unqueue(user_id, turn_id, None)
        return record

    def _fail(self, what: str, user_id: str, turn_id: str, decision: bool | None) -> bool:
        self._count_failure(what)
        logger.warning(
            "conditional %s call failed for turn %s; it stays pending", what, turn_id, exc_info=True
        )
        self._unqueue(user_id, turn_id, {"turn_id": turn_id, "decision": decision})
        return False

    def _unqueue(self, user_id: str, turn_id: str, replacement: dict[str, Any] | None) -> None:
        pending = list(self.store.get_state(_PENDING, user_id=user_id) or [])
        kept = [item for item in pending if item["turn_id"] != turn_id]
        if replacement is not None:
            kept.append(replacement)
        self.store.set_state(_PENDING, kept or None, user_id=user_id)

    def _session_turns(self, scope: Scope, *, limit: int) -> list[MemoryRecord]:
        where: dict[str, str] = {"kind": "turn"}
        if scope.session_id is not None:
            where["session_id"] = scope.session_id
        turns = self.store.list(user_id=scope.user_id, where=where)
        return turns[-limit:] if limit > 0 else []

    def _context_before(self, turn: MemoryRecord) -> list[MemoryRecord]:
        """The turns of the same session said before ``turn`` (Table 18's dialogue context)."""
        if self.context_turns <= 1:
            return []
        where: dict[str, str] = {"kind": "turn"}
        if turn.session_id is not None:
            where["session_id"] = turn.session_id
        session = self.store.list(user_id=turn.user_id, where=where, until=turn.created_at)
        ids = [r.id for r in session]
        position = ids.index(turn.id) if turn.id in ids else len(session)
        return session[max(0, position - (self.context_turns - 1)) : position]


def _content(record: MemoryRecord) -> str:
    from memories_core.mechanisms.base import turn_from_record

    return turn_from_record(record).content
