"""The SQL engine's per-day statistics, folded into the count pass's single aggregation.

Every parsed line contributes one extra (column, value) pair to the value-count aggregation:
column ``_row`` and a *row class* value — read partition, fast or not, reject reason, padded,
and the bit mask of its missing integer fields. Counting those classes gives rows read, valid,
padded, rejected per reason, missing integers per column and the lines of every read
partition: statistics without a second pass. A categorical's missing values are the valid rows
less the values counted for it (``add_categorical_missing``), not bits of the mask: a mask over
all 39 fields takes thousands of distinct patterns per day, each one more key for the
aggregation to hash and shuffle, while the categoricals' missing counts come for free from the
value counts the pass makes anyway.
"""

from __future__ import annotations

from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS
from spark_jobs.stats import PARTITION_SHIFT, DayStats

ROW_CLASS_COLUMN = "_row"  # the pseudo column of the row classes in the count aggregation
MASKED_COLUMNS: tuple[str, ...] = INT_COLUMNS  # bit i of the row class mask = column i missing
# modulo ids count no values, so their classes' mask covers all 39 columns (more classes, but
# no 26 (column, value) pairs per line)
ALL_MASKED_COLUMNS: tuple[str, ...] = (*INT_COLUMNS, *CAT_COLUMNS)


def row_class_sql(masked: tuple[str, ...] = MASKED_COLUMNS) -> str:
    """'pid:fast:reason:padded:mask' of a parsed line; mask bit i = MASKED_COLUMNS[i] missing
    (valid rows only). The mask, not the null values, gives the integers' missing rates, so a
    day whose values are not recounted still gets them and null values need not be counted."""
    bits = " + ".join(f"CASE WHEN {c} IS NULL THEN {1 << i} ELSE 0 END" for i, c in enumerate(masked))
    return (
        f"concat_ws(':', CAST(shiftright(pos, {PARTITION_SHIFT}) AS STRING), "
        "CASE WHEN fast THEN '1' ELSE '0' END, coalesce(reason, ''), "
        "CASE WHEN padded THEN '1' ELSE '0' END, "
        f"CAST(CASE WHEN reason IS NULL THEN {bits} ELSE 0 END AS STRING))"
    )


def stats_from_counts(rows, masked: tuple[str, ...] = MASKED_COLUMNS) -> dict[int, DayStats]:
    """DayStats from the aggregation rows (day, value, count) of column ``ROW_CLASS_COLUMN``."""
    stats: dict[int, DayStats] = {}
    for row in rows:
        day = int(row["day"])
        s = stats.setdefault(day, DayStats(day))
        n = row["count"]
        pid, fast, reason, padded, mask = row["value"].split(":")
        s.rows_read += n
        s.partitions[int(pid)] = s.partitions.get(int(pid), 0) + n
        s.rows_fast += n if fast == "1" else 0
        if reason:
            s.rejected[reason] += n
            continue
        s.rows_valid += n
        s.rows_padded += n if padded == "1" else 0
        bits = int(mask)
        for i, c in enumerate(masked):
            if bits >> i & 1:
                s.missing[c] += n
    return stats


def add_categorical_missing(stats: dict[int, DayStats], values_counted) -> None:
    """Missing categoricals per day = valid rows - values counted for the column.

    ``values_counted``: rows (day, column, count) summed from the day's value counts, which
    count every non-missing categorical of every valid line (and nothing else).
    """
    counted = {(int(r["day"]), r["column"]): int(r["count"]) for r in values_counted}
    for day, s in stats.items():
        for c in CAT_COLUMNS:
            s.missing[c] = s.rows_valid - counted.get((day, c), 0)
