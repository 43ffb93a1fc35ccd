"""The Arrow engine's split writer: packed rows survive the trip, and a retried task leaves
exactly one file per partition."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS, LABEL
from spark_jobs.engines.arrow.split_writer import (
    ROW_BYTES,
    WriteSpec,
    commit,
    pack_rows,
    parquet_schema,
    unpack_rows,
    write_task,
)


def _rows(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return (
        rng.integers(0, 2, n, dtype=np.int32),
        rng.standard_normal((n, 13)).astype(np.float32),
        rng.integers(0, 2**31 - 1, (n, 26), dtype=np.int32),
    )


def test_packed_rows_round_trip_even_when_sliced():
    label, numericals, ids = _rows(1000)
    packed = pack_rows(label, numericals, ids)
    assert packed.type == pa.binary() and len(packed[0].as_py()) == ROW_BYTES
    rows = unpack_rows(packed.slice(300, 200))
    assert np.array_equal(rows["label"], label[300:500])
    assert np.array_equal(rows["num"], numericals[300:500])
    assert np.array_equal(rows["cat"], ids[300:500])


def test_rows_of_another_width_are_refused():
    with pytest.raises(ValueError, match="160 bytes"):
        unpack_rows(pa.array([b"x" * 7, b"y" * 7], pa.binary()))


def _batches(label, numericals, ids, part: int, lines: np.ndarray, size: int):
    for start in range(0, len(label), size):
        end = start + size
        yield pa.record_batch(
            {
                "_p": pa.array(np.full(len(label[start:end]), part, np.int32)),
                "_order": pa.array(lines[start:end]),
                "row": pack_rows(label[start:end], numericals[start:end], ids[start:end]),
            }
        )


def test_a_retried_partition_keeps_one_file_with_every_row_in_order(tmp_path):
    label, numericals, ids = _rows(2500, seed=1)
    spec = WriteSpec(out_dir=str(tmp_path), compression="snappy", row_group_rows=500, test_lines=1200)
    lines = np.arange(2500, dtype=np.int64)
    first = list(write_task(spec)(_batches(label, numericals, ids, 3, lines, 700)))  # "failed"
    second = list(write_task(spec)(_batches(label, numericals, ids, 3, lines, 700)))
    assert len(list(tmp_path.glob("*/part-*.parquet"))) == 4  # two attempts x two splits
    results = pa.Table.from_batches(second).to_pylist()
    assert first and results
    rows = commit(results, tmp_path)
    assert rows == {"test": 1200, "validation": 1300}
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.glob("*/part-*")) == [
        "test/part-00003.parquet",
        "validation/part-00003.parquet",
    ]
    test = pq.read_table(tmp_path / "test" / "part-00003.parquet")
    validation = pq.read_table(tmp_path / "validation" / "part-00003.parquet")
    assert test.schema.equals(parquet_schema()) and not test.schema.field(LABEL).nullable
    # row groups close once they reach row_group_rows: 700 + 500 test rows
    assert pq.ParquetFile(tmp_path / "test" / "part-00003.parquet").metadata.num_row_groups == 2
    both = pa.concat_tables([test, validation])
    assert np.array_equal(both[LABEL].to_numpy(), label)
    assert np.array_equal(np.stack([both[c].to_numpy() for c in INT_COLUMNS], 1), numericals)
    assert np.array_equal(np.stack([both[c].to_numpy() for c in CAT_COLUMNS], 1), ids)
