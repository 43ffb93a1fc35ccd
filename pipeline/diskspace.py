"""Free space, and telling a full disk from other failures.

A full disk is the commonest way a long run dies, and the one failure the user fixes without
reading code: so wherever it happens (Spark, the converters, checkpoints, logs, manifests) it
becomes one line naming the stage, the path and the free space, with its own exit code.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterable

from dlrm_contracts.byte_units import human_bytes
from dlrm_contracts.errors import ExitCode, PipelineError, disk_full_cause


def existing_ancestor(path: Path) -> Path:
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def free_bytes(path: str | Path) -> int:
    """Free bytes (for an unprivileged user) on the filesystem that holds or will hold ``path``."""
    return shutil.disk_usage(existing_ancestor(Path(path))).free


def same_filesystem(a: str | Path, b: str | Path) -> bool:
    return existing_ancestor(Path(a)).stat().st_dev == existing_ancestor(Path(b)).stat().st_dev


def disk_full_error(stage: str, path: str | Path) -> PipelineError:
    """The one-line failure: stage, path, free space, and what to do."""
    path = Path(path)
    try:
        free = human_bytes(free_bytes(path))
    except OSError:
        free = "unknown"
    return PipelineError(
        f"disk full: stage {stage}: writing {path} failed (no space left on "
        f"device; {free} free on its filesystem now): free space there and run "
        "again (finished stages are skipped)",
        ExitCode.DISK_FULL,
    )


def fullest(paths: Iterable[str | Path]) -> Path:
    """Of the candidate paths a failed child may have written to, the one with least free space."""
    candidates = [Path(p) for p in paths if p]
    return min(candidates, key=lambda p: free_bytes(p))


def as_disk_full(exc: BaseException, stage: str, default_path: str | Path) -> PipelineError | None:
    """``exc`` as the disk-full failure of ``stage`` when a full disk caused it, else None."""
    cause = disk_full_cause(exc)
    if cause is None:
        return None
    filename = getattr(cause, "filename", None)
    return disk_full_error(stage, filename or default_path)
