"""Cheap, stable fingerprints of the files a stage wrote, by which the pipeline and the
converters recognise them again (the parquet a lean-mode record names, the binary dataset a
manifest records).

Names, sizes and modification times (not whole contents): hashing a terabyte of files to decide
whether to skip a stage would cost as much as the stage. Small JSON descriptions written by the
stages themselves (preprocess.json, dataset.json) are hashed by content.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def stable_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def file_stats(path: Path, ignore: tuple[str, ...] = ()) -> dict[str, list[int]]:
    """Relative name -> [size, mtime_ns] of every file under ``path`` (or of one file)."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    stats = {}
    for file in files:
        rel = file.name if file == path else str(file.relative_to(path))
        if any(part in ignore for part in Path(rel).parts):
            continue
        st = file.stat()
        stats[rel] = [st.st_size, st.st_mtime_ns]
    return stats


def tree_fingerprint(path: Path, ignore: tuple[str, ...] = ()) -> str:
    """Hash of relative names, sizes and mtimes of every file under ``path`` (or of one file)."""
    path = Path(path)
    if not path.exists():
        return "missing"
    return stable_hash([(rel, *stat) for rel, stat in file_stats(path, ignore).items()])


def file_content_hash(path: Path) -> str:
    path = Path(path)
    if not path.exists():
        return "missing"
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
