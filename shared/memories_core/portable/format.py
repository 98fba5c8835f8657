"""The memory file's format: version constants, member names, import limits, errors, report."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from memories_core import token_vectors as stored_tokens
from memories_core.errors import InvalidInputError, MemoriesError, check_count

if TYPE_CHECKING:
    from memories_core.engine import MemoryEngine

__all__ = [
    "CHECKPOINT_SUFFIX",
    "FORMAT",
    "MIN_VERSION",
    "VERSION",
    "ImportLimits",
    "ImportReport",
    "MemoryFileError",
    "UserExistsError",
]


#: The ``format`` field of every manifest.
FORMAT = "llm-memories/user"


#: The newest file format version this module writes and reads: 2 adds the optional
#: late-interaction token vectors; a file without them is still written as version 1.
VERSION = 2


#: The oldest file format version this module reads (there is no version 0).
MIN_VERSION = 1


#: Artifacts whose name ends so are resumable training state (MaLP's
#: ``malp/lora.checkpoint``): valid only in the store that wrote them, never exported or
#: imported, so that a checkpoint a file brings is never resumed.
CHECKPOINT_SUFFIX = ".checkpoint"


class UserExistsError(MemoriesError):
    """The target store holds the user already and ``on_conflict="refuse"`` was asked."""


class MemoryFileError(InvalidInputError):
    """A memory file that is refused: damaged, too large, of another version, or invalid.

    Nothing of it was written. The message names the member and row at fault.
    """


@dataclass(frozen=True)
class ImportLimits:
    """Bounds :func:`import_user` checks before it reads a member of a memory file.

    The defaults fit a memory of a million records; a service importing uploads may lower
    them.

    Attributes:
        max_members: Members of the zip archive.
        max_member_bytes: Expanded size of one member.
        max_total_bytes: Expanded size of all members together.
        max_ratio: Largest expanded/compressed ratio of a member larger than
            ``ratio_floor`` (a zip bomb expands a thousandfold; memory files compress
            about tenfold).
        ratio_floor: Members smaller than this many expanded bytes are not ratio-checked.
        max_records: Records in the file.
        max_rows: Rows of each other table (history, jobs, graph nodes, graph edges,
            state keys, artifacts).
        max_id_chars: Length of a record, job, node or edge id.
        max_depth: Nesting of JSON values (metadata, payloads, state).
    """

    max_members: int = 20_000
    max_member_bytes: int = 1 << 30
    max_total_bytes: int = 4 << 30
    max_ratio: float = 200.0
    ratio_floor: int = 1 << 20
    max_records: int = 1_000_000
    max_rows: int = 5_000_000
    max_id_chars: int = 256
    max_depth: int = 32

    def __post_init__(self) -> None:
        for name in (
            "max_members",
            "max_member_bytes",
            "max_total_bytes",
            "ratio_floor",
            "max_records",
            "max_rows",
            "max_id_chars",
            "max_depth",
        ):
            label = f"ImportLimits.{name}"
            checked = check_count(label, getattr(self, name), error=InvalidInputError)
            object.__setattr__(self, name, checked)
        if not isinstance(self.max_ratio, (int, float)) or not self.max_ratio >= 1:
            raise InvalidInputError("ImportLimits.max_ratio must be a number >= 1")


@dataclass(frozen=True)
class ImportReport:
    """What :func:`import_user` did.

    Attributes:
        user_id: The user imported.
        records: Records added.
        skipped: Records skipped (already present, ``on_conflict="merge"``).
        reembedded: Whether the records were embedded again (the embedder differs or the file
            holds no vectors).
        history: History entries added.
        jobs: Pending jobs added.
        artifacts: Artifacts added.
        dropped: Artifacts of the file left out (training checkpoints, see
            :data:`CHECKPOINT_SUFFIX`).
    """

    user_id: str
    records: int
    skipped: int
    reembedded: bool
    history: int
    jobs: int
    artifacts: int
    dropped: tuple[str, ...] = field(default=())


def _engine(memory_or_engine: Any) -> MemoryEngine:
    from memories_core.engine import MemoryEngine

    engine = getattr(memory_or_engine, "engine", memory_or_engine)
    if not isinstance(engine, MemoryEngine):
        raise InvalidInputError(
            f"expected a MemoryEngine or a memory with .engine, got {type(memory_or_engine)}"
        )
    return engine


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


_TABLES = ("records.jsonl", "history.jsonl", "jobs.jsonl")


_JSON_MEMBERS = ("manifest.json", "graph.json", "state.json", "artifacts.json")


_REQUIRED = frozenset({*_TABLES, *_JSON_MEMBERS})


_VECTOR_MEMBERS = frozenset({"vectors.npy", "vector_ids.json"})
_TOKEN_MEMBERS = frozenset({stored_tokens.ROWS_MEMBER, stored_tokens.VALUES_MEMBER})


_ARTIFACT_MEMBER = re.compile(r"artifacts/(0|[1-9][0-9]{0,8})/(.+)")


_COUNTS = ("records", "history", "jobs", "graph_nodes", "graph_edges", "artifacts", "vectors")


_INDEX_STATES = frozenset({"indexed", "pending", "failed"})


#: Turn metadata the library writes itself (``save``); accepted in a file's records.
_LIBRARY_META_KEYS = frozenset({"role", "speaker", "batch_id"})


_MANIFEST_BYTES = 1 << 20


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _fail(where: str, problem: str) -> MemoryFileError:
    return MemoryFileError(f"memory file refused: {where}: {problem}")
