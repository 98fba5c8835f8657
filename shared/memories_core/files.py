"""Small JSON files kept beside a store: written atomically, read back as untrusted input.

One writer and one reader for every such file (the Chroma index's pins and learned filter
shares, the benchmark harness's kept work), so each is written the same way: a temporary
sibling, fsync, rename, so a crash leaves the old file or the new one and never half of
one; and read with a size cap, so a damaged or hostile file costs a warning, not memory.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["read_json_file", "write_json_atomic"]


def write_json_atomic(path: str | Path, data: Any, *, indent: int | None = 2) -> None:
    """Write ``data`` as JSON to ``path`` through a temporary sibling and a rename.

    Args:
        path: The file; its folder is created if missing.
        data: JSON-serialisable data (keys are sorted, so equal data gives equal bytes).
        indent: JSON indentation (``None``: one line).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{target.name}-", dir=target.parent)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=indent, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json_file(path: str | Path, *, max_bytes: int) -> Any:
    """The JSON in ``path``, or ``None`` if there is no such file.

    Args:
        path: The file.
        max_bytes: Largest file read.

    Raises:
        ValueError: if the file is larger than ``max_bytes`` or not JSON (the caller decides
            whether that is an error or a warning).
        OSError: if the file cannot be read.
    """
    target = Path(path)
    if not target.is_file():
        return None
    if target.stat().st_size > max_bytes:
        raise ValueError(f"larger than {max_bytes} bytes")
    return json.loads(target.read_text(encoding="utf-8"))
