"""Where llm-memories keeps files it derives on this machine (converted models, exports)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root() -> Path:
    """Root folder of llm-memories caches: ``$LLM_MEMORIES_CACHE`` or ``~/.cache/llm-memories``.

    Read at call time, so setting the variable after import works.
    """
    env = os.environ.get("LLM_MEMORIES_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llm-memories"
