"""One file replaced whole: how the Arrow engine's tasks write what another task reads.

A retried task rewrites its own file, and a reader never sees half of one. The temporary's name
is random rather than carrying a pid: the tasks run on many nodes, where a pid says nothing.
The rename and its flushes are dlrm_contracts.atomic's (``replace_file``): ``fsync`` for a
file a later step reads from another node or a later run; scratch files between two phases
of one job skip it (a killed job starts them over).
"""

from __future__ import annotations

import uuid
from pathlib import Path

from dlrm_contracts.atomic import replace_file


def write_atomically(path: Path, write, fsync: bool = False) -> None:
    """``write(temporary)``, then the temporary renamed onto ``path`` (removed if ``write``
    fails); with ``fsync`` flushed before the rename and its directory after."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        write(temporary)
        replace_file(temporary, path, fsync)
    finally:
        temporary.unlink(missing_ok=True)
