"""Categorical value counts as sorted integer arrays: counted, merged and handed between tasks.

A column's counts are two parallel arrays: its distinct values (uint32, ascending: the order of
their 8-digit hex strings) and how often each occurs. Sorting is the one primitive: counting a
block sorts its values, merging partial counts sorts their concatenation (a stable sort of
already sorted runs, which numpy's timsort merges in near-linear time). Its cost per value does
not grow with the number of distinct values, where a hash table's does once it outgrows the CPU
cache, as it does on the columns of millions of values.

Small arrays that go back to the driver (samples, histograms) travel as Arrow binary values
(``to_binary``): one value per array, no per-entry conversion in the JVM.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VALUE_DTYPE = np.dtype("<u4")
DAY_COUNT_DTYPE = np.dtype("<u4")  # counts within one day (a day has fewer than 2**32 lines)
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
    """One Counts from several (each sorted): values summed, in ``count_dtype``. Runs are
    merged pairwise, smallest first, in one linear pass each (``kernels.merge_two``): the
    values are already sorted, so nothing is sorted again. The runs wait in a heap by length:
    a group's merge is handed a run per chunk, thousands on the Terabyte logs, and a sorted
    list kept by scanning would cost their number squared."""
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty_counts(count_dtype)
    if len(parts) == 1:
        return Counts(parts[0].values, parts[0].counts.astype(count_dtype, copy=False))
    import heapq

    from spark_jobs.engines.arrow.kernels import merge_two

    runs = [(len(p), k, Counts(p.values, p.counts.astype(np.int64, copy=False))) for k, p in enumerate(parts)]
    heapq.heapify(runs)
    order = len(runs)  # ties broken by arrival: the heap never compares Counts
    while len(runs) > 1:
        (_, _, a), (_, _, b) = heapq.heappop(runs), heapq.heappop(runs)
        values = np.empty(len(a) + len(b), VALUE_DTYPE)
        counts = np.empty(len(a) + len(b), np.int64)
        n = merge_two(a.values, a.counts, b.values, b.counts, values, counts)
        heapq.heappush(runs, (n, order, Counts(values[:n], counts[:n])))
        order += 1
    out = runs[0][2]  # trimmed: the last merge's buffers had room for no duplicates
    return Counts(out.values.copy(), out.counts.astype(count_dtype))


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
    data = (
        np.concatenate([np.ascontiguousarray(a).view(np.uint8).reshape(-1) for a in arrays])
        if arrays
        else np.zeros(0, np.uint8)
    )
    return pa.Array.from_buffers(pa.binary(), len(arrays), [None, pa.py_buffer(offsets), pa.py_buffer(data)])
