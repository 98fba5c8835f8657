"""The bundled late-interaction encoder's projection onto the shipped principal basis."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import memories_core.retrieval.late_encoder as late_encoder
from memories_core.errors import ConfigurationError
from memories_core.retrieval.late_encoder import (
    BUNDLED_COLBERT_NAME,
    BUNDLED_HIDDEN_DIM,
    DEFAULT_LATE_DIM,
    OnnxLateInteractionEncoder,
    bundled_basis,
)
from reranker_scenarios import needs_bundled


@pytest.fixture
def fresh_basis() -> Iterator[None]:
    """Forget the process's checked basis before and after (the test swaps the file)."""
    bundled_basis.cache_clear()
    yield
    bundled_basis.cache_clear()


def test_the_shipped_basis_is_an_orthonormal_read_only_matrix(fresh_basis: None) -> None:
    basis = bundled_basis()
    assert basis.shape == (BUNDLED_HIDDEN_DIM, BUNDLED_HIDDEN_DIM)
    assert basis.dtype == np.float32
    assert np.allclose(basis.T @ basis, np.eye(BUNDLED_HIDDEN_DIM), atol=1e-3)
    with pytest.raises(ValueError):
        basis[0, 0] = 1.0
    assert bundled_basis() is basis  # read and checked once per process


@pytest.mark.parametrize(
    "content",
    [
        b"not an npy file",
        "pickled object array",
        np.zeros((BUNDLED_HIDDEN_DIM, 96), dtype=np.float32),
        np.ones((BUNDLED_HIDDEN_DIM, BUNDLED_HIDDEN_DIM), dtype=np.float32),
        np.eye(BUNDLED_HIDDEN_DIM, dtype=np.float64),
    ],
    ids=["garbage", "pickle", "too-narrow", "not-orthonormal", "float64"],
)
def test_a_missing_or_damaged_basis_is_a_typed_error_and_nothing_is_unpickled(
    content: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_basis: None
) -> None:
    path = tmp_path / "basis.npy"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, np.ndarray):
        np.save(path, content)
    else:  # an object array can only be read back by unpickling it
        np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    monkeypatch.setattr(late_encoder, "_BASIS_FILE", path)
    with pytest.raises(ConfigurationError, match="basis"):
        bundled_basis()
    monkeypatch.setattr(late_encoder, "_BASIS_FILE", tmp_path / "missing.npy")
    bundled_basis.cache_clear()
    with pytest.raises(ConfigurationError, match="reinstall"):
        bundled_basis()


def test_width_settings_are_checked_and_name_the_vectors(tmp_path: Path) -> None:
    assert OnnxLateInteractionEncoder().dim == DEFAULT_LATE_DIM
    assert f"principal directions={DEFAULT_LATE_DIM}" in OnnxLateInteractionEncoder().name
    # The full width is the hidden states unprojected, under the name their stored rows had.
    full = OnnxLateInteractionEncoder(dim=BUNDLED_HIDDEN_DIM)
    assert full.name == f"{BUNDLED_COLBERT_NAME} markers=False augment=False lengths=32/128"
    assert OnnxLateInteractionEncoder(dim=64).name != OnnxLateInteractionEncoder(dim=96).name
    # Another model has no basis: its hidden states are used as they are.
    other = OnnxLateInteractionEncoder(model_dir=tmp_path)
    assert other.dim is None and "principal" not in other.name
    for bad in (0, 4, BUNDLED_HIDDEN_DIM + 1, True, 12.5, "128"):
        with pytest.raises(ConfigurationError, match="dim"):
            OnnxLateInteractionEncoder(dim=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="model_dir"):
        OnnxLateInteractionEncoder(model_dir=tmp_path, dim=64)


@pytest.mark.slow
@needs_bundled
def test_bundled_vectors_are_the_unit_hidden_states_projected_and_normalised_again() -> None:
    narrow = OnnxLateInteractionEncoder()
    full = OnnxLateInteractionEncoder(dim=BUNDLED_HIDDEN_DIM)
    text = "Ana: I adopted a grey cat and named her Pixel"
    rows = narrow.encode_document(text)
    hidden = full.encode_document(text)
    assert rows.shape == (hidden.shape[0], DEFAULT_LATE_DIM)
    assert hidden.shape[1] == BUNDLED_HIDDEN_DIM
    projected = hidden @ bundled_basis()[:, :DEFAULT_LATE_DIM]
    expected = projected / np.linalg.norm(projected, axis=1, keepdims=True)
    assert np.allclose(rows, expected, atol=1e-5)
    query = narrow.encode_query("What is the name of Ana's cat?")
    assert query.shape[1] == DEFAULT_LATE_DIM
    assert np.allclose(np.linalg.norm(query, axis=1), 1.0, atol=1e-4)


def test_a_missing_basis_is_found_before_a_default_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_basis: None
) -> None:
    from memories_core.retrieval.late_interaction import (
        late_interaction_installed,
        late_interaction_reranker,
    )

    installed = late_interaction_installed()
    monkeypatch.setattr(late_encoder, "_BASIS_FILE", tmp_path / "missing.npy")
    # A broken install is not "installed": the default pipeline keeps the first stage ...
    assert late_interaction_installed() is False
    if installed:  # ... and an explicit build says why, before any recall
        with pytest.raises(ConfigurationError, match="basis"):
            late_interaction_reranker()
