"""Embedders: the template rules, the hashing embedder, and the bundled MiniLM model."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import numpy as np
import numpy.typing as npt
import pytest

import memories_core.embedders as embedders
from memories_core.embedders import BaseEmbedder, HashingEmbedder
from memories_core.embedders.hashing import stem
from memories_core.errors import ConfigurationError, InvalidInputError
from memories_core.interfaces import Embedder


def test_public_api_is_pinned() -> None:
    assert sorted(embedders.__all__) == [
        "BaseEmbedder",
        "HashingEmbedder",
        "OnnxEmbedder",
        "SentenceTransformerEmbedder",
    ]


def test_importing_package_does_not_import_torch() -> None:
    code = (
        "import sys, memories_core.embedders as e; e.HashingEmbedder().embed_query('x');"
        "print('sentence_transformers' in sys.modules or 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class Doubling(BaseEmbedder):
    """Minimal subclass: returns unnormalised vectors to check the template's work."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[str]] = []

    @property
    def name(self) -> str:
        return "doubling"

    @property
    def dimension(self) -> int:
        return 3

    def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
        self.seen.append(texts)
        return np.array([[len(t), 0.0, 0.0] for t in texts], dtype=np.float64)  # type: ignore[return-value]


def test_base_normalises_and_counts() -> None:
    emb = Doubling()
    out = emb.embed_documents(["abcd", "", "xy"])
    assert out.dtype == np.float32 and out.shape == (3, 3)
    assert np.allclose(out[0], [1, 0, 0])
    assert np.all(out[1] == 0)  # zero stays zero, no NaN
    usage = emb.usage
    assert (usage.calls, usage.items) == (1, 3)
    assert usage.prompt_tokens == 2  # "abcd" -> 1, "" -> 0, "xy" -> 1
    emb.reset_usage()
    assert emb.usage.calls == 0


def test_base_empty_batch_skips_model() -> None:
    emb = Doubling()
    out = emb.embed_documents([])
    assert out.shape == (0, 3) and out.dtype == np.float32
    assert emb.seen == [] and emb.usage.calls == 0


@pytest.mark.parametrize("bad", ["a string", [1, 2], ["ok", None], None, 5])
def test_base_rejects_bad_input(bad: object) -> None:
    with pytest.raises(InvalidInputError):
        Doubling().embed_documents(bad)  # type: ignore[arg-type]


def test_embed_query_shape_and_type_check() -> None:
    emb = Doubling()
    assert emb.embed_query("abc").shape == (3,)
    with pytest.raises(InvalidInputError):
        emb.embed_query(["abc"])  # type: ignore[arg-type]


def test_base_rejects_wrong_shape_from_subclass() -> None:
    class Broken(Doubling):
        def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
            return np.zeros((len(texts), 2), dtype=np.float32)

    emb = Broken()
    with pytest.raises(RuntimeError, match="shape"):
        emb.embed_documents(["a"])
    assert emb.usage.failures == 1


def test_base_counts_failures() -> None:
    class Failing(Doubling):
        def _embed(self, texts: list[str]) -> npt.NDArray[np.float32]:
            raise OSError("disk")

    emb = Failing()
    with pytest.raises(OSError):
        emb.embed_documents(["a"])
    assert emb.usage.failures == 1 and emb.usage.calls == 0


async def test_async_twins() -> None:
    emb = HashingEmbedder(64)
    docs = await emb.aembed_documents(["a b", "c d"])
    query = await emb.aembed_query("a b")
    assert docs.shape == (2, 64) and query.shape == (64,)
    assert np.allclose(docs[0], query)


def test_hashing_satisfies_protocol_and_name() -> None:
    emb = HashingEmbedder()
    assert isinstance(emb, Embedder)
    assert emb.name == "hashing-256" and emb.dimension == 256
    assert HashingEmbedder(64).name == "hashing-64"
    assert "hashing-256" in repr(emb)


@pytest.mark.parametrize("bad", [0, 4, -1, 2.5, True, "256"])
def test_hashing_rejects_bad_dimension(bad: object) -> None:
    with pytest.raises(ConfigurationError):
        HashingEmbedder(bad)  # type: ignore[arg-type]


def test_hashing_is_deterministic_across_processes() -> None:
    text = "I love spicy Thai food"
    code = (
        "from memories_core.embedders import HashingEmbedder;"
        f"print(HashingEmbedder(32).embed_query({text!r}).tolist())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    )
    other = np.array(json.loads(out.stdout), dtype=np.float32)
    assert np.array_equal(other, HashingEmbedder(32).embed_query(text))


def test_hashing_vectors_are_normalised_and_empty_is_zero() -> None:
    out = HashingEmbedder().embed_documents(["hello world", "", "!!!", "the"])
    norms = np.linalg.norm(out, axis=1)
    assert np.isclose(norms[0], 1.0) and np.isclose(norms[3], 1.0)
    assert norms[1] == 0 and norms[2] == 0


QUERY = "what food does the user like"
RELATED = "I love spicy Thai food"
UNRELATED = [
    "The train leaves at 9 from platform 4",
    "My sister moved to Berlin last year",
    "The meeting is scheduled for Tuesday morning",
    "He repaired the bicycle in the garage",
]


def test_hashing_similar_beats_unrelated() -> None:
    emb = HashingEmbedder()
    q = emb.embed_query(QUERY)
    docs = emb.embed_documents([RELATED, *UNRELATED])
    scores = docs @ q
    assert scores[0] > 0.2
    assert scores[0] > max(scores[1:]) + 0.15


def test_hashing_matches_inflections_and_typos() -> None:
    emb = HashingEmbedder()
    base = emb.embed_query("she loves running marathons")
    variants = emb.embed_documents(["she loved to run a marathon", "the weather is cold today"])
    scores = variants @ base
    assert scores[0] > scores[1] + 0.2
    typo = emb.embed_documents(["restaurant", "resturant", "platform"]) @ emb.embed_query(
        "restaurant"
    )
    assert typo[1] > typo[2] + 0.3


def test_stop_words_do_not_create_similarity() -> None:
    emb = HashingEmbedder()
    a, b = emb.embed_documents(["what is the name of the dog", "what is the colour of the car"])
    c, d = emb.embed_documents(["dog name Rex", "dog name"])
    assert float(a @ b) < float(c @ d)


@pytest.mark.parametrize(
    ("word", "expected"),
    [
        ("loves", "lov"),
        ("loved", "lov"),
        ("loving", "lov"),
        ("love", "lov"),
        ("running", "run"),
        ("cities", "city"),
        ("class", "class"),
        ("boxes", "box"),
        ("foods", "food"),
        ("cat", "cat"),
    ],
)
def test_stemmer(word: str, expected: str) -> None:
    assert stem(word) == expected


def test_hashing_is_fast_on_10k_texts() -> None:
    texts = [
        f"user {i} likes item number {i % 97} and colour {i % 13} very much" for i in range(10_000)
    ]
    emb = HashingEmbedder()
    start = time.perf_counter()
    out = emb.embed_documents(texts)
    elapsed = time.perf_counter() - start
    assert out.shape == (10_000, 256)
    assert elapsed < 3.0  # ~0.3 s on the 2-core CI box; generous for a loaded machine


def test_hashing_is_thread_safe() -> None:
    emb = HashingEmbedder(64)
    expected = emb.embed_documents([f"text {i} apple" for i in range(200)])
    results: list[npt.NDArray[np.float32]] = []

    def work() -> None:
        results.append(emb.embed_documents([f"text {i} apple" for i in range(200)]))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(r, expected) for r in results)
    assert emb.usage.calls == 5 and emb.usage.items == 1000


# -- sentence-transformers -------------------------------------------------------------------


def test_sentence_transformer_is_lazy() -> None:
    from memories_core.embedders import SentenceTransformerEmbedder

    emb = SentenceTransformerEmbedder()
    assert emb.dimension == 384
    assert emb.name == "sentence-transformers:all-MiniLM-L6-v2"
    assert not emb.loaded
    assert emb.embed_documents([]).shape == (0, 384)
    assert not emb.loaded


def test_sentence_transformer_bundled_path_is_the_default_model() -> None:
    from memories_core.embedders import SentenceTransformerEmbedder
    from memories_core.embedders.sentence_transformer import default_model_path

    emb = SentenceTransformerEmbedder(str(default_model_path()))
    assert emb.name == SentenceTransformerEmbedder().name
    assert emb.dimension == 384 and not emb.loaded
    assert SentenceTransformerEmbedder("some-org/some-model").name == (
        "sentence-transformers:some-org/some-model"
    )


@pytest.mark.parametrize("kwargs", [{"batch_size": 0}, {"max_chars": -1}, {"batch_size": True}])
def test_sentence_transformer_rejects_bad_options(kwargs: dict[str, int]) -> None:
    from memories_core.embedders import SentenceTransformerEmbedder

    with pytest.raises(ConfigurationError):
        SentenceTransformerEmbedder(**kwargs)


def test_sentence_transformer_missing_library(monkeypatch: pytest.MonkeyPatch) -> None:
    from memories_core.embedders import SentenceTransformerEmbedder
    from memories_core.errors import MissingExtraError

    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    emb = SentenceTransformerEmbedder()
    with pytest.raises(MissingExtraError, match="pip install sentence-transformers"):
        emb.embed_query("x")


@pytest.mark.slow
def test_sentence_transformer_bundled_model_ranks_food_first() -> None:
    from memories_core.embedders import SentenceTransformerEmbedder

    emb = SentenceTransformerEmbedder(max_chars=500)
    assert isinstance(emb, Embedder)
    docs = emb.embed_documents([RELATED, *UNRELATED, "word " * 5000])
    query = emb.embed_query(QUERY)
    assert emb.loaded
    assert docs.shape == (6, 384) and docs.dtype == np.float32
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-4)
    scores = docs[:5] @ query
    assert int(np.argmax(scores)) == 0
    assert emb.usage.calls == 2 and emb.usage.items == 7
