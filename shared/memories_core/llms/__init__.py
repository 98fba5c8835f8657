"""Chat models behind the :class:`~memories_core.interfaces.LLM` protocol.

* :class:`ScriptedLLM`: a scripted fake for tests.
* :class:`OpenAIChatLLM`: any OpenAI-compatible server (OpenAI, Ollama, vLLM, llama.cpp).
* :class:`LocalLLM`: SmolLM2-135M-Instruct, offline (extra ``local``).

The last two are imported lazily, so importing this package never imports ``openai`` or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memories_core.llms.base import BaseLLM, LLMResult
from memories_core.llms.scripted import ScriptedLLM

if TYPE_CHECKING:
    from memories_core.llms.local import LocalLLM
    from memories_core.llms.openai_chat import OpenAIChatLLM

__all__ = ["BaseLLM", "LLMResult", "LocalLLM", "OpenAIChatLLM", "ScriptedLLM"]

_LAZY = {
    "OpenAIChatLLM": "memories_core.llms.openai_chat",
    "LocalLLM": "memories_core.llms.local",
}


def __getattr__(name: str) -> Any:
    # Lazy: these modules pull in heavy clients only when a user asks for them.
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module_name), name)
