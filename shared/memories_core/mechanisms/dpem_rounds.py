"""DPeM's rounds: which saved turns make one iteration ``d_i`` (Zhang et al., 2023, "DPeM").

Part of :mod:`memories_core.mechanisms.dpem`. An iteration is one round of dialogue: one user
turn (or several before a reply) and the replies to it, however an adapter batches its saves.
:func:`split_save` reads a save's turns against the round an earlier save held open and says
which rounds the save closes and which it holds for its reply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memories_core.types import Job, MemoryRecord

__all__ = ["HeldRound", "exchanges", "mark_processed", "round_turns", "split_save"]


@dataclass(frozen=True)
class HeldRound:
    """A round whose last turn is the user's, held open for the reply a later save brings.

    Attributes:
        session: The session its turns were said in (a reply from another one never joins).
        turns: Its turns' ids, in order.
    """

    session: str | None
    turns: tuple[str, ...]

    def to_state(self) -> dict[str, Any]:
        """The JSON kept in the user's state."""
        return {"session": self.session, "turns": list(self.turns)}

    @classmethod
    def from_state(cls, value: object) -> HeldRound | None:
        """Read :meth:`to_state`'s JSON back (``None`` for nothing held or a damaged value)."""
        if not isinstance(value, Mapping) or not isinstance(value.get("turns"), list):
            return None
        turns = tuple(str(t) for t in value["turns"])
        session = value.get("session")
        return cls(None if session is None else str(session), turns) if turns else None


def _role(record: MemoryRecord) -> object:
    return record.metadata.get("role")


def exchanges(records: Sequence[MemoryRecord]) -> list[list[MemoryRecord]]:
    """Split saved turns into exchanges: a user turn after any other turn opens a new one.

    ``[user, assistant, user, assistant]`` is two exchanges; ``[user, user, assistant]``
    one (the user said two things before the reply).
    """
    groups: list[list[MemoryRecord]] = []
    for record in records:
        opens = _role(record) == "user"
        if not groups or (opens and _role(groups[-1][-1]) != "user"):
            groups.append([])
        groups[-1].append(record)
    return groups


def split_save(
    records: Sequence[MemoryRecord], held: HeldRound | None
) -> tuple[list[list[str]], HeldRound | None]:
    """The rounds a save closes (lists of turn ids, in order) and the round it holds open.

    * The save's leading replies join the ``held`` round of the same session and close it;
      a save that starts with a user turn, or comes from another session, closes ``held``
      as it is (no reply came).
    * Every whole exchange of the save is a round.
    * A last exchange that ends with a user turn is held for its reply (see
      :class:`HeldRound`); the session's end closes it.

    ``records`` are the turns of one save (one session), in order.
    """
    if not records:
        return [], held
    session = records[0].session_id
    groups = exchanges(records)
    closed: list[list[str]] = []
    if held is not None:
        if held.session == session and _role(groups[0][0]) != "user":
            closed.append([*held.turns, *(r.id for r in groups.pop(0))])  # its replies
        else:
            closed.append(list(held.turns))
    still_open: HeldRound | None = None
    if groups and _role(groups[-1][-1]) == "user":
        still_open = HeldRound(session, tuple(r.id for r in groups.pop()))
    closed += [[r.id for r in group] for group in groups]
    return closed, still_open


def round_turns(job: Job) -> tuple[str, ...]:
    """The ids of the turns of a round's job (its payload's ``turn_ids``)."""
    return tuple(str(t) for t in job.payload.get("turn_ids", []))


def mark_processed(log: dict[str, Any], round_no: int) -> bool:
    """Note that ``round_no`` was memorized; returns ``False`` if it had been already.

    A job that memorized its round but died before its completion was written runs again;
    counting it again would leave ``processed`` one too high. The rounds done are kept as
    ``done_through`` (every round up to it) plus the few finished out of order above it.
    """
    if "done_through" not in log:
        # A log written before this bookkeeping: its rounds up to last_round are done when
        # it counted as many.
        last = int(log.get("last_round", 0))
        log["done_through"] = last if int(log.get("processed", 0)) >= last else 0
        log["done_above"] = []
    through = int(log["done_through"])
    above = {int(r) for r in log.get("done_above", [])}
    if round_no <= through or round_no in above:
        return False
    above.add(round_no)
    while through + 1 in above:
        through += 1
        above.discard(through)
    log["done_through"] = through
    log["done_above"] = sorted(above)
    return True
