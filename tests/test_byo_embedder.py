"""Bring your own embedder: LangChain, LlamaIndex and sentence-transformers models.

Each path stores a memory with the user's embedder, shows that reopening it with another
embedder raises :class:`EmbedderMismatchError`, and that ``allow_embedder_change=True`` /
``reindex()`` re-embeds every record so dense recall follows the new model.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.runnables import Runnable, RunnableLambda
from llama_index.core.base.embeddings.base import BaseEmbedding, Embedding

from langchain_memories import LangChainEmbedder, MemoryRetriever
from llamaindex_memories import LlamaIndexEmbedder
from memories_core import EmbedderMismatchError, HistoryMemory, MemoryBase, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.engine import MemoryEngine
from memories_core.retrieval import DenseSource, Pipeline

ANA = Scope("ana")
#: Dense only, no context: what the embedder alone ranks.
DENSE = Pipeline(sources=(DenseSource(weight=1.0),), rerankers=())
TURNS = [
    "I adopted a kitten last spring",
    "my brother repairs old motorbikes",
    "green tea in the morning keeps me calm",
]
#: Words of one concept share a dimension in the keyword embedding below.
CONCEPTS = {
    "cat": 0, "kitten": 0, "feline": 0, "pet": 0,
    "motorbike": 1, "motorbikes": 1, "bike": 1, "vehicle": 1,
    "tea": 2, "drink": 2, "beverage": 2,
}  # fmt: skip


class KeywordEmbedding(BaseEmbedding):
    """A custom LlamaIndex embedding: one dimension per concept, plus a query marker.

    Queries and documents differ on purpose (dimension 7 is set for queries only), so a
    test can see which LlamaIndex method embedded what.
    """

    query_calls: int = 0

    @classmethod
    def class_name(cls) -> str:
        return "KeywordEmbedding"

    def _vector(self, text: str, query: bool) -> Embedding:
        vector = [0.0] * 8
        for word in re.findall(r"[a-z]+", text.lower()):
            if word in CONCEPTS:
                vector[CONCEPTS[word]] += 1.0
        vector[7] = 0.5 if query else 0.0
        vector[6] = 0.01  # never all zero
        return vector

    def _get_query_embedding(self, query: str) -> Embedding:
        self.query_calls += 1
        return self._vector(query, True)

    def _get_text_embedding(self, text: str) -> Embedding:
        return self._vector(text, False)

    async def _aget_query_embedding(self, query: str) -> Embedding:
        return self._get_query_embedding(query)


def contents(docs: list[Document]) -> list[str]:
    return sorted(d.page_content for d in docs)


def save_all(memory: MemoryBase) -> None:
    for text in TURNS:
        memory.save([Turn("user", text)], ANA)


def dense_top(memory: MemoryBase, query: str) -> str:
    return memory.recall(query, ANA, k=1).records[0].record.text


def test_llamaindex_embedder_uses_query_embedding_and_its_own_name() -> None:
    model = KeywordEmbedding()
    embedder = LlamaIndexEmbedder(model)
    assert embedder.name == "llamaindex:KeywordEmbedding"  # model_name left "unknown"
    assert LlamaIndexEmbedder(model, name="keywords-v1").name == "keywords-v1"
    query = embedder.embed_query("which pet")
    document = embedder.embed_documents(["which pet"])[0]
    assert model.query_calls == 1
    assert query[7] > 0 and document[7] == 0
    assert np.isclose(np.linalg.norm(query), 1.0)


def test_langchain_embeddings_then_llamaindex_embedding_change_check_and_reindex(
    tmp_path: Path,
) -> None:
    path = tmp_path / "memory"
    fake = LangChainEmbedder(DeterministicFakeEmbedding(size=8), name="fake-8")
    with HistoryMemory(path=path, embedder=fake, pipeline=DENSE) as memory:
        save_all(memory)
        # The memory runs inside a LangChain chain through the retriever.
        chain: Runnable[str, list[str]] = MemoryRetriever(
            memory=memory, user_id="ana", k=3
        ) | RunnableLambda(contents)
        assert chain.invoke("anything") == sorted(f"user: {t}" for t in TURNS)

    keywords = LlamaIndexEmbedder(KeywordEmbedding(), name="keywords-8")
    # Same dimension, another model: the name alone tells them apart.
    with pytest.raises(EmbedderMismatchError, match="fake-8"):
        HistoryMemory(path=path, embedder=keywords)
    with HistoryMemory(
        path=path, embedder=keywords, pipeline=DENSE, allow_embedder_change=True
    ) as changed:
        # Every record was re-embedded: dense recall now follows the keyword concepts.
        assert "kitten" in dense_top(changed, "my feline")
        assert "motorbikes" in dense_top(changed, "a vehicle")
        assert "tea" in dense_top(changed, "a hot beverage")
        assert [t.content for t in changed.turns(ANA)] == TURNS
    # The store now belongs to the new embedder; the old one is the stranger.
    with HistoryMemory(path=path, embedder=keywords, pipeline=DENSE) as reopened:
        assert "kitten" in dense_top(reopened, "pet")
    with pytest.raises(EmbedderMismatchError, match="keywords-8"):
        HistoryMemory(path=path, embedder=fake)


def test_engine_reindex_after_a_dimension_change(tmp_path: Path) -> None:
    path = tmp_path / "memory"
    with HistoryMemory(path=path, embedder=HashingEmbedder(dimension=64)) as memory:
        save_all(memory)
    keywords = LlamaIndexEmbedder(KeywordEmbedding())
    with pytest.raises(EmbedderMismatchError, match="dimension 64"):
        MemoryEngine(path=path, embedder=keywords)
    engine = MemoryEngine(path=path, embedder=keywords, allow_embedder_change=True)
    try:
        # reindex() can also be called explicitly, e.g. after a model upgrade in place.
        assert engine.reindex(progress=False) == len(TURNS)
        memory = HistoryMemory(engine=engine, pipeline=DENSE)
        assert "motorbikes" in dense_top(memory, "bike")
    finally:
        engine.close()


@pytest.mark.slow
def test_sentence_transformers_model_from_a_local_path(tmp_path: Path) -> None:
    from memories_core.embedders import SentenceTransformerEmbedder
    from memories_core.embedders.sentence_transformer import default_model_path

    # Any sentence-transformers model folder works; a copy of the bundled MiniLM under
    # another name stands in for "the user's model".
    folder = tmp_path / "my-minilm"
    shutil.copytree(default_model_path(), folder)
    path = tmp_path / "memory"
    with HistoryMemory(path=path, embedder=HashingEmbedder(dimension=384)) as memory:
        save_all(memory)
    mine = SentenceTransformerEmbedder(str(folder))
    assert mine.name == "sentence-transformers:my-minilm"
    with pytest.raises(EmbedderMismatchError, match="my-minilm"):
        HistoryMemory(path=path, embedder=mine)
    with HistoryMemory(
        path=path, embedder=mine, pipeline=DENSE, allow_embedder_change=True
    ) as changed:
        assert "kitten" in dense_top(changed, "What pet do I have?")
        assert "motorbikes" in dense_top(changed, "Who fixes vehicles in my family?")
