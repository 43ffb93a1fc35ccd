"""The SQL engine's transform: parsed rows + dictionaries → the parquet splits.

Categoricals arrive as 64-bit keys (``spark_jobs.engines.sql.parse.cat_key_sqls``) and are
joined with the dictionaries' ``key`` column: small dictionaries are broadcast (map-side hash joins keep each
partition's row order); dictionaries above ``broadcast_max_values`` are joined with a shuffle,
never collected.

One query writes all three splits (so the broadcast dictionaries are built once): train is
hash-partitioned by ``key1`` (a seeded hash of the raw line) and sorted within each partition
by (key1, key2, the row), so its order depends only on the input and the seed and no
range-partitioning sample pass is needed; the last day's partitions follow its lines and are
sorted by line position (a global sort only after a shuffle join). The writer partitions by
split into a staging directory whose ``split=<name>`` folders become the split directories.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from dlrm_contracts.schema import ALL_COLUMNS, CAT_COLUMNS, INT_COLUMNS, LABEL
from spark_jobs.engines.sql.parse import log_transform, value_key

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

OUTPUT_COLUMNS = ALL_COLUMNS  # the splits hold the whole record, in its order


def map_categoricals(
    rows: DataFrame,
    session: SparkSession,
    dict_dir: Path,
    sizes: dict[str, int],
    broadcast_max_values: int,
    columns=CAT_COLUMNS,
    dictionary_key=value_key,
) -> tuple[DataFrame, bool]:
    """Replace each of ``columns`` (keys) by its id (0 when rare or missing). Returns (rows,
    shuffled?). ``dictionary_key`` maps the dictionary's ``value`` to the rows' key."""
    from pyspark.sql import functions as F

    shuffled = False
    dictionaries = session.read.parquet(str(dict_dir)) if max(sizes.values()) > 1 else None
    for c in columns:
        if sizes[c] <= 1:
            rows = rows.withColumn(c, F.lit(0).cast("int"))
            continue
        table = dictionaries.where(F.col("column") == c).select(
            dictionary_key(F.col("value")).alias(f"_k_{c}"), F.col("id").alias(f"_id_{c}")
        )
        if sizes[c] - 1 <= broadcast_max_values:
            table = F.broadcast(table)
        else:
            shuffled = True
        rows = (
            rows.join(table, rows[c] == table[f"_k_{c}"], "left")
            .withColumn(c, F.coalesce(F.col(f"_id_{c}"), F.lit(0)).cast("int"))
            .drop(f"_k_{c}", f"_id_{c}")
        )
    return rows, shuffled


def capped_categoricals(rows: DataFrame, caps: dict[str, int]) -> tuple[DataFrame, bool]:
    """Capped ids (``spark_jobs.capped_ids``): each C* (its hex value) becomes value % cap, 0
    when missing. Nothing is joined, so the rows keep their order: (rows, False)."""
    from pyspark.sql import functions as F

    for c in CAT_COLUMNS:
        rows = rows.withColumn(c, F.coalesce(F.col(c) % F.lit(int(caps[c])), F.lit(0)).cast("int"))
    return rows, False


def output_projection(rows: DataFrame, extra: tuple = ()) -> DataFrame:
    """label int32, I* float32 (log transform), C* int32, plus ``extra`` helper columns."""
    from pyspark.sql import functions as F

    return rows.select(
        F.col(LABEL).cast("int").alias(LABEL),
        *[log_transform(F.col(c)).alias(c) for c in INT_COLUMNS],
        *[F.col(c).cast("int").alias(c) for c in CAT_COLUMNS],
        *extra,
    )


def write_parquet(frame: DataFrame, path: Path, compression: str, partition_by: str | None = None) -> None:
    writer = frame.write.mode("overwrite").option("compression", compression)
    if partition_by:
        writer = writer.partitionBy(partition_by)
    writer.parquet(str(path))


def train_part(rows: DataFrame, partitions: int) -> DataFrame:
    """Train rows (output columns, ``_order``, ``_tie``) hash-partitioned by the seeded key and
    sorted within each file by (key, day << 40 | line): a total order, and a sort on a leading
    long key, which Spark does by radix sort on its prefix."""
    from pyspark.sql import functions as F

    return (
        rows.repartition(partitions, F.col("_order"))
        .sortWithinPartitions("_order", "_tie")
        .select(*OUTPUT_COLUMNS)
    )


def eval_part(rows: DataFrame, must_sort: bool) -> DataFrame:
    """Rows of the last day (output columns, ``split``, ``_order`` = line number): sorted by
    (split, line) within each read partition, the order the split-partitioned writer needs;
    globally after a shuffle join, which loses the line order."""
    frame = rows.select(*OUTPUT_COLUMNS, "split", "_order")
    frame = frame.orderBy("split", "_order") if must_sort else frame.sortWithinPartitions("split", "_order")
    return frame.drop("_order")
