"""Offline model registry: chunks joined, hash-checked and cached; the best model chosen."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest

from memories_core.cache import cache_root
from memories_core.errors import ConfigurationError, MissingExtraError
from memories_core.llms import LocalLLM, models
from memories_core.llms.models import MODELS, OfflineModel, default_model_name, model_gguf


def _fake_parts(root: Path, chunks: list[bytes]) -> tuple[str, ...]:
    names = []
    for index, chunk in enumerate(chunks, start=1):
        name = f"fake_model_part{index}_{root.name}"
        folder = root / name
        (folder / "data").mkdir(parents=True)
        (folder / "__init__.py").write_text("raise RuntimeError('never imported')\n")
        (folder / "data" / f"part{index:02d}.bin").write_bytes(chunk)
        names.append(name)
    return tuple(names)


@pytest.fixture
def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, bytes]:
    chunks = [b"GGUF" + b"a" * 1000, b"b" * 3000, b"c" * 10]
    whole = b"".join(chunks)
    packages = _fake_parts(tmp_path / "site", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("LLM_MEMORIES_CACHE", str(tmp_path / "cache"))
    model = OfflineModel(
        name="fake",
        title="Fake-Model",
        packages=packages,
        files=tuple(f"data/part{i:02d}.bin" for i in range(1, 4)),
        sha256=hashlib.sha256(whole).hexdigest(),
        context_tokens=1024,
        install="pip install fake",
    )
    monkeypatch.setitem(MODELS, "fake", model)
    return "fake", whole


def test_chunks_are_joined_verified_and_cached(fake_model: tuple[str, bytes]) -> None:
    name, whole = fake_model
    path = model_gguf(name)
    assert path.read_bytes() == whole
    assert path.parent.name == "gguf"
    mtime = path.stat().st_mtime_ns
    assert model_gguf(name) == path and path.stat().st_mtime_ns == mtime  # reused
    assert not any(m.startswith("fake_model_part") for m in sys.modules)  # never imported
    assert name in models.installed_models()


def test_a_tampered_chunk_is_refused_and_leaves_nothing(
    fake_model: tuple[str, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, _ = fake_model
    monkeypatch.setitem(
        MODELS, name, MODELS[name].__class__(**{**MODELS[name].__dict__, "sha256": "0" * 64})
    )
    with pytest.raises(ConfigurationError, match="SHA-256"):
        model_gguf(name)
    cache = cache_root() / "gguf"
    assert not any(cache.glob("*.gguf")) and not any(cache.glob(".*"))


def test_a_changed_chunk_invalidates_the_cached_copy(fake_model: tuple[str, bytes]) -> None:
    name, _ = fake_model
    path = model_gguf(name)
    first_part = models._parts(MODELS[name])[0]  # type: ignore[index]
    first_part.write_bytes(first_part.read_bytes() + b"x")  # new size: rebuilt, then refused
    with pytest.raises(ConfigurationError):
        model_gguf(name)
    assert path.exists()  # the old verified copy is not destroyed by a failed rebuild


def test_missing_and_unknown_models_are_typed_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="unknown model"):
        model_gguf("no-such-model")
    with pytest.raises(ConfigurationError, match="unknown model"):
        LocalLLM(model="no-such-model")
    with pytest.raises(ConfigurationError, match="not both"):
        LocalLLM(model="qwen2.5-1.5b", gguf_path=__file__)
    missing = OfflineModel("gone", "Gone", ("no_such_package_xyz",), ("*.gguf",), None, 8, "x")
    monkeypatch.setitem(MODELS, "gone", missing)
    with pytest.raises(MissingExtraError, match="not installed"):
        model_gguf("gone")


def test_the_best_installed_model_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(models.MODEL_ENV, raising=False)
    monkeypatch.setattr(models, "installed_models", lambda: ["smollm2-135m", "qwen2.5-1.5b"])
    assert default_model_name() == "qwen2.5-1.5b"
    monkeypatch.setattr(models, "installed_models", lambda: ["smollm2-135m"])
    assert default_model_name() == "smollm2-135m"
    monkeypatch.setattr(models, "installed_models", lambda: [])
    assert default_model_name() == "smollm2-135m"


def test_named_model_identity_without_loading(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = LocalLLM(model="qwen2.5-1.5b")
    assert llm.name == "local:Qwen2.5-Coder-1.5B-Instruct-Q4_K_M"
    assert not llm.loaded
    assert llm.context_tokens >= 8192


def test_the_environment_names_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(models, "installed_models", lambda: ["smollm2-135m", "qwen2.5-1.5b"])
    monkeypatch.setenv(models.MODEL_ENV, "smollm2-135m")
    assert default_model_name() == "smollm2-135m"
    monkeypatch.setenv(models.MODEL_ENV, "gpt-17")
    with pytest.raises(ConfigurationError, match="not a known model"):
        default_model_name()
