"""Partial value counts handed from the count tasks to the merge through Spark, not through
files: the exchange a workdir behind a URL uses (docs/cluster.md §2.0.1).

Why: the file exchange (``spark_jobs.engines.arrow.partial_files``) makes a merge task read
a slice of every partial file for every value group, one request per (group, file) with two
reads each; on the Terabyte logs some 20M requests, which a local filesystem answers from the
page cache in microseconds and an object store in milliseconds each, billed. Here each count
task emits its chunk's counts as a few binary rows per column, one per *fine bucket* (the
top ``FINE_BITS`` bits of a value: its ``1 / 2**FINE_BITS`` slice of the value space); Spark
keeps those rows on the executors' local disks (``persist(DISK_ONLY)``: written once, never
through the object store) and, once the driver has planned the value groups, shuffles each
row to the merge task of its group. The object store sees no request of the exchange.

The groups are the file exchange's value ranges (planned from the samples, ``dictionaries``),
so both exchanges write the same bytes; a fine bucket across a group bound is sent to each
group it meets, whose task keeps its own range of it. A row is a binary value of a bucket's slice of a chunk's sorted values (uint32) and
one of their counts (uint32): the JVM moves a few thousand byte strings per chunk, never a
row per value (a JVM object per value, serialised and shuffled, costs more than the count
itself at high cardinality).
"""

from __future__ import annotations

import numpy as np

from spark_jobs.engines.arrow.value_counts import (
    DAY_COUNT_DTYPE,
    VALUE_DTYPE,
    Counts,
    merge_counts,
    to_binary,
)

KIND_PARTIAL = 3
FINE_BITS = 10  # 1024 buckets per column
FINE_SHIFT = 32 - FINE_BITS
GROUP_MAP_SCHEMA = "column INT, value LONG, group INT"
MERGE_INPUT = ("group", "day", "values", "counts")


def bucket_rows(day: int, counts_by_column: dict[int, Counts]):
    """One record batch (``dictionaries.COUNT_SCHEMA``) of a chunk's partial counts: a row per
    (column, fine bucket) that holds values; ``value`` is the bucket, ``count`` its entries."""
    import pyarrow as pa

    columns, buckets, values, counts = [], [], [], []
    edges = np.arange(1, 1 << FINE_BITS, dtype=np.uint64) << np.uint64(FINE_SHIFT)
    for column, c in sorted(counts_by_column.items()):
        if not len(c):
            continue
        cuts = np.searchsorted(c.values, edges)  # each bucket's first entry
        starts = np.concatenate([[0], cuts])
        ends = np.concatenate([cuts, [len(c)]])
        for bucket in np.flatnonzero(ends > starts):
            a, b = int(starts[bucket]), int(ends[bucket])
            columns.append(column)
            buckets.append(int(bucket))
            values.append(np.ascontiguousarray(c.values[a:b], VALUE_DTYPE))
            counts.append(np.ascontiguousarray(c.counts[a:b], DAY_COUNT_DTYPE))
    n = len(columns)
    return pa.record_batch(
        {
            "kind": pa.array(np.full(n, KIND_PARTIAL, np.int32)),
            "day": pa.array(np.full(n, day, np.int32)),
            "column": pa.array(np.array(columns, np.int32)),
            "value": pa.array(np.array(buckets, np.int64)),
            "count": pa.array(np.array([len(v) for v in values], np.int64)),
            "values": to_binary(values),
            "counts": to_binary(counts),
        }
    )


def group_map(plan) -> list[tuple[int, int, int]]:
    """(column, fine bucket, group) for every group whose value range meets the bucket: what
    the shuffle routes rows by. A bucket across a group bound goes to each group it meets,
    whose task keeps only its range's values: the groups are the file exchange's, so both
    exchanges write the same files."""
    out = []
    starts = np.arange(1 << FINE_BITS, dtype=np.uint64) << np.uint64(FINE_SHIFT)
    ends = starts + np.uint64((1 << FINE_SHIFT) - 1)  # each bucket's last value
    for column, bounds in enumerate(plan.bounds):
        bounds = np.asarray(bounds, np.uint64)
        first = np.searchsorted(bounds, starts, side="right") - 1
        last = np.searchsorted(bounds, ends, side="right") - 1
        for bucket in range(1 << FINE_BITS):
            out += [
                (column, bucket, plan.first[column] + r)
                for r in range(int(first[bucket]), int(last[bucket]) + 1)
            ]
    return out


def merge_task(spec):
    """mapInArrow function over (group, day, values, counts) rows sorted by group: each
    group's rows summed per day and merged (``dictionaries.merge_group``); a worker holds one
    group's entries at a time."""
    from spark_jobs.engines.arrow.dictionaries import merge_group

    def finish(group, parts):
        return merge_group(spec, group, {d: merge_counts(p) for d, p in parts.items()})

    def run(batches):
        group, parts, low, high = None, {}, 0, None
        for batch in batches:
            groups = batch.column("group").to_numpy()
            days = batch.column("day").to_numpy()
            values, counts = batch.column("values"), batch.column("counts")
            for i in range(batch.num_rows):
                g = int(groups[i])
                if g != group:
                    if parts:
                        yield finish(group, parts)
                    group, parts = g, {}
                    _, low, high = spec.plan.value_range(g)
                part = np.frombuffer(values[i].as_buffer(), VALUE_DTYPE)
                a = int(np.searchsorted(part, np.uint32(low))) if low else 0
                b = len(part) if high is None else int(np.searchsorted(part, np.uint32(high)))
                if b > a:
                    parts.setdefault(int(days[i]), []).append(
                        Counts(part[a:b], np.frombuffer(counts[i].as_buffer(), DAY_COUNT_DTYPE)[a:b])
                    )
        if parts:
            yield finish(group, parts)

    return run
