"""A LlamaIndex chat engine that remembers a user across sessions. Runs offline.

    python examples/llamaindex_chat.py

Uses OpenAI only if ``llama-index-llms-openai`` is installed and ``OPENAI_API_KEY`` is set;
otherwise a fake LLM prints the long-term memory LlamaIndex put in its prompt and answers with a
fixed line (its answers are saved like any assistant turn, so they must not copy memories).
Memories persist in ``examples/.memories/llamaindex`` (``--path DIR`` for another folder).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llama_index.core.base.llms.types import CompletionResponse, CompletionResponseGen
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import LLM, CustomLLM, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.memory import Memory

from llamaindex_memories import MemoryBlock
from memories_core import HistoryMemory, Scope
from memories_core.embedders import HashingEmbedder

STORE = Path(__file__).parent / ".memories" / "llamaindex"


class ShowMemoryLLM(CustomLLM):
    """Fake LLM: prints the long-term memory block found in its prompt, answers a fixed line."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="show-memory-fake")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        found = re.search(r"<long_term_memory>(.*?)</long_term_memory>", prompt, re.DOTALL)
        if not found:
            return CompletionResponse(text="[fake LLM] I have no memories of you yet.")
        print("[fake LLM sees]", found.group(1).strip().replace("\n", "\n    "))
        return CompletionResponse(text="[fake LLM] A real model would answer from that memory.")

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        raise NotImplementedError("this fake does not stream")


def make_llm() -> LLM:
    if os.environ.get("OPENAI_API_KEY"):
        try:
            from llama_index.llms.openai import OpenAI

            return OpenAI(model="gpt-4o-mini")
        except ImportError:
            pass
    print("No OpenAI LLM available: using a FAKE LLM that shows the memory it receives.\n")
    return ShowMemoryLLM()


def chat_session(llm: LLM, history: HistoryMemory, session_id: str, messages: list[str]) -> None:
    block = MemoryBlock(memory=history, user_id="alice")
    memory = Memory.from_defaults(session_id=session_id, memory_blocks=[block])
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    print(f"--- session {session_id}")
    for text in messages:
        print(f"alice: {text}")
        print(f"bot:   {engine.chat(text)}\n")
    # Memory only hands messages to blocks once its token limit overflows; save the rest now.
    block.flush(memory)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--path", type=Path, default=STORE, help="memory folder")
    args = parser.parse_args(argv)
    llm = make_llm()
    # HashingEmbedder keeps the demo instant; the default embedder (all-MiniLM-L6-v2) matches
    # meaning rather than words.
    history = HistoryMemory(path=args.path, embedder=HashingEmbedder())
    history.clear(Scope("alice"))  # start the demo from scratch on every run
    chat_session(llm, history, "monday", ["Hi! I'm vegetarian and I love spicy food."])
    chat_session(llm, history, "tuesday", ["Suggest some spicy food for dinner tonight."])
    history.close()


if __name__ == "__main__":
    main()
