"""MemoChat's memo on a long multi-topic chat (Lu et al., 2023, Figure 1 and §3.2).

A user talks about quantum physics, then business etiquette in Japan, then a polynomial.
The memo is written as the buffer fills (Table 6: topic, summary and line range). Then comes
the long-range question "the business etiquette we talked about belongs to Korea, right?":
memo retrieval (Table 7) chooses the evidence, and the chat-with-memo prompt (Table 8) is
answered with it.

    python examples/memochat_topics.py              # offline, rule-following stand-in LLM
    python examples/memochat_topics.py --llm-free   # no LLM: TextTiling memo, fused selector

Offline, the model is ``ScriptedLLM`` over
:func:`memories_core.prompts.memochat.rule_following_reply`: a deterministic stand-in that
follows the prompts' output formats with simple rules. It shows the mechanics (what is
stored, what is chosen, how many calls), not the quality of a model.
"""

from __future__ import annotations

import argparse

from memories_core import MemoChatMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.memochat import rule_following_reply

CHAT = [
    ("user", "I started reading about quantum physics. What is quantum entanglement?"),
    ("assistant", "Two entangled particles share one quantum state, however far apart."),
    ("user", "And quantum superposition, is a qubit really zero and one at once?"),
    ("assistant", "A qubit in superposition has amplitudes for both; measuring picks one."),
    ("user", "Does quantum tunnelling matter for physics in real chips?"),
    ("assistant", "Yes, tunnelling limits how thin transistor barriers can get."),
    ("user", "Next month I visit business partners in Japan. What etiquette should I know?"),
    ("assistant", "In Japan, bow when greeting and offer your business card with both hands."),
    ("user", "Should I bring a gift to the business meeting in Japan?"),
    ("assistant", "A modest wrapped gift is good Japanese business etiquette; give it at the end."),
    ("user", "Help me with a polynomial: how do I factor x^2 - 5x + 6?"),
    ("assistant", "Find two numbers with product 6 and sum -5: the polynomial is (x - 2)(x - 3)."),
    ("user", "So the polynomial has roots 2 and 3?"),
    ("assistant", "Yes, the polynomial is zero at x = 2 and at x = 3."),
]
QUESTION = "The business etiquette we talked about belongs to Korea, right?"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--llm-free", action="store_true", help="no LLM at all")
    args = parser.parse_args()

    llm = None if args.llm_free else ScriptedLLM(default=lambda m: rule_following_reply(m) or "")
    memory = MemoChatMemory(llm=llm, embedder=HashingEmbedder(), max_lines=10)
    scope = Scope("ann")
    for i in range(0, len(CHAT), 2):  # one exchange a save, as a chat app would
        memory.save([Turn(role, text) for role, text in CHAT[i : i + 2]], scope)
    memory.end_session(scope)  # the rest of the buffer goes into the memo too
    # Memos are written in the background; a script that prints them waits for them.
    memory.flush(scope.user_id)

    print(f"mode: {memory.mode}")
    print("memo:")
    for entry in memory.memos(scope):
        print(f"  - {entry.topic}: {entry.summary} ({len(entry.dialogs)} lines)")
    print(f"buffer: {len(memory.buffer(scope))} lines not in a memo yet")

    print(f"\nuser: {QUESTION}")
    evidence = memory.retrieve(QUESTION, scope)
    print("evidence chosen:")
    for entry in evidence:
        print(f"  - {entry.topic}: {entry.summary}")
        for line in entry.dialogs:
            print(f"      {line}")
    if not evidence:
        print("  (none of the others)")
    if llm is not None:
        print(f"\nassistant: {memory.respond(QUESTION, scope)}")
        print(f"LLM calls: {llm.usage.calls}")


if __name__ == "__main__":
    main()
