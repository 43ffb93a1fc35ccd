"""One file replaced whole: how the Arrow engine's tasks write what another task reads.

A retried task rewrites its own file, and a reader never sees half of one. The temporary's name
is random rather than carrying a pid: the tasks run on many nodes, where a pid says nothing.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_atomically(path: Path, write) -> None:
    """``write(temporary)``, then the temporary renamed onto ``path`` (removed if ``write``
    fails)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
