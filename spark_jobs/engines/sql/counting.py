"""The SQL engine's count pass: one aggregation over (day, column, value) pairs gives the
recounted days' value counts (written per day) and every day's statistics; the totals and
their histogram are summed from the stored counts.

What both engines share (which days to count, days.json, the histogram file) is
``spark_jobs.counting``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from dlrm_contracts.layout import values_dir
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts import table_sizes
from spark_jobs.engines.sql.row_classes import (
    ALL_MASKED_COLUMNS,
    MASKED_COLUMNS,
    ROW_CLASS_COLUMN,
    add_categorical_missing,
    row_class_sql,
    stats_from_counts,
)
from spark_jobs.stats import DayStats

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

# The stored counts, read with an explicit schema: when no valid line of any day has a
# categorical value, no day partition is written and schema inference would fail
# (UNABLE_TO_INFER_SCHEMA). A value is the integer of its 8 hex digits (0 .. 2**32 - 1): it
# sorts like the string, and is written and read several times faster.
COUNTS_SCHEMA = "column STRING, value LONG, count LONG, day STRING"


def _pairs(parsed: DataFrame, recount: bool, masked=MASKED_COLUMNS) -> DataFrame:
    """(day, column, value) pairs of one day: its row classes, and its values if recounted."""
    from pyspark.sql import functions as F

    classes = parsed.withColumn("_class", F.expr(row_class_sql(masked)))
    if not recount:
        return classes.select("day", F.lit(ROW_CLASS_COLUMN).alias("column"), F.col("_class").alias("value"))
    pairs = ", ".join([*(f"'{c}', `{c}`" for c in CAT_COLUMNS), f"'{ROW_CLASS_COLUMN}', _class"])
    return (
        classes.select("day", "reason", F.expr(f"stack({len(CAT_COLUMNS) + 1}, {pairs}) AS (column, value)"))
        .where(
            (F.col("reason").isNull() & F.col("value").isNotNull()) | (F.col("column") == ROW_CLASS_COLUMN)
        )
        .drop("reason")
    )


def count_pass(
    parsed_days: dict[int, DataFrame], recount: list[int], counts_dir: Path, values_counted: bool = True
) -> dict[int, DayStats]:
    """One aggregation over every day: value counts of the recounted days (written to their
    partitions) and every day's statistics (from the row classes). ``values_counted=False``
    (modulo ids, ``recount`` empty): no stored counts to take the missing categoricals from,
    so the row classes' mask covers the categoricals too."""
    from functools import reduce

    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    masked = MASKED_COLUMNS if values_counted else ALL_MASKED_COLUMNS
    frames = [_pairs(frame, day in recount, masked) for day, frame in parsed_days.items()]
    counts = (
        reduce(lambda a, b: a.unionByName(b), frames)
        .groupBy("day", "column", "value")
        .agg(F.count(F.lit(1)).alias("count"))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    try:
        stats = stats_from_counts(counts.where(F.col("column") == ROW_CLASS_COLUMN).collect(), masked)
        if not values_counted:
            return stats
        if recount:
            # a recounted day with no value left (every line rejected or without categoricals)
            # writes no partition: dynamic overwrite alone would keep its old counts
            for day in recount:
                shutil.rmtree(values_dir(counts_dir) / f"day={day}", ignore_errors=True)
            values = counts.where(
                (F.col("column") != ROW_CLASS_COLUMN) & F.col("day").isin([str(d) for d in recount])
            )
            (
                values.select("day", "column", F.conv("value", 16, 10).cast("long").alias("value"), "count")
                .write.mode("overwrite")
                .option("partitionOverwriteMode", "dynamic")
                .partitionBy("day")
                .parquet(str(values_dir(counts_dir)))
            )
    finally:
        counts.unpersist()
    add_categorical_missing(stats, _values_counted(frames[0].sparkSession, counts_dir))
    return stats


def _values_counted(session: SparkSession, counts_dir: Path) -> list[Row]:
    """(day, column, count) summed over the stored counts of every day (recounted or reused)."""
    from pyspark.sql import functions as F

    if not values_dir(counts_dir).is_dir():  # no day has any categorical value
        return []
    return (
        session.read.schema(COUNTS_SCHEMA)
        .parquet(str(values_dir(counts_dir)))
        .groupBy("day", "column")
        .agg(F.sum("count").alias("count"))
        .collect()
    )


def stored_counts(session: SparkSession, counts_dir: Path, days: list[int] | None = None) -> DataFrame:
    """The stored (column, value, count, day) rows (``days``: only those days')."""
    from pyspark.sql import functions as F

    counts = session.read.schema(COUNTS_SCHEMA).parquet(str(values_dir(counts_dir)))
    if days is not None:
        counts = counts.where(F.col("day").isin([str(d) for d in days]))
    return counts


def value_totals(session: SparkSession, counts_dir: Path, days: list[int] | None = None) -> DataFrame:
    """(column, value, count) summed over the counted days (``days``: only those); ``value``
    is the integer of the hex string."""
    from pyspark.sql import functions as F

    return (
        stored_counts(session, counts_dir, days)
        .groupBy("column", "value")
        .agg(F.sum("count").cast("long").alias("count"))
    )


def write_histogram(totals: DataFrame, counts_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """(column, count, num_values) of a totals DataFrame, stored; returns it per column."""
    from pyspark.sql import functions as F

    rows = totals.groupBy("column", "count").agg(F.count(F.lit(1)).cast("long").alias("num_values")).collect()
    histogram: dict[str, list[tuple[int, int]]] = {c: [] for c in CAT_COLUMNS}
    for r in rows:
        histogram[r["column"]].append((r["count"], r["num_values"]))
    return table_sizes.write_histogram(histogram, counts_dir)
