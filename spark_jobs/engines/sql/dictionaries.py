"""The SQL engine's frequency-thresholded dictionaries: value → id, ids 1..k by count
descending, value ascending.

The ids come from one global sort of the kept (column, value, count) rows and the row counts of
the sorted partitions, so no column's dictionary has to fit one task or the driver. Because the
order is by count first, the values kept at a higher threshold are exactly ids 1..k' — the
converters raise the threshold without Spark by relying on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import ThresholdSpec
from spark_jobs.columns import hex_value, literal_lookup
from spark_jobs.stats import PARTITION_SHIFT

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

_MAX_COUNT = 2**63 - 1  # a count is a LONG: a higher threshold keeps nothing, as this one does


def _threshold_of(column: Column, spec: ThresholdSpec) -> Column:
    from pyspark.sql import functions as F

    def effective(c: str) -> int:
        # a spec may hold any whole number; a literal above a LONG fails in the JVM
        return min(spec.effective(c), _MAX_COUNT)

    expr = F.lit(effective(CAT_COLUMNS[0]))
    cases = None
    for c in CAT_COLUMNS:
        cases = F.when(column == c, effective(c)) if cases is None else cases.when(column == c, effective(c))
    return cases.otherwise(expr)


def column_starts(sizes: dict[str, int]) -> dict[str, int]:
    """Where each column's kept values start in the order (column, count desc, value): Spark
    sorts the names as strings (C1, C10, ..., C19, C2, C20, ...), as Python does."""
    starts, total = {}, 0
    for c in sorted(CAT_COLUMNS):
        starts[c] = total
        total += sizes[c] - 1
    return starts


def build_dictionaries(
    totals: DataFrame,
    spec: ThresholdSpec,
    sizes: dict[str, int],
    out_dir: Path,
    after: dict[str, int] | None = None,
    carried: DataFrame | None = None,
) -> None:
    """Write (value, id, count) partitioned by ``column`` to ``out_dir``. ``totals``' values are 8-digit hex strings or
    their integers (the same order; an integer sorts faster and becomes its string only when
    kept). ``sizes`` (``table_sizes`` of the same totals) place each column in the global
    order, so no job has to look for where a column starts.

    Stable ids: ``totals`` are the newcomers, numbered after ``after`` (per column, the highest
    previous id), and ``carried`` (column, value, id, count: the previous entries) is written
    with them."""
    from pyspark.sql import functions as F

    kept = totals.where(F.col("count") >= _threshold_of(F.col("column"), spec))
    ordered = (
        kept.orderBy("column", F.desc("count"), "value")
        .withColumn("pos", F.monotonically_increasing_id())
        .persist()
    )
    try:
        pid = F.shiftright(F.col("pos"), PARTITION_SHIFT)
        partition_sizes = ordered.groupBy(pid.alias("pid")).count().collect()
        offsets, total = {}, 0
        for row in sorted(partition_sizes, key=lambda r: r["pid"]):
            offsets[int(row["pid"])] = total
            total += row["count"]
        if not offsets:
            offsets = {0: 0}
        starts = column_starts(sizes)
        if total != sum(sizes[c] - 1 for c in CAT_COLUMNS):
            raise RuntimeError(
                f"{total} values kept, but the table sizes from the histogram "
                f"add up to {sum(sizes[c] - 1 for c in CAT_COLUMNS)}"
            )
        global_index = literal_lookup(offsets, pid) + (F.col("pos") - F.shiftleft(pid, PARTITION_SHIFT))
        indexed = ordered.withColumn("index", global_index.cast("long"))
        value = F.col("value")
        if dict(totals.dtypes)["value"] != "string":
            value = hex_value(value)
        number = F.col("index") - literal_lookup(starts, "column") + 1
        if after:
            number = number + literal_lookup(after, "column")
        ids = indexed.select("column", value.alias("value"), number.cast("int").alias("id"), "count")
        if carried is not None:
            ids = ids.unionByName(
                carried.select("column", "value", F.col("id").cast("int"), F.col("count").cast("long"))
            )
        ids.write.mode("overwrite").partitionBy("column").parquet(str(out_dir))
    finally:
        ordered.unpersist()
