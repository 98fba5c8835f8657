"""Tolerant parsing of model output, with one bounded repair retry.

Small models answer in many shapes: chatty prefixes, markdown bold, lowercase tags, JSON in
code fences with single quotes and trailing commas. The parsers here accept those shapes and
raise :class:`~memories_core.errors.ParseError` (carrying the raw text) when nothing usable is
left; they never return a silent empty result (the failure mode mem0's parser is known for).

* :func:`parse_tagged`: ``<Decision>: yes`` / ``<Memory>: ...`` outputs (Yuan et al. formats),
  with a rule that keeps tags forged inside echoed user text from winning.
* :func:`parse_json`: JSON objects or lists, optionally validated by a pydantic model.
* :func:`parse_options`: MemoChat-style option lists (``2#4``).
* :func:`parse_yes_no`: a tolerant yes/no reading of a tag value.
* :func:`parse_steps`: the generate-parse-repair loop written once, as a generator that
  yields :class:`LLMRequest` values; :func:`drive` and :func:`adrive` run it with blocking
  or async calls, so the sync and async paths cannot drift apart.
* :func:`generate_parsed` / :func:`agenerate_parsed`: call a model, parse, and on a
  ``ParseError`` ask once more with the error fed back (thin wrappers over the above).

Each part lives in its own module (``tagged``, ``json_values``, ``options``, ``steps``); this
package re-exports the public names, so ``from memories_core.parsing import parse_json`` is
the import to use.
"""

from __future__ import annotations

from memories_core.parsing.json_values import close_cut_json, parse_json
from memories_core.parsing.options import parse_options
from memories_core.parsing.steps import (
    LLMRequest,
    ParseSteps,
    adrive,
    agenerate_parsed,
    drive,
    generate_parsed,
    parse_steps,
    repair_messages,
)
from memories_core.parsing.tagged import parse_tagged, parse_yes_no, strip_echoed

__all__ = [
    "LLMRequest",
    "ParseSteps",
    "adrive",
    "agenerate_parsed",
    "close_cut_json",
    "drive",
    "generate_parsed",
    "parse_json",
    "parse_options",
    "parse_steps",
    "parse_tagged",
    "parse_yes_no",
    "repair_messages",
    "strip_echoed",
]
