"""The compiled loops of the Arrow engine's dictionaries (numba): merging sorted value counts,
ids within a value range, and the dictionary index's hash tables (build a range's table,
probe it).

They are loops because their numpy formulations make several passes over the data where one
loop makes one (a numpy probe: one vectorised gather per round). In the index, a slot is
``value | id << 32`` (id >= 1), 0 when empty; a value's home slot in a region of ``size``
slots is ``mix32(value) * size >> 32``, and linear probing wraps around the region.
Compiled once per machine: ``cache=True`` keeps the machine code beside this file (or, for
code shipped to executors in a zip, in numba's cache directory).
"""

from __future__ import annotations

import numba
import numpy as np

_MASK32 = np.uint64(0xFFFFFFFF)


@numba.njit(cache=True, nogil=True, inline="always")
def _mix32(value):
    """MurmurHash3's 32-bit finaliser: spreads clustered values (small integers, shared
    prefixes) over the region."""
    h = np.uint64(value)
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & _MASK32
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & _MASK32
    h ^= h >> np.uint64(16)
    return h


@numba.njit(cache=True, nogil=True)
def build_region(values, ids, region):
    """Insert distinct ``values`` (uint32) with their ``ids`` (int32 >= 1) into ``region``
    (uint64, zeroed, more slots than values). Returns the values that found no empty slot
    (0 unless the region is too small): each probe ends after one lap of the region."""
    size = np.uint64(region.shape[0])
    lost = 0
    for i in range(values.shape[0]):
        key = np.uint64(values[i])
        s = (_mix32(key) * size) >> np.uint64(32)
        for _ in range(region.shape[0]):
            if region[s] == 0:
                region[s] = key | (np.uint64(ids[i]) << np.uint64(32))
                break
            s += np.uint64(1)
            if s == size:
                s = np.uint64(0)
        else:
            lost += 1
    return lost


@numba.njit(cache=True, nogil=True)
def lookup_column(values, bounds, starts, sizes, slots, out):
    """``out[i]`` = the id of ``values[i]`` (int64; negative = missing), 0 if absent.
    ``bounds``: each range's lowest value (ascending, bounds[0] = 0); ``starts``/``sizes``:
    its region of ``slots`` (checked to lie inside it, ``index_checks``). A probe ends at an
    empty slot, at the value, or after one lap of the region: a damaged region with no empty
    slot cannot make it loop."""
    ranges = bounds.shape[0]
    for i in range(values.shape[0]):
        v = values[i]
        if v < 0:
            out[i] = 0
            continue
        key = np.uint64(v)
        lo, hi = 0, ranges  # the last range whose bound is <= key
        while hi - lo > 1:
            mid = (lo + hi) >> 1
            if np.uint64(bounds[mid]) <= key:
                lo = mid
            else:
                hi = mid
        size = np.uint64(sizes[lo])
        if size == 0:
            out[i] = 0
            continue
        base = np.uint64(starts[lo])
        s = (_mix32(key) * size) >> np.uint64(32)
        found = 0
        for _ in range(sizes[lo]):
            slot = slots[base + s]
            if slot == 0:
                break
            if (slot & _MASK32) == key:
                found = np.int32(slot >> np.uint64(32))
                break
            s += np.uint64(1)
            if s == size:
                s = np.uint64(0)
        out[i] = found


@numba.njit(cache=True, nogil=True)
def merge_two(a_values, a_counts, b_values, b_counts, out_values, out_counts):
    """Two runs of distinct ascending values and their counts merged into ``out_*`` (room
    for both), equal values' counts summed; returns the entries written. One linear pass,
    because numpy's best, a stable sort of the concatenation, sorts again what is already
    sorted."""
    i, j, n = 0, 0, 0
    na, nb = a_values.shape[0], b_values.shape[0]
    while i < na and j < nb:
        va, vb = a_values[i], b_values[j]
        if va < vb:
            out_values[n] = va
            out_counts[n] = a_counts[i]
            i += 1
        elif vb < va:
            out_values[n] = vb
            out_counts[n] = b_counts[j]
            j += 1
        else:
            out_values[n] = va
            out_counts[n] = np.int64(a_counts[i]) + np.int64(b_counts[j])
            i += 1
            j += 1
        n += 1
    while i < na:
        out_values[n] = a_values[i]
        out_counts[n] = a_counts[i]
        i += 1
        n += 1
    while j < nb:
        out_values[n] = b_values[j]
        out_counts[n] = b_counts[j]
        j += 1
        n += 1
    return n


@numba.njit(cache=True, nogil=True)
def ranks_in_class(classes, first, out):
    """``out[i] = first[classes[i]] + ``how many ``j < i`` share ``classes[i]``: with values
    in ascending order, each value's id is its class's first id plus its rank in the class."""
    seen = np.zeros(first.shape[0], np.int64)
    for i in range(classes.shape[0]):
        k = classes[i]
        out[i] = first[k] + seen[k]
        seen[k] += 1


@numba.njit(cache=True, nogil=True)
def relabel_region(region, labelled_ids):
    """Each slot's high 32 bits, a row number + 1 of the group's values (as the merge built
    the region; 0 in an empty slot), replaced by ``labelled_ids[row + 1]``, that row's id
    (``labelled_ids[0]`` = 0 keeps an empty slot empty). No branch per slot: a filled slot
    and an empty one are mixed at random, and a mispredicted branch cost more than the
    gather. A row past ``labelled_ids`` (a damaged staged region) is an error, never read (that
    branch is never taken in an intact region, so it costs nothing); the task's retry then
    rebuilds the region from the filled part."""
    rows = np.uint64(labelled_ids.shape[0])
    for s in range(region.shape[0]):
        slot = region[s]
        row = slot >> np.uint64(32)
        if row >= rows:
            raise ValueError(
                "a staged dictionary index region points past its group's rows: "
                "delete the workdir's counts/.totals and run again"
            )
        region[s] = (slot & _MASK32) | (np.uint64(labelled_ids[np.int64(row)]) << np.uint64(32))


def warm_up() -> None:
    """Call each loop once with the argument types the tasks use (read-only slots: the index
    is memory-mapped read-only), loading its machine code from the cache or compiling it."""
    slots = np.zeros(512, np.uint64)
    build_region(np.arange(1, 3, dtype=np.uint32), np.arange(1, 3, dtype=np.int32), slots)
    slots.setflags(write=False)
    lookup_column(
        np.arange(-1, 3, dtype=np.int64),
        np.zeros(1, np.uint32),
        np.zeros(1, np.int64),
        np.full(1, 512, np.int64),
        slots,
        np.zeros(4, np.int32),
    )
    ranks_in_class(np.zeros(2, np.int64), np.ones(1, np.int64), np.zeros(2, np.int64))
    merge_two(
        np.ones(1, np.uint32),
        np.ones(1, np.int64),
        np.ones(1, np.uint32),
        np.ones(1, np.int64),
        np.zeros(2, np.uint32),
        np.zeros(2, np.int64),
    )
    relabel_region(np.zeros(4, np.uint64), np.zeros(2, np.int32))
