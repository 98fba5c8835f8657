"""``DualProcessMemory.memorize``: the executive process fed typed knowledge directly.

The coordinator's jobs call it per round; called directly it replays a recorded run's items
under other settings (promotion threshold, STM refresh), with no model.
"""

from __future__ import annotations

import pytest

from memories_core import DualProcessMemory, Scope
from memories_core.embedders import HashingEmbedder
from memories_core.errors import InvalidInputError

USER, COMMON = "user-specific", "common-sense"


def make(**settings: int) -> DualProcessMemory:
    return DualProcessMemory(llm=None, embedder=HashingEmbedder(), **settings)


def test_recurring_items_are_promoted_and_others_dropped_by_the_refresh() -> None:
    memory = make(theta=2, stm_refresh_rounds=2)
    memory.memorize("ann", 1, [("Ann has type 2 diabetes.", USER), ("Walking helps.", COMMON)])
    memory.memorize("ann", 2, [("Ann has type 2 diabetes!", USER)])  # a recurrence
    memory.memorize("ann", 3, [("Ann adopted a cat named Miso.", USER)])
    memory.memorize("ann", 4, [("Ann started the violin.", USER)])
    ltm = {item.text: item.count for item in memory.ltm("ann")}
    assert ltm == {"Ann has type 2 diabetes.": 2}
    stm = {item.text for item in memory.stm("ann")}
    # Round 1's item that never recurred was dropped at round 2's refresh; round 3's and
    # round 4's were seen within the last period.
    assert stm == {"Ann adopted a cat named Miso.", "Ann started the violin."}
    stats = memory.stats("ann")
    assert (stats.promotions, stats.merges, stats.dropped) == (1, 1, 1)
    assert "diabetes" in memory.recall("diabetes", Scope("ann"), k=3).context
    assert not memory.recall("diabetes", Scope("bob"), k=3).records


def test_without_a_refresh_nothing_is_forgotten() -> None:
    memory = make(theta=3, stm_refresh_rounds=10_000)
    for n, text in enumerate(["Ann likes tea.", "Ann runs marathons.", "Ann lives in Lyon."], 1):
        memory.memorize("ann", n, [(text, USER)])
    assert len(memory.stm("ann")) == 3 and not memory.ltm("ann")


@pytest.mark.parametrize(
    ("round_no", "typed"),
    [
        (0, [("Ann likes tea.", USER)]),
        (True, [("Ann likes tea.", USER)]),
        (1, [("", USER)]),
        (1, [("Ann likes tea.", "opinion")]),
        (1, ["Ann likes tea."]),
    ],
)
def test_bad_rounds_and_items_are_refused_before_anything_is_written(
    round_no: object, typed: object
) -> None:
    memory = make()
    with pytest.raises(InvalidInputError):
        memory.memorize("ann", round_no, typed)  # type: ignore[arg-type]
    assert not memory.stm("ann")
    with pytest.raises(InvalidInputError):
        memory.memorize("", 1, [("Ann likes tea.", USER)])


def test_the_flag_table_rules_alone() -> None:
    """The near-duplicate lookup and the STM refresh, as the executive process applies them."""
    from memories_core.mechanisms.dpem_items import LTM, STM, matching_item, refreshed_stm

    texts = {"a": "The user likes green tea.", "b": "The user has 2 cats."}
    assert matching_item("the user likes green tea", texts, 88.0) == "a"
    assert matching_item("The user has 3 cats.", texts, 88.0) is None  # numbers differ
    assert matching_item("anything", {}, 88.0) is None

    tiers = {"old": STM, "seen": STM, "kept": LTM}
    rounds = {"old": {1}, "seen": {3, 4}, "kept": {1}}
    log: dict[str, int] = {}
    # Round 3 ends no period of 4: nothing is dropped, no refresh is counted.
    assert refreshed_stm(3, tiers, rounds, log, period=4, capacity=10) == []
    assert log == {"dropped": 0}
    # Round 4 ends the period of rounds 1-4, and every STM item was seen in it.
    assert refreshed_stm(4, tiers, rounds, log, period=4, capacity=10) == []
    assert log["refreshes"] == 1 and log["last_refresh"] == 4
    # A second call for the same round refreshes nothing again.
    assert refreshed_stm(4, tiers, rounds, log, period=4, capacity=10) == []
    assert log["refreshes"] == 1
    # Round 8 ends rounds 5-8, where no STM item was seen; the LTM item stays.
    assert refreshed_stm(8, tiers, rounds, log, period=4, capacity=10) == ["old", "seen"]
    assert log["refreshes"] == 2 and log["dropped"] == 2
    # The capacity drops the least frequent, then least recent, short-term items.
    assert refreshed_stm(9, tiers, rounds, log, period=4, capacity=1) == ["old"]
