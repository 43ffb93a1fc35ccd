"""The pipeline's fingerprints beyond the shared ones (dlrm_contracts.fingerprint): the input
and what changed in a stage's outputs since they were written.

The input's day files, which someone else writes, also get a hash of a few sampled blocks
(``dlrm_contracts.content_sample``) beside their names, sizes and mtimes: a file rewritten with
its size and mtime kept is then noticed.
"""

from __future__ import annotations

from pathlib import Path

from dlrm_contracts.content_sample import sampled_hash
from dlrm_contracts.fingerprint import file_stats, stable_hash


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
