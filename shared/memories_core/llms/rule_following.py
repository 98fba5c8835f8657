"""Deprecated location of :mod:`memories_core.prompts.rule_following`.

The rule-following stand-in answers this package's prompts, so it lives with them; the
prompts build on :mod:`memories_core.llms`, and a module here importing them back would
make the two packages depend on each other. Importing a name from this module still works,
with a :class:`DeprecationWarning`.
"""

from __future__ import annotations

import warnings
from typing import Any

_MOVED = frozenset({"UNKNOWN_PROMPT_REPLY", "is_worth_remembering", "rule_following_reply"})


def __getattr__(name: str) -> Any:
    """Resolve a moved name from :mod:`memories_core.prompts.rule_following`, with a warning."""
    if name not in _MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"memories_core.llms.rule_following.{name} moved to "
        f"memories_core.prompts.rule_following.{name}",
        DeprecationWarning,
        stacklevel=2,
    )
    from memories_core.prompts import rule_following

    return getattr(rule_following, name)
