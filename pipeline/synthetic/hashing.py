"""Seeded integer hashes: rank → 8-hex-digit value, and key → reproducible random numbers.

Both must be pure functions of (seed, column, rank), never tables: that keeps the generator's
memory flat whatever the vocabulary size, makes every chunk independent of every other one
(so the worker count cannot change the output), and lets a test invert a written hex value
back to its rank.
"""

from __future__ import annotations

import numpy as np

_M32 = 0xFFFFFFFF
_M64 = 0xFFFFFFFFFFFFFFFF
_FMIX_C1 = 0x85EBCA6B
_FMIX_C2 = 0xC2B2AE35
_FMIX_C1_INV = pow(_FMIX_C1, -1, 2**32)
_FMIX_C2_INV = pow(_FMIX_C2, -1, 2**32)


def splitmix64(x: int) -> int:
    """The SplitMix64 finalizer on a Python int (for salts)."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def salt(seed: int, *parts: int) -> int:
    """A 64-bit salt derived from the seed and small integers (column index, purpose...)."""
    h = splitmix64(seed & _M64)
    for part in parts:
        h = splitmix64(h ^ (part & _M64))
    return h


def mix64(keys: np.ndarray, salt64: int) -> np.ndarray:
    """SplitMix64 of ``keys ^ salt`` over a uint64 array (wrapping arithmetic)."""
    x = keys.astype(np.uint64) ^ np.uint64(salt64)
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def hash_normal(keys: np.ndarray, salt64: int) -> np.ndarray:
    """A standard normal per key (Box-Muller on the two 32-bit halves of one 64-bit hash)."""
    h = mix64(keys, salt64)
    u1 = ((h >> np.uint64(32)).astype(np.float64) + 0.5) * (1.0 / 2**32)
    u2 = (h & np.uint64(_M32)).astype(np.float64) * (1.0 / 2**32)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


def hash_uniform(key: int, salt64: int) -> float:
    """One uniform in [0, 1) for a scalar key (per-column amplitudes and the like)."""
    return float(mix64(np.array([key], np.uint64), salt64)[0] >> np.uint64(11)) / 2**53


def rank_to_value(ranks: np.ndarray, salt32: int) -> np.ndarray:
    """Bijective 32-bit mix of ``rank ^ salt`` (MurmurHash3's fmix32): the written value.

    Bijective, so distinct ranks of a column give distinct hex values; mixed, so the most
    frequent value of a column is some arbitrary hash, as in the real logs.
    """
    x = ranks.astype(np.uint32) ^ np.uint32(salt32 & _M32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(_FMIX_C1)
    x ^= x >> np.uint32(13)
    x *= np.uint32(_FMIX_C2)
    x ^= x >> np.uint32(16)
    return x


def value_to_rank(values: np.ndarray, salt32: int) -> np.ndarray:
    """Inverse of :func:`rank_to_value` (lets tests and tools read ranks back from files)."""
    x = values.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(_FMIX_C2_INV)
    x ^= (x >> np.uint32(13)) ^ (x >> np.uint32(26))
    x *= np.uint32(_FMIX_C1_INV)
    x ^= x >> np.uint32(16)
    return (x ^ np.uint32(salt32 & _M32)).astype(np.int64)
