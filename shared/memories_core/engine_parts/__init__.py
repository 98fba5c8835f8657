"""The layers of :class:`~memories_core.engine.MemoryEngine`, one module per concern.

``rules`` holds what the engine checks and returns (input checks, :class:`Derivation`,
:class:`JobPolicy`, :class:`MechanismHooks`, :class:`VerifyReport`); the layers stack
``base`` -> ``reads`` -> ``indexing`` -> ``deletion`` -> ``search`` -> ``jobs`` ->
``writes``, and :mod:`memories_core.engine` puts them together with the constructor and
the composition (mechanism hooks, locks, transactions, close). Import the engine's names
from :mod:`memories_core.engine`.
"""
