"""Contiguous ids (``preprocess.ids: contiguous``): TorchRec's rule for the dataset MLPerf
DLRMv2 trains on.

That dataset is made by TorchRec's scripts in sequence: ``npy_preproc_criteo`` reads a
categorical as ``int(text or "0", 16)`` (a missing value is the value 0), then
``contiguous_preproc_criteo`` (``BinaryCriteoUtils.sparse_to_contiguous``) numbers each
column's values over every day file in day order, line by line: a value gets the next id,
from 2, at its first appearance; with ``--frequency_threshold t`` above 1, a value seen fewer
than ``t`` times over all days gets 1 instead (and takes no number). The reader
(``InMemoryBinaryCriteoIterDataPipe``) or the multi-hot materializer then takes each id
modulo the column's ``num_embeddings_per_feature``: our ``preprocess.caps``, optional here.

Here: every day of the input (or of ``window_days``) in day order, its valid lines in line
order (a rejected line has no values), the threshold spec as the reference's threshold
(per column if the spec says so; 0 and 1 keep every value). ``dictionary_days: train``
numbers over the train days only; a value first seen on the last day is then 1, as a rare
one is. Without caps a column's table has its highest id + 1 rows (kept values + 2).

Cost: unlike capped ids this is a dictionary pass, one more read of the raw text than
``ids: modulo`` plus one aggregation of (column, value) → (first position, count) over the
distinct values of every chunk (the size of the SQL engine's value count) and one global sort
of the distinct values by first position (882M on the Terabyte logs with threshold 0, as
MLPerf's), then the transform looks every value up as frequency ids do.

The rule is stated once in numpy below (``contiguous_ids``: what the tests check both engines
against); the Spark part (``build_dictionaries``) is shared by the engines, which feed it
their partial first appearances (``PARTIAL_SCHEMA``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dlrm_contracts.contiguous_ids import DICTIONARIES_DIR, FIRST_ID, MISSING_VALUE, RARE_ID
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import ThresholdSpec

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

# One row per (column index, value, chunk or partition): the value's first position there and
# its count. ``pos`` orders the lines of a day (read partition or chunk << 33 | line in it).
PARTIAL_SCHEMA = "column INT, value LONG, day INT, pos LONG, count LONG"


def contiguous_ids(days: list[np.ndarray], spec: ThresholdSpec, caps=None) -> list[np.ndarray]:
    """The rule in numpy: ``days`` [rows, 26] int64 hex values per day (negative = missing), in
    day order → their ids, [rows, 26] int64 per day. ``caps``: 26 ints or None."""
    rows = [len(d) for d in days]
    values = np.concatenate(days) if days else np.zeros((0, len(CAT_COLUMNS)), np.int64)
    out = np.empty(values.shape, np.int64)
    for j, column in enumerate(CAT_COLUMNS):
        column_values = np.where(values[:, j] < 0, MISSING_VALUE, values[:, j])
        unique, first, inverse, counts = np.unique(
            column_values, return_index=True, return_inverse=True, return_counts=True
        )
        ids = np.full(len(unique), RARE_ID, np.int64)
        kept = np.flatnonzero(counts >= spec.effective(column))
        ids[kept[np.argsort(first[kept])]] = FIRST_ID + np.arange(len(kept))
        out[:, j] = ids[inverse.reshape(-1)]
        if caps is not None:
            out[:, j] %= int(caps[j])
    return np.split(out, np.cumsum(rows)[:-1]) if days else []


def first_seen(values: np.ndarray, positions: np.ndarray):
    """One column's (values, first positions, counts) of a block of lines (positions
    ascending); a missing value (negative) is the value 0."""
    values = np.where(values < 0, MISSING_VALUE, values)
    unique, first, counts = np.unique(values, return_index=True, return_counts=True)
    return unique, positions[first], counts.astype(np.int64)


def merge_first_seen(parts):
    """Several ``first_seen`` results of one column as one."""
    if len(parts) == 1:
        return parts[0]
    values = np.concatenate([p[0] for p in parts])
    positions = np.concatenate([p[1] for p in parts])
    counts = np.concatenate([p[2] for p in parts])
    order = np.lexsort((positions, values))
    values, positions, counts = values[order], positions[order], counts[order]
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]])
    return values[starts], positions[starts], np.add.reduceat(counts, starts)


class ContiguousIds:
    """A transform's ids (``lookup_into``, the dictionary index's call) read through the
    dictionary index by a mode's rule (``IdMode.missing_value`` and ``rare_id``; by default
    contiguous ids', that of ``dlrm_contracts.contiguous_ids``, which the served model keeps
    too): a missing value looked up as ``missing_value`` (None: left to the index, id 0), an
    absent one (rare) is ``rare_id``, then the caps."""

    def __init__(
        self,
        index,
        caps: tuple[int, ...] | None,
        missing_value: int | None = MISSING_VALUE,
        rare_id: int = RARE_ID,
    ):
        self.index = index
        # int64: a cap may be 2**31 (MAX_CAP), one above int32's range
        self.caps = None if caps is None else np.asarray(caps, np.int64).reshape(-1, 1)
        self.missing_value = missing_value
        self.rare_id = rare_id

    def lookup_into(self, values: np.ndarray, out: np.ndarray) -> None:
        if self.missing_value is not None:
            values = np.where(values < 0, self.missing_value, values)
        self.index.lookup_into(values, out)
        if self.rare_id:
            out[out == 0] = self.rare_id
        if self.caps is not None:
            out[...] = np.remainder(out, self.caps)


def table_sizes(kept: dict[str, int], caps: dict[str, int] | None) -> dict[str, int]:
    """Rows of each column's table: its cap, or its highest id + 1."""
    if caps is not None:
        return dict(caps)
    return {c: kept.get(c, 0) + FIRST_ID for c in CAT_COLUMNS}


def build_dictionaries(
    partials: DataFrame, spec: ThresholdSpec, dict_dir: Path | str
) -> tuple[DataFrame, dict[str, int]]:
    """The dictionaries from the engines' partial first appearances (``PARTIAL_SCHEMA``):
    returns (column index, value, id, count) of every kept value, persisted (the caller
    unpersists it), and the kept values per column name; written as the other modes' dictionaries (value as 8 hex digits, id,
    count, partitioned by column name) to ``dict_dir`` (``DICTIONARIES_DIR``).

    The ids come from one global sort by (column, first day, first position) and the row
    counts of the sorted partitions, so no column has to fit one task or the driver."""
    from pyspark.sql import functions as F

    from spark_jobs.columns import hex_value, literal_lookup
    from spark_jobs.stats import PARTITION_SHIFT

    minimum = {j: spec.effective(c) for j, c in enumerate(CAT_COLUMNS)}
    totals = partials.groupBy("column", "value").agg(
        F.min(F.struct("day", "pos")).alias("first"), F.sum("count").alias("count")
    )
    kept = totals.where(F.col("count") >= literal_lookup(minimum, "column"))
    ordered = (
        kept.orderBy("column", "first.day", "first.pos")
        .withColumn("_pos", F.monotonically_increasing_id())
        .persist()
    )
    try:
        pid = F.shiftright(F.col("_pos"), PARTITION_SHIFT)
        offsets, total = {}, 0
        for row in sorted(ordered.groupBy(pid.alias("pid")).count().collect(), key=lambda r: r["pid"]):
            offsets[int(row["pid"])] = total
            total += int(row["count"])
        per_column = {int(r["column"]): int(r["count"]) for r in ordered.groupBy("column").count().collect()}
        starts, before = {}, 0
        for j in range(len(CAT_COLUMNS)):
            starts[j] = before
            before += per_column.get(j, 0)
        index = literal_lookup(offsets or {0: 0}, pid) + (F.col("_pos") - F.shiftleft(pid, PARTITION_SHIFT))
        number = index - literal_lookup(starts, "column") + FIRST_ID
        ids = ordered.select("column", "value", number.cast("int").alias("id"), "count").persist()
        names = dict(enumerate(CAT_COLUMNS))
        (
            ids.select(
                literal_lookup(names, "column").alias("column"),
                hex_value("value").alias("value"),
                "id",
                "count",
            )
            .write.mode("overwrite")
            .partitionBy("column")
            .parquet(str(dict_dir))
        )
        ids.count()
        return ids, {c: per_column.get(j, 0) for j, c in enumerate(CAT_COLUMNS)}
    finally:
        ordered.unpersist()


__all__ = [
    "DICTIONARIES_DIR",
    "FIRST_ID",
    "PARTIAL_SCHEMA",
    "RARE_ID",
    "ContiguousIds",
    "build_dictionaries",
    "contiguous_ids",
    "first_seen",
    "merge_first_seen",
    "table_sizes",
]
