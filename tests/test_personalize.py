"""MaLP personalization: LoRA training on one user's turns, adapters per user, serving.

A tiny randomly initialised LLaMA-style model and a BPE tokenizer trained on the test texts
stand in for SmolLM2, so a training run takes seconds. The one test that loads SmolLM2 is
marked slow.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from memories_core import DualProcessMemory, MemoryEngine, Scope, Turn, personalize
from memories_core.embedders import HashingEmbedder
from memories_core.errors import ConfigurationError, MissingExtraError
from memories_core.llms import ScriptedLLM
from memories_core.personalize import (
    ADAPTER_ARTIFACT,
    CHECKPOINT_ARTIFACT,
    LoRAConfig,
    NotEnoughDataError,
    PersonalizedLLM,
    Personalizer,
)
from memories_core.portable import export_user, import_user
from memories_core.prompts.dpem import dpem_reply
from memories_core.types import ChatMessage

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None, reason="extra 'personalize' not installed"
)

T0 = datetime(2024, 5, 1, 9, 0, tzinfo=timezone.utc)

ANN = [
    ("I have type 2 diabetes and I like short answers.", "Noted. Keep sugar steady."),
    ("My feet feel numb in the evening.", "Check your feet daily. Keep sugar steady."),
    ("Can I eat rice?", "Small portions. Keep sugar steady."),
    ("I feel tired after lunch.", "Walk after meals. Keep sugar steady."),
    ("My skin is dry.", "Moisturise daily. Keep sugar steady."),
    ("I forgot my pills today.", "Take the next dose on time. Keep sugar steady."),
]
BOB = [
    ("I twisted my ankle while running yesterday evening.", "Rest it, ice it, raise it."),
    ("Should I stretch before a long run?", "A gentle warm-up is wise, then stretch after."),
    ("My knee aches on stairs.", "Strengthen the thigh muscles and rest a little."),
]


def tiny_model() -> tuple[Any, Any]:
    """A 2-layer LLaMA with random weights and a BPE tokenizer fitted to the test texts."""
    return personalize.tiny_model([t for pair in ANN + BOB for t in pair])


@pytest.fixture(scope="module")
def tiny() -> tuple[Any, Any]:
    import torch

    # A model this small runs fastest on one thread (and the CI machine is shared).
    torch.set_num_threads(1)
    return tiny_model()


def exchanges(pairs: list[tuple[str, str]], start: datetime) -> list[list[Turn]]:
    return [
        [
            Turn("user", u, timestamp=start + timedelta(hours=i)),
            Turn("assistant", a, timestamp=start + timedelta(hours=i, seconds=5)),
        ]
        for i, (u, a) in enumerate(pairs)
    ]


def build(tmp_path: Path | None, tiny: tuple[Any, Any], **config: Any) -> Personalizer:
    # The engine serves each user's personalized model through its llm_for hook.
    served: list[Personalizer] = []
    engine = MemoryEngine(
        path=tmp_path,
        embedder=HashingEmbedder(dimension=64),
        llm_for=lambda scope: served[0].llm_for(scope) if served else None,
    )
    memory = DualProcessMemory(engine=engine, llm=ScriptedLLM(default=dpem_reply), theta=2)
    for turns in exchanges(ANN, T0):
        memory.save(turns, Scope("ann"))
    for turns in exchanges(BOB, T0):
        memory.save(turns, Scope("bob"))
    engine.flush()
    model, tokenizer = tiny
    options = {"learning_rate": 3e-3, "max_steps": 24, "checkpoint_every": 8, **config}
    served.append(
        Personalizer(memory, model=model, tokenizer=tokenizer, config=LoRAConfig(**options))
    )
    return served[0]


def test_examples_put_the_recalled_memory_before_each_assistant_turn(tiny: Any) -> None:
    personalizer = build(None, tiny)
    examples = personalizer.examples("ann")
    assert [e.target for e in examples] == [a for _, a in ANN]
    last = examples[-1]
    assert last.messages[-1] == ChatMessage("user", ANN[-1][0])
    assert "What you remember about this user" in last.messages[0].content
    assert "User-specific knowledge" in last.messages[0].content
    # History: the previous turns, at most history_turns of them, in order.
    assert [m.content for m in last.messages[1:-1]] == [
        ANN[3][0],
        ANN[3][1],
        ANN[4][0],
        ANN[4][1],
    ]
    # Another user's memory never enters ann's prompts.
    assert all("ankle" not in m.content for e in examples for m in e.messages)


def test_each_example_recalls_only_what_was_known_when_its_turn_was_said(tiny: Any) -> None:
    examples = build(None, tiny).examples("ann")
    assert "What you remember" not in examples[0].messages[0].content  # nothing known yet
    for n, example in enumerate(examples):
        system = example.messages[0].content
        # Neither this round's own lines (the reply trained on included) nor a later one's.
        assert not any(line in system for pair in ANN[n:] for line in pair)
        if n:
            assert f"The user said: {ANN[n - 1][0]}" in system  # the round before is known
    # Without the cut, recall reads the final memory: later rounds in the first prompt.
    personalizer = build(None, tiny)
    final = personalizer.prompt_messages("ann", [], ANN[0][0])[0].content
    assert any(user in final for user, _ in ANN[1:])


def test_recall_as_of_a_turn_widens_until_it_finds_k_known_records(
    tiny: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    personalizer = build(None, tiny, memory_k=1)
    memory = personalizer.memory
    assert memory is not None
    asked: list[int] = []
    recall = memory.recall

    def counting(query: str, scope: Scope, *, k: int | None = None, **kw: Any) -> Any:
        asked.append(int(k or 0))
        return recall(query, scope, k=k, **kw)

    monkeypatch.setattr(memory, "recall", counting)
    messages = personalizer.prompt_messages(
        "ann", [], "Can I eat rice?", known=lambda r: "pills" in r.text
    )
    assert "I forgot my pills today." in messages[0].content  # however low it ranked
    assert asked[0] == 1 and all(b == 2 * a for a, b in itertools.pairwise(asked))
    asked.clear()
    none = personalizer.prompt_messages("ann", [], "Can I eat rice?", known=lambda r: False)
    assert "What you remember" not in none[0].content
    assert len(asked) < 20  # stops once the memory has no more to give


def test_defaults_are_the_papers_except_the_measured_rate_and_steps() -> None:
    config = LoRAConfig()
    assert (config.rank, config.alpha, config.epochs) == (8, 32, 3)
    # Chosen by benchmarks/personalize_grid.py (leave-one-user-out), not the paper's 5e-5.
    assert (config.learning_rate, config.max_steps) == (3e-3, 60)
    assert (config.warmup_ratio, config.weight_decay) == (0.1, 1e-4)
    assert (config.max_input_tokens, config.max_output_tokens) == (1024, 2048)
    with pytest.raises(ConfigurationError):
        LoRAConfig(rank=0)
    with pytest.raises(ConfigurationError):
        LoRAConfig(warmup_ratio=1.5)


def test_training_lowers_loss_and_perplexity_on_own_turns(tmp_path: Path, tiny: Any) -> None:
    personalizer = build(tmp_path / "m", tiny)
    own = personalizer.examples("ann")
    other = personalizer.examples("bob")
    before_own = personalizer.perplexity(own)
    before_other = personalizer.perplexity(other)
    report = personalizer.train("ann", progress=False)
    assert report.steps == 24 and report.resumed_from == 0 and len(report.losses) == 24
    assert sum(report.losses[-6:]) < sum(report.losses[:6])
    assert report.adapter_bytes > 0 and report.trainable_parameters > 0
    after_own = personalizer.perplexity(own, adapter_of="ann")
    after_other = personalizer.perplexity(other, adapter_of="ann")
    assert after_own < before_own
    # The adapter learnt ann, not language in general: bob's turns gain less.
    assert before_own / after_own > before_other / after_other
    # One adapter for ann, stored in the engine's artifact store; none for bob.
    engine = personalizer.engine
    info = engine.artifacts.get("ann", ADAPTER_ARTIFACT)
    assert info is not None and info.meta["steps"] == 24
    assert (info.path / "adapter_config.json").is_file()
    assert engine.artifacts.get("ann", CHECKPOINT_ARTIFACT) is None
    assert personalizer.adapter("bob") is None
    assert personalizer.llm_for(Scope("bob")) is None
    assert isinstance(personalizer.llm_for(Scope("ann")), PersonalizedLLM)


def test_training_resumes_from_a_checkpoint(tmp_path: Path, tiny: Any) -> None:
    personalizer = build(tmp_path / "m", tiny)

    class Stop(Exception):
        pass

    def stop_at_ten(step: int, loss: float) -> None:
        if step == 10:
            raise Stop

    with pytest.raises(Stop):
        personalizer.train("ann", progress=False, on_step=stop_at_ten)
    checkpoint = personalizer.engine.artifacts.get("ann", CHECKPOINT_ARTIFACT)
    assert checkpoint is not None and checkpoint.meta["step"] == 8
    assert personalizer.adapter("ann") is None
    resumed = personalizer.train("ann", progress=False)
    assert resumed.resumed_from == 8 and len(resumed.losses) == 16
    fresh = build(tmp_path / "other", tiny).train("ann", progress=False)
    # Same seed and order: the resumed run ends where an uninterrupted run ends.
    assert resumed.losses[-1] == pytest.approx(fresh.losses[-1], rel=1e-4)
    # A checkpoint of other data (or config) is not resumed.
    personalizer.config = LoRAConfig(learning_rate=3e-3, max_steps=12, checkpoint_every=4)
    assert personalizer.train("ann", progress=False).resumed_from == 0


def test_too_little_data_is_a_typed_error(tiny: Any) -> None:
    memory = DualProcessMemory(
        llm=ScriptedLLM(default=dpem_reply), embedder=HashingEmbedder(dimension=64)
    )
    memory.save([Turn("user", "Hello there, doctor.")], Scope("new"))
    model, tokenizer = tiny
    personalizer = Personalizer(memory, model=model, tokenizer=tokenizer)
    with pytest.raises(NotEnoughDataError, match="at least 2"):
        personalizer.train("new", progress=False)
    with pytest.raises(ConfigurationError):
        Personalizer(memory, model=model)
    with pytest.raises(ConfigurationError):
        Personalizer(None)


def test_personalized_llm_uses_memory_and_the_users_adapter(tmp_path: Path, tiny: Any) -> None:
    personalizer = build(tmp_path / "m", tiny)
    llm = personalizer.llm("ann")
    before = llm.generate([ChatMessage("user", "I got red spots on my skin recently")])
    assert isinstance(before, str)
    assert llm.trace.adapter is False  # no adapter yet: the base model answers
    system = llm.last_prompt[0]
    memory = personalizer.memory
    assert isinstance(memory, DualProcessMemory)
    recalled = memory.prompt("I got red spots on my skin recently", Scope("ann"), k=4)
    assert recalled and recalled in system.content and system.role == "system"
    personalizer.train("ann", progress=False)
    llm.generate([ChatMessage("user", "I got red spots on my skin recently")], max_tokens=8)
    assert llm.trace.adapter is True
    # Bob has no adapter: his model runs the base weights even after ann's was loaded.
    bob = personalizer.llm("bob")
    bob.generate([ChatMessage("user", "My ankle hurts")], max_tokens=4)
    assert bob.trace.adapter is False
    assert "sugar" not in bob.last_prompt[0].content
    assert "ankle" not in system.content
    # Greedy decoding with the adapter differs from the base model on ann's own prompt.
    prompt = personalizer.examples("ann")[0].messages
    with_adapter = personalizer.generate("ann", prompt, max_new_tokens=6).text
    without = personalizer.generate(None, prompt, max_new_tokens=6).text
    assert with_adapter != without
    # Served through the engine's llm_for hook.
    engine = personalizer.engine
    assert engine.llm_for(Scope("ann")) is llm
    assert engine.llm_for(Scope("bob")) is None  # no adapter: the mechanism's own model


def test_adapter_is_exported_imported_and_deleted_with_the_user(tmp_path: Path, tiny: Any) -> None:
    personalizer = build(tmp_path / "m", tiny, max_steps=4)
    personalizer.train("ann", progress=False)
    engine = personalizer.engine
    archive = tmp_path / "ann.zip"
    export_user(engine, "ann", archive)
    info = personalizer.adapter("ann")
    assert info is not None
    folder = info.path
    engine.delete_user("ann")
    assert personalizer.adapter("ann") is None
    assert not folder.exists()
    assert personalizer.llm_for(Scope("ann")) is None
    with MemoryEngine(path=tmp_path / "fresh", embedder=HashingEmbedder(dimension=64)) as other:
        import_user(other, archive)
        restored = other.artifacts.get("ann", ADAPTER_ARTIFACT)
        assert restored is not None and restored.sha256 == info.sha256


def test_an_imported_checkpoint_is_never_resumed(tmp_path: Path, tiny: Any) -> None:
    personalizer = build(tmp_path / "m", tiny)

    class Stop(Exception):
        pass

    def stop_at_ten(step: int, loss: float) -> None:
        if step == 10:
            raise Stop

    with pytest.raises(Stop):
        personalizer.train("ann", progress=False, on_step=stop_at_ten)
    assert personalizer.engine.artifacts.get("ann", CHECKPOINT_ARTIFACT) is not None
    archive = export_user(personalizer.engine, "ann", tmp_path / "ann.zip")
    # The same memory in another store: the training data, hence the fingerprint, match.
    other = build(tmp_path / "other", tiny)
    other.engine.delete_user("ann")
    report = import_user(other.engine, archive)
    assert report.records > 0
    assert other.examples("ann") == personalizer.examples("ann")  # same fingerprint
    assert other.engine.artifacts.get("ann", CHECKPOINT_ARTIFACT) is None
    assert other.train("ann", progress=False).resumed_from == 0


def test_serving_loads_safetensors_weights_only(tmp_path: Path, tiny: Any) -> None:
    from memories_core.testing.hostile import pickle_payload

    personalizer = build(tmp_path / "m", tiny, max_steps=4)
    personalizer.train("ann", progress=False)
    info = personalizer.adapter("ann")
    assert info is not None
    marker = tmp_path / "unpickled.marker"
    config = (info.path / "adapter_config.json").read_bytes()
    engine = personalizer.engine
    # Pickled weights beside the safetensors ones are ignored ...
    engine.artifacts.put(
        "ann",
        ADAPTER_ARTIFACT,
        {
            "adapter_config.json": config,
            "adapter_model.safetensors": (info.path / "adapter_model.safetensors").read_bytes(),
            "adapter_model.bin": pickle_payload(marker),
        },
        meta=dict(info.meta),
    )
    personalizer.generate("ann", [ChatMessage("user", "hello")], max_new_tokens=2)
    # ... and pickled weights alone are refused, not loaded.
    engine.artifacts.put(
        "bob",
        ADAPTER_ARTIFACT,
        {"adapter_config.json": config, "adapter_model.bin": pickle_payload(marker)},
        meta=dict(info.meta),
    )
    with pytest.raises(ConfigurationError, match="safetensors"):
        personalizer.generate("bob", [ChatMessage("user", "hello")], max_new_tokens=2)
    assert not marker.exists()


def test_importing_personalize_stays_light() -> None:
    code = (
        "import sys, memories_core.personalize; "
        "print(sorted(m for m in ('torch', 'peft', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_smollm2_lora_step_runs(tmp_path: Path) -> None:
    """The default base model (SmolLM2-135M-Instruct, offline) trains and serves an adapter."""
    memory = DualProcessMemory(
        path=tmp_path / "m",
        llm=ScriptedLLM(default=dpem_reply),
        embedder=HashingEmbedder(dimension=64),
    )
    for turns in exchanges(ANN[:3], T0):
        memory.save(turns, Scope("ann"))
    personalizer = Personalizer(memory, config=LoRAConfig(max_steps=2, max_input_tokens=256))
    report = personalizer.train("ann", progress=False)
    assert report.steps == 2 and report.adapter_bytes > 0
    question = [ChatMessage("user", "Can I eat bread?")]
    reply = personalizer.llm("ann").generate(question, max_tokens=8)
    assert isinstance(reply, str)


def test_missing_extra_is_a_typed_error(monkeypatch: pytest.MonkeyPatch, tiny: Any) -> None:
    real = importlib.util.find_spec

    def without_peft(name: str, *args: Any) -> Any:
        return None if name == "peft" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_peft)
    with pytest.raises(MissingExtraError, match=r"llm-memories\[personalize\]"):
        personalize.require_personalize()
    personalizer = build(None, tiny)
    with pytest.raises(MissingExtraError):
        personalizer.train("ann", progress=False)


@pytest.mark.parametrize(
    ("cuda", "bf16", "mps", "device", "dtype"),
    [
        (True, True, True, "cuda", "bfloat16"),
        (True, False, False, "cuda", "float32"),
        (False, False, True, "mps", "float32"),
        (False, False, False, "cpu", "float32"),
    ],
)
def test_device_is_the_gpu_when_present_else_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
    tiny: Any,
    cuda: bool,
    bf16: bool,
    mps: bool,
    device: str,
    dtype: str,
) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert personalize.select_device() == device
    assert personalize.default_dtype(device) == getattr(torch, dtype)
    # An explicit device wins over what is present.
    assert personalize.select_device("cpu") == "cpu"
    model, tokenizer = tiny
    memory = DualProcessMemory(
        llm=ScriptedLLM(default=dpem_reply), embedder=HashingEmbedder(dimension=64)
    )
    assert Personalizer(memory, model=model, tokenizer=tokenizer).device == device
    assert Personalizer(memory, model=model, tokenizer=tokenizer, device="cpu").device == "cpu"
    with pytest.raises(ConfigurationError, match="unknown torch device"):
        personalize.select_device("gpu-please")


def test_training_and_serving_run_on_the_chosen_device_and_dtype(tiny: Any) -> None:
    import torch
    from safetensors.torch import load_file

    personalizer = build(None, tiny, max_steps=2)
    personalizer = Personalizer(
        personalizer.memory,
        model=tiny[0],
        tokenizer=tiny[1],
        config=personalizer.config,
        device="cpu",
        dtype=torch.float64,
    )
    report = personalizer.train("ann", progress=False)
    assert report.steps == 2 and all(math.isfinite(x) for x in report.losses)
    info = personalizer.adapter("ann")
    assert info is not None
    weights = load_file(str(info.path / "adapter_model.safetensors"))
    assert weights and {w.dtype for w in weights.values()} == {torch.float64}
    # The given model itself is never moved or cast.
    assert {p.dtype for p in tiny[0].parameters()} == {torch.float32}
    assert math.isfinite(personalizer.perplexity(personalizer.examples("ann"), adapter_of="ann"))


# Facts that recur (DPeM promotes an item to long-term memory at its second round, theta=2)
# with a different reply each round; long-term memory after each save: 0 0 1 2 2 2 3 4 4.
RECURRING = list(
    zip(
        [
            "I have type 2 diabetes.",
            "I take metformin every morning.",
            "I have type 2 diabetes.",
            "I take metformin every morning.",
            "I prefer short answers.",
            "My feet often feel numb.",
            "I prefer short answers.",
            "My feet often feel numb.",
            "Can I eat rice?",
        ],
        [
            "Noted.",
            "Check your sugar today.",
            "Walk after lunch.",
            "Drink water, not juice.",
            "Moisturise your skin.",
            "Eat whole fruit.",
            "Sleep eight hours.",
            "See the nurse monthly.",
            "A small portion.",
        ],
        strict=True,
    )
)


def interleaved(path: Path, tiny: Any, **options: Any) -> tuple[MemoryEngine, Personalizer]:
    engine = MemoryEngine(path=path, embedder=HashingEmbedder(dimension=64))
    memory = DualProcessMemory(engine=engine, llm=ScriptedLLM(default=dpem_reply), theta=2)
    model, tokenizer = tiny
    config = LoRAConfig(learning_rate=3e-3, max_steps=4, checkpoint_every=0)
    personalizer = Personalizer(
        memory, model=model, tokenizer=tokenizer, config=config, train_every=2, **options
    )
    return engine, personalizer


def test_training_is_interleaved_with_memory_generation_as_pending_work(
    tmp_path: Path, tiny: Any
) -> None:
    engine, personalizer = interleaved(tmp_path / "m", tiny)
    memory = personalizer.memory
    assert isinstance(memory, DualProcessMemory)
    rounds = exchanges(RECURRING, T0)

    def jobs() -> list[tuple[str, str, str]]:
        return [(j.user_id, j.kind, j.mechanism) for j in engine.pending(mechanism="malp")]

    for turns in rounds[:4]:
        memory.save(turns, Scope("ann"))
        assert jobs() == []
    assert len(memory.ltm("ann")) == 2
    # The next save sees two new long-term items: a training job is enqueued, not run.
    memory.save(rounds[4], Scope("ann"))
    assert jobs() == [("ann", "train", "malp")]
    memory.save(rounds[5], Scope("ann"))
    assert jobs() == [("ann", "train", "malp")]  # one pending training per user
    assert personalizer.adapter("ann") is None  # saves never block on training
    for turns in exchanges(BOB, T0):
        memory.save(turns, Scope("bob"))
    assert jobs() == [("ann", "train", "malp")]
    # The engine's pending work (a worker's explicit run) trains the adapter.
    assert engine.run_pending() == 0
    first = personalizer.adapter("ann")
    assert first is not None and first.meta["examples"] == 6
    assert personalizer.trained_at_ltm("ann") == 2
    assert personalizer.adapter("bob") is None and personalizer.trained_at_ltm("bob") == 0
    assert jobs() == []
    # One more long-term item is not enough; two more enqueue the next training.
    memory.save(rounds[6], Scope("ann"))
    memory.save(rounds[7], Scope("ann"))
    assert len(memory.ltm("ann")) == 4 and jobs() == []
    memory.save(rounds[8], Scope("ann"))
    assert jobs() == [("ann", "train", "malp")]
    assert personalizer.run_pending("ann") == 0
    second = personalizer.adapter("ann")
    assert second is not None and second.meta["examples"] == 9
    assert second.sha256 != first.sha256
    assert personalizer.trained_at_ltm("ann") == 4
    # The training state goes with the user.
    engine.delete_user("ann")
    assert personalizer.trained_at_ltm("ann") == 0 and personalizer.adapter("ann") is None


def test_interleaved_training_needs_a_long_term_memory(tmp_path: Path, tiny: Any) -> None:
    from memories_core import HistoryMemory

    model, tokenizer = tiny
    history = HistoryMemory(embedder=HashingEmbedder(dimension=64))
    with pytest.raises(ConfigurationError, match="long-term memory"):
        Personalizer(history, model=model, tokenizer=tokenizer, train_every=2)
    engine, personalizer = interleaved(tmp_path / "m", tiny)
    with pytest.raises(ConfigurationError, match="positive int"):
        Personalizer(personalizer.memory, model=model, tokenizer=tokenizer, train_every=0)
    # A second trainer on the same engine needs its own name.
    with pytest.raises(ConfigurationError, match="malp"):
        Personalizer(personalizer.memory, model=model, tokenizer=tokenizer, train_every=3)
    other = Personalizer(
        personalizer.memory, model=model, tokenizer=tokenizer, train_every=3, name="malp-2"
    )
    assert set(engine.mechanisms) >= {"malp", "malp-2"}
    assert other.trained_at_ltm("ann") == 0


@pytest.mark.slow
def test_smollm2_interleaved_training_job(tmp_path: Path) -> None:
    """The pending training job trains the default base model's adapter (SmolLM2, offline)."""
    engine = MemoryEngine(path=tmp_path / "m", embedder=HashingEmbedder(dimension=64))
    memory = DualProcessMemory(engine=engine, llm=ScriptedLLM(default=dpem_reply), theta=2)
    personalizer = Personalizer(
        memory, config=LoRAConfig(max_steps=2, max_input_tokens=128), train_every=1
    )
    for turns in exchanges(RECURRING[:4], T0):
        memory.save(turns, Scope("ann"))
    assert [j.kind for j in engine.pending(mechanism="malp")] == ["train"]
    assert engine.run_pending() == 0
    info = personalizer.adapter("ann")
    assert info is not None and info.meta["steps"] == 2
