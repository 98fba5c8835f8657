"""An EMG-RAG memory with the secretary's story (Table 1), shared by the adapter tests."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np

from memories_core import EMGMemory, FixedClock
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.mechanisms.emg_policy import HIDDEN, SelectionPolicy
from memories_core.prompts.emg import ExtractedMemory, emg_reply

NOW = datetime(2024, 5, 10, 9, 0, tzinfo=timezone.utc)
QUESTION = "When does flight EK349 depart?"


def _fact(
    text: str,
    s: str,
    r: str,
    o: str,
    kind: str = "Event",
    sub: str = "Arrangement",
    when: datetime | None = None,
) -> ExtractedMemory:
    return ExtractedMemory(text, kind, sub, s, r, o, when=when)


def story_memory() -> EMGMemory:
    """``ann``'s memories (a flight, a hotel, a phone number); ``bob`` has one of his own."""
    memory = EMGMemory(
        llm=ScriptedLLM(default=emg_reply),
        embedder=HashingEmbedder(dimension=256),
        clock=FixedClock(NOW),
    )
    memory.add_memories(
        "ann",
        [
            _fact("The boss flies on flight EK349.", "boss", "flight", "EK349"),
            _fact(
                "Flight EK349 departs at 01:30 on 2024-05-12.",
                "EK349",
                "departs_at",
                "01:30 on 2024-05-12",
                when=NOW + timedelta(days=2),
            ),
            _fact("The boss stays at the Crowne Plaza.", "boss", "hotel", "Crowne Plaza"),
            _fact("The boss travels to Amsterdam.", "boss", "travels_to", "Amsterdam"),
            _fact(
                "The user's phone number is +31 6 1234 5678.",
                "user",
                "phone_number",
                "+31 6 1234 5678",
                "Attribute",
                "Contact",
            ),
        ],
        at=NOW - timedelta(days=1),
    )
    memory.add_memories(
        "bob",
        [_fact("Bob's flight LH100 departs at 07:00.", "Bob", "departs_at", "07:00")],
        at=NOW - timedelta(days=1),
    )
    return memory


def spread_policy() -> SelectionPolicy:
    """A hand-set policy whose P(required) is flat over ranks: the selection spreads (2+)."""
    policy = SelectionPolicy.initial(0, ["rank"])
    policy.w1, policy.b1 = np.zeros((HIDDEN, 1)), np.zeros(HIDDEN)
    policy.w2, policy.b2 = np.zeros((2, HIDDEN)), np.zeros(2)
    policy.b2[1] = float(np.log(0.5 / 0.5))
    policy.trained = True
    return policy
