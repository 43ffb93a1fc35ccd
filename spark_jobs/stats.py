"""Per-day statistics of the parsed rows, from one aggregation over the cached parse.

Grouped by (day, read partition) so that the same pass also gives the line offsets of every
partition: line numbers of rejected lines and the test/validation boundary of the last day
come from them without a single-partition window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.schema import CAT_COLUMNS, INT_COLUMNS
from spark_jobs.parse import REASONS

PARTITION_SHIFT = 33  # monotonically_increasing_id = partition index << 33 | row in partition


@dataclass
class DayStats:
    day: int
    rows_read: int = 0
    rows_valid: int = 0
    rows_padded: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: {r: 0 for r in REASONS})
    missing: dict[str, int] = field(default_factory=lambda: {c: 0 for c in (*INT_COLUMNS, *CAT_COLUMNS)})
    # (partition index, lines in it) in read order
    partitions: list[tuple[int, int]] = field(default_factory=list)

    @property
    def rows_rejected(self) -> int:
        return sum(self.rejected.values())

    def missing_rates(self) -> dict[str, float]:
        return {c: (n / self.rows_valid if self.rows_valid else 0.0) for c, n in self.missing.items()}

    def line_offsets(self) -> dict[int, int]:
        """Partition index → number of lines of this day in earlier partitions."""
        offsets, total = {}, 0
        for pid, lines in sorted(self.partitions):
            offsets[pid] = total
            total += lines
        return offsets


def collect_day_stats(parsed) -> dict[int, DayStats]:
    from pyspark.sql import functions as F

    valid = F.col("reason").isNull()
    aggs = [F.count(F.lit(1)).alias("rows_read"),
            F.sum(valid.cast("long")).alias("rows_valid"),
            F.sum((valid & F.col("padded")).cast("long")).alias("rows_padded")]
    aggs += [F.sum((F.col("reason") == r).cast("long")).alias(f"rej_{r}") for r in REASONS]
    aggs += [F.sum((valid & F.col(c).isNull()).cast("long")).alias(f"miss_{c}")
             for c in (*INT_COLUMNS, *CAT_COLUMNS)]
    pid = F.shiftright(F.col("pos"), PARTITION_SHIFT).alias("pid")
    rows = parsed.groupBy("day", pid).agg(*aggs).collect()
    stats: dict[int, DayStats] = {}
    for row in rows:
        s = stats.setdefault(row["day"], DayStats(row["day"]))
        s.rows_read += row["rows_read"]
        s.rows_valid += row["rows_valid"] or 0
        s.rows_padded += row["rows_padded"] or 0
        for r in REASONS:
            s.rejected[r] += row[f"rej_{r}"] or 0
        for c in s.missing:
            s.missing[c] += row[f"miss_{c}"] or 0
        s.partitions.append((row["pid"], row["rows_read"]))
    return stats


def split_boundary(stats: DayStats) -> int:
    """The ``pos`` where validation starts: test = the first ceil(n/2) lines (NVIDIA's split)."""
    half = (stats.rows_read + 1) // 2
    seen = 0
    for pid, lines in sorted(stats.partitions):
        if seen + lines > half:
            return (pid << PARTITION_SHIFT) + (half - seen)
        seen += lines
    last_pid = max(p for p, _ in stats.partitions)
    return (last_pid + 1) << PARTITION_SHIFT
