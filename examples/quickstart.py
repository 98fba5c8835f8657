"""Quickstart: two sessions with one user; session 2 recalls a preference from session 1.

Runs fully offline: Chroma embedded under ./.quickstart_memory, the bundled all-MiniLM-L6-v2
embedder, and the best offline chat model installed (Qwen2.5-Coder-1.5B-Instruct with the
extra `qwen`, else SmolLM2-135M-Instruct). Set OPENAI_API_KEY (and optionally
OPENAI_BASE_URL / OPENAI_MODEL, e.g. for an Ollama or vLLM server) to use that model instead.

    python examples/quickstart.py
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from memories_core import ChatMessage, HistoryMemory, Scope, SummaryMemory, Turn
from memories_core.embedders import SentenceTransformerEmbedder
from memories_core.interfaces import LLM

MEMORY_DIR = Path(".quickstart_memory")


def choose_llm() -> LLM:
    """An OpenAI-compatible server if one is configured, else the bundled local model."""
    if os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"):
        from memories_core.llms import OpenAIChatLLM

        return OpenAIChatLLM(model=os.environ.get("OPENAI_MODEL", "gpt-4o-mini"))
    from memories_core.llms import LocalLLM
    from memories_core.llms.models import default_model_name

    # The best offline model installed: Qwen2.5-1.5B with the extra `qwen` (the README's
    # install), else the tiny SmolLM2; LLM_MEMORIES_MODEL=smollm2-135m forces the tiny one.
    return LocalLLM(model=default_model_name(), max_new_tokens=60)


def main() -> int:
    shutil.rmtree(MEMORY_DIR, ignore_errors=True)
    llm = choose_llm()
    embedder = SentenceTransformerEmbedder()
    history = HistoryMemory(path=MEMORY_DIR / "history", embedder=embedder)
    summaries = SummaryMemory(path=MEMORY_DIR / "summaries", embedder=embedder, llm=llm)
    print(f"LLM: {type(llm).__name__}; memory folder: {MEMORY_DIR.resolve()}\n")

    def chat(text: str, scope: Scope) -> tuple[str, str]:
        recalled = "\n".join(
            part
            for part in (
                history.recall(text, scope).context,
                summaries.recall(text, scope).context,
            )
            if part
        )
        system = "You are a helpful assistant. Answer in one or two sentences."
        if recalled:
            system += f"\nWhat you remember about this user:\n{recalled}"
        reply = (
            llm.generate(
                [ChatMessage("system", system), ChatMessage("user", text)], max_tokens=60
            ).strip()
            or "(no reply)"
        )
        turns = [Turn("user", text), Turn("assistant", reply)]
        history.save(turns, scope)
        summaries.save(turns, scope)
        return reply, recalled

    started = time.perf_counter()
    print("== Session 1")
    for text in (
        "Hi, I'm Sam. I'm vegetarian, so please never suggest meat or fish dishes.",
        "Also, I live in Lyon and I cook dinner for two most evenings.",
    ):
        reply, _ = chat(text, Scope("sam", session_id="monday"))
        print(f"user: {text}\nassistant: {reply}\n")
    summaries.end_session(Scope("sam", session_id="monday"))  # the conversation is over
    # Saves and end_session return at once; the summary is written in the background.
    # A script that needs it now waits for it (a chat app would just carry on).
    summaries.flush("sam", progress=True)

    print("== Session 2 (days later)")
    question = "Can you suggest something I could cook for dinner tonight?"
    reply, recalled = chat(question, Scope("sam", session_id="friday"))
    print(f"recalled before answering:\n{recalled}\n")
    print(f"user: {question}\nassistant: {reply}\n")

    llm_usage = llm.usage
    print("== Cost")
    print(
        f"LLM calls: {llm_usage.calls} (failures {llm_usage.failures}), "
        f"prompt tokens: {llm_usage.prompt_tokens}, "
        f"completion tokens: {llm_usage.completion_tokens}"
    )
    print(f"embedder: {embedder.usage.calls} calls, {embedder.usage.items} texts")
    print(
        f"summary failures (turns kept, retried later): "
        f"{summaries.usage.failures.get('summary', 0)}"
    )
    print(f"wall time: {time.perf_counter() - started:.1f} s")
    history.close()
    summaries.close()
    if "never suggest meat" not in recalled:
        print("ERROR: session 2 did not recall the preference from session 1", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
