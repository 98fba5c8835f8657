"""Prompt overrides: a mechanism's system instructions replaced by name, without subclassing.

Every prompt of the package is a :class:`~memories_core.prompts.spec.PromptSpec` with a
stable name (``"memorybank.daily_summary"``, ``"dpem.notes"``, ...). A mechanism takes
``prompts={name: instruction}`` (or a :class:`PromptOverrides`) and runs its specs with
those system instructions; the builders, parsers and stand-ins stay the package's. The
library-with-overrides shape follows graphiti's prompt library (STYLE.md).

An override is checked when the mechanism is built, never at call time:

* its name must be one of the prompts the mechanism runs;
* the prompt must be overridable (its spec names its default ``system`` instruction);
* it must keep the output format the parser reads: every tag (``<Decision>``,
  ``</memory>``), bracketed label (``[Summary]``) and ``{placeholder}`` of the default
  instruction, and for a JSON prompt every field name of its answer model the default
  instruction names.

Anything else raises :class:`PromptOverrideError`, so a typo or a lost format line is
found at start-up instead of as parse failures in background jobs.

.. code-block:: python

    from memories_core import MemoryBankMemory

    memory = MemoryBankMemory(
        prompts={"memorybank.daily_summary": "Summarise the day for a nurse. Reply with the "
                 "summary only."},
    )
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

from memories_core.errors import ConfigurationError
from memories_core.prompts.spec import PromptSpec
from memories_core.types import ChatMessage

__all__ = ["PromptOverrideError", "PromptOverrides", "format_markers"]

In = TypeVar("In")
Out = TypeVar("Out")

# Tags (<Decision>, </memory>, <Memory Type>), bracketed labels ([Summary]) and {placeholders}.
_MARKER = re.compile(r"</?[A-Za-z_][\w \-]{0,40}>|\[[A-Za-z][\w \-]{0,40}\]|\{[A-Za-z_]\w*\}")


class PromptOverrideError(ConfigurationError):
    """A prompt override names no prompt of the mechanism, or drops its output format."""


def format_markers(spec: PromptSpec[In, Out]) -> frozenset[str]:
    """What an override of ``spec`` must keep: the format its parser reads.

    The tags, bracketed labels and ``{placeholders}`` of the default instruction, and the
    field names of a JSON answer model that the default instruction names.
    """
    system = spec.system or ""
    markers = set(_MARKER.findall(system))
    if spec.response_model is not None:
        markers.update(
            name for name in spec.response_model.model_fields if re.search(rf"\b{name}\b", system)
        )
    return frozenset(markers)


def _override(spec: PromptSpec[In, Out], text: str) -> PromptSpec[In, Out]:
    default = spec.system
    assert default is not None  # checked by PromptOverrides.check
    build = spec.build

    def build_with_override(inputs: In) -> list[ChatMessage]:
        messages = build(inputs)
        return [
            ChatMessage(m.role, m.content.replace(default, text)) if m.role == "system" else m
            for m in messages
        ]

    return replace(spec, build=build_with_override, system=text)


@dataclass(frozen=True)
class PromptOverrides:
    """System instructions that replace the default ones, keyed by prompt name.

    Key init args:
        system: ``{prompt name: instruction}``.

    Build one with :meth:`of` (from a mapping, ``None`` or another instance), check it
    against the prompts a mechanism runs with :meth:`check`, and run a spec through
    :meth:`apply`.
    """

    system: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, value: PromptOverrides | Mapping[str, str] | None) -> PromptOverrides:
        """``value`` as overrides (``None``: none).

        Raises:
            PromptOverrideError: if a name or an instruction is not a non-empty string.
        """
        if value is None:
            return cls()
        if isinstance(value, PromptOverrides):
            return value
        if not isinstance(value, Mapping):
            raise PromptOverrideError(f"prompts must be a mapping of name -> text, got {value!r}")
        for name, text in value.items():
            if not isinstance(name, str) or not isinstance(text, str) or not text.strip():
                raise PromptOverrideError(
                    f"a prompt override maps a prompt name to a non-empty text, got {name!r}"
                )
        return cls(dict(value))

    def __bool__(self) -> bool:
        return bool(self.system)

    def check(self, specs: Iterable[PromptSpec[object, object]]) -> PromptOverrides:
        """Check every override against ``specs`` (a mechanism's prompts); return ``self``.

        Raises:
            PromptOverrideError: on an unknown name, a prompt that cannot be overridden, or
                an instruction missing a marker of the output format.
        """
        known: dict[str, PromptSpec[object, object]] = {}
        for spec in specs:
            known[spec.name] = spec
            if spec.structured is not None:
                known[spec.structured.name] = spec.structured
        for name, text in self.system.items():
            found = known.get(name)
            if found is None:
                raise PromptOverrideError(
                    f"no prompt named {name!r} here; the prompts are {sorted(known)}"
                )
            if found.system is None:
                raise PromptOverrideError(f"prompt {name!r} cannot be overridden")
            missing = sorted(m for m in format_markers(found) if m not in text)
            if missing:
                raise PromptOverrideError(
                    f"the override of {name!r} drops the output format its parser reads: "
                    f"it must keep {missing}"
                )
        return self

    def apply(self, spec: PromptSpec[In, Out]) -> PromptSpec[In, Out]:
        """``spec`` with its instruction (and its JSON twin's) overridden where asked."""
        if not self.system:
            return spec
        twin = spec.structured
        if twin is not None and twin.name in self.system:
            spec = replace(spec, structured=_override(twin, self.system[twin.name]))
        if spec.name in self.system:
            spec = _override(spec, self.system[spec.name])
        return spec
