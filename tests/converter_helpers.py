"""The converter tests' inputs: parquet splits and a counts histogram written with pyarrow in
the layout spark_jobs produces, so the expected values are known without running Spark."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dlrm_contracts import table_sizes as table_sizes_io
from dlrm_contracts.config import ConvertConfig
from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS, SPLITS

# Sizes around every dtype boundary, plus ordinary ones.
TABLE_SIZES = [
    1,
    2,
    127,
    128,
    129,
    32767,
    32768,
    32769,
    100_000,
    40,
    7,
    3000,
    1,
    500,
    60,
    129,
    128,
    32769,
    2,
    10,
    70_000,
    3,
    5000,
    12,
    300,
    9,
]
SPLIT_ROWS = {"train": 5000, "test": 1700, "validation": 1300}
BASE_THRESHOLD = 2
CONFIG = ConvertConfig(workers=2, batch_rows=700, progress=False, fsync=False)


def _value_counts(size: int, rng: np.random.Generator) -> np.ndarray:
    """Total count of the value with id i (i = 1..size-1): non-increasing, all >= the base."""
    counts = np.sort(rng.integers(BASE_THRESHOLD, 60, size - 1))[::-1]
    return counts.astype(np.int64)


def write_workdir(
    root: Path, table_sizes=TABLE_SIZES, split_rows=SPLIT_ROWS, seed=7, files=3
) -> dict[str, pa.Table]:
    """Parquet splits + model_size/preprocess/_SUCCESS + a matching counts histogram.

    Returns each split's expected rows (files concatenated in name order)."""
    rng = np.random.default_rng(seed)
    parquet = root / "parquet"
    expected = {}
    for split in SPLITS:
        (parquet / split).mkdir(parents=True)
        n = split_rows[split]
        columns = {"label": pa.array(rng.integers(0, 2, n).astype(np.int32))}
        for name in INT_COLUMNS:
            values = np.log(rng.integers(0, 10**6, n) + 3.0).astype(np.float32)
            values[rng.random(n) < 0.2] = 0.0
            columns[name] = pa.array(values)
        for name, size in zip(CAT_COLUMNS, table_sizes):
            ids = rng.integers(0, size, n).astype(np.int32)
            ids[:3] = size - 1  # the largest id occurs in every split
            columns[name] = pa.array(ids)
        table = pa.table(columns)
        expected[split] = table
        # Files created last-name-first: row order must follow the names, not creation.
        bounds = np.linspace(0, n, files + 1).astype(int)
        names = [f"part-{10**f:05d}-c000.snappy.parquet" for f in range(files)]
        for f in reversed(range(files)):
            part = table.slice(bounds[f], bounds[f + 1] - bounds[f])
            pq.write_table(part, parquet / split / names[f], row_group_size=max(1, part.num_rows // 4))
        (parquet / split / f".{names[0]}.crc").write_bytes(b"not parquet")
        (parquet / split / "_SUCCESS").write_text("")
    (parquet / "model_size.json").write_text(json.dumps(dict(zip(CAT_COLUMNS, table_sizes))))
    (parquet / "preprocess.json").write_text(json.dumps({"threshold_spec": str(BASE_THRESHOLD)}))
    (parquet / "_SUCCESS").write_text("")
    write_histogram(root / "counts", table_sizes, rng)
    return expected


def write_histogram(counts: Path, table_sizes, rng) -> None:
    histogram = {}
    for name, size in zip(CAT_COLUMNS, table_sizes):
        values, how_many = np.unique(_value_counts(size, rng), return_counts=True)
        # plus values seen once: below the base threshold
        histogram[name] = list(zip(values.tolist(), how_many.tolist())) + [(1, int(rng.integers(1, 50)))]
    counts.mkdir(parents=True)
    table_sizes_io.write_histogram(histogram, counts)
