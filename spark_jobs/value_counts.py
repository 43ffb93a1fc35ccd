"""Categorical value counts as sorted integer arrays: counted, merged and handed between tasks.

A column's counts are two parallel arrays: its distinct values (uint32, ascending: the order of
their 8-digit hex strings) and how often each occurs. Sorting is the one primitive: counting a
block sorts its values, merging partial counts sorts their concatenation (a stable sort of
already sorted runs, which numpy's timsort merges in near-linear time). Its cost per value does
not grow with the number of distinct values, where a hash table's does once it outgrows the CPU
cache (counting a column of 2.5M uniform values cost a pandas hash table 212 ns a value, a sort
17 ns).

Between Spark tasks, arrays travel as Arrow binary values (``to_binary``/``from_binary``): one
value per array, no per-entry conversion in the JVM, which only moves and shuffles the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VALUE_DTYPE = np.dtype("<u4")
DAY_COUNT_DTYPE = np.dtype("<u4")    # counts within one day (a day has fewer than 2**32 lines)
TOTAL_COUNT_DTYPE = np.dtype("<i8")  # counts over days


@dataclass
class Counts:
    """Distinct values (ascending) and their counts."""

    values: np.ndarray
    counts: np.ndarray

    def __len__(self) -> int:
        return len(self.values)

    def slice(self, start: int, stop: int) -> "Counts":
        return Counts(self.values[start:stop], self.counts[start:stop])


def empty_counts(count_dtype=TOTAL_COUNT_DTYPE) -> Counts:
    return Counts(np.zeros(0, VALUE_DTYPE), np.zeros(0, count_dtype))


def _run_starts(sorted_values: np.ndarray) -> np.ndarray:
    """Where each run of equal values starts in a sorted array."""
    change = np.empty(len(sorted_values), bool)
    change[:1] = True
    np.not_equal(sorted_values[1:], sorted_values[:-1], out=change[1:])
    return np.flatnonzero(change)


def count_values(values: np.ndarray) -> Counts:
    """Counts of the present values of one column (``values``: int64, negative = missing)."""
    present = values[values >= 0].astype(VALUE_DTYPE)
    if not len(present):
        return empty_counts(DAY_COUNT_DTYPE)
    present.sort()
    starts = _run_starts(present)
    counts = np.diff(starts, append=len(present)).astype(DAY_COUNT_DTYPE)
    return Counts(present[starts], counts)


def merge_counts(parts: list[Counts], count_dtype=TOTAL_COUNT_DTYPE) -> Counts:
    """One Counts from several (each sorted): values summed, in ``count_dtype``."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty_counts(count_dtype)
    if len(parts) == 1:
        return Counts(parts[0].values, parts[0].counts.astype(count_dtype, copy=False))
    if all(int(p.counts.max()) <= _LOW32 for p in parts):
        values, counts = _sorted_packed(parts)
    else:
        values = np.concatenate([p.values for p in parts])
        counts = np.concatenate([p.counts.astype(count_dtype, copy=False) for p in parts])
        order = np.argsort(values, kind="stable")
        values, counts = values[order], counts[order]
    starts = _run_starts(values)
    return Counts(values[starts], np.add.reduceat(counts, starts).astype(count_dtype, copy=False))


_LOW32 = 0xFFFFFFFF


def _sorted_packed(parts: list[Counts]) -> tuple[np.ndarray, np.ndarray]:
    """The parts' entries sorted by value, as one sort of ``value << 32 | count`` keys: a
    third cheaper than an argsort and two gathers (bench/README.md), for counts that fit 32
    bits (a day's always do)."""
    keys = np.concatenate([(p.values.astype(np.uint64) << np.uint64(32))
                           | p.counts.astype(np.uint64) for p in parts])
    keys.sort(kind="stable")          # timsort: the parts are sorted runs
    return (keys >> np.uint64(32)).astype(VALUE_DTYPE), (keys & np.uint64(_LOW32)).astype(np.int64)


# Counts below this are histogrammed by one bincount pass (a table of 8 MB at most), higher
# ones by a sort: counts of a value group are mostly small, and a sort of millions of them
# cost the merge more than summing them.
_BINCOUNT_LIMIT = 1 << 20


def count_histogram(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(count, number of values with that count), counts ascending."""
    if not len(counts):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if int(counts.max()) < _BINCOUNT_LIMIT and int(counts.min()) >= 0:
        sizes = np.bincount(counts)
        present = np.flatnonzero(sizes)
        return present.astype(np.int64), sizes[present].astype(np.int64)
    sorted_counts = np.sort(counts.astype(np.int64))
    starts = _run_starts(sorted_counts)
    return sorted_counts[starts], np.diff(starts, append=len(sorted_counts)).astype(np.int64)


def class_index(classes: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each count's position in ``classes`` (ascending, holding every count), int64: a table
    lookup when the counts are small, a binary search otherwise."""
    if len(classes) and int(classes[-1]) < _BINCOUNT_LIMIT:
        table = np.zeros(int(classes[-1]) + 1, np.int64)
        table[classes] = np.arange(len(classes))
        return table[counts]
    return np.searchsorted(classes, counts).astype(np.int64)


def evenly_spaced(values: np.ndarray, step: int) -> np.ndarray:
    """Every ``step``-th value and the last: a sorted array's quantiles, for range planning."""
    if len(values) <= 2:
        return values.copy()
    picks = np.unique(np.append(np.arange(0, len(values), step), len(values) - 1))
    return values[picks]


# ---------------------------------------------------------------- arrays as Arrow binary values

def to_binary(arrays: list[np.ndarray]):
    """An Arrow binary array with one value per numpy array (one copy, into one buffer)."""
    import pyarrow as pa

    sizes = np.array([a.nbytes for a in arrays], np.int64)
    offsets = np.zeros(len(arrays) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    data = np.concatenate([np.ascontiguousarray(a).view(np.uint8).reshape(-1) for a in arrays]) \
        if arrays else np.zeros(0, np.uint8)
    return pa.Array.from_buffers(pa.binary(), len(arrays), [None, pa.py_buffer(offsets),
                                                             pa.py_buffer(data)])


def slices_to_binary(array: np.ndarray, bounds: np.ndarray):
    """An Arrow binary array of ``array[bounds[k]:bounds[k+1]]`` for each k, zero-copy."""
    import pyarrow as pa

    offsets = (np.asarray(bounds, np.int64) * array.itemsize).astype(np.int32)
    base = np.ascontiguousarray(array)
    return pa.Array.from_buffers(pa.binary(), len(bounds) - 1,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(base)])


def from_binary(column, dtype) -> list[np.ndarray]:
    """The numpy arrays behind an Arrow binary column (views, no copy); None stays None."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        return [a for chunk in column.chunks for a in from_binary(chunk, dtype)]
    n = len(column)
    if n == 0:
        return []
    validity, offsets_buf, data = column.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, n + 1, column.offset * 4)
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    valid = column.is_valid().to_numpy(zero_copy_only=False) if column.null_count else None
    out = []
    for k in range(n):
        if valid is not None and not valid[k]:
            out.append(None)
            continue
        out.append(raw[offsets[k]:offsets[k + 1]].view(dtype))
    return out
