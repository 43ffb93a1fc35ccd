"""Partial value counts handed from the count tasks to the merge through Spark, not through
files: the exchange a workdir behind a URL uses (docs/cluster.md §2.0.2).

Why: the file exchange (``spark_jobs.engines.arrow.partial_files``) makes a merge task read
a slice of every partial file for every value group, one request per (group, file) with two
reads each; on the Terabyte logs some 20M requests, which a local filesystem answers from the
page cache in microseconds and an object store in milliseconds each, billed. Here each count
task emits its chunk's counts as one binary row per column (``partial_rows``); Spark keeps
those rows on the executors' local disks (``persist(DISK_ONLY)``: written once, never through
the object store). Once the driver has planned the value groups from the samples, a routing
pass (``route_task``) cuts each row at its column's group bounds, one row per (group, chunk)
the chunk reaches, and Spark shuffles those to the merge task of their group (``merge_task``).
The object store sees no request of the exchange.

Why rows are cut after planning: before the plan, rows could only be cut at fixed points of
the value space (say 1/1024 of it), and a merge task would get one run per (slice, chunk),
hundreds per chunk, each costing the JVM a row and the merge a Python-level step. Cut at the
group bounds, a merge task gets one run per chunk, as the file exchange reads one slice per
file, and the rows shuffled grow as groups x chunks, not as slices x chunks.

The groups are the file exchange's value ranges (``dictionaries.GroupPlan``) and a run holds
exactly its group's values, so both exchanges write the same bytes. A row is a binary value of
a run's sorted values (uint32) and one of their counts (uint32): the JVM moves byte strings,
never a row per value (a JVM object per value, serialised and shuffled, costs more than the
count itself at high cardinality).

Why the byte strings are compressed (``pack_values``, ``pack_counts``): what the exchange costs
over the file exchange is the JVM's handling of these bytes (cached, read back twice, routed,
shuffled, sorted), each step in proportion to them. The values ascend, so their differences
are small numbers; those and the counts (mostly small too) go through zstd at its fastest
level: fewer bytes in every step for a few milliseconds of Python per megabyte. The routing
pass decodes a row, cuts it and packs each piece again.
"""

from __future__ import annotations

import numpy as np

from spark_jobs.engines.arrow import remote
from spark_jobs.engines.arrow.value_counts import DAY_COUNT_DTYPE, VALUE_DTYPE, Counts, merge_counts

KIND_PARTIAL = 3
# Entries per row at most (8 bytes each): a column of a chunk larger than this is emitted as
# several rows, so a row stays far below the 2 GB a JVM byte array or an Arrow batch can hold
# whatever ``arrow_chunk_mb`` is.
ROW_ENTRIES = 1 << 20
ROUTED_SCHEMA = "group INT, day INT, values BINARY, counts BINARY"
ROUTE_INPUT = ("day", "column", "values", "counts")


_CODEC_LEVEL = 1  # zstd's fastest: the bytes it saves are worth more than a higher ratio
_ENTRIES = np.dtype("<u4")  # a packed array starts with its length (entries), then zstd's bytes


def _codec():
    import pyarrow as pa

    return pa.Codec("zstd", _CODEC_LEVEL)


def _pack(array: np.ndarray, codec) -> bytes:
    return np.array([len(array)], _ENTRIES).tobytes() + codec.compress(array, asbytes=True)


def _unpack(packed, dtype: np.dtype, codec) -> np.ndarray:
    data = memoryview(packed)
    n = int(np.frombuffer(data[: _ENTRIES.itemsize], _ENTRIES)[0])
    if not n:
        return np.zeros(0, dtype)
    return np.frombuffer(codec.decompress(data[_ENTRIES.itemsize :], n * dtype.itemsize), dtype)


def pack_values(values: np.ndarray, codec=None) -> bytes:
    """Sorted values (uint32) as their differences (the first as itself), compressed."""
    values = np.ascontiguousarray(values, VALUE_DTYPE)
    deltas = np.empty_like(values)
    deltas[:1] = values[:1]
    np.subtract(values[1:], values[:-1], out=deltas[1:])
    return _pack(deltas, codec or _codec())


def pack_counts(counts: np.ndarray, codec=None) -> bytes:
    return _pack(np.ascontiguousarray(counts, DAY_COUNT_DTYPE), codec or _codec())


def unpack(values, counts, codec=None) -> Counts:
    """A run packed by ``pack_values`` and ``pack_counts`` (bytes or Arrow buffers)."""
    codec = codec or _codec()
    deltas = _unpack(values, VALUE_DTYPE, codec)
    run = Counts(np.cumsum(deltas, dtype=VALUE_DTYPE), _unpack(counts, DAY_COUNT_DTYPE, codec))
    if len(run.values) != len(run.counts):
        raise ValueError(
            f"a run of partial counts with {len(run.values)} values and {len(run.counts)} counts"
        )
    return run


def partial_rows(day: int, counts_by_column: dict[int, Counts], row_entries: int = ROW_ENTRIES):
    """One record batch (``dictionaries.COUNT_SCHEMA``) of a chunk's partial counts: a row per
    column that holds values (per ``row_entries`` of them), packed; ``count`` is its entries."""
    import pyarrow as pa

    codec = _codec()
    columns, entries, values, counts = [], [], [], []
    for column, c in sorted(counts_by_column.items()):
        for start in range(0, len(c), row_entries):
            columns.append(column)
            entries.append(len(c.values[start : start + row_entries]))
            values.append(pack_values(c.values[start : start + row_entries], codec))
            counts.append(pack_counts(c.counts[start : start + row_entries], codec))
    n = len(columns)
    return pa.record_batch(
        {
            "kind": pa.array(np.full(n, KIND_PARTIAL, np.int32)),
            "day": pa.array(np.full(n, day, np.int32)),
            "column": pa.array(np.array(columns, np.int32)),
            "value": pa.array(np.zeros(n, np.int64)),
            "count": pa.array(np.array(entries, np.int64)),
            "values": pa.array(values, pa.binary()),
            "counts": pa.array(counts, pa.binary()),
        }
    )


def _rows(batch, codec):
    """(row, its run) of each row of packed values and counts in ``batch``."""
    values, counts = batch.column("values"), batch.column("counts")
    for i in range(batch.num_rows):
        yield i, unpack(values[i].as_buffer(), counts[i].as_buffer(), codec)


def route_batch(plan, batch):
    """Rows of partial counts (``ROUTE_INPUT``) cut at their column's group bounds: a row per
    (input row, group it reaches), ``ROUTED_SCHEMA``, each piece packed again."""
    import pyarrow as pa

    codec = _codec()
    columns = batch.column("column").to_numpy()
    days = batch.column("day").to_numpy()
    groups, out_days, values, counts = [], [], [], []
    for i, run in _rows(batch, codec):
        n = len(run)
        if not n:
            continue
        column = int(columns[i])
        # each range's first entry in the row; the ranges the row reaches are the non-empty ones
        edges = np.concatenate(
            [[0], np.searchsorted(run.values, np.asarray(plan.bounds[column][1:], VALUE_DTYPE)), [n]]
        )
        for r in np.flatnonzero(edges[1:] > edges[:-1]):
            groups.append(plan.first[column] + int(r))
            out_days.append(int(days[i]))
            values.append(pack_values(run.values[edges[r] : edges[r + 1]], codec))
            counts.append(pack_counts(run.counts[edges[r] : edges[r + 1]], codec))
    return pa.record_batch(
        {
            "group": pa.array(groups, pa.int32()),
            "day": pa.array(out_days, pa.int32()),
            "values": pa.array(values, pa.binary()),
            "counts": pa.array(counts, pa.binary()),
        }
    )


def route_task(plan):
    """mapInArrow function over the persisted partial rows: each cut at its group bounds
    (``route_batch``)."""

    def run(batches):
        for batch in batches:
            routed = route_batch(plan, batch)
            if routed.num_rows:
                yield routed

    return run


def merge_task(spec):
    """mapInArrow function over routed rows (``ROUTED_SCHEMA``) sorted by group: each group's
    runs (one per chunk) summed per day and merged (``dictionaries.merge_group``); a worker
    holds one group's entries at a time."""
    from spark_jobs.engines.arrow.dictionaries import merge_group

    def finish(group, parts):
        return merge_group(spec, group, {d: merge_counts(p) for d, p in parts.items()})

    def run(batches):
        with remote.writes_behind():  # a group's objects land while the next one merges
            yield from _merged(batches)

    def _merged(batches):
        codec = _codec()
        group, parts = None, {}
        for batch in batches:
            groups = batch.column("group").to_numpy()
            days = batch.column("day").to_numpy()
            for i, piece in _rows(batch, codec):
                g = int(groups[i])
                if g != group:
                    if parts:
                        yield finish(group, parts)
                    group, parts = g, {}
                if len(piece):
                    parts.setdefault(int(days[i]), []).append(piece)
        if parts:
            yield finish(group, parts)

    return run
