"""Learning from feedback with conditional memory (Yuan et al., Figure 1).

Session 1: the user asks to capitalize some words, gets "Apple Banana", and corrects the
assistant: capitalize means every letter. Conditional memory decides that the correction is
worth remembering and writes a "Context: ... Knowledge: ..." record. Session 2, later: a
similar request recalls that record before answering.

    python examples/conditional_feedback.py            # offline, rule-following stand-in
    python examples/conditional_feedback.py --local    # the bundled SmolLM2-135M (weak, slow)
    python examples/conditional_feedback.py --local --model qwen2.5-1.5b   # better, slower
    OPENAI_API_KEY=... python examples/conditional_feedback.py   # a real model

Offline, the default model is ``ScriptedLLM(default=rule_following_reply)``: a deterministic
stand-in that follows the package's prompt formats and the paper's decision rule with simple
heuristics. It shows the mechanics (what is stored, what is recalled, how many calls), not the
quality of a model. A real model may garble its answer (a small one often does): the turn is
kept, the decision stays pending, and the script says so and carries on.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from memories_core import ConditionalMemory, ConditionalReply, LLMError, ParseError, Scope
from memories_core.embedders import HashingEmbedder, SentenceTransformerEmbedder
from memories_core.interfaces import LLM, Embedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.rule_following import rule_following_reply


def choose(local: bool, model: str = "smollm2-135m") -> tuple[LLM, Embedder, str]:
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

        return (
            LocalLLM(model=model, max_new_tokens=120),
            SentenceTransformerEmbedder(),
            f"local {model}",
        )
    stand_in = ScriptedLLM(default=rule_following_reply)
    return stand_in, HashingEmbedder(), "rule-following stand-in (not a model)"


def respond(memory: ConditionalMemory, text: str, scope: Scope) -> ConditionalReply | None:
    """One turn; a failed or garbled answer is reported, not fatal (the turn is kept)."""
    try:
        return memory.respond(text, scope)
    except (ParseError, LLMError) as exc:
        print(f"user: {text}\nassistant: (no usable answer: {type(exc).__name__}: {exc})")
        print("  (the user turn is stored; its decision stays pending for retry_pending)\n")
        return None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--local", action="store_true", help="use a bundled local model")
    parser.add_argument(
        "--model", default="smollm2-135m", help="with --local: the model (default: smollm2-135m)"
    )
    args = parser.parse_args(argv)
    run(*choose(args.local, args.model))


def run(llm: LLM, embedder: Embedder, label: str) -> None:
    """The two sessions with ``llm``."""
    memory = ConditionalMemory(llm=llm, embedder=embedder)  # in memory; pass path= to persist
    print(f"model: {label}\n")

    monday = Scope("lee", session_id="monday")
    print("== Session 1")
    for text in (
        "Please capitalize these words: apple, banana",
        "No, capitalize means every letter in upper case, like APPLE.",
    ):
        before = llm.usage.calls
        reply = respond(memory, text, monday)
        if reply is None:
            continue
        print(f"user: {text}\nassistant: {reply.response}")
        print(f"  (remember it? {reply.decision}; LLM calls: {llm.usage.calls - before})\n")

    print("== Stored conditional records")
    for record in memory.store.list(user_id="lee", where={"kind": "conditional"}):
        print(f"- {record.text}")

    print("\n== Session 2 (days later)")
    request = "Capitalize this word for me: cherry"
    reply = respond(memory, request, Scope("lee", session_id="friday"))
    if reply is not None:
        print(f"recalled before answering:\n{reply.recall.context or '(nothing)'}\n")
        print(f"user: {request}\nassistant: {reply.response}\n")
    usage = llm.usage
    print(
        f"cost: {usage.calls} LLM calls, {usage.prompt_tokens} prompt tokens, "
        f"{usage.completion_tokens} completion tokens; failures: {memory.usage.failures}; "
        f"decisions pending: {len(memory.engine.pending('lee'))}"
    )
    memory.close()


if __name__ == "__main__":
    main()
