"""The SQL engine's part of contiguous ids (``spark_jobs.contiguous_ids``): the first
appearances of every day's values.

The dictionary pass reads each day as the transform does (valid rows, categoricals as their
hex values) and stacks the 26 columns into (column, value, day, pos, 1) rows; the shared
builder aggregates them. The transform reads the dictionaries by the mode's rule
(``engines.sql.transform.looked_up``): joined on the value itself (a long: the hex value is
exact), a missing value as the value 0; a value without an id is rare.
"""

from __future__ import annotations

from functools import reduce
from typing import TYPE_CHECKING

from dlrm_contracts.schema import CAT_COLUMNS
from spark_jobs.engines.sql.parse import parse_for_transform, read_day

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def first_seen_partials(session: SparkSession, days, stats, max_line_bytes: int) -> DataFrame:
    """(column, value, day, pos, count) of every categorical of the valid lines of ``days``
    (``contiguous_ids.PARTIAL_SCHEMA``; the aggregation sums them)."""
    from pyspark.sql import functions as F

    frames = []
    for day in days:
        rows = parse_for_transform(
            read_day(session, str(day.path), day.day),
            max_line_bytes,
            checked=not stats[day.day].all_fast,
            hex_values=True,
        )
        pairs = F.explode(
            F.array(
                *[
                    F.struct(F.lit(j).alias("column"), F.coalesce(F.col(c), F.lit(0)).alias("value"))
                    for j, c in enumerate(CAT_COLUMNS)
                ]
            )
        ).alias("pair")
        frames.append(
            rows.select(F.col("day").cast("int").alias("day"), "pos", pairs).select(
                F.col("pair.column").cast("int").alias("column"),
                F.col("pair.value").alias("value"),
                "day",
                "pos",
                F.lit(1).cast("long").alias("count"),
            )
        )
    return reduce(lambda a, b: a.unionByName(b), frames)
