"""What the package's LangChain chat models share: tracing parameters and one-chunk streams.

Each of them (``CoreChatModel``, ``PersonalizedChatModel``, ``ConditionalMemoryChat``) writes
a whole reply per call, so a stream is that reply as one ``AIMessageChunk``; and each names
its model the same way for LangSmith and for LangChain's usage callback.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LangSmithParams
from langchain_core.messages import AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult

__all__ = ["PROVIDER", "WholeReplyChatModel", "ls_params", "model_name_of", "one_chunk"]

#: The provider every chat model of the package reports.
PROVIDER = "llm-memories"


def model_name_of(llm: object) -> str:
    """A core model's name (its ``name``), else its class name."""
    name = getattr(llm, "name", None)
    return name if isinstance(name, str) else type(llm).__name__


def ls_params(
    model_name: str,
    kwargs: dict[str, Any],
    *,
    stop: Sequence[str] | None = None,
    temperature: float | None = None,
    max_tokens: int | None = None,
) -> LangSmithParams:
    """LangSmith's parameters of one call: the fields' values, overridden by the call's own.

    A ``model`` keyword of the call names the model instead of ``model_name`` (LangChain's
    convention for a model chosen per call).
    """
    model = kwargs.get("model")
    params = LangSmithParams(
        ls_provider=PROVIDER,
        ls_model_name=model if isinstance(model, str) else model_name,
        ls_model_type="chat",
    )
    chosen_temperature = kwargs.get("temperature", temperature)
    if chosen_temperature is not None:
        params["ls_temperature"] = chosen_temperature
    chosen_max = kwargs.get("max_tokens", max_tokens)
    if chosen_max is not None:
        params["ls_max_tokens"] = chosen_max
    if stop:
        params["ls_stop"] = list(stop)
    return params


def one_chunk(result: ChatResult) -> ChatGenerationChunk:
    """The reply of ``result`` as the last (and only) chunk of a stream, with its metadata."""
    message = result.generations[0].message
    chunk = AIMessageChunk(
        content=message.content,
        response_metadata=dict(message.response_metadata),
        usage_metadata=getattr(message, "usage_metadata", None),
        chunk_position="last",
    )
    return ChatGenerationChunk(message=chunk)


class WholeReplyChatModel(BaseChatModel):
    """A chat model whose stream is its whole reply, as one chunk (see :func:`one_chunk`)."""

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        chunk = one_chunk(self._generate(messages, stop, run_manager, **kwargs))
        if run_manager is not None:
            run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        yield chunk
