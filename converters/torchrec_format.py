"""TorchRec's in-memory binary Criteo layout, written in the same pass as the split binary.

TorchRec's ``InMemoryBinaryCriteoIterDataPipe`` (and the ``dlrm_main.py`` built on it) reads 24
day files ``day_<k>_{dense,sparse,labels}.npy``: days 0-22 are train, day 23 is split in two
(its first ceil(n/2) rows are the "val" stage, the rest "test"). Each file is a plain 2-D
``.npy``: dense float32 (rows, 13) already log-transformed (the reader applies nothing),
sparse int64 (rows, 26), labels int32 (rows, 1). The reader takes each sparse value modulo the
table size it is given (``--num_embeddings_per_feature``); our ids are already below their
table size, so that modulo leaves them unchanged.

How our splits map onto those days (docs/converters.md, "TorchRec layout"):
  * train rows, in their parquet order, are cut into 23 consecutive files of near-equal size,
    so an unmodified dlrm_main.py finds every day it reads (our train split is one shuffle
    over all train days, so a day boundary carries no meaning here);
  * day 23 is the last day in input line order: our test rows (its first ceil(n/2) lines),
    then our validation rows, so TorchRec's "val" stage reads our test split and its "test"
    stage our validation split.

Each ``.npy`` header is written first (the row counts are known from the parquet metadata)
and the rows are written at their offsets as the batches arrive: one pass, memory bounded by
a batch, and every file's row count is checked when it is closed (rows in = rows out).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from dlrm_contracts.binary_format import DatasetError, write_json
from dlrm_contracts.schema import CAT_COLUMNS, INT_COLUMNS

TORCHREC_DIR = "torchrec"
TORCHREC_JSON = "torchrec.json"
DAYS = 24  # torchrec.datasets.criteo.DAYS: dlrm_main.py reads exactly these day files
TRAIN_DAYS = DAYS - 1
EVAL_DAY = DAYS - 1
DENSE_DTYPE = np.dtype("<f4")
SPARSE_DTYPE = np.dtype("<i8")
LABEL_DTYPE = np.dtype("<i4")
# (file part, dtype, columns) as TorchRec's tsv_to_npys writes them
PARTS = (
    ("dense", DENSE_DTYPE, len(INT_COLUMNS)),
    ("sparse", SPARSE_DTYPE, len(CAT_COLUMNS)),
    ("labels", LABEL_DTYPE, 1),
)


def day_file(day: int, part: str) -> str:
    return f"day_{day}_{part}.npy"


def train_day_rows(rows: int, days: int = TRAIN_DAYS) -> list[int]:
    """Near-equal consecutive pieces: day k holds rows [floor(k*rows/days), floor((k+1)*rows/days))."""
    bounds = [k * rows // days for k in range(days + 1)]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def split_placement(split_rows: dict[str, int]) -> dict[str, list[tuple[int, int, int]]]:
    """Per split, where its rows go in order: (day, first row in that day's file, rows)."""
    placement: dict[str, list[tuple[int, int, int]]] = {
        "train": [(day, 0, n) for day, n in enumerate(train_day_rows(split_rows["train"]))],
        "test": [(EVAL_DAY, 0, split_rows["test"])],
        "validation": [(EVAL_DAY, split_rows["test"], split_rows["validation"])],
    }
    return placement


def day_rows(split_rows: dict[str, int]) -> list[int]:
    return train_day_rows(split_rows["train"]) + [split_rows["test"] + split_rows["validation"]]


def _header(dtype: np.dtype, shape: tuple[int, int]) -> bytes:
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buffer, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    )
    return buffer.getvalue()


@dataclass
class _NpyFile:
    """One preallocated ``.npy`` file whose rows are written at their offsets."""

    path: Path
    dtype: np.dtype
    shape: tuple[int, int]
    fd: int = -1
    data_offset: int = 0
    written: int = 0

    def open(self) -> None:
        header = _header(self.dtype, self.shape)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(self.fd, header)
        self.data_offset = len(header)
        os.ftruncate(self.fd, self.data_offset + self.shape[0] * self.shape[1] * self.dtype.itemsize)

    def write(self, first_row: int, values: np.ndarray) -> None:
        data = np.ascontiguousarray(values, dtype=self.dtype)
        offset = self.data_offset + first_row * self.shape[1] * self.dtype.itemsize
        view = memoryview(data).cast("B")
        while view:  # pwrite may write less than asked
            done = os.pwrite(self.fd, view, offset)
            view, offset = view[done:], offset + done
        self.written += data.shape[0]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _columns(batch: pa.RecordBatch, names: tuple[str, ...], dtype: np.dtype) -> np.ndarray:
    return np.stack(
        [
            batch.column(batch.schema.get_field_index(n))
            .to_numpy(zero_copy_only=False)
            .astype(dtype, copy=False)
            for n in names
        ],
        axis=1,
    )


@dataclass
class TorchrecWriter:
    """Writes the 72 day files of one dataset from the record batches convert already reads."""

    out_dir: Path
    split_rows: dict[str, int]
    table_sizes: list[int]
    files: dict[tuple[int, str], _NpyFile] = field(default_factory=dict)
    cursor: dict[str, int] = field(default_factory=dict)

    def open(self) -> "TorchrecWriter":
        self.out_dir.mkdir()
        for day, rows in enumerate(day_rows(self.split_rows)):
            for part, dtype, width in PARTS:
                npy = _NpyFile(self.out_dir / day_file(day, part), dtype, (rows, width))
                self.files[(day, part)] = npy
                npy.open()
        self.cursor = {split: 0 for split in self.split_rows}
        return self

    def write(self, split: str, batch: pa.RecordBatch, where: str) -> None:
        """Append one batch of ``split`` (batches arrive in order, one at a time per split)."""
        start = self.cursor[split]
        if start + batch.num_rows > self.split_rows[split]:
            raise DatasetError(
                f"{where}: {split} has more rows than its parquet metadata says ({self.split_rows[split]})"
            )
        arrays = {
            "dense": _columns(batch, INT_COLUMNS, DENSE_DTYPE),
            "sparse": _columns(batch, CAT_COLUMNS, SPARSE_DTYPE),
            "labels": _columns(batch, ("label",), LABEL_DTYPE),
        }
        done = 0  # rows of the split before the current piece
        for day, first, rows in split_placement(self.split_rows)[split]:
            lo, hi = max(start, done), min(start + batch.num_rows, done + rows)
            if lo < hi:
                for part, values in arrays.items():
                    self.files[(day, part)].write(first + lo - done, values[lo - start : hi - start])
            done += rows
        self.cursor[split] = start + batch.num_rows

    def close(self) -> None:
        for npy in self.files.values():
            npy.close()

    def finish(self) -> dict[str, Any]:
        """Close every file, check each got exactly its rows, write torchrec.json."""
        self.close()
        short = [
            f"{npy.path.name}: {npy.written} of {npy.shape[0]} rows"
            for npy in self.files.values()
            if npy.written != npy.shape[0]
        ]
        if short:
            raise DatasetError(f"{self.out_dir}: TorchRec files not filled: {'; '.join(short)}")
        description = describe(self.split_rows, self.table_sizes)
        write_json(self.out_dir / TORCHREC_JSON, description)
        return description


def describe(split_rows: dict[str, int], table_sizes: list[int]) -> dict[str, Any]:
    """torchrec.json: what the files hold and how dlrm_main.py is pointed at them."""
    return {
        "layout": "torchrec InMemoryBinaryCriteoIterDataPipe",
        "days": DAYS,
        "rows_per_day": day_rows(split_rows),
        "splits": {
            "train": f"day_0..day_{TRAIN_DAYS - 1}",
            "test": f"day_{EVAL_DAY} rows [0, {split_rows['test']}) = TorchRec's 'val'"
            " stage when the last day had no rejected line",
            "validation": f"day_{EVAL_DAY} rows [{split_rows['test']}, "
            f"{split_rows['test'] + split_rows['validation']})",
        },
        "dense": {
            "dtype": "float32",
            "columns": list(INT_COLUMNS),
            "transform": "log(x + 3); missing or x <= -3 -> 0 (already applied)",
        },
        "sparse": {
            "dtype": "int64",
            "columns": list(CAT_COLUMNS),
            "ids": "this dataset's ids, each below its table size",
        },
        "labels": {"dtype": "int32", "shape": "(rows, 1)"},
        "num_embeddings_per_feature": list(table_sizes),
        "dlrm_main_flags": [
            "--in_memory_binary_criteo_path",
            "<this directory>",
            "--num_embeddings_per_feature",
            ",".join(str(s) for s in table_sizes),
        ],
    }
