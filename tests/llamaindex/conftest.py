"""Fixtures of the LlamaIndex adapter tests: explicit Settings, fakes, real core memories."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from li_fakes import RecordingLLM
from llama_index.core import Settings

from llamaindex_memories import CoreEmbedding
from memories_core import HistoryMemory
from memories_core.embedders import HashingEmbedder


@pytest.fixture
def recording_llm() -> RecordingLLM:
    return RecordingLLM()


@pytest.fixture(autouse=True)
def li_settings(recording_llm: RecordingLLM) -> Iterator[None]:
    """Set Settings.llm / embed_model explicitly (the defaults need OpenAI) and restore them."""
    saved_llm = Settings._llm
    saved_embed = Settings._embed_model
    Settings.llm = recording_llm
    Settings.embed_model = CoreEmbedding(HashingEmbedder())
    yield
    Settings._llm = saved_llm
    Settings._embed_model = saved_embed


@pytest.fixture
def history() -> Iterator[HistoryMemory]:
    memory = HistoryMemory(embedder=HashingEmbedder(), path=None)
    yield memory
    memory.close()
