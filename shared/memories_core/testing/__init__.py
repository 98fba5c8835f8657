"""A reusable contract suite that every memory mechanism runs, as ``langchain_tests`` does.

The suite checks, through the public mechanism API only (``save``, ``recall``, ``clear``,
``end_session``, ``delete_user``, the async twins, ``close``), the promises every mechanism
makes:

* **isolation**: users with tricky ids (case, width and whitespace variants, SQL and path
  metacharacters, LIKE wildcards, CJK, a 300-character id, ids that are prefixes of each other)
  never see each other's memories, and clearing or deleting one leaves the others intact;
* **persistence**: what was saved is recalled after ``close`` and a reopen;
* **erasure**: after ``delete_user`` and ``close``, neither a unique marker (saved in the
  text, the metadata and the session id) nor the user id occurs in the raw bytes of any file
  under the memory's directory (SQLite ``-wal``/``-shm`` files and Chroma's files included);
* **typed errors**: bad input raises a :class:`~memories_core.errors.MemoriesError` (never a
  bare ``TypeError``, ``AttributeError``, ``OverflowError`` or ``UnicodeEncodeError``), stores
  nothing, and never blocks another user's recall (:data:`BAD_INPUT_CASES`);
* **async twins** give the same results as the sync calls;
* **k**: a recall returns at most ``k`` records, and exactly ``k`` when the user has that many
  (unless :attr:`MechanismContract.fills_k` says the mechanism filters by design);
* **LLM outages**: with a failing or garbage-answering LLM (:class:`FlakyLLM`, each of
  :data:`GARBAGE_REPLIES` and a mix of them) no turn is lost, no garbage is ever recalled,
  and once the LLM recovers a retry derives the records exactly once;
* **crash safety**: a writer process is SIGKILLed at random points of its progress (after
  a chosen acknowledgement: in saves, derivations, recalls and session ends, never after a
  wall-clock delay); afterwards every acknowledged turn is present exactly once, every
  save is all or nothing, and no derived record is duplicated (``MEMORIES_CONTRACT_SEED``
  replays a run; the seed is in every failure message).

Usage: subclass :class:`MechanismContract` at module level in a test module, provide the
factory, and run pytest. The subclass is also imported by name in the crash test's child
process, so it must live in an importable module (any pytest test module is).

.. code-block:: python

    # tests/test_my_mechanism_contract.py
    from pathlib import Path

    from memories_core.embedders import HashingEmbedder
    from memories_core.interfaces import LLM
    from memories_core.testing import MechanismContract

    from my_package import MyMemory


    class TestMyMemoryContract(MechanismContract):
        needs_llm = True  # the mechanism calls the LLM
        derives_records = True  # it writes records of its own from the turns
        end_session_derives = False  # it derives on save, not only at end_session
        known_failures = {}  # e.g. {"test_delete_user_leaves_no_trace_on_disk": "why"}

        def make_memory(self, path: Path | None, llm: LLM) -> MyMemory:
            return MyMemory(path=path, llm=llm, embedder=HashingEmbedder(dimension=64))

The factory receives ``path=None`` for an in-memory memory (``storages`` says which storages
the storage-agnostic tests run on: in memory by default; reopen, erasure, crash and isolation
tests run on disk) and an LLM that the suite controls: a scripted model that
follows the package's prompts (:func:`~memories_core.prompts.rule_following.rule_following_reply`)
or a :class:`FlakyLLM`. Each entry of ``known_failures`` marks the matching tests
``xfail(strict=False)`` with the entry as reason; a key is a test name (every parametrization),
a full test id (``"test_x[memory]"``) or a pattern with ``*`` (``"test_x[*-metadata-nan]"``).
Turn-level checks read the turns with ``memory.turns(scope)``; a mechanism without it overrides
:meth:`MechanismContract.stored_turns` (or returns ``None`` there, and the suite then checks
through ``recall`` that each turn's content is still found). Retries call
``retry_pending(user_id)`` when the mechanism has it (override :meth:`MechanismContract.retry`
otherwise); the next ``save`` is a retry too. A mechanism that keeps nothing on disk sets
``supports_disk = False`` (the reopen, erasure and crash tests are then skipped); a project
that does not register the ``slow`` marker sets ``slow_marker = None``.

Test names, for ``known_failures``: ``test_isolation_between_tricky_user_ids``,
``test_clear_one_user_keeps_the_others``, ``test_delete_user_keeps_the_others``,
``test_persists_across_reopen``, ``test_delete_user_leaves_no_trace_on_disk``,
``test_bad_input_raises_typed_error_and_stores_nothing[<storage>-<case>]``,
``test_async_twins_match_sync``, ``test_failing_llm_never_loses_a_turn``,
``test_garbage_llm_never_loses_a_turn[<storage>-<reply name or "mixed">]`` and
``test_kill_at_any_point_loses_nothing_acknowledged`` (marked slow).

The package's modules: :mod:`~memories_core.testing.cases` (tricky user ids, garbage replies,
bad input), :mod:`~memories_core.testing.doubles` (scripted, failing, taught and gated models,
and :func:`rule_following_reply`), :mod:`~memories_core.testing.mechanism_contract`,
:mod:`~memories_core.testing.store_contract` (the same promises for a record store, once per
backend), :mod:`~memories_core.testing.crash` (writers killed after their acknowledgements)
and :mod:`~memories_core.testing.servers` (a ``chroma run`` server); every name of these is
importable from ``memories_core.testing`` itself. Two suites are imported from their own
modules: :mod:`~memories_core.testing.hostile` (hostile memory files: every one refused with a
typed error, leaving nothing behind) and :mod:`~memories_core.testing.langgraph_store`
(LangGraph's ``BaseStore`` contract, for ``MemoryStore`` and a control store).

Importing this package imports neither pytest nor any framework; pytest is imported only while
tests are collected.
"""

from __future__ import annotations

from memories_core.testing.cases import (
    BAD_INPUT_CASES,
    GARBAGE_MARKERS,
    GARBAGE_REPLIES,
    TRICKY_USER_IDS,
    BadInputCase,
)
from memories_core.testing.crash import KillPoint, kill_writer_repeatedly, run_crash_writer
from memories_core.testing.doubles import (
    FlakyLLM,
    GatedLLM,
    ScriptedLLM,
    TaughtLLM,
    rule_following_reply,
)
from memories_core.testing.mechanism_contract import MechanismContract
from memories_core.testing.servers import chroma_server
from memories_core.testing.store_contract import StoreContract, run_store_crash_writer

__all__ = [
    "BAD_INPUT_CASES",
    "GARBAGE_MARKERS",
    "GARBAGE_REPLIES",
    "TRICKY_USER_IDS",
    "BadInputCase",
    "FlakyLLM",
    "GatedLLM",
    "KillPoint",
    "MechanismContract",
    "ScriptedLLM",
    "StoreContract",
    "TaughtLLM",
    "chroma_server",
    "kill_writer_repeatedly",
    "rule_following_reply",
    "run_crash_writer",
    "run_store_crash_writer",
]
