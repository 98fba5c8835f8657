"""Every mechanism, offline and filled with five facts in five sessions, for the retriever suites.

Each builder returns a memory whose user ``alice`` has at least five recallable records, so a
retriever asked for k <= 5 must return exactly k of them (and never more).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from memories_core import (
    ConditionalMemory,
    DualProcessMemory,
    EMGMemory,
    HistoryMemory,
    MemoChatMemory,
    MemoryBankMemory,
    MultiViewMemory,
    Scope,
    SelfReflectiveMemory,
    SummaryMemory,
    Turn,
)
from memories_core.clock import FixedClock
from memories_core.embedders import HashingEmbedder
from memories_core.interfaces import LLM, Mechanism
from memories_core.llms import ScriptedLLM
from memories_core.prompts.dpem import dpem_reply
from memories_core.prompts.emg import emg_reply
from memories_core.prompts.memochat import rule_following_reply as memochat_reply
from memories_core.prompts.memorybank import memorybank_reply
from memories_core.prompts.rule_following import UNKNOWN_PROMPT_REPLY, rule_following_reply
from memories_core.testing import TaughtLLM
from memories_core.types import ChatMessage

FACTS = (
    "I love hiking in the Alps",
    "My sister lives in Lisbon",
    "I am allergic to peanuts",
    "I play the cello on weekends",
    "My favourite hiking trail is in Norway",
)
QUERY = "where do I like hiking?"
USER = "alice"
START = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)


def _embedder() -> HashingEmbedder:
    return HashingEmbedder(dimension=64)


def _obedient() -> ScriptedLLM:
    return ScriptedLLM(default=rule_following_reply)


def _taught(reply: Callable[[Sequence[ChatMessage]], str]) -> LLM:
    return TaughtLLM(_obedient(), reply)


def _memochat(messages: Sequence[ChatMessage]) -> str:
    return memochat_reply(messages) or UNKNOWN_PROMPT_REPLY


BUILDERS: dict[str, Callable[[FixedClock], Any]] = {
    "history": lambda clock: HistoryMemory(embedder=_embedder(), clock=clock),
    "summary": lambda clock: SummaryMemory(llm=_obedient(), embedder=_embedder(), clock=clock),
    "conditional": lambda clock: ConditionalMemory(
        llm=_obedient(), embedder=_embedder(), clock=clock
    ),
    "multiview": lambda clock: MultiViewMemory.from_defaults(
        llm=_obedient(), embedder=_embedder(), clock=clock
    ),
    "memochat_llm_free": lambda clock: MemoChatMemory(
        mode="llm_free", embedder=_embedder(), max_lines=4, clock=clock
    ),
    "memorybank": lambda clock: MemoryBankMemory(
        llm=_taught(memorybank_reply), embedder=_embedder(), clock=clock
    ),
    "dpem": lambda clock: DualProcessMemory(
        llm=_taught(dpem_reply), embedder=_embedder(), theta=2, clock=clock
    ),
    # EMG's fixed-k mode; its default (the policy's selection) is in FILTERING.
    "emg": lambda clock: EMGMemory(
        llm=_taught(emg_reply), embedder=_embedder(), clock=clock, recall_mode="fused"
    ),
}

#: Mechanisms whose recall may return fewer than k by design (the model filters the records).
FILTERING: dict[str, Callable[[FixedClock], Any]] = {
    "reflective": lambda clock: SelfReflectiveMemory(
        HistoryMemory(embedder=_embedder(), clock=clock), _obedient()
    ),
    # MemoChat with a model recalls the memos the model chose (Lu et al. §3.2).
    "memochat": lambda clock: MemoChatMemory(
        llm=_taught(_memochat), embedder=_embedder(), max_lines=4, clock=clock
    ),
    # EMG-RAG's default: the policy's variable-size selection (top-1 while untrained).
    "emg_selection": lambda clock: EMGMemory(
        llm=_taught(emg_reply), embedder=_embedder(), clock=clock
    ),
}


def filled(name: str) -> Mechanism:
    """The mechanism ``name`` with :data:`FACTS` saved for ``alice``, one session a day."""
    clock = FixedClock(START)
    memory: Any = {**BUILDERS, **FILTERING}[name](clock)
    for day, fact in enumerate(FACTS):
        clock.set(START + timedelta(days=day))
        scope = Scope(USER, f"s{day}")
        memory.save(
            [
                Turn("user", fact, timestamp=clock.now()),
                Turn("assistant", "Noted.", timestamp=clock.now() + timedelta(seconds=1)),
            ],
            scope,
        )
        memory.end_session(scope)
    clock.set(START + timedelta(days=len(FACTS)))
    return memory  # type: ignore[no-any-return]
