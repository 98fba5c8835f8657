"""Loading ``benchmarks/<name>.py`` scripts in tests (they are not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_script(name: str) -> Any:
    """``benchmarks/<name>.py`` as a fresh module, registered under ``name``.

    Registering lets the script's dataclasses resolve their annotations through
    ``sys.modules``, and lets a later script's ``import <name>`` get this module (a test that
    patched it first is the one that script sees). The folder goes on ``sys.path`` because
    the scripts import their siblings.
    """
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
