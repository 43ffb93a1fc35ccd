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
count itself at high cardinality). The cutting copies nothing: a routed row's bytes are a
slice of the buffer the row arrived in.
"""

from __future__ import annotations

import numpy as np

from spark_jobs.engines.arrow.value_counts import DAY_COUNT_DTYPE, VALUE_DTYPE, Counts, merge_counts

KIND_PARTIAL = 3
# Entries per row at most (8 bytes each): a column of a chunk larger than this is emitted as
# several rows, so a row stays far below the 2 GB a JVM byte array or an Arrow batch can hold
# whatever ``arrow_chunk_mb`` is.
ROW_ENTRIES = 1 << 20
ROUTED_SCHEMA = "group INT, day INT, values BINARY, counts BINARY"
ROUTE_INPUT = ("day", "column", "values", "counts")


def partial_rows(day: int, counts_by_column: dict[int, Counts], row_entries: int = ROW_ENTRIES):
    """One record batch (``dictionaries.COUNT_SCHEMA``) of a chunk's partial counts: a row per
    column that holds values (per ``row_entries`` of them); ``count`` is its entries."""
    import pyarrow as pa

    from spark_jobs.engines.arrow.value_counts import to_binary

    columns, values, counts = [], [], []
    for column, c in sorted(counts_by_column.items()):
        for start in range(0, len(c), row_entries):
            columns.append(column)
            values.append(np.ascontiguousarray(c.values[start : start + row_entries], VALUE_DTYPE))
            counts.append(np.ascontiguousarray(c.counts[start : start + row_entries], DAY_COUNT_DTYPE))
    n = len(columns)
    return pa.record_batch(
        {
            "kind": pa.array(np.full(n, KIND_PARTIAL, np.int32)),
            "day": pa.array(np.full(n, day, np.int32)),
            "column": pa.array(np.array(columns, np.int32)),
            "value": pa.array(np.zeros(n, np.int64)),
            "count": pa.array(np.array([len(v) for v in values], np.int64)),
            "values": to_binary(values),
            "counts": to_binary(counts),
        }
    )


def _binary_parts(array) -> tuple[np.ndarray, object]:
    """A binary array's byte offsets (one per row and the end, into its data buffer) and
    that buffer: its rows read as numpy views, no Python object per row."""
    import pyarrow as pa

    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    width = np.int64 if pa.types.is_large_binary(array.type) else np.int32
    _, offsets, data = array.buffers()
    offsets = np.frombuffer(offsets, width, len(array) + 1, array.offset * np.dtype(width).itemsize)
    if data is None:  # every row empty
        data = pa.py_buffer(b"")
    return offsets.astype(np.int64), data


def _binary_view(offsets: np.ndarray, data):
    """A binary array whose rows are the spans between consecutive ``offsets`` of ``data``."""
    import pyarrow as pa

    if len(offsets) and int(offsets[-1]) >= 2**31:
        return pa.Array.from_buffers(pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), data])
    return pa.Array.from_buffers(
        pa.binary(), len(offsets) - 1, [None, pa.py_buffer(offsets.astype(np.int32)), data]
    )


def route_batch(plan, batch):
    """Rows of partial counts (``ROUTE_INPUT``) cut at their column's group bounds: a row per
    (input row, group it reaches), ``ROUTED_SCHEMA``, its bytes a slice of the input's."""
    import pyarrow as pa

    columns = batch.column("column").to_numpy()
    days = batch.column("day").to_numpy()
    value_offsets, value_data = _binary_parts(batch.column("values"))
    count_offsets, count_data = _binary_parts(batch.column("counts"))
    groups, out_days, value_starts, count_starts = [], [], [], []
    for i in range(batch.num_rows):
        at, stop = int(value_offsets[i]), int(value_offsets[i + 1])
        n = (stop - at) // VALUE_DTYPE.itemsize
        if not n:
            continue
        column = int(columns[i])
        values = np.frombuffer(value_data, VALUE_DTYPE, n, at)
        # each range's first entry in the row; the ranges the row reaches are the non-empty ones
        edges = np.concatenate(
            [[0], np.searchsorted(values, np.asarray(plan.bounds[column][1:], VALUE_DTYPE)), [n]]
        )
        reached = np.flatnonzero(edges[1:] > edges[:-1])
        groups.append(plan.first[column] + reached)
        out_days.append(np.full(len(reached), days[i], np.int32))
        value_starts.append(at + VALUE_DTYPE.itemsize * edges[reached])
        count_starts.append(int(count_offsets[i]) + DAY_COUNT_DTYPE.itemsize * edges[reached])
    if not groups:
        return pa.RecordBatch.from_pydict(
            {"group": [], "day": [], "values": [], "counts": []},
            schema=pa.schema(
                [("group", pa.int32()), ("day", pa.int32()), ("values", pa.binary()), ("counts", pa.binary())]
            ),
        )
    # the pieces of a row cover it and the rows lie end to end in their buffer, so each
    # piece ends where the next one starts: the starts and the batch's end are the offsets
    value_end, count_end = int(value_offsets[-1]), int(count_offsets[-1])
    return pa.record_batch(
        {
            "group": pa.array(np.concatenate(groups).astype(np.int32)),
            "day": pa.array(np.concatenate(out_days)),
            "values": _binary_view(np.append(np.concatenate(value_starts), value_end), value_data),
            "counts": _binary_view(np.append(np.concatenate(count_starts), count_end), count_data),
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
        group, parts = None, {}
        for batch in batches:
            groups = batch.column("group").to_numpy()
            days = batch.column("day").to_numpy()
            value_offsets, value_data = _binary_parts(batch.column("values"))
            count_offsets, count_data = _binary_parts(batch.column("counts"))
            entries = np.diff(value_offsets) // VALUE_DTYPE.itemsize
            for i in range(batch.num_rows):
                g = int(groups[i])
                if g != group:
                    if parts:
                        yield finish(group, parts)
                    group, parts = g, {}
                n = int(entries[i])
                if n:
                    parts.setdefault(int(days[i]), []).append(
                        Counts(
                            np.frombuffer(value_data, VALUE_DTYPE, n, int(value_offsets[i])),
                            np.frombuffer(count_data, DAY_COUNT_DTYPE, n, int(count_offsets[i])),
                        )
                    )
        if parts:
            yield finish(group, parts)

    return run
