"""The Arrow engine's part of contiguous ids (``spark_jobs.contiguous_ids``): each chunk's
first appearances, and the dictionary index the transform looks the ids up in.

A first-seen task parses its chunks as the count pass does and emits, per column, the
chunk's distinct values with their first position (chunk << 33 | line in the chunk: the
lines' order within a day) and count; the shared builder aggregates and numbers them. The
numbered values are then written into the same memory-mapped index as frequency ids
(``dictionary_index``): each column's values split into ``arrow_group_values``-sized value
ranges by their leading bits, one task writing each range's region, so the transform reads
them as it reads frequency ids (``contiguous_ids.ContiguousIds`` maps missing and rare).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dlrm_contracts.schema import CAT_COLUMNS, NUM_CATEGORICAL
from spark_jobs.contiguous_ids import first_seen, merge_first_seen
from spark_jobs.engines.arrow import dictionary_index
from spark_jobs.engines.arrow.chunks import Chunk
from spark_jobs.engines.arrow.tasks import ReadSettings, _blocks, _parse

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def first_seen_task(chunks: list[Chunk], settings: ReadSettings):
    """mapInArrow function: (column, value, day, pos, count) of each chunk's distinct values
    (``contiguous_ids.PARTIAL_SCHEMA``). A column's pieces are merged whenever they hold more
    than ``count_flush_lines`` entries, bounding a task's memory by its distinct values."""
    import pyarrow as pa

    def run(batches):
        for _, chunk, blocks in _blocks(chunks, batches, settings):
            parts: list[list] = [[] for _ in range(NUM_CATEGORICAL)]
            for block in blocks:
                parsed = _parse(block, settings)
                valid = np.flatnonzero(parsed.valid)
                cats = parsed.cats.T[:, valid]
                positions = (np.int64(chunk.index) << 33) + block.first + valid
                for j in range(NUM_CATEGORICAL):
                    parts[j].append(first_seen(cats[j], positions))
                    if sum(len(p[0]) for p in parts[j]) > settings.count_flush_lines:
                        parts[j] = [merge_first_seen(parts[j])]
            for j, column_parts in enumerate(parts):
                if not column_parts:
                    continue
                values, positions, counts = merge_first_seen(column_parts)
                n = len(values)
                yield pa.record_batch(
                    {
                        "column": pa.array(np.full(n, j, np.int32)),
                        "value": pa.array(values.astype(np.int64)),
                        "day": pa.array(np.full(n, chunk.day, np.int32)),
                        "pos": pa.array(positions.astype(np.int64)),
                        "count": pa.array(counts),
                    }
                )

    return run


def _ranges(kept: int, group_values: int) -> int:
    return max(1, -(-kept // max(1, group_values)))


def range_bounds(ranges: int) -> np.ndarray:
    """Lowest value of each of ``ranges`` equal ranges of the 32-bit values: range r holds the
    values v with v * ranges >> 32 == r."""
    return np.array([-(-(r << 32) // ranges) for r in range(ranges)], np.uint32)


def write_index(
    session: SparkSession, ids: DataFrame, kept: dict[str, int], index_dir: str, group_values: int
) -> None:
    """The dictionary index of ``ids`` (column index, value, id): a layout of value ranges per
    column, a task per group of ranges writing their regions, then the seal."""
    from pyspark.sql import functions as F

    from spark_jobs.columns import literal_lookup

    ranges = {j: _ranges(kept[c], group_values) for j, c in enumerate(CAT_COLUMNS)}
    keyed = ids.select(
        "column",
        "value",
        "id",
        F.shiftright(F.col("value") * literal_lookup(ranges, "column"), 32).alias("range"),
    )
    found = {
        (int(r["column"]), int(r["range"])): int(r["count"])
        for r in keyed.groupBy("column", "range").count().collect()
    }
    layouts, sizes = {}, {}
    for j, c in enumerate(CAT_COLUMNS):
        per_range = [found.get((j, r), 0) for r in range(ranges[j])]
        layouts[c] = dictionary_index.ColumnLayout.of(range_bounds(ranges[j]), per_range)
        sizes.update({(j, r): int(s) for r, s in enumerate(layouts[c].sizes)})
    dictionary_index.create_index(Path(index_dir), layouts)
    tasks = max(1, min(len(found), 4 * session.sparkContext.defaultParallelism))
    written = (
        keyed.repartition(tasks, "column", "range")
        .mapInArrow(_region_task(index_dir, sizes), "written LONG")
        .collect()
    )
    if sum(r["written"] for r in written) != sum(found.values()):
        raise RuntimeError("the contiguous ids' index regions do not hold every kept value")
    dictionary_index.seal_index(Path(index_dir))


def _region_task(index_dir: str, sizes: dict[tuple[int, int], int]):
    """mapInArrow function: the regions of the (column, range) groups of a partition (a
    group is never split across partitions)."""
    import pyarrow as pa

    def run(batches):
        tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        if not tables:
            return
        table = pa.concat_tables(tables)
        column = table.column("column").to_numpy()
        ranges = table.column("range").to_numpy()
        values = table.column("value").to_numpy()
        ids = table.column("id").to_numpy()
        order = np.lexsort((ranges, column))
        keys = column[order].astype(np.int64) << 32 | ranges[order]
        starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
        ends = np.r_[starts[1:], len(keys)]
        for s, e in zip(starts, ends):
            j, r = int(column[order[s]]), int(ranges[order[s]])
            rows = order[s:e]
            dictionary_index.write_region(
                index_dir, CAT_COLUMNS[j], r, sizes[(j, r)], values[rows], ids[rows]
            )
        yield pa.record_batch({"written": pa.array([len(keys)], pa.int64())})

    return run
