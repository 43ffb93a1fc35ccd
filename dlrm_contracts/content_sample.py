"""A cheap content check of a large file: a hash of a few blocks spread over it.

A file's name, size and modification time say whether it was replaced only while whoever
replaced it let the mtime move. A day file rewritten with the same size and its mtime put back
(``cp -p``, ``rsync --times``, ``touch -r``, a restore from backup) would otherwise keep its old
fingerprint, and its stale counts and parts would be reused. Reading every byte to tell would
cost as much as counting the day, so a fixed number of blocks is hashed whatever the file's
size: the first and last (where a rewritten header or an appended tail shows) and evenly
spaced ones between. A file no larger than the blocks together is hashed whole.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Callable

BLOCK_BYTES = 64 * 2**10
BLOCKS = 8  # first, last and six between: 512 KiB read per file, a few seeks


def block_offsets(size: int, block: int = BLOCK_BYTES, blocks: int = BLOCKS) -> list[int]:
    """Where the sampled blocks start in a file of ``size`` bytes (the whole file when small)."""
    if size <= block * blocks:
        return list(range(0, size, block)) or [0]
    last = size - block
    return sorted({round(i * last / (blocks - 1)) for i in range(blocks)})


def sampled_hash(path: str | os.PathLike[str], block: int = BLOCK_BYTES, blocks: int = BLOCKS) -> str:
    """Hex digest of the file's size and its sampled blocks (16 characters)."""
    with open(Path(path), "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        return sampled_hash_of(
            lambda offset, length: os.pread(fh.fileno(), length, offset), size, block, blocks
        )


def sampled_hash_of(
    read_at: Callable[[int, int], bytes], size: int, block: int = BLOCK_BYTES, blocks: int = BLOCKS
) -> str:
    """:func:`sampled_hash` of a file read through ``read_at(offset, length)`` (an object on a
    store: one ranged request per block), the same digest for the same bytes."""
    digest = hashlib.blake2b(digest_size=8)
    digest.update(size.to_bytes(8, "little"))
    for offset in block_offsets(size, block, blocks):
        digest.update(read_at(offset, block))
    return digest.hexdigest()
