"""Per-day value counts (incremental), the count histogram and days.json.

A day's counts depend only on that day's file, so they are kept per day
(``counts/values/day=<k>/``) and a day whose fingerprint is unchanged in ``days.json`` is not
recounted: adding a day counts only the new one. ``days.json`` is written after the counts,
so a crash in between only means the day is counted again.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from dlrm_contracts.atomic import atomic_file, read_json, write_json_atomic
from dlrm_contracts.layout import days_json_path, histogram_path, values_dir
from dlrm_contracts.schema import CAT_COLUMNS
from spark_jobs.inputs import DayFile
from spark_jobs.stats import (ROW_CLASS_COLUMN, DayStats, add_categorical_missing, row_class_sql,
                              stats_from_counts)

# 2: lines end at '\n' only and fields must match up to the end of the line (parse.py);
# 3: a value is stored as its integer (the 8 hex digits' value), not as its string. Counts
# written under another version are recounted, not reused.
DAYS_FORMAT_VERSION = 3
# The stored counts, read with an explicit schema: when no valid line of any day has a
# categorical value, no day partition is written and schema inference would fail
# (UNABLE_TO_INFER_SCHEMA). A value is the integer of its 8 hex digits (0 .. 2**32 - 1): it
# sorts like the string, and is written and read several times faster.
COUNTS_SCHEMA = "column STRING, value LONG, count LONG, day STRING"


def counted_days(counts_dir: Path) -> dict[int, dict]:
    """days.json entries whose counts partition still exists, by day number (none when the
    counts were written by another DAYS_FORMAT_VERSION)."""
    path = days_json_path(counts_dir)
    try:
        data = read_json(path, default={}) or {}
        if data.get("format_version") != DAYS_FORMAT_VERSION:  # counted under other parsing rules
            return {}
        return {int(entry["day"]): entry for entry in data.get("days", [])
                if (values_dir(counts_dir) / f"day={entry['day']}").is_dir()}
    except (ValueError, TypeError, KeyError, AttributeError) as error:
        # our own bookkeeping, damaged (a disk, a hand edit): every day is counted again
        print(f"spark_jobs: {path} is damaged ({type(error).__name__}: {error}): every day is "
              "counted again", file=sys.stderr)
        return {}


def days_to_count(days: list[DayFile], counts_dir: Path) -> list[int]:
    """Days that are new, whose file changed since they were counted, or whose stored counts
    are damaged (counted again from the day file, which is at hand)."""
    known = counted_days(counts_dir)
    return [d.day for d in days
            if d.day not in known or known[d.day].get("fingerprint") != d.fingerprint()
            or not _stored_counts_intact(counts_dir, d.day)]


def _stored_counts_intact(counts_dir: Path, day: int) -> bool:
    """Every stored counts file of ``day`` opens as parquet (a truncated or overwritten file
    fails here, on its footer, for the cost of one small read per file)."""
    import pyarrow.parquet as pq

    for path in sorted((values_dir(counts_dir) / f"day={day}").glob("*.parquet")):
        if path.name.startswith((".", "_")):
            continue
        try:
            pq.read_metadata(path)
        except Exception as error:   # ArrowInvalid, OSError: whatever makes it unreadable
            print(f"spark_jobs: the stored value counts {path} are damaged "
                  f"({type(error).__name__}): day {day} is counted again", file=sys.stderr)
            return False
    return True


def _pairs(parsed, recount: bool):
    """(day, column, value) pairs of one day: its row classes, and its values if recounted."""
    from pyspark.sql import functions as F

    classes = parsed.withColumn("_class", F.expr(row_class_sql()))
    if not recount:
        return classes.select("day", F.lit(ROW_CLASS_COLUMN).alias("column"), F.col("_class").alias("value"))
    pairs = ", ".join([*(f"'{c}', `{c}`" for c in CAT_COLUMNS), f"'{ROW_CLASS_COLUMN}', _class"])
    return (classes.select("day", "reason",
                           F.expr(f"stack({len(CAT_COLUMNS) + 1}, {pairs}) AS (column, value)"))
            .where((F.col("reason").isNull() & F.col("value").isNotNull())
                   | (F.col("column") == ROW_CLASS_COLUMN))
            .drop("reason"))


def count_pass(parsed_days: dict[int, object], recount: list[int], counts_dir: Path) -> dict[int, DayStats]:
    """One aggregation over every day: value counts of the recounted days (written to their
    partitions) and every day's statistics (from the row classes)."""
    from functools import reduce

    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    frames = [_pairs(frame, day in recount) for day, frame in parsed_days.items()]
    counts = (reduce(lambda a, b: a.unionByName(b), frames)
              .groupBy("day", "column", "value").agg(F.count(F.lit(1)).alias("count"))
              .persist(StorageLevel.MEMORY_AND_DISK))
    try:
        stats = stats_from_counts(counts.where(F.col("column") == ROW_CLASS_COLUMN).collect())
        if recount:
            # a recounted day with no value left (every line rejected or without categoricals)
            # writes no partition: dynamic overwrite alone would keep its old counts
            for day in recount:
                shutil.rmtree(values_dir(counts_dir) / f"day={day}", ignore_errors=True)
            values = counts.where((F.col("column") != ROW_CLASS_COLUMN)
                                  & F.col("day").isin([str(d) for d in recount]))
            (values.select("day", "column", F.conv("value", 16, 10).cast("long").alias("value"),
                           "count").write.mode("overwrite")
             .option("partitionOverwriteMode", "dynamic")
             .partitionBy("day").parquet(str(values_dir(counts_dir))))
    finally:
        counts.unpersist()
    add_categorical_missing(stats, _values_counted(frames[0].sparkSession, counts_dir))
    return stats


def _values_counted(session, counts_dir: Path) -> list:
    """(day, column, count) summed over the stored counts of every day (recounted or reused)."""
    from pyspark.sql import functions as F

    if not values_dir(counts_dir).is_dir():  # no day has any categorical value
        return []
    return (session.read.schema(COUNTS_SCHEMA).parquet(str(values_dir(counts_dir)))
            .groupBy("day", "column").agg(F.sum("count").alias("count")).collect())


def drop_stale_days(days: list[DayFile], counts_dir: Path) -> None:
    """Remove counts of days no longer in the input, so totals cover exactly the input."""
    root = values_dir(counts_dir)
    if not root.is_dir():
        return
    wanted = {f"day={d.day}" for d in days}
    for child in root.iterdir():
        if child.is_dir() and child.name.startswith("day=") and child.name not in wanted:
            shutil.rmtree(child)


def write_days_json(days: list[DayFile], stats: dict[int, DayStats], counts_dir: Path) -> None:
    entries = []
    for d in days:
        s = stats[d.day]
        entries.append({"day": d.day, "file": d.name, "fingerprint": d.fingerprint(),
                        "rows_read": s.rows_read, "rows_counted": s.rows_valid,
                        "missing_rate": s.missing_rates()})
    write_json_atomic(days_json_path(counts_dir), {"format_version": DAYS_FORMAT_VERSION, "days": entries},
                      sort_keys=False)


def stored_counts(session, counts_dir: Path, days: list[int] | None = None):
    """The stored (column, value, count, day) rows (``days``: only those days')."""
    from pyspark.sql import functions as F

    counts = session.read.schema(COUNTS_SCHEMA).parquet(str(values_dir(counts_dir)))
    if days is not None:
        counts = counts.where(F.col("day").isin([str(d) for d in days]))
    return counts


def value_totals(session, counts_dir: Path, days: list[int] | None = None):
    """(column, value, count) summed over the counted days (``days``: only those); ``value``
    is the integer of the hex string."""
    from pyspark.sql import functions as F

    return (stored_counts(session, counts_dir, days)
            .groupBy("column", "value").agg(F.sum("count").cast("long").alias("count")))


def write_histogram(totals, counts_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """(column, count, num_values) of a totals DataFrame, stored; returns it per column."""
    from pyspark.sql import functions as F

    rows = (totals.groupBy("column", "count").agg(F.count(F.lit(1)).cast("long").alias("num_values"))
            .collect())
    histogram: dict[str, list[tuple[int, int]]] = {c: [] for c in CAT_COLUMNS}
    for r in rows:
        histogram[r["column"]].append((r["count"], r["num_values"]))
    return write_histogram_file(histogram, counts_dir)


def write_histogram_file(histogram: dict[str, list[tuple[int, int]]],
                         counts_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """Store (column, count, num_values) as one small parquet file, columns in their order and
    counts ascending (both engines write the same bytes); returns it sorted the same way."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ordered = {c: sorted(histogram.get(c, [])) for c in CAT_COLUMNS}
    rows = [(c, count, n) for c in CAT_COLUMNS for count, n in ordered[c]]
    table = pa.table({"column": pa.array([r[0] for r in rows], pa.string()),
                      "count": pa.array([r[1] for r in rows], pa.int64()),
                      "num_values": pa.array([r[2] for r in rows], pa.int64())})
    path = histogram_path(counts_dir)
    with atomic_file(path) as tmp:
        pq.write_table(table, tmp)
    return ordered
