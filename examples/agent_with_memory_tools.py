"""A LangChain agent that decides itself what to remember, over two runs in two processes.

Run 1 (this process): the user tells the agent a few things; the agent calls ``save_memory``
for the facts worth keeping (not for small talk). Run 2 (a second process started by this
script, on the same memory folder): the user asks a question; the agent calls
``search_memory`` and answers from what run 1 saved. Then it corrects one memory with
``update_memory``; the old text stays in the history.

    python examples/agent_with_memory_tools.py              # offline, scripted decisions
    python examples/agent_with_memory_tools.py --path DIR   # keep the memory folder

Offline, the model is a small rule-based stand-in that calls the tools the way a real
tool-calling model would (swap in ``ChatOpenAI(...)`` or any chat model with tool calling).
Inspect the folder afterwards with ``llm-memories --path DIR --embedder hashing show user-1``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from langchain_memories import create_memory_tools
from memories_core import HistoryMemory
from memories_core.embedders import HashingEmbedder

USER = "user-1"
FACT = re.compile(r"\b(i am|i'm|my|i live|i work|i have)\b", re.I)


class RuleBasedToolCaller(BaseChatModel):
    """Decides like a tool-calling model: save facts, search for questions, then answer."""

    @property
    def _llm_type(self) -> str:
        return "rule-based-tool-caller"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> RuleBasedToolCaller:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self._decide(messages))])

    @staticmethod
    def _decide(messages: list[BaseMessage]) -> AIMessage:
        last = messages[-1]
        if isinstance(last, ToolMessage):
            if last.name == "search_memory":
                hits = [json.loads(line) for line in last.text.splitlines() if line.startswith("{")]
                if hits and "correction" in messages[-3].text.lower():
                    new_text = messages[-3].text.split(":", 1)[1].strip()
                    args = {"memory_id": hits[0]["id"], "text": new_text}
                    return AIMessage("", tool_calls=[_call("update_memory", args)])
                return AIMessage(f"From memory: {hits[0]['text']}" if hits else "I don't know.")
            return AIMessage("Got it, I'll remember that.")
        text = last.text
        if text.lower().startswith("correction:"):
            query = text.split(":", 1)[1]
            return AIMessage(text, tool_calls=[_call("search_memory", {"query": query, "k": 1})])
        if text.rstrip().endswith("?"):
            return AIMessage("", tool_calls=[_call("search_memory", {"query": text, "k": 1})])
        if FACT.search(text):
            fact = re.sub(r"^(i am|i'm)\b", "The user is", text.strip(), flags=re.I)
            fact = re.sub(r"^my\b", "The user's", fact, flags=re.I)
            return AIMessage("", tool_calls=[_call("save_memory", {"text": fact})])
        return AIMessage("Nice to hear!")  # small talk: nothing worth remembering


def _call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "args": args, "id": f"call-{name}"}


def agent_for(path: Path) -> tuple[Any, HistoryMemory]:
    memory = HistoryMemory(path=path, embedder=HashingEmbedder())
    return create_agent(model=RuleBasedToolCaller(), tools=create_memory_tools(memory)), memory


def say(agent: Any, text: str) -> str:
    state = agent.invoke({"messages": [HumanMessage(text)]}, context={"user_id": USER})
    tools = [m.name for m in state["messages"] if isinstance(m, ToolMessage)]
    answer = state["messages"][-1].text
    print(f"user: {text}\n  tools: {tools or '-'}\n  agent: {answer}")
    return answer


def run_1(path: Path) -> None:
    agent, memory = agent_for(path)
    print(f"--- run 1 (process {os.getpid()})")
    say(agent, "I'm allergic to shellfish")
    say(agent, "The weather is lovely today")
    say(agent, "My daughter's name is Ines")
    memory.close()


def run_2(path: Path) -> None:
    agent, memory = agent_for(path)
    print(f"--- run 2 (process {os.getpid()})")
    say(agent, "What am I allergic to?")
    say(agent, "Correction: The user's daughter is called Inês")
    say(agent, "What is my daughter's name?")
    kept = [r.text for r in memory.engine.records(USER, where={"kind": "memory"})]
    print("memories:", kept)
    print("history:", [(h.old, h.new) for h in memory.engine.history(USER)])
    memory.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=Path, help="memory folder (default: a temporary one)")
    parser.add_argument("--run", type=int, choices=[1, 2], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    path = args.path or Path(tempfile.mkdtemp(prefix="agent-memory-"))
    if args.run == 2:
        run_2(path)
        return
    run_1(path)
    # Run 2 in a new process: nothing is shared but the memory folder.
    subprocess.run([sys.executable, __file__, "--path", str(path), "--run", "2"], check=True)


if __name__ == "__main__":
    main()
