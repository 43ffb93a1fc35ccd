"""The train order key, computed alike by both engines: Spark's ``xxhash64(seed, day, line)``.

The train split is hash-partitioned and sorted by a seeded hash of each line's *place* (day,
line number within the day), so its order depends only on the input, the seed and the file
count: never on the threshold, the engine, or how Spark split the files. The SQL engine
evaluates ``F.xxhash64`` itself; the Arrow engine computes the same function with numpy, so
the two engines write identical files.

For a fixed day the key is a bijection of the line number (XXH64 of one 8-byte word is
invertible), so keys within a day never collide; (day, line) breaks ties across days.
"""

from __future__ import annotations

import numpy as np

_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)
SPARK_SEED = 42  # the seed Spark's xxhash64 starts from
LINE_BITS = 40  # tie-break key = day << LINE_BITS | line


def _rotl(x, r: int):
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h):
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def hash_long(values, seed):
    """Spark's ``XXH64.hashLong(value, seed)``, elementwise (uint64 arithmetic wraps)."""
    with np.errstate(over="ignore"):
        v = np.asarray(values, np.int64).astype(np.uint64)
        h = np.asarray(seed, np.int64).astype(np.uint64) + _P5 + np.uint64(8)
        h = h ^ (_rotl(v * _P2, 31) * _P1)
        h = _rotl(h, 27) * _P1 + _P4
        return _fmix(h)


def hash_int(value: int, seed):
    """Spark's ``XXH64.hashInt(value, seed)`` for one 32-bit value."""
    with np.errstate(over="ignore"):
        h = np.asarray(seed, np.int64).astype(np.uint64) + _P5 + np.uint64(4)
        h = h ^ (np.uint64(value & 0xFFFFFFFF) * _P1)
        h = _rotl(h, 23) * _P2 + _P3
        return _fmix(h)


def day_seed(seed: int, day: int) -> np.uint64:
    """The running hash after Spark's xxhash64 has consumed (seed as LONG, day as INT)."""
    return hash_int(day, hash_long(np.int64(seed), np.int64(SPARK_SEED)))


def train_keys(seed: int, day: int, lines: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(key, tie-break) as int64 for lines of one day: what the SQL engine computes as
    ``xxhash64(CAST(seed AS LONG), CAST(day AS INT), CAST(line AS LONG))`` and
    ``day << 40 | line``."""
    key = hash_long(lines, day_seed(seed, day).astype(np.int64)).astype(np.int64)
    return key, (np.int64(day) << np.int64(LINE_BITS)) | np.asarray(lines, np.int64)


def train_key_columns(seed: int, day: int, line):
    """The same two keys as Spark columns (SQL engine); ``line`` is a LONG column."""
    from pyspark.sql import functions as F

    key = F.xxhash64(F.lit(int(seed)).cast("long"), F.lit(int(day)).cast("int"), line.cast("long"))
    return key, F.shiftleft(F.lit(int(day)).cast("long"), LINE_BITS) + line
