"""The core's public names change only on purpose (as langchain partner packages pin theirs)."""

from __future__ import annotations

import subprocess
import sys

import memories_core

EXPECTED_ALL = [
    "BackendError",
    "ChatMessage",
    "ConditionalMemory",
    "ConditionalReply",
    "ConfigurationError",
    "DualProcessMemory",
    "EMGMemory",
    "EmbedderMismatchError",
    "FixedClock",
    "HistoryMemory",
    "InvalidInputError",
    "LLMError",
    "MemoChatMemory",
    "MemoEntry",
    "MemoriesError",
    "MemoryBankMemory",
    "MemoryBase",
    "MemoryEngine",
    "MemoryRecord",
    "MemoryUsage",
    "MissingExtraError",
    "MissingUserError",
    "MultiViewMemory",
    "ParseError",
    "Recall",
    "RecordState",
    "Scope",
    "ScoredRecord",
    "SearchKeyError",
    "SelfReflectiveMemory",
    "SelfReflectiveRetrieval",
    "StateChange",
    "SummaryMemory",
    "SystemClock",
    "Turn",
    "Usage",
    "export_user",
    "import_user",
]


def test_all_is_pinned() -> None:
    assert sorted(memories_core.__all__) == EXPECTED_ALL
    for name in EXPECTED_ALL:
        assert getattr(memories_core, name) is not None


def test_import_stays_light() -> None:
    code = (
        "import sys, memories_core, memories_core.engine, memories_core.backends; "
        "print(sorted(m for m in ('chromadb', 'torch', 'sentence_transformers', 'networkx', "
        "'psycopg', 'psycopg_pool') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_core_imports_no_framework() -> None:
    from pathlib import Path

    core = Path(memories_core.__file__).parent
    offenders = [
        str(path)
        for path in core.rglob("*.py")
        for line in path.read_text(encoding="utf-8").splitlines()
        if line.lstrip().startswith(
            (
                "import langchain",
                "from langchain",
                "import langgraph",
                "from langgraph",
                "import llama_index",
                "from llama_index",
            )
        )
    ]
    assert offenders == []
