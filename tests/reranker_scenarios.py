"""What the second-stage reranker tests share: a pipeline helper and one real-model scenario."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.retrieval import Pipeline

#: Four turns about cats, one of which names the cat; the question asks its name.
CAT_TURNS = (
    "What did you do on the weekend?",
    "I went to the cat cafe with my sister.",
    "My cat is called Pixel, she is two years old.",
    "Cat videos are the best thing on the internet.",
)
CAT_QUESTION = "What is the name of my cat?"


def with_reranker(reranker: Any) -> Pipeline:
    """The default pipeline with ``reranker`` after its own rerankers."""
    base = Pipeline()
    return replace(base, rerankers=(*base.rerankers, reranker))


def top_answer_to_the_cat_question(reranker: Any) -> str:
    """Save :data:`CAT_TURNS` in a hashing-embedder memory reranked by ``reranker`` and
    return the text of the best record for :data:`CAT_QUESTION` (of the top 2)."""
    memory = HistoryMemory(embedder=HashingEmbedder(), pipeline=with_reranker(reranker))
    scope = Scope("ana")
    for text in CAT_TURNS:
        memory.save([Turn("user", text)], scope)
    hits = memory.recall(CAT_QUESTION, scope, k=2).records
    memory.close()
    return hits[0].record.text
