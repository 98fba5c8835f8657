"""The transformers runtime of :class:`~memories_core.llms.LocalLLM`: one call, or a batch.

Kept apart from the model's loading and configuration (:mod:`memories_core.llms.local`):
how a loaded model turns messages into a reply, with stop strings, a deadline, a reused
key/value cache for a shared prompt start, constrained JSON, and several conversations in
one ``generate`` (left padding).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from memories_core.llms import cancel
from memories_core.llms.base import LLMResult, ResponseFormat, truncate_at_stop
from memories_core.llms.loops import (
    LOOP_REPEATS,
    MAX_LOOP_PERIOD,
    MIN_LOOP_PERIOD,
    inside_json_string,
    loop_end,
    strings_bounded,
)
from memories_core.types import ChatMessage

__all__ = [
    "FRESH_PROMPT_TAIL",
    "LOOP_REPEATS",
    "MAX_LOOP_PERIOD",
    "MIN_LOOP_PERIOD",
    "MIN_REUSED_PREFIX",
    "Runtime",
    "loop_end",
    "run_batch",
    "run_one",
]


def _stop_criteria(tokenizer: Any, stops: list[str], prompt_length: int) -> Any:
    """A transformers stopping criterion that ends a sequence once a stop string appears.

    Each sequence of a batch is checked on its own tail (a finished one is padded by
    ``generate`` while the others go on).

    transformers' own ``stop_strings`` option pre-computes tables over the whole vocabulary
    (tens of seconds on a small CPU for each new set of strings); decoding the tail of the
    output at each step costs microseconds instead.
    """
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    # Every token decodes to at least one character (or none, for specials), so this many
    # trailing tokens always cover a stop string that has just been completed.
    tail = max(len(s) for s in stops) + 2

    class StopOnStrings(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            done = [
                any(
                    s in tokenizer.decode(row[prompt_length:][-tail:], skip_special_tokens=True)
                    for s in stops
                )
                for row in input_ids
            ]
            return torch.tensor(done, dtype=torch.bool)

    return StoppingCriteriaList([StopOnStrings()])


class _LoopStop:
    """A transformers stopping criterion that ends a row once :func:`loop_end` finds a cycle.

    ``ends`` maps a stopped row to the tokens of its reply to keep. With ``decode`` (a JSON
    reply), a cycle inside a string is left for the schema to close
    (:func:`~memories_core.llms.loops.inside_json_string`).
    """

    def __init__(
        self, prompt_length: int, decode: Callable[[list[int]], str] | None = None
    ) -> None:
        from transformers import StoppingCriteria

        self.ends: dict[int, int] = {}
        outer = self

        class StopLoops(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                import torch

                done = []
                for row, ids in enumerate(input_ids):
                    if row not in outer.ends:
                        reply = ids[prompt_length:].tolist()
                        end = loop_end(reply)
                        if end is not None and not (
                            decode is not None and inside_json_string(decode(reply))
                        ):
                            outer.ends[row] = end
                    done.append(row in outer.ends)
                return torch.tensor(done, dtype=torch.bool)

        self.criterion = StopLoops()


class _Deadline:
    """A transformers stopping criterion that ends generation at a monotonic ``deadline``.

    transformers' ``max_time`` stops silently and returns a cut answer; this one also records
    that it fired, so the call raises ``LLMTimeoutError`` instead of passing half an answer
    to a parser.
    """

    def __init__(self, deadline: float) -> None:
        from transformers import StoppingCriteria

        self.fired = False
        outer = self

        class StopAtDeadline(StoppingCriteria):
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                import torch

                if time.monotonic() >= deadline:
                    outer.fired = True
                return torch.full((input_ids.shape[0],), outer.fired, dtype=torch.bool)

        self.criterion = StopAtDeadline()


class _Interrupted(Exception):
    """Raised inside the model's forward pass once the calling scope is cancelled."""


@contextmanager
def _interruptible(model: Any) -> Iterator[None]:
    """Let a cancelled scope (:mod:`memories_core.llms.cancel`) stop ``model`` between layers.

    A stopping criterion runs only between decoded tokens, while reading a long prompt is
    one forward pass (seconds on a CPU, a minute for a batch of long prompts). A pre-hook on
    each decoder layer raises :class:`_Interrupted` once the scope's event is set, so a call
    ends within one layer's work. Outside a cancellable scope nothing is hooked.
    """
    event = cancel.current()
    if event is None:
        yield
        return

    def check(module: Any, args: Any) -> None:
        if event.is_set():
            raise _Interrupted

    handles = [layer.register_forward_pre_hook(check) for layer in _layers(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _layers(model: Any) -> list[Any]:
    """The decoder's layers (the model's longest ``ModuleList``), else the model itself."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    longest = max(lists, key=len, default=None)
    return list(longest) if longest else [model]


@dataclass
class Runtime:
    """A loaded model and the function that runs it."""

    backend: str
    model: Any
    tokenizer: Any = None
    # lm-format-enforcer's view of the vocabulary, built on the first constrained call.
    enforcer_data: Any = None
    context_tokens: int = 8192
    # The key/value cache of the last call's tokens, reused for a prompt that starts the same
    # way (a reader asked many questions over one long memory reads that memory once).
    cached_ids: list[int] | None = None
    cache: Any = None


def _cache_argument() -> str:
    """``generate``'s name for a key/value cache: ``cache`` from transformers 5 on."""
    try:
        from importlib.metadata import version

        return "cache" if int(version("transformers").split(".")[0]) >= 5 else "past_key_values"
    except Exception:  # pragma: no cover - metadata missing
        return "past_key_values"


_CACHE_ARGUMENT = _cache_argument()

#: Shortest shared prompt start worth reusing the cache for (tokens).
MIN_REUSED_PREFIX = 64

#: Prompt tokens always read afresh, not taken from the cache. Int8 decoding weights serve
#: passes of at most ``decode_int8.DECODE_ROWS`` (1) token per sequence, so a prompt whose
#: last token alone were left to read (the same prompt asked again: the cache holds it and
#: the last reply) would get its first written token from the int8 copy, not from the exact
#: float32 logits a fresh read gives: a repeated prompt could answer differently.
FRESH_PROMPT_TAIL = 2


def _shared_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _reusable_cache(runtime: Runtime, ids: list[int]) -> Any:
    """A copy of the cached keys/values for the start ``ids`` shares with the last call.

    Returns ``None`` when fewer than :data:`MIN_REUSED_PREFIX` tokens are shared. The last
    :data:`FRESH_PROMPT_TAIL` tokens of ``ids`` are always computed.
    """
    if runtime.cache is None or runtime.cached_ids is None:
        return None
    shared = min(_shared_prefix(runtime.cached_ids, ids), len(ids) - FRESH_PROMPT_TAIL)
    if shared < MIN_REUSED_PREFIX:
        return None
    return _cached_start(runtime, shared)


def _cached_start(runtime: Runtime, length: int) -> Any:
    """A copy of the last call's keys/values cut to its first ``length`` tokens, or ``None``."""
    import copy

    cache = copy.deepcopy(runtime.cache)
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)  # transformers 5: a negative count removes tokens from the end
    if cache.get_seq_length() != length:  # an unexpected cache API: do not reuse
        return None
    return cache


def _shared_start(prompts: list[list[int]]) -> int:
    """Tokens every prompt starts with, leaving each its last :data:`FRESH_PROMPT_TAIL`."""
    shared = min(len(ids) for ids in prompts) - FRESH_PROMPT_TAIL
    for ids in prompts[1:]:
        shared = min(shared, _shared_prefix(prompts[0], ids))
    return max(0, shared)


def _prefix_cache(runtime: Runtime, ids: list[int]) -> Any:
    """The keys/values of exactly ``ids`` (one row), kept as the runtime's cache.

    Taken from the last call's cache when it covers ``ids``, else computed now. ``None``
    when this transformers version's cache cannot be copied, cut or repeated per row.
    """
    import copy

    import torch

    cached = runtime.cached_ids
    if runtime.cache is not None and cached is not None and _shared_prefix(cached, ids) >= len(ids):
        cache = _cached_start(runtime, len(ids))
        if cache is not None and hasattr(cache, "batch_repeat_interleave"):
            return cache
    with torch.inference_mode():
        result = runtime.model(input_ids=torch.tensor([ids]), use_cache=True)
    cache = getattr(result, "cache", None) or getattr(result, "past_key_values", None)
    if cache is None or not all(
        hasattr(cache, name) for name in ("batch_repeat_interleave", "crop", "get_seq_length")
    ):
        return None
    runtime.cache, runtime.cached_ids = copy.deepcopy(cache), list(ids)
    return cache


def _allowed_tokens_fn(runtime: Runtime, fmt: ResponseFormat, prompt_length: int) -> Any:
    """A ``prefix_allowed_tokens_fn`` that keeps generation inside the JSON schema."""
    from memories_core.llms.constrained import allowed_tokens_fn, enforcer_data

    if runtime.enforcer_data is None:
        runtime.enforcer_data = enforcer_data(runtime.tokenizer)
    return allowed_tokens_fn(runtime.enforcer_data, fmt, prompt_length)


def _row_allowed_fn(
    runtime: Runtime, fmt: ResponseFormat, width: int, ends: set[int], pad: int
) -> Any:
    """:func:`_allowed_tokens_fn` for a batch: a row that has ended may only be padded.

    ``generate`` still asks for the rows it pads; the schema's parser has no state after
    the end of its answer, so it is not asked.
    """
    inner = _allowed_tokens_fn(runtime, fmt, width)

    def allowed(batch_id: int, sentence: Any) -> Any:
        if any(int(t) in ends for t in sentence[width:].tolist()):
            return [pad]
        return inner(batch_id, sentence)

    return allowed


def _prompt_ids(runtime: Runtime, messages: tuple[ChatMessage, ...], limit: int) -> list[int]:
    """The chat template's token ids for ``messages``, cut from the left to fit the window.

    The most recent context is kept: ``limit`` tokens of the window are left for the reply.
    """
    encoded = runtime.tokenizer.apply_chat_template(
        [m.to_dict() for m in messages],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    room = max(1, runtime.context_tokens - limit)
    return [int(t) for t in encoded["input_ids"][0].tolist()][-room:]


def _leaves_strings(fmt: ResponseFormat | None) -> bool:
    """Whether ``fmt`` is a schema whose every string is bounded (loops there are its own)."""
    return strings_bounded(getattr(fmt, "schema", None))


def _generation_options(
    tokenizer: Any,
    limit: int,
    temperature: float,
    stop: tuple[str, ...] | None,
    prompt_length: int,
    deadline: float | None,
    stop_loops: bool,
    json_reply: bool = False,
) -> tuple[dict[str, Any], _Deadline | None, _LoopStop | None]:
    """``generate``'s options, with the deadline's and the loop stop's criteria (if any).

    ``json_reply``: the reply is constrained by a schema that bounds its strings, so the loop
    stop leaves a cycle inside a JSON string to the schema (:func:`_leaves_strings`).

    Stop strings end generation inside ``generate`` (saves decoding time); the text is still
    cut afterwards because the criterion fires after the token that completes the string.
    """
    from transformers import StoppingCriteriaList

    options: dict[str, Any] = {"max_new_tokens": limit}
    if temperature == 0:
        options["do_sample"] = False
    else:
        options.update(do_sample=True, temperature=temperature, top_p=0.95)
    criteria = StoppingCriteriaList()
    clean_stop = [s for s in stop or () if s]
    if clean_stop:
        criteria.extend(_stop_criteria(tokenizer, clean_stop, prompt_length))
    timer = _Deadline(deadline) if deadline is not None else None
    if timer is not None:
        criteria.append(timer.criterion)
    decode = None
    if json_reply:

        def decode(ids: list[int]) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=True))

    loops = _LoopStop(prompt_length, decode) if stop_loops else None
    if loops is not None:
        criteria.append(loops.criterion)
    if criteria:
        options["stopping_criteria"] = criteria
    return options, timer, loops


def run_one(
    runtime: Runtime,
    messages: tuple[ChatMessage, ...],
    limit: int,
    temperature: float,
    stop: tuple[str, ...] | None,
    fmt: ResponseFormat | None = None,
    deadline: float | None = None,
    *,
    stop_loops: bool = False,
) -> LLMResult | None:
    """One transformers call; ``None`` if ``deadline`` passed before the answer ended.

    With ``stop_loops``, a reply that falls into a cycle (:func:`loop_end`) ends after the
    cycle's second writing, marked ``looped``.
    """
    import torch

    tokenizer = runtime.tokenizer
    model = runtime.model
    ids = _prompt_ids(runtime, messages, limit)
    input_ids = torch.tensor([ids])
    inputs = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
    options, timer, loops = _generation_options(
        tokenizer, limit, temperature, stop, len(ids), deadline, stop_loops, _leaves_strings(fmt)
    )
    if tokenizer.pad_token_id is None:
        options["pad_token_id"] = tokenizer.eos_token_id
    if fmt is not None:
        options["prefix_allowed_tokens_fn"] = _allowed_tokens_fn(runtime, fmt, len(ids))
    cache = _reusable_cache(runtime, ids)
    if cache is not None:
        options[_CACHE_ARGUMENT] = cache
    try:
        with torch.inference_mode(), _interruptible(model):
            try:
                result = model.generate(**inputs, **options, return_dict_in_generate=True)
            except _Interrupted:
                raise
            except Exception:
                if cache is None:
                    raise
                # A cache this transformers version cannot continue: compute from scratch.
                options.pop(_CACHE_ARGUMENT, None)
                runtime.cache = runtime.cached_ids = None
                result = model.generate(**inputs, **options, return_dict_in_generate=True)
    except _Interrupted:
        runtime.cache = runtime.cached_ids = None  # cut in the middle of a pass
        return None
    output = result.sequences
    kept = getattr(result, "cache", None) or getattr(result, "past_key_values", None)
    if kept is not None and hasattr(kept, "get_seq_length") and hasattr(kept, "crop"):
        length = int(kept.get_seq_length())
        runtime.cache = kept
        runtime.cached_ids = [int(t) for t in output[0, :length].tolist()]
    if timer is not None and timer.fired:
        return None
    new_tokens = output[0, len(ids) :]
    end = None if loops is None else loops.ends.get(0)
    text = tokenizer.decode(new_tokens[:end], skip_special_tokens=True)
    return LLMResult(
        truncate_at_stop(text, stop).strip(),
        prompt_tokens=len(ids),
        completion_tokens=int(new_tokens.shape[0]),
        looped=end is not None,
    )


def _generate_rows(
    runtime: Runtime, inputs: dict[str, Any], options: dict[str, Any], cache: Any, rows: int
) -> Any:
    """``generate`` over a batch's rows, from the shared start's ``cache`` if there is one.

    ``None`` if this transformers version cannot continue that cache (the caller then reads
    every prompt whole).
    """
    if cache is None:
        return runtime.model.generate(**inputs, **options)
    cache.batch_repeat_interleave(rows)
    try:
        return runtime.model.generate(**inputs, **options, **{_CACHE_ARGUMENT: cache})
    except _Interrupted:
        raise
    except Exception:
        return None


def run_batch(
    runtime: Runtime,
    conversations: list[tuple[ChatMessage, ...]],
    limit: int,
    temperature: float,
    stop: tuple[str, ...] | None,
    fmt: ResponseFormat | None = None,
    deadline: float | None = None,
    *,
    reuse: bool = True,
    stop_loops: bool = False,
) -> list[LLMResult] | None:
    """Several conversations in one ``generate``; ``None`` if ``deadline`` passed.

    Prompts are padded on the left of their own parts (the attention mask hides the padding,
    and positions are counted from each prompt's first real token), so every reply starts at
    the same column. The start every prompt shares (a mechanism's instructions, at least
    :data:`MIN_REUSED_PREFIX` tokens) is read once, or taken from the last call's cache, and
    its keys/values are given to every row: a CPU reads a prompt at the cost of every weight
    per token, so reading a long shared instruction once per row cost more than the batch
    saved in writing (BENCHMARKS.md, "Batched memory writing"). With ``fmt``
    each row is kept inside the JSON schema on its own (the enforcer keys its state by the
    row's own tokens); a row that has ended is only padded.
    """
    import torch

    tokenizer = runtime.tokenizer
    prompts = [_prompt_ids(runtime, messages, limit) for messages in conversations]
    pad = tokenizer.pad_token_id
    if pad is None:
        pad = tokenizer.eos_token_id
    shared = _shared_start(prompts) if reuse else 0
    cache = _prefix_cache(runtime, prompts[0][:shared]) if shared >= MIN_REUSED_PREFIX else None
    if cache is None:
        shared = 0
    # Each row: the shared start, padding, then its own part, so every reply starts at the same
    # column and the shared start keeps the positions the cache was computed at.
    rest = max(len(ids) - shared for ids in prompts)
    width = shared + rest
    rows, masks = [], []
    for ids in prompts:
        gap = rest - (len(ids) - shared)
        rows.append(ids[:shared] + [pad] * gap + ids[shared:])
        masks.append([1] * shared + [0] * gap + [1] * (len(ids) - shared))
    inputs = {"input_ids": torch.tensor(rows), "attention_mask": torch.tensor(masks)}
    options, timer, loops = _generation_options(
        tokenizer, limit, temperature, stop, width, deadline, stop_loops, _leaves_strings(fmt)
    )
    options["pad_token_id"] = pad
    ends = set(tokenizer.all_special_ids) | {pad}
    if fmt is not None:
        options["prefix_allowed_tokens_fn"] = _row_allowed_fn(runtime, fmt, width, ends, pad)
    try:
        with torch.inference_mode(), _interruptible(runtime.model):
            output = _generate_rows(runtime, inputs, options, cache, len(prompts))
    except _Interrupted:
        runtime.cache = runtime.cached_ids = None  # cut in the middle of a pass
        return None
    if output is None:
        # A cache this transformers version cannot continue: read every prompt whole.
        runtime.cache = runtime.cached_ids = None
        return run_batch(
            runtime,
            conversations,
            limit,
            temperature,
            stop,
            fmt,
            deadline,
            reuse=False,
            stop_loops=stop_loops,
        )
    if timer is not None and timer.fired:
        return None
    results = []
    for index, (ids, row) in enumerate(zip(prompts, output, strict=True)):
        new = [int(t) for t in row[width:].tolist()]
        # A finished sequence is padded while the others go on: its reply ends at its
        # first special token (end of turn, end of text or padding).
        cut = next((i + 1 for i, t in enumerate(new) if t in ends), len(new))
        loop = None if loops is None else loops.ends.get(index)
        text = tokenizer.decode(
            new[: cut if loop is None else min(cut, loop)], skip_special_tokens=True
        )
        results.append(
            LLMResult(
                truncate_at_stop(text, stop).strip(),
                prompt_tokens=len(ids),
                completion_tokens=cut,
                looped=loop is not None,
            )
        )
    return results
