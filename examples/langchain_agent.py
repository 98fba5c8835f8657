"""Long-term memory for a LangChain agent (``create_agent`` + ``MemoryMiddleware``).

Runs offline: with ``OPENAI_API_KEY`` set and ``langchain-openai`` installed it uses
``ChatOpenAI``; otherwise a small fake chat model that prints the memories the middleware put
in its prompt and answers with a fixed line (so its answers, which are saved like any
assistant turn, never copy memories back into memory). Memories persist in
``examples/.memories/langchain``: run the script twice and the second run recalls the first.

    python examples/langchain_agent.py [--path DIR]
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from langchain_memories import MemoryMiddleware
from memories_core import HistoryMemory, Scope
from memories_core.embedders import HashingEmbedder

MEMORY_DIR = Path(__file__).parent / ".memories" / "langchain"
USER = "alice"
SYSTEM_PROMPT = "You are a helpful cooking assistant."


class EchoMemoryModel(BaseChatModel):
    """A fake chat model: prints what the middleware added to its prompt, answers a fixed line.

    The answer is saved as the assistant's turn; quoting the injected memories in it would
    store them again on every run.
    """

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        system = messages[0].text if messages[0].type == "system" else ""
        injected = system.removeprefix(SYSTEM_PROMPT).strip()
        print("  (fake model) my prompt carried:", injected.replace("\n", "\n    ") or "nothing")
        reply = "(fake model) A real model would answer here, using that memory."
        return ChatResult(generations=[ChatGeneration(message=AIMessage(reply))])

    def bind_tools(self, tools: Any, **kwargs: Any) -> EchoMemoryModel:
        return self

    @property
    def _llm_type(self) -> str:
        return "echo-memory-fake"


def build_model() -> tuple[BaseChatModel, bool]:
    """Return ``(model, is_fake)``: ChatOpenAI when configured and installed, else the fake."""
    if os.environ.get("OPENAI_API_KEY"):
        try:
            from langchain_openai import ChatOpenAI
        except ImportError:
            print("OPENAI_API_KEY is set but langchain-openai is not installed.")
        else:
            return ChatOpenAI(model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini")), False
    return EchoMemoryModel(), True


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=Path, default=MEMORY_DIR, help="memory folder")
    args = parser.parse_args(argv)
    model, is_fake = build_model()
    print("Model:", "a FAKE echo model (no LLM, offline)" if is_fake else type(model).__name__)
    # HashingEmbedder keeps the example fast; drop `embedder=` for the bundled MiniLM model.
    memory = HistoryMemory(embedder=HashingEmbedder(), path=args.path)
    agent = create_agent(
        model=model,
        tools=[],
        system_prompt=SYSTEM_PROMPT,
        middleware=[MemoryMiddleware(memory, k=3)],
    )
    for text in ["I'm vegetarian and I love spicy Thai food.", "What should I cook tonight?"]:
        recalled = memory.recall(text, Scope(USER), k=3)  # what the middleware will inject
        print(f"\nuser: {text}")
        print("recalled:", [hit.record.text for hit in recalled.records] or "nothing yet")
        state = agent.invoke(
            {"messages": [{"role": "user", "content": text}]}, context={"user_id": USER}
        )
        print("assistant:", state["messages"][-1].text)
    print(f"\n{len(memory.turns(Scope(USER)))} turns of {USER!r} stored in {args.path}")
    memory.close()


if __name__ == "__main__":
    main()
