"""Frequency-thresholded dictionaries: value → id, ids 1..k by count descending, value ascending.

The ids come from one global sort of the kept (column, value, count) rows and the row counts of
the sorted partitions, so no column's dictionary has to fit one task or the driver. Because the
order is by count first, the values kept at a higher threshold are exactly ids 1..k' — the
converters raise the threshold without Spark by relying on it.
"""

from __future__ import annotations

from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import ThresholdSpec


def table_sizes(histogram: dict[str, list[tuple[int, int]]], spec: ThresholdSpec) -> dict[str, int]:
    """k + 1 per column (id 0 is rare-or-missing), from the count histogram alone."""
    return {c: 1 + sum(n for count, n in histogram[c] if count >= spec.effective(c)) for c in CAT_COLUMNS}


def sizes_of_kept(kept: dict[str, int]) -> dict[str, int]:
    """k + 1 per column from the values given ids 1..k (an engine's numbering's answer)."""
    return {c: kept[c] + 1 for c in CAT_COLUMNS}
