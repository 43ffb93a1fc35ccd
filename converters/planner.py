"""Threshold planner: table sizes and embedding memory for candidate thresholds, from counts.

Answers "what does threshold T cost?" before any Spark or training run, from the tiny
``DIR/counts/histogram.parquet``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dlrm_contracts.byte_units import human_bytes
from dlrm_contracts.binary_format import cat_dtype, dtype_name
from dlrm_contracts.schema import CAT_COLUMNS
from dlrm_contracts.table_sizes import embedding_bytes, export_bytes, read_histogram
from dlrm_contracts.thresholds import parse_threshold_spec


def plan(
    counts_dir: str | Path, specs: list[str], embedding_dim: int = 128, dtype_bytes: int = 4
) -> list[dict[str, Any]]:
    """Per spec: canonical spec, table sizes, id dtypes, total rows, embedding bytes and the
    size of the serving export (float32 tables + vocabularies)."""
    histogram = read_histogram(counts_dir)
    rows = []
    for text in specs:
        spec = parse_threshold_spec(text)
        sizes = histogram.table_sizes(spec)
        rows.append(
            {
                "threshold_spec": str(spec),
                "table_sizes": sizes,
                "cat_dtypes": {c: dtype_name(cat_dtype(s)) for c, s in sizes.items()},
                "total_rows": sum(sizes.values()),
                "embedding_dim": embedding_dim,
                "dtype_bytes": dtype_bytes,
                "embedding_bytes": embedding_bytes(sizes, embedding_dim, dtype_bytes),
                "export_bytes": export_bytes(sizes, embedding_dim),
            }
        )
    return rows


def format_plan(rows: list[dict[str, Any]]) -> str:
    """A table: one line per column, one column per threshold, totals at the bottom."""
    header = ["column"] + [f"T={r['threshold_spec']}" for r in rows]
    lines = [[c] + [f"{r['table_sizes'][c]:,}" for r in rows] for c in CAT_COLUMNS]
    lines.append(["total rows"] + [f"{r['total_rows']:,}" for r in rows])
    if rows:
        lines.append(
            [f"memory (dim {rows[0]['embedding_dim']}, {rows[0]['dtype_bytes']} B)"]
            + [human_bytes(r["embedding_bytes"]) for r in rows]
        )
        lines.append(["export (SavedModel)"] + [human_bytes(r["export_bytes"]) for r in rows])
    widths = [max(len(line[i]) for line in [header] + lines) for i in range(len(header))]

    def aligned(line: list[str]) -> str:
        return "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths))
        )

    rule = ["-" * w for w in widths]
    return "\n".join(aligned(line) for line in [header, rule, *lines])
