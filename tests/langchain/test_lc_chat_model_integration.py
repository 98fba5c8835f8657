"""LangChain's standard chat-model integration suite over CoreChatModel, offline.

The core model is a scripted fake that replies in plain text, and under a JSON schema with
the smallest object the schema admits (as constrained decoding would).
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_tests.integration_tests import ChatModelIntegrationTests

from langchain_memories import CoreChatModel
from memories_core.llms import LLMResult, ScriptedLLM
from memories_core.llms.base import JsonSchema, ResponseFormat
from memories_core.types import ChatMessage


def _instance(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    """The smallest value valid under ``schema`` (the subset pydantic emits)."""
    if "$ref" in schema:
        return _instance(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            return _instance(schema[key][0], defs)
    kind = schema.get("type", "object")
    if "enum" in schema:
        return schema["enum"][0]
    if kind == "object":
        props = schema.get("properties", {})
        return {name: _instance(props[name], defs) for name in schema.get("required", props)}
    if kind == "array":
        return []
    return {"string": "cats", "integer": 1, "number": 1.0, "boolean": True}.get(kind)


class SchemaFollowingLLM(ScriptedLLM):
    """Plain replies by script; structured replies are valid JSON under the schema."""

    def __init__(self) -> None:
        super().__init__(
            default="Hello! I am a scripted model.",
            structured_output=frozenset({"json_schema", "json_object"}),
        )

    def _generate_structured(
        self,
        messages: tuple[ChatMessage, ...],
        *,
        response_format: ResponseFormat,
        **options: Any,
    ) -> LLMResult:
        if isinstance(response_format, JsonSchema):
            schema = dict(response_format.schema)
            value = _instance(schema, schema.get("$defs", {}))
        else:
            value = {"setup": "cats", "punchline": "purr"}
        return LLMResult(json.dumps(value))


class TestCoreChatModelIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[BaseChatModel]:
        return CoreChatModel

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"llm": SchemaFollowingLLM()}

    @property
    def supports_json_mode(self) -> bool:
        return True
