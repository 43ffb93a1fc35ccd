"""Cheap, stable fingerprints of files and directories, for deciding whether a stage is stale.

Names, sizes and modification times (not whole contents): hashing a terabyte of logs to decide
whether to skip a stage would cost as much as the stage. The input's day files, which someone
else writes, also get a hash of a few sampled blocks (``dlrm_contracts.content_sample``): a
file rewritten with its size and mtime kept is then noticed. Small JSON descriptions written by
the stages themselves (preprocess.json, dataset.json) are hashed by content.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from dlrm_contracts.content_sample import sampled_hash


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


def input_fingerprint(raw_dir: Path, ignore: tuple[str, ...] = ("generator_meta.json",)) -> str:
    """Names, sizes, mtimes and sampled-block hashes of the files directly in the input
    directory, the day files the preprocess job reads: a subdirectory (a workdir kept inside
    the input, say) is not input."""
    raw_dir = Path(raw_dir)
    if not raw_dir.is_dir():
        if not raw_dir.exists():
            return "missing"
        stats = file_stats(raw_dir, ignore)
        return stable_hash([(rel, *stat, sampled_hash(raw_dir)) for rel, stat in stats.items()])
    stats = {rel: stat for rel, stat in file_stats(raw_dir, ignore).items() if "/" not in rel}
    return stable_hash([(rel, *stat, sampled_hash(raw_dir / rel)) for rel, stat in stats.items()])


def changed_files(recorded: dict[str, list[int]], path: Path) -> list[str]:
    """Files under ``path`` whose size or mtime differ from ``recorded``, or that are missing
    or new: what was changed after the stage that wrote them finished."""
    now = file_stats(path) if Path(path).exists() else {}
    return sorted(name for name in set(recorded) | set(now) if recorded.get(name) != now.get(name))


def file_content_hash(path: Path) -> str:
    path = Path(path)
    if not path.exists():
        return "missing"
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
