"""DPeM rounds and promotions by adapter: the same exchanges through LangChain and LlamaIndex.

DPeM counts a knowledge item once per round it appears in and promotes it to long-term memory
at ``theta`` rounds (Zhang et al., 2023, "DPeM Mechanism"). The same ``N`` identical exchanges
("I have type 2 diabetes." / a reply) go to a :class:`DualProcessMemory` (``theta = 3``, the
rule-based coordinator ``dpem_reply``, hashing embedder) through:

* LangChain: ``LegacyChainMemory`` inside a ``ConversationChain`` (one save per exchange);
* LlamaIndex: ``MemoryBlock`` inside ``llama_index.core.memory.Memory`` with a
  ``SimpleChatEngine`` (the tests' scripted LLM, same reply); the session's messages reach
  the block in one flush (one save).

Printed per adapter: saves, DPeM rounds, items in LTM, promotions.

    python benchmarks/dpem_rounds.py [--exchanges 3]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "llamaindex"))

from memories_core import DualProcessMemory
from memories_core.embedders import HashingEmbedder
from memories_core.llms import ScriptedLLM
from memories_core.prompts.dpem import dpem_reply

USER = "I have type 2 diabetes."
REPLY = "Noted. Keep your sugar steady."


class _Counting:
    """Counts ``save`` calls of a memory (the adapters call ``save`` or ``asave``)."""

    def __init__(self, memory: DualProcessMemory) -> None:
        self.saves = 0
        original = memory.save

        def save(turns: Any, scope: Any) -> None:
            self.saves += 1
            original(turns, scope)

        memory.save = save  # type: ignore[method-assign]


def _memory() -> DualProcessMemory:
    return DualProcessMemory(
        llm=ScriptedLLM(default=dpem_reply), embedder=HashingEmbedder(), theta=3
    )


def langchain(exchanges: int) -> dict[str, int]:
    from langchain_classic.chains import ConversationChain
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage

    from langchain_memories import LegacyChainMemory

    memory = _memory()
    counter = _Counting(memory)
    model = GenericFakeChatModel(messages=iter([AIMessage(REPLY)] * exchanges))
    chain = ConversationChain(llm=model, memory=LegacyChainMemory(memory=memory, user_id="ann"))
    for _ in range(exchanges):
        chain.invoke({"input": USER})
    return _stats(memory, counter.saves)


def llamaindex(exchanges: int) -> dict[str, int]:
    from li_fakes import RecordingLLM
    from llama_index.core.chat_engine import SimpleChatEngine
    from llama_index.core.memory import Memory

    from llamaindex_memories import MemoryBlock

    memory = _memory()
    counter = _Counting(memory)
    block = MemoryBlock(memory=memory, user_id="ann")
    chat_memory = Memory.from_defaults(session_id="s1", memory_blocks=[block])
    engine = SimpleChatEngine.from_defaults(llm=RecordingLLM(default=REPLY), memory=chat_memory)
    for _ in range(exchanges):
        engine.chat(USER)
    block.flush(chat_memory)
    return _stats(memory, counter.saves)


def _stats(memory: DualProcessMemory, saves: int) -> dict[str, int]:
    stats = memory.stats("ann")
    return {
        "saves": saves,
        "rounds": stats.rounds,
        "ltm": stats.ltm,
        "promotions": stats.promotions,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=3)
    args = parser.parse_args(argv)
    out = {"langchain": langchain(args.exchanges), "llamaindex": llamaindex(args.exchanges)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
