"""Parsed rows + dictionaries → the parquet splits.

Small dictionaries are broadcast (map-side hash joins keep each partition's row order);
dictionaries above ``broadcast_max_values`` are joined with a shuffle, never collected.
Train is ordered by two seeded hashes of the raw line (then by the row itself), so its order
depends only on the input and the seed. Test and validation keep line order: with broadcast
joins only, partitions already are in line order and are written as they are; after a shuffle
join they are re-sorted by ``pos``.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.schema import CAT_COLUMNS, INT_COLUMNS, LABEL
from spark_jobs.parse import log_transform

OUTPUT_COLUMNS: tuple[str, ...] = (LABEL, *INT_COLUMNS, *CAT_COLUMNS)


def map_categoricals(rows, session, dict_dir: Path, sizes: dict[str, int],
                     broadcast_max_values: int):
    """Replace every C column by its id (0 when rare or missing). Returns (rows, shuffled?)."""
    from pyspark.sql import functions as F

    shuffled = False
    dictionaries = session.read.parquet(str(dict_dir)) if max(sizes.values()) > 1 else None
    for c in CAT_COLUMNS:
        if sizes[c] <= 1:
            rows = rows.withColumn(c, F.lit(0).cast("int"))
            continue
        table = (dictionaries.where(F.col("column") == c)
                 .select(F.col("value").alias(f"_v_{c}"), F.col("id").alias(f"_id_{c}")))
        if sizes[c] - 1 <= broadcast_max_values:
            table = F.broadcast(table)
        else:
            shuffled = True
        rows = (rows.join(table, rows[c] == table[f"_v_{c}"], "left")
                .withColumn(c, F.coalesce(F.col(f"_id_{c}"), F.lit(0)).cast("int"))
                .drop(f"_v_{c}", f"_id_{c}"))
    return rows, shuffled


def output_projection(rows, extra: tuple[str, ...] = ()):
    """label int32, I* float32 (log transform), C* int32, plus ``extra`` helper columns."""
    from pyspark.sql import functions as F

    return rows.select(F.col(LABEL).cast("int").alias(LABEL),
                       *[log_transform(F.col(c)).alias(c) for c in INT_COLUMNS],
                       *[F.col(c).cast("int").alias(c) for c in CAT_COLUMNS],
                       *extra)


def write_parquet(frame, path: Path, compression: str) -> None:
    frame.write.mode("overwrite").option("compression", compression).parquet(str(path))


def shuffled_train(rows, output_files: int):
    """Output-projected train rows (+ key1, key2) in their seeded order: hashes of the line, then the row as tie-break."""
    from pyspark.sql import functions as F

    keys = [F.col("key1"), F.col("key2"), *[F.col(c) for c in OUTPUT_COLUMNS]]
    frame = rows
    if output_files > 0:
        frame = frame.repartitionByRange(output_files, *keys).sortWithinPartitions(*keys)
    else:
        frame = frame.orderBy(*keys)
    return frame.select(*OUTPUT_COLUMNS)


def in_line_order(rows, must_sort: bool, output_files: int):
    """Eval rows in input line order (``pos``), sorting only when a shuffle broke the order."""
    frame = rows
    if output_files > 0:
        frame = frame.repartitionByRange(output_files, "pos").sortWithinPartitions("pos")
    elif must_sort:
        frame = frame.orderBy("pos")
    return frame.select(*OUTPUT_COLUMNS)
