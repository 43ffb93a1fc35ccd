"""The Arrow engine's split rows: packed into one fixed-width binary value per row, and written
to parquet by pyarrow inside Spark's tasks.

Why packed: between the transform task and the files, Spark only moves the rows (the train
shuffle, the sort by the order keys). Forty typed columns cost the JVM a conversion per field
at every step (Arrow → rows, shuffle, rows → parquet columns); one 160-byte value plus the
keys costs it a conversion per row, and pyarrow encodes the columns in C++.

Spark still schedules every task, shuffles, sorts and joins; only the encoding of the parquet
files runs in Python. Tasks may be retried, so on a filesystem each attempt writes under a name
of its own and the driver keeps exactly the files of the attempts whose results it collected
(``commit``). Behind a URL each file is written once under its final name in the run's own
version prefix (``spark_jobs.splits.split_staging``), published later by a marker: an object
appears whole when its upload completes, and every attempt of a task writes the same bytes (its
rows and their order are fixed by the plan: sorted by the order key, or a chunk's line order),
so whichever attempt completes last leaves the same object, and nothing is copied or renamed.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlrm_contracts.schema import NUM_CATEGORICAL, NUM_INTEGER
from spark_jobs.engines.arrow import remote
from spark_jobs.splits import parquet_codec, parquet_schema, split_dir

ROW_DTYPE = np.dtype([("label", "<i4"), ("num", "<f4", (NUM_INTEGER,)), ("cat", "<i4", (NUM_CATEGORICAL,))])
ROW_BYTES = ROW_DTYPE.itemsize
RESULT_SCHEMA = "split STRING, part INT, path STRING, rows LONG"


def pack_rows(label: np.ndarray, numericals: np.ndarray, ids: np.ndarray):
    """One Arrow binary array of ROW_BYTES per row (label, 13 float32, 26 int32), zero-copy
    over one numpy buffer."""
    import pyarrow as pa

    n = len(label)
    rows = np.empty(n, ROW_DTYPE)
    rows["label"] = label
    rows["num"] = numericals
    rows["cat"] = ids
    offsets = np.arange(0, (n + 1) * ROW_BYTES, ROW_BYTES, dtype=np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(rows)])


def unpack_rows(array) -> np.ndarray:
    """The structured rows behind a binary array of packed rows (whatever its slicing)."""
    n = len(array)
    if n == 0:
        return np.empty(0, ROW_DTYPE)
    _, offsets_buf, data = array.buffers()
    offsets = np.frombuffer(offsets_buf, np.int32, n + 1, array.offset * 4)
    if offsets[-1] - offsets[0] != n * ROW_BYTES:
        raise ValueError(
            f"packed rows of {ROW_BYTES} bytes expected, got {offsets[-1] - offsets[0]} bytes for {n} rows"
        )
    return np.frombuffer(data, ROW_DTYPE, n, int(offsets[0]))


@dataclass(frozen=True)
class WriteSpec:
    """What a writer task needs; pickled with it."""

    out_dir: str  # staging: <split_dir(out_dir, split)>/part-<partition>[.<attempt>].parquet
    compression: str
    row_group_rows: int  # rows buffered per row group (bounds a worker's memory)
    test_lines: int | None  # None: every row is train; else test = _order < test_lines


class _SplitFile:
    """One split's file of one task: rows buffered into row groups, opened on the first row."""

    def __init__(self, spec: WriteSpec, split: str, part: int, token: str):
        self.spec, self.split, self.part = spec, split, part
        name = (
            f"part-{part:05d}.parquet" if remote.is_url(spec.out_dir) else f"part-{part:05d}.{token}.parquet"
        )
        self.path = remote.join(split_dir(spec.out_dir, split), name)
        self.sink = None  # behind a URL: the object's upload stream
        self.pending: list = []
        self.pending_rows = 0
        self.rows = 0
        self.writer = None

    def add(self, table) -> None:
        if table.num_rows:
            self.pending.append(table)
            self.pending_rows += table.num_rows
            if self.pending_rows >= self.spec.row_group_rows:
                self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self.pending:
            return
        table = pa.concat_tables(self.pending)
        self.pending, self.pending_rows = [], 0
        if self.writer is None:
            if remote.is_url(self.path):
                # the object appears whole when the stream closes (a multipart upload)
                fs, inner = remote.filesystem(self.path)
                self.sink = fs.open_output_stream(inner, compression=None)
            else:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(
                self.sink or self.path, table.schema, compression=parquet_codec(self.spec.compression)
            )
        self.writer.write_table(table, row_group_size=table.num_rows)
        self.rows += table.num_rows

    def close(self):
        """The task's result row for this file, or None when it got no rows."""
        self._flush()
        if self.writer is None:
            return None
        self.writer.close()
        if self.sink is not None:
            written = self.sink.tell()
            self.sink.close()
            remote.log_request("put", written)
        return self.split, self.part, str(self.path), self.rows


def split_table(label: np.ndarray, numericals_by_column, ids_by_column, schema=None):
    """The splits' table from one array per column."""
    import pyarrow as pa

    columns = [
        pa.array(label),
        *[pa.array(x) for x in numericals_by_column],
        *[x if isinstance(x, pa.Array) else pa.array(x) for x in ids_by_column],
    ]
    return pa.Table.from_arrays(columns, schema=schema or parquet_schema())


def _table(batch, schema):
    rows = unpack_rows(batch.column("row"))
    return split_table(
        rows["label"], np.ascontiguousarray(rows["num"].T), np.ascontiguousarray(rows["cat"].T), schema
    )


class PartitionFiles:
    """The files one task writes for its partition: one per split, under this attempt's name."""

    def __init__(self, spec: WriteSpec, part: int):
        self.spec, self.part = spec, part
        self.token = uuid.uuid4().hex
        self.files: dict[str, _SplitFile] = {}

    def add(self, table, lines: np.ndarray | None = None) -> None:
        """Rows of the train split, or (``lines`` given) of the last day, in line order: those
        below ``test_lines`` are test, the rest validation."""
        if lines is None:
            self._file("train").add(table)
            return
        test = int(np.count_nonzero(lines < self.spec.test_lines))
        self._file("test").add(table.slice(0, test))
        self._file("validation").add(table.slice(test))

    def _file(self, split: str) -> _SplitFile:
        if split not in self.files:
            self.files[split] = _SplitFile(self.spec, split, self.part, self.token)
        return self.files[split]

    def results(self):
        """Close the files; the result rows (split, part, path, rows) as one batch, or None."""
        import pyarrow as pa

        results = [r for r in (f.close() for f in self.files.values()) if r is not None]
        if not results:
            return None
        split, part, path, rows = zip(*results)
        return pa.record_batch(
            {
                "split": pa.array(split, pa.string()),
                "part": pa.array(part, pa.int32()),
                "path": pa.array(path, pa.string()),
                "rows": pa.array(rows, pa.int64()),
            }
        )


def write_task(spec: WriteSpec):
    """mapInArrow function over (_p, _order, row): writes this partition's rows, in
    the order they arrive, to one file per split; yields one result row per file written."""
    schema = parquet_schema()

    def run(batches):
        files = None
        for batch in batches:
            if not batch.num_rows:
                continue
            if files is None:
                files = PartitionFiles(spec, int(batch.column("_p")[0].as_py()))
            lines = None if spec.test_lines is None else batch.column("_order").to_numpy()
            files.add(_table(batch, schema), lines)
        results = files.results() if files is not None else None
        if results is not None:
            yield results

    return run


def write_partitions(frame, spec: WriteSpec) -> list:
    """Run the writer over ``frame``'s partitions (their order is the files' order)."""
    from pyspark.sql import functions as F

    return (
        frame.select(F.spark_partition_id().alias("_p"), "_order", "row")
        .mapInArrow(write_task(spec), RESULT_SCHEMA)
        .collect()
    )


def commit(results: list, staging: Path | str) -> dict[str, int]:
    """Keep the files of the collected attempts as ``<split>/part-<partition>.parquet``; delete
    what failed or duplicate attempts left behind. Returns rows per split. Behind a URL the
    files are already under their final names (no request here)."""
    rows: dict[str, int] = {}
    for r in results:
        rows[r["split"]] = rows.get(r["split"], 0) + r["rows"]
    if remote.is_url(staging):
        return rows
    kept = set()
    for r in results:
        final = Path(staging) / r["split"] / f"part-{r['part']:05d}.parquet"
        os.replace(r["path"], final)
        kept.add(final)
    for path in Path(staging).glob("*/part-*.parquet"):
        if path not in kept:
            path.unlink()
    return rows
