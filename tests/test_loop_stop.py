"""A local model's reply that falls into a cycle ends after the cycle's second writing."""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from typing import Any

import pytest

from memories_core.llms import LocalLLM
from memories_core.llms.transformers_runtime import LOOP_REPEATS, MIN_LOOP_PERIOD, loop_end
from memories_core.types import ChatMessage

NOTE = list(range(100, 118))  # one 18-token note, written out
OTHER = list(range(200, 215))


def test_a_note_written_three_times_in_a_row_ends_after_its_second_writing() -> None:
    start = [1, 2, 3, 4, 5]
    tokens = start + OTHER + NOTE * LOOP_REPEATS
    assert loop_end(tokens) == len(start + OTHER + NOTE * 2)
    # Checked at every token: two writings are not yet a cycle.
    assert all(loop_end(tokens[:n]) is None for n in range(len(tokens)))


def test_a_cycle_of_several_notes_is_found() -> None:
    cycle = NOTE + OTHER + [7, 8, 9]
    tokens = [1, 2] + cycle * LOOP_REPEATS
    assert loop_end(tokens) == 2 + 2 * len(cycle)


def test_each_item_of_a_cycle_found_mid_item_is_kept_whole() -> None:
    # Items are ``<``-opened and ``>``-closed; the cycle of two items is found mid-item.
    first, second = [0, *range(10, 24), 1], [0, *range(30, 40), 1]
    tokens = [0, 5, 6, 1] + (first + second) * 4
    end = next(n for n in range(len(tokens) + 1) if loop_end(tokens[:n]) is not None)
    kept = tokens[: loop_end(tokens[:end])]
    for item in (first, second):
        assert any(kept[i : i + len(item)] == item for i in range(len(kept)))


def test_items_that_only_share_their_structure_are_not_a_cycle() -> None:
    # Same keys and punctuation, a different value in each item.
    items = [[10, 11, 12, 13, 14, 15, value, 16, 17, 18, 19, 20, 21, 22] for value in range(8)]
    tokens = [tok for item in items for tok in item]
    assert all(loop_end(tokens[:n]) is None for n in range(len(tokens) + 1))


@pytest.mark.parametrize("label", [[5], [5, 6], [5, 6, 7], [5, 6, 7, 8, 9]])
def test_a_run_of_short_labels_is_never_stopped(label: list[int]) -> None:
    # ``"fact", "fact", ...``: a short span repeated on purpose, however long the run.
    tokens = [1, 2, 3] + label * 200
    assert all(loop_end(tokens[:n]) is None for n in range(len(tokens) + 1))


def test_a_span_shorter_than_the_minimum_period_is_not_a_cycle() -> None:
    span = list(range(300, 300 + MIN_LOOP_PERIOD - 1))
    tokens = span * LOOP_REPEATS
    assert loop_end(tokens) is None
    longer = list(range(300, 300 + MIN_LOOP_PERIOD))
    assert loop_end(longer * LOOP_REPEATS) == 2 * MIN_LOOP_PERIOD


class LoopingLlama:
    """Stands in for ``llama_cpp.Llama``: decodes a fixed reply token by token, checking its
    stopping criteria after each sampled token with the tokens evaluated so far, as
    llama-cpp-python does; a token ``t`` reads ``"<t>"``."""

    PROMPT = tuple(range(1, 40))

    def __init__(self, reply: list[int], **kwargs: Any) -> None:
        self.reply = reply
        self.decoded = 0

    def detokenize(self, tokens: list[int]) -> bytes:
        return "".join(f"<{t}>" for t in tokens).encode()

    def create_chat_completion(self, **request: Any) -> dict[str, Any]:
        criteria = request.get("stopping_criteria") or []
        evaluated = list(self.PROMPT)
        for token in self.reply[: request["max_tokens"]]:
            if any(criterion(evaluated, None) for criterion in criteria):
                break
            evaluated.append(token)
        self.decoded = len(evaluated) - len(self.PROMPT)
        text = self.detokenize(evaluated[len(self.PROMPT) :]).decode()
        usage = {"prompt_tokens": len(self.PROMPT), "completion_tokens": self.decoded}
        return {"choices": [{"message": {"content": text}}], "usage": usage}


def llama_with(monkeypatch: pytest.MonkeyPatch, reply: list[int], **options: Any) -> Any:
    fake = types.ModuleType("llama_cpp")
    models: list[LoopingLlama] = []

    def load(**kwargs: Any) -> LoopingLlama:
        models.append(LoopingLlama(reply, **kwargs))
        return models[-1]

    fake.Llama = load  # type: ignore[attr-defined]
    fake.StoppingCriteriaList = list  # type: ignore[attr-defined]
    fake.__spec__ = importlib.machinery.ModuleSpec("llama_cpp", None)
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    return LocalLLM(backend="llama_cpp", **options), models


def test_the_llama_cpp_runtime_ends_a_looping_reply_after_its_second_writing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reply = OTHER + NOTE * 20
    llm, models = llama_with(monkeypatch, reply)
    text = llm.generate([ChatMessage("user", "notes please")], max_tokens=400)
    kept = OTHER + NOTE * 2
    assert text == "".join(f"<{t}>" for t in kept)
    assert models[0].decoded == len(OTHER + NOTE * LOOP_REPEATS)  # not the 400-token cap
    assert llm.usage.capped == 1


def test_the_llama_cpp_runtime_keeps_a_reply_that_does_not_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    labels = [1, 2, 3] + [5, 6] * 100  # a run of short labels is not a cycle
    for reply, options in [(labels, {}), (OTHER + NOTE * 20, {"stop_loops": False})]:
        llm, models = llama_with(monkeypatch, reply, **options)
        text = llm.generate([ChatMessage("user", "types please")], max_tokens=400)
        assert text == "".join(f"<{t}>" for t in reply)
        assert models[0].decoded == len(reply)
        assert llm.usage.capped == 0


# ------------------------------------------------------ loops inside a schema-bounded string
BOUNDED: dict[str, Any] = {
    "type": "object",
    "properties": {
        "topics": {
            "type": "array",
            "items": {"$ref": "#/$defs/Topic"},
        }
    },
    "$defs": {
        "Topic": {
            "type": "object",
            "properties": {
                "topic": {"type": "string", "maxLength": 120},
                "summary": {"type": "string", "maxLength": 600},
                "kind": {"type": "string", "enum": ["a", "b"]},
                "start": {"type": "integer"},
            },
        }
    },
}


def test_strings_bounded_needs_a_max_length_on_every_string() -> None:
    from memories_core.llms.loops import strings_bounded

    assert strings_bounded(BOUNDED)
    notes = {"type": "array", "items": {"type": "string"}}
    unbounded = {"type": "object", "properties": {"notes": notes}}
    assert not strings_bounded(unbounded)
    assert not strings_bounded({"type": ["string", "null"]})
    assert not strings_bounded(None) and not strings_bounded({})


def test_inside_json_string_follows_quotes_and_escapes() -> None:
    from memories_core.llms.loops import inside_json_string

    assert inside_json_string('{"topics": [{"summary": "Both mention')
    assert not inside_json_string('{"topics": [{"summary": "done", "start": 1')
    assert inside_json_string('{"s": "she said \\"hi')  # an escaped quote does not close it
    assert not inside_json_string('{"s": "a backslash \\\\"')  # an escaped backslash does


# Token ids read as text: 1 is a quote, the others a word each.
WORDS = {1: '"', 2: "{", 3: "}", 4: ":", 5: ","}


def _text(ids: list[int]) -> str:
    return "".join(WORDS.get(t, f" w{t}") for t in ids)


def _criterion_stops(reply: list[int], decode: Any) -> bool:
    import torch

    from memories_core.llms.transformers_runtime import _LoopStop

    prompt = [9, 9, 9]
    loops = _LoopStop(len(prompt), decode)
    for n in range(1, len(reply) + 1):
        if bool(loops.criterion(torch.tensor([prompt + reply[:n]]), None)[0]):
            return True
    return False


def test_a_cycle_inside_a_bounded_json_string_is_left_to_the_schema() -> None:
    sentence = list(range(300, 314))  # a 14-word sentence with no quote in it
    in_string = [2, 1, 50, 1, 4, 1, *sentence * 4, 1, 5, 1, 51, 1, 4, 60, 3]
    items = [2, *([1, *range(400, 412), 1, 5] * 4), 3]  # whole items, outside any string
    # Without a decoder (no schema, or one with unbounded strings) both are cut.
    assert _criterion_stops(in_string, None) and _criterion_stops(items, None)
    # With a schema that bounds its strings, only the cycle of whole items is.
    assert not _criterion_stops(in_string, _text)
    assert _criterion_stops(items, _text)


def test_the_llama_cpp_runtime_leaves_a_bounded_string_to_the_schema(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from memories_core.llms.base import JsonSchema

    sentence = list(range(300, 314))
    reply = [2, 1, 50, 1, 4, 1, *sentence * 4, 1, 5, 1, 51, 1, 4, 60, 3]
    monkeypatch.setattr(LoopingLlama, "detokenize", lambda self, ids: _text(ids).encode())
    unbounded: dict[str, Any] = {"type": "object", "properties": {"s": {"type": "string"}}}
    cases: list[tuple[dict[str, Any], int]] = [(BOUNDED, 0), (unbounded, 1)]
    for schema, capped in cases:
        llm, models = llama_with(monkeypatch, reply)
        llm.generate([ChatMessage("user", "memo please")], response_format=JsonSchema("m", schema))
        assert llm.usage.capped == capped
        assert models[0].decoded == (len(reply) if capped == 0 else len(reply[:6] + sentence * 3))


def _library_specs() -> dict[str, Any]:
    """Every prompt spec the package's prompt modules define, by name."""
    import importlib
    import pkgutil

    import memories_core.prompts as prompts
    from memories_core.prompts.spec import PromptSpec

    found: dict[str, Any] = {}
    for info in pkgutil.walk_packages(prompts.__path__, prefix="memories_core.prompts."):
        for value in vars(importlib.import_module(info.name)).values():
            if isinstance(value, PromptSpec):
                found[value.name] = value
    return found


#: The JSON prompts that leave a string without ``maxLength``, so that the loop stop may end
#: their replies anywhere, and why. A new JSON prompt bounds its strings or is listed here.
UNBOUNDED_ON_PURPOSE = {
    # Measured (BENCHMARKS.md, "Loop stop and JSON strings"): with every string bounded, a
    # looping reply ran to the 800-token cap instead of being stopped at 151 tokens, for
    # the same memories; the parser keeps a cut reply's whole memories.
    "emg.extract",
    # One short value that must be found in the memories: a runaway value fails either way.
    "emg.autofill",
    # Not measured: left as it was when the rule was written.
    "reflection.json",
}


def test_the_json_prompts_that_leave_a_string_unbounded_are_the_listed_ones() -> None:
    from memories_core.llms.loops import strings_bounded

    specs = _library_specs()
    schemas = {name: spec.json_schema() for name, spec in specs.items() if spec.response_model}
    # the walk finds the JSON prompts (memo writing is the one the rule was made for)
    assert UNBOUNDED_ON_PURPOSE | {"memochat.writing", "dpem.notes.json"} <= set(schemas)
    unbounded = {name for name, schema in schemas.items() if not strings_bounded(schema)}
    assert unbounded == UNBOUNDED_ON_PURPOSE


def test_a_schema_only_length_limit_is_in_the_schema_and_not_in_parsing() -> None:
    from typing import Annotated

    import pydantic

    from memories_core.llms.loops import strings_bounded
    from memories_core.prompts.spec import schema_max_length, schema_of

    class Answer(pydantic.BaseModel):
        note: Annotated[str, schema_max_length(10)]
        notes: list[Annotated[str, schema_max_length(5)]]

    schema = schema_of(Answer)
    assert schema["properties"]["note"]["maxLength"] == 10
    assert schema["properties"]["notes"]["items"]["maxLength"] == 5
    assert strings_bounded(schema)
    read = Answer.model_validate_json(json.dumps({"note": "x" * 50, "notes": ["2024-01-01"]}))
    assert read.note == "x" * 50 and read.notes == ["2024-01-01"]
