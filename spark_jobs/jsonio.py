"""JSON files of the preprocess job: the pipeline's atomic writer, in file order (not sorted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline.manifest import read_json, write_json_atomic

__all__ = ["read_json", "write_json"]


def write_json(path: Path, data: Any) -> None:
    """Keys keep their order (C1..C26, days in order), which is how people read these files."""
    write_json_atomic(path, data, sort_keys=False)
