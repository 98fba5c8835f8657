"""A prompt whose answer length follows from its input gets a generation limit per input.

DPeM's typing answers one label per knowledge item; the 1.5B model typed one long item
sentence by sentence until its 300-token cap. Its limit now grows with the item count, and a
batch of such calls is decoded at the largest limit among them instead of being split.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from memories_core import DualProcessMemory, FixedClock, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.batch import run_spec_batch
from memories_core.prompts.conditional import DECISION, DecisionInput
from memories_core.prompts.dpem import TYPING, TYPING_JSON, TypingInput, dpem_reply
from memories_core.prompts.spec import run_spec
from memories_core.types import ChatMessage

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=timezone.utc)


class Recording(ScriptedLLM):
    """A scripted model that keeps the length cap of every call and every batch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.caps: list[int | None] = []
        self.batch_caps: list[int | None] = []

    def generate(self, messages: Sequence[ChatMessage], **options: Any) -> str:
        self.caps.append(options.get("max_tokens"))
        return super().generate(messages, **options)

    def generate_batch(self, conversations: Any, **options: Any) -> Any:
        self.batch_caps.append(options.get("max_tokens"))
        return super().generate_batch(conversations, **options)


def items(count: int) -> TypingInput:
    return TypingInput(tuple(f"The user keeps bees, fact {n}." for n in range(count)))


def test_the_typing_limit_grows_with_the_items_up_to_the_prompts_cap() -> None:
    one, three, many = (TYPING.tokens_for(items(n)) for n in (1, 3, 40))
    assert one is not None and three is not None and TYPING.max_tokens == 300
    assert one < three < 300 == many
    assert TYPING_JSON.tokens_for(items(1)) == one
    assert DECISION.tokens_for(DecisionInput("hi")) == DECISION.max_tokens  # no limit: the cap


def test_run_spec_asks_for_the_inputs_limit_and_an_explicit_cap_wins() -> None:
    llm = Recording(default=lambda m: dpem_reply(m))
    run_spec(llm, TYPING, items(1))
    run_spec(llm, TYPING, items(3))
    run_spec(llm, TYPING, items(1), max_tokens=250)
    assert llm.caps == [TYPING.tokens_for(items(1)), TYPING.tokens_for(items(3)), 250]


def test_a_batch_of_other_limits_is_one_batch_at_the_largest() -> None:
    llm = Recording(default=lambda m: dpem_reply(m), batch_capacity=8)
    inputs = [items(1), items(3), items(2)]
    answers = run_spec_batch(llm, TYPING, inputs)
    assert [len(a) for a in answers] == [1, 3, 2]  # type: ignore[arg-type]
    assert llm.batches == [3]
    assert llm.batch_caps == [TYPING.tokens_for(items(3))]


def test_dpem_types_each_round_within_its_limit() -> None:
    llm = Recording(default=lambda m: dpem_reply(m))
    memory = DualProcessMemory(
        llm=llm, embedder=HashingEmbedder(dimension=64), clock=FixedClock(T0)
    )
    memory.save(
        [Turn("user", "I keep bees and I am allergic to peanuts."), Turn("assistant", "Noted.")],
        Scope("ann"),
    )
    typing_caps = [
        cap
        for cap, call in zip(llm.caps, llm.calls, strict=True)
        if "Type every item" in call[-1].content
    ]
    assert typing_caps and all(cap is not None and cap < 300 for cap in typing_caps)
    assert memory.stm("ann") or memory.ltm("ann")
