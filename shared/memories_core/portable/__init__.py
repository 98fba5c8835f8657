"""The portable memory file: one user's whole memory in one versioned file.

:func:`export_user` writes everything the engine keeps of one user, and nothing of anybody
else: records with their state and index status, the update history, pending jobs, the
per-user key-value state (open session, mechanism bookkeeping), graph nodes and edges,
artifacts (their bytes) and the embedder's identity, with the vectors when the index can
give them back. :func:`import_user` restores it into any engine: with the same embedder the
stored vectors are reused (nothing is embedded again); with another embedder the records are
re-embedded. The round trip is exact: records, state, history, graph and artifacts compare
equal after export and import into a fresh engine.

The file is a zip archive (a user's memory file is private and portable, as the
conditional-memory paper asks for):

* ``manifest.json``: ``format`` (:data:`FORMAT`), ``version`` (:data:`VERSION`), ``user_id``,
  ``exported_at``, ``embedder`` (name, dimension) and counts;
* ``records.jsonl``, ``history.jsonl``, ``jobs.jsonl``, ``graph.json``, ``state.json``;
* ``vectors.npy`` + ``vector_ids.json`` (optional);
* ``token_vectors.jsonl`` + ``token_vectors.npy`` (optional, version 2): the records'
  late-interaction token vectors (:mod:`memories_core.token_vectors`);
* ``artifacts/<n>/...`` with ``artifacts.json`` naming each artifact's folder.

Works for every mechanism, because it works on the engine (``memory.engine``).

A memory file is untrusted input. :func:`import_user` reads and validates the whole file
before it writes anything: the zip's size (members, expanded bytes, compression ratio, within
:class:`ImportLimits`), the manifest (format, version, the user id it names, counts), and every
row through the rules ``save`` applies (text length, metadata keys and values, timestamps,
finite numbers). Then it writes in one store transaction, with artifacts staged beside it
and vectors added after it commits, so that a refused or failed import leaves nothing and a
retry of a good file works. Nothing in a file is unpickled, and a training checkpoint
(an artifact named ``*.checkpoint``) is neither exported nor imported: only a checkpoint this
store wrote itself may be resumed.
"""

from __future__ import annotations

from memories_core.portable.export import export_user
from memories_core.portable.format import (
    CHECKPOINT_SUFFIX,
    FORMAT,
    MIN_VERSION,
    VERSION,
    ImportLimits,
    ImportReport,
    MemoryFileError,
    UserExistsError,
)
from memories_core.portable.importer import import_user
from memories_core.portable.reader import read_manifest

__all__ = [
    "CHECKPOINT_SUFFIX",
    "FORMAT",
    "MIN_VERSION",
    "VERSION",
    "ImportLimits",
    "ImportReport",
    "MemoryFileError",
    "UserExistsError",
    "export_user",
    "import_user",
    "read_manifest",
]
