"""Several independent prompts at once: their model calls grouped into batches.

A mechanism with several pending jobs whose calls do not depend on one another (DPeM's
notes for several rounds: each round's notes read only that round's dialogue) can send the
same step of every job together. :func:`run_spec_batch` runs one spec over many inputs;
:func:`drive_batch` runs any parse loops (:func:`~memories_core.parsing.parse_steps`) in
lock-step, so a reply that does not parse is repaired in the next round, beside the other
loops' next calls, with the same rules as :func:`~memories_core.prompts.spec.run_spec`.

Only a model that decodes several sequences per step gains time
(:attr:`~memories_core.llms.base.BaseLLM.batch_capacity`); any other model is called once per
request, in order, and gives the same answers as :func:`run_spec` would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from memories_core.errors import ParseError
from memories_core.parsing import LLMRequest, ParseSteps
from memories_core.prompts.spec import Layer, PromptSpec, spec_steps

if TYPE_CHECKING:
    from memories_core.interfaces import LLM

__all__ = ["batch_capacity", "by_model", "drive_batch", "run_spec_batch"]

In = TypeVar("In")
Out = TypeVar("Out")
T = TypeVar("T")


def batch_capacity(llm: object) -> int:
    """How many requests ``llm`` decodes in one pass (1 for a model that says nothing)."""
    size = getattr(llm, "batch_capacity", 1)
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 1 else 1


def by_model(items: Iterable[T], model_of: Callable[[T], LLM]) -> list[tuple[LLM, list[T]]]:
    """``items`` grouped by the model that serves them (in first-seen order), one batch each.

    An engine's ``llm_for`` hook may serve users with different models; a batch goes to one.
    """
    groups: dict[int, tuple[LLM, list[T]]] = {}
    for item in items:
        model = model_of(item)
        groups.setdefault(id(model), (model, []))[1].append(item)
    return list(groups.values())


def _send(llm: LLM, requests: list[LLMRequest]) -> list[str]:
    """The replies to ``requests`` (which share their options but the length cap), in order.

    A batch is decoded at the largest cap of its requests (``None``, the model's default,
    if one has none); a model without ``generate_batch`` answers each at its own cap.
    """
    batch = getattr(llm, "generate_batch", None)
    if batch is None or len(requests) == 1:
        return [llm.generate(r.messages, **r.kwargs()) for r in requests]
    options = requests[0].kwargs()
    caps = [r.max_tokens for r in requests]
    options["max_tokens"] = None if None in caps else max(c for c in caps if c is not None)
    results = batch([r.messages for r in requests], **options)
    return [str(result.text) for result in results]


def _shared_options(request: LLMRequest) -> dict[str, Any]:
    """The options a request must share with the others of its batch (all but its cap)."""
    options = request.kwargs()
    options.pop("max_tokens", None)
    return options


def drive_batch(llm: LLM, loops: Sequence[ParseSteps[T]]) -> list[T | ParseError]:
    """Run independent parse loops together; each loop's value, or its ``ParseError``.

    Each round takes the next request of every unfinished loop; requests with the same
    options (temperature, stop strings, response format) go to the model as one
    ``generate_batch``, at the largest length cap among them (a cap that follows from each
    input, :attr:`PromptSpec.limit`, would otherwise split a batch by input size). A loop
    that still does not parse after its repairs gets its ``ParseError`` in its place, and
    the others go on.

    Raises:
        LLMError: if a model call fails (the model is down: no loop is finished).
    """
    results: list[Any] = [None] * len(loops)
    waiting: dict[int, LLMRequest] = {}

    def advance(i: int, reply: str | None) -> None:
        try:
            waiting[i] = next(loops[i]) if reply is None else loops[i].send(reply)
        except StopIteration as done:
            results[i] = done.value
        except ParseError as exc:
            results[i] = exc

    for i in range(len(loops)):
        advance(i, None)
    while waiting:
        groups: list[tuple[dict[str, Any], list[int]]] = []
        for i, request in waiting.items():
            options = _shared_options(request)
            group = next((g for g in groups if g[0] == options), None)
            if group is None:
                groups.append((options, [i]))
            else:
                group[1].append(i)
        for _, members in groups:
            replies = _send(llm, [waiting.pop(i) for i in members])
            for i, reply in zip(members, replies, strict=True):
                advance(i, reply)
    return results


def run_spec_batch(
    llm: LLM,
    spec: PromptSpec[In, Out],
    inputs: Sequence[In],
    *,
    retries: int = 1,
    layer: Layer | None = None,
    max_tokens: int | None = None,
    temperature: float = 0.0,
) -> list[Out | ParseError]:
    """:func:`~memories_core.prompts.spec.run_spec` over several inputs, the calls batched.

    Returns:
        Per input, in order, the parsed output or the ``ParseError`` that ``run_spec`` would
        have raised for it.

    Raises:
        LLMError: if a model call fails.

    Example:
        >>> from memories_core.llms import ScriptedLLM
        >>> from memories_core.prompts.conditional import DECISION, DecisionInput
        >>> llm = ScriptedLLM(["<Decision>: yes", "<Decision>: no"])
        >>> run_spec_batch(llm, DECISION, [DecisionInput("I am vegan"), DecisionInput("hi")])
        [True, False]
    """
    loops = [
        spec_steps(
            llm,
            spec,
            item,
            retries=retries,
            layer=layer,
            max_tokens=max_tokens,
            temperature=temperature,
        )
        for item in inputs
    ]
    return drive_batch(llm, loops)
