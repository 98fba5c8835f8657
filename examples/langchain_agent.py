"""Long-term memory for a LangChain agent (``create_agent`` + ``MemoryMiddleware``).

Runs offline: with ``OPENAI_API_KEY`` set and ``langchain-openai`` installed it uses
``ChatOpenAI``; otherwise a small fake chat model that only echoes the memories it was given,
so you can see what the middleware injected. Memories persist in
``examples/.memories/langchain``: run the script twice and the second run remembers more.

    python examples/langchain_agent.py
"""

from __future__ import annotations

import os
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
    """A fake chat model: it answers by quoting what the middleware added to its prompt."""

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        system = messages[0].text if messages[0].type == "system" else ""
        injected = system.removeprefix(SYSTEM_PROMPT).strip()
        reply = f"(fake model) My prompt said: {injected}" if injected else "(fake model) Noted."
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


def main() -> None:
    model, is_fake = build_model()
    print("Model:", "a FAKE echo model (no LLM, offline)" if is_fake else type(model).__name__)
    # HashingEmbedder keeps the example fast; drop `embedder=` for the bundled MiniLM model.
    memory = HistoryMemory(embedder=HashingEmbedder(), path=MEMORY_DIR)
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
    print(f"\n{len(memory.turns(Scope(USER)))} turns of {USER!r} stored in {MEMORY_DIR}")
    memory.close()


if __name__ == "__main__":
    main()
