"""Per-day statistics (``DayStats``), whichever engine's count pass gathered them.

Each engine's count pass fills them without a second read of the data (the SQL engine from
row classes folded into its value-count aggregation, ``spark_jobs.engines.sql.row_classes``;
the Arrow engine from its tasks' statistics rows). The lines of every read partition (or
chunk) give the line numbers of rejected lines and the test/validation boundary of the last
day without a single-partition window.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS, REJECT_REASONS
from spark_jobs.columns import literal_lookup

if TYPE_CHECKING:
    from pyspark.sql import Column

PARTITION_SHIFT = 33  # monotonically_increasing_id = partition index << 33 | row in partition


@dataclass
class DayStats:
    day: int
    rows_read: int = 0
    rows_valid: int = 0
    rows_padded: int = 0
    rows_fast: int = 0
    rejected: dict[str, int] = field(default_factory=lambda: {r: 0 for r in REJECT_REASONS})
    missing: dict[str, int] = field(default_factory=lambda: {c: 0 for c in (*INT_COLUMNS, *CAT_COLUMNS)})
    # partition index → lines in it
    partitions: dict[int, int] = field(default_factory=dict)

    @property
    def rows_rejected(self) -> int:
        return sum(self.rejected.values())

    @property
    def all_fast(self) -> bool:
        """Every line passed the cheap checks: the transform pass may skip them for this day."""
        return self.rows_fast == self.rows_read

    def missing_rates(self) -> dict[str, float]:
        return {c: (n / self.rows_valid if self.rows_valid else 0.0) for c, n in self.missing.items()}

    @property
    def test_lines(self) -> int:
        """Test = the first ceil(n/2) lines of the last day, validation the rest (NVIDIA's split)."""
        return (self.rows_read + 1) // 2

    def line_offsets(self) -> dict[int, int]:
        """Partition index → number of lines of this day in earlier partitions."""
        offsets, total = {}, 0
        for pid in sorted(self.partitions):
            offsets[pid] = total
            total += self.partitions[pid]
        return offsets


def line_number_column(stats: dict[int, DayStats], days: Iterable[int]) -> Column:
    """0-based line number within its day file of rows with ``day`` and ``pos`` columns (pos =
    read partition or chunk << PARTITION_SHIFT | line within it), for the given days."""
    from pyspark.sql import functions as F

    offsets = {
        (int(day) << 20) + pid: offset for day in days for pid, offset in stats[day].line_offsets().items()
    }
    pid = F.shiftright(F.col("pos"), PARTITION_SHIFT)
    key = F.shiftleft(F.col("day").cast("long"), 20) + pid
    return (literal_lookup(offsets, key) + (F.col("pos") - F.shiftleft(pid, PARTITION_SHIFT))).cast("long")
