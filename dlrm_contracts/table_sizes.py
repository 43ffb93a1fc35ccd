"""Table sizes for any threshold, from ``DIR/counts/histogram.parquet`` alone.

The histogram says, per column, how many distinct values have exactly each total count, so
the number of values kept at threshold T is ``k(T) = sum(num_values where count >= max(1, T))``
and the table size is ``k(T) + 1`` (id 0 = rare or missing). The planner, rethreshold and the
trainer (to size its embeddings before reading data) all use this one module; it imports only
pyarrow and numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dlrm_contracts.atomic import atomic_file
from dlrm_contracts.binary_format import DatasetError, unreadable_parquet
from dlrm_contracts.layout import DATASET_JSON
from dlrm_contracts.errors import ExitCode
from dlrm_contracts.layout import histogram_path
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.thresholds import ThresholdSpec, parse_threshold_spec


@dataclass(frozen=True)
class CountHistogram:
    """Per column: distinct total counts ascending, and how many values have at least each."""

    counts: dict[str, np.ndarray]
    kept_at_least: dict[str, np.ndarray]  # kept_at_least[c][i] = values with count >= counts[c][i]

    def values_kept(self, column: str, threshold: int) -> int:
        """How many values of ``column`` get an id >= 1 at ``threshold`` (0 and 1 keep all)."""
        counts = self.counts.get(column)
        if counts is None or len(counts) == 0:
            return 0
        first = int(np.searchsorted(counts, max(1, int(threshold)), side="left"))
        return int(self.kept_at_least[column][first]) if first < len(counts) else 0

    def table_sizes(self, spec: str | int | ThresholdSpec) -> dict[str, int]:
        """Table size (values kept + 1) of every column under a threshold spec."""
        spec = parse_threshold_spec(spec)
        return {c: self.values_kept(c, spec.effective(c)) + 1 for c in CAT_COLUMNS}


def write_histogram(
    histogram: dict[str, list[tuple[int, int]]], counts_dir: str | Path
) -> dict[str, list[tuple[int, int]]]:
    """Store (column, count, num_values) as one small parquet file, columns in their order and
    counts ascending (both engines write the same bytes); returns it sorted the same way. The
    one writer of what :func:`read_histogram` reads."""
    ordered = {c: sorted(histogram.get(c, [])) for c in CAT_COLUMNS}
    rows = [(c, count, n) for c in CAT_COLUMNS for count, n in ordered[c]]
    table = pa.table(
        {
            "column": pa.array([r[0] for r in rows], pa.string()),
            "count": pa.array([r[1] for r in rows], pa.int64()),
            "num_values": pa.array([r[2] for r in rows], pa.int64()),
        }
    )
    with atomic_file(histogram_path(counts_dir)) as tmp:
        pq.write_table(table, tmp)
    return ordered


def read_histogram(counts_dir: str | Path) -> CountHistogram:
    """Load the histogram (a directory of counts or the parquet file itself)."""
    path = histogram_path(counts_dir)
    if not path.exists():
        raise DatasetError(f"{path} is missing: run spark_jobs first (it writes the counts)")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as exc:
        raise unreadable_parquet(path, exc) from exc
    needed = {"column", "count", "num_values"}
    if not needed <= set(table.column_names):
        raise DatasetError(f"{path}: columns {sorted(needed)} expected, found {table.column_names}")
    columns = np.asarray(table.column("column").to_pylist(), dtype=object)
    count = table.column("count").to_numpy().astype(np.int64)
    num_values = table.column("num_values").to_numpy().astype(np.int64)
    unknown = sorted(set(columns.tolist()) - set(CAT_COLUMNS))
    if unknown:
        raise DatasetError(f"{path}: unknown column names {unknown[:5]}")
    if len(count) and (count.min() < 1 or num_values.min() < 0):
        raise DatasetError(f"{path}: counts must be >= 1 and num_values >= 0")
    counts, kept = {}, {}
    for column in CAT_COLUMNS:
        mine = columns == column
        order = np.argsort(count[mine], kind="stable")
        col_counts, col_values = count[mine][order], num_values[mine][order]
        if len(col_counts) != len(np.unique(col_counts)):
            raise DatasetError(f"{path}: column {column} lists a count twice")
        counts[column] = col_counts
        # Suffix sums: values with count >= col_counts[i].
        kept[column] = np.cumsum(col_values[::-1])[::-1]
    return CountHistogram(counts, kept)


def embedding_bytes(table_sizes: dict[str, int] | list[int], embedding_dim: int, dtype_bytes: int = 4) -> int:
    sizes = table_sizes.values() if isinstance(table_sizes, dict) else table_sizes
    return int(sum(sizes)) * int(embedding_dim) * int(dtype_bytes)


# One exported vocabulary line (trainer.export): 8 hex digits and a newline.
VOCABULARY_LINE_BYTES = 9


def export_bytes(table_sizes: dict[str, int] | list[int], embedding_dim: int) -> int:
    """Size on disk of the serving SavedModel's tables (float32) and vocabularies (the MLPs,
    a few MB at most, are left out): what ``trainer --mode export`` will write."""
    sizes = list(table_sizes.values() if isinstance(table_sizes, dict) else table_sizes)
    values = sum(max(0, int(s) - 1) for s in sizes)
    return embedding_bytes(sizes, embedding_dim, 4) + values * VOCABULARY_LINE_BYTES


class LowerThresholdError(DatasetError):
    """The requested threshold keeps values the source dataset has already merged into id 0:
    no conversion can make it (exit 6, as the pipeline's convert stage refusing it)."""

    default_code = ExitCode.CONVERT


def written_threshold_spec(info_spec: str | None, source: Path) -> ThresholdSpec:
    """The threshold a dataset was written at (its dataset.json), needed to derive any other."""
    if info_spec is None:
        raise DatasetError(
            f"{source / DATASET_JSON} records no threshold_spec, so it is unknown "
            "which values it kept; reconvert it from parquet with a known spec"
        )
    return parse_threshold_spec(info_spec)


def new_table_sizes(
    counts_dir: str | Path, base: ThresholdSpec, new: ThresholdSpec, source_sizes: tuple[int, ...]
) -> list[int]:
    """Table sizes at ``new``; checks the counts agree with the source's sizes at ``base``."""
    if not new.is_at_least(base):
        lower = [
            f"{c}: {new.effective(c)} < {base.effective(c)}"
            for c in CAT_COLUMNS
            if new.effective(c) < base.effective(c)
        ]
        raise LowerThresholdError(
            f"threshold {new} is below the dataset's base threshold {base} for "
            f"{', '.join(lower[:6])}{' …' if len(lower) > 6 else ''}: the rarer values were "
            "already merged into id 0, so this needs a Spark rerun "
            f"(python -m spark_jobs ... --frequency-threshold '{new}')"
        )
    histogram = read_histogram(counts_dir)
    base_sizes = histogram.table_sizes(base)
    mismatched = [
        f"{c}: counts say {base_sizes[c]}, dataset has {s}"
        for c, s in zip(CAT_COLUMNS, source_sizes)
        if base_sizes[c] != s
    ]
    if mismatched:
        raise DatasetError(
            f"the counts in {counts_dir} do not belong to this dataset (table "
            f"sizes at its threshold {base} differ: {'; '.join(mismatched[:4])})"
        )
    return [histogram.table_sizes(new)[c] for c in CAT_COLUMNS]
