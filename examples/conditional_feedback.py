"""Learning from feedback with conditional memory (Yuan et al., Figure 1).

Session 1: the user asks to capitalize some words, gets "Apple Banana", and corrects the
assistant: capitalize means every letter. Conditional memory decides that the correction is
worth remembering and writes a "Context: ... Knowledge: ..." record. Session 2, later: a
similar request recalls that record before answering.

    python examples/conditional_feedback.py            # offline, rule-following stand-in
    python examples/conditional_feedback.py --local    # the bundled SmolLM2-135M (weak, slow)
    OPENAI_API_KEY=... python examples/conditional_feedback.py   # a real model

Offline, the default model is ``ScriptedLLM(default=rule_following_reply)``: a deterministic
stand-in that follows the package's prompt formats and the paper's decision rule with simple
heuristics. It shows the mechanics (what is stored, what is recalled, how many calls), not the
quality of a model.
"""

from __future__ import annotations

import argparse
import os

from memories_core import ConditionalMemory, Scope
from memories_core.embedders import HashingEmbedder, SentenceTransformerEmbedder
from memories_core.interfaces import LLM, Embedder
from memories_core.llms import ScriptedLLM
from memories_core.llms.rule_following import rule_following_reply


def choose(local: bool) -> tuple[LLM, Embedder, str]:
    if os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"):
        from memories_core.llms import OpenAIChatLLM

        model = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")
        return (
            OpenAIChatLLM(model=model),
            SentenceTransformerEmbedder(),
            f"OpenAI-compatible {model}",
        )
    if local:
        from memories_core.llms import LocalLLM

        return LocalLLM(max_new_tokens=120), SentenceTransformerEmbedder(), "local SmolLM2-135M"
    stand_in = ScriptedLLM(default=rule_following_reply)
    return stand_in, HashingEmbedder(), "rule-following stand-in (not a model)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--local", action="store_true", help="use the bundled local model")
    args = parser.parse_args()
    llm, embedder, label = choose(args.local)
    memory = ConditionalMemory(llm=llm, embedder=embedder)  # in memory; pass path= to persist
    print(f"model: {label}\n")

    monday = Scope("lee", session_id="monday")
    print("== Session 1")
    for text in (
        "Please capitalize these words: apple, banana",
        "No, capitalize means every letter in upper case, like APPLE.",
    ):
        before = llm.usage.calls
        reply = memory.respond(text, monday)
        print(f"user: {text}\nassistant: {reply.response}")
        print(f"  (remember it? {reply.decision}; LLM calls: {llm.usage.calls - before})\n")

    print("== Stored conditional records")
    for record in memory.store.list(user_id="lee", where={"kind": "conditional"}):
        print(f"- {record.text}")

    print("\n== Session 2 (days later)")
    request = "Capitalize this word for me: cherry"
    reply = memory.respond(request, Scope("lee", session_id="friday"))
    print(f"recalled before answering:\n{reply.recall.context or '(nothing)'}\n")
    print(f"user: {request}\nassistant: {reply.response}\n")
    usage = llm.usage
    print(
        f"cost: {usage.calls} LLM calls, {usage.prompt_tokens} prompt tokens, "
        f"{usage.completion_tokens} completion tokens; failures: {memory.usage.failures}"
    )


if __name__ == "__main__":
    main()
