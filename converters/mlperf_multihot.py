"""The MLPerf DLRMv2 reference's multi-hot dataset, written from our split binary dataset.

What the reference's ``materialize_synthetic_multihot_dataset.py`` writes (with
``--copy_labels_and_dense``) and its ``MultiHotCriteoIterDataPipe`` / ``dlrm_main.py
--synthetic_multi_hot_criteo_path`` read, so an MLPerf user takes the directory as is:

* ``day_<d>_sparse_multi_hot.npz``, d = 0..23: an uncompressed npz (the reader memory-maps its
  entries and asserts they are stored) with entries ``0``..``25``, each an int32 array of rows
  x k ids (k = the column's multi-hot size, 1 for a one-hot column);
* ``day_<d>_dense.npy`` (float32, rows x 13) and ``day_<d>_labels.npy`` (int32, rows x 1),
  TorchRec's in-memory binary layout. The dense values are ours (log(x + 3), float16-rounded),
  not TorchRec's log(x - min + 2) of its own preprocessing;
* the reader trains on days 0..22 in order and splits day 23 into validation (its first
  ⌈n/2⌉ rows) and test (the rest). Our train split, in row order, is cut into 23 contiguous
  days of near-equal rows (the reader sees one row stream, so where a day ends does not
  matter); day 23 is our test split followed by our validation split, which is the last raw
  day in line order (our test is its first ⌈n/2⌉ lines: the reference's validation half);
* ``mlperf_multihot.json``: what it came from, rows per day, and the ``dlrm_main.py`` flags
  that must match (``--num_embeddings_per_feature``, ``--multi_hot_sizes``).

The ids are the binary dataset's, already materialized (dlrm_contracts.multi_hot), so the
npz hold exactly what the reference script makes from the same one-hot ids. Every array is
streamed from the memory-mapped binary files in chunks into the zip entries and .npy files:
memory stays at one chunk whatever a day's size. The directory is written atomically.
"""

from __future__ import annotations

import json
import time
import zipfile
from pathlib import Path
from typing import Any, BinaryIO, Iterator

import numpy as np

from dlrm_contracts.atomic import atomic_directory, refuse_overlap
from dlrm_contracts.binary_format import (
    LABEL_DTYPE,
    LABEL_FILE,
    NUM_NUMERICAL,
    NUMERICAL_DTYPE,
    NUMERICAL_FILE,
    DatasetInfo,
    cat_file,
)
from dlrm_contracts.config import ConvertConfig
from dlrm_contracts.schema import NUM_CATEGORICAL
from dlrm_contracts.verify import verify_dataset

FORMAT = "mlperf_multihot"
DAYS = 24  # the reference reads day_0 .. day_23 (torchrec.datasets.criteo.DAYS)
TRAIN_DAYS = DAYS - 1
DESCRIPTION = "mlperf_multihot.json"
IDS_DTYPE = np.dtype("<i4")  # the reader refuses any other
DENSE_DTYPE = np.dtype("<f4")
LABELS_DTYPE = np.dtype("<i4")


def output_dir(binary_dir: str | Path) -> Path:
    """Where the layout goes beside a binary dataset: ``DIR/mlperf_multihot`` for a workdir's
    ``DIR/binary``, else ``<name>_mlperf_multihot``."""
    binary_dir = Path(binary_dir)
    name = FORMAT if binary_dir.name == "binary" else f"{binary_dir.name}_{FORMAT}"
    return binary_dir.parent / name


def day_slices(train_rows: int) -> list[slice]:
    """The train split's rows of days 0..22: contiguous, in order, sizes differing by <= 1."""
    share, extra = divmod(train_rows, TRAIN_DAYS)
    bounds = np.cumsum([0] + [share + (d < extra) for d in range(TRAIN_DAYS)])
    return [slice(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def _day_pieces(info: DatasetInfo) -> list[list[tuple[str, slice]]]:
    """Per day, the (split, rows) it is made of, in order."""
    days = [[("train", s)] for s in day_slices(info.splits["train"])]
    days.append(
        [("test", slice(0, info.splits["test"])), ("validation", slice(0, info.splits["validation"]))]
    )
    return days


def _rows(info: DatasetInfo, split: str, name: str, dtype: np.dtype, width: int, rows: slice) -> np.ndarray:
    """A memory map of rows ``rows`` of one binary file (rows x width)."""
    path = info.file(split, name)
    count = rows.stop - rows.start
    if count == 0:
        return np.empty((0, width), dtype)
    return np.memmap(
        path, dtype=dtype, mode="r", offset=rows.start * width * dtype.itemsize, shape=(count, width)
    )


def _chunks(pieces, info, name, dtype, width, chunk_rows) -> Iterator[np.ndarray]:
    for split, rows in pieces:
        data = _rows(info, split, name, dtype, width, rows)
        for start in range(0, len(data), chunk_rows):
            yield data[start : start + chunk_rows]


def _write_npy(
    handle: BinaryIO, shape: tuple[int, int], dtype: np.dtype, chunks: Iterator[np.ndarray]
) -> None:
    """An .npy stream (the header np.save writes, then C-order data) from chunks of rows."""
    np.lib.format.write_array_header_1_0(
        handle, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    )
    for chunk in chunks:
        handle.write(memoryview(np.ascontiguousarray(chunk, dtype=dtype)).cast("B"))


def _write_day(info: DatasetInfo, day: int, pieces, folder: Path, chunk_rows: int) -> int:
    rows = sum(r.stop - r.start for _, r in pieces)
    sizes = info.multi_hot_sizes
    # np.savez's own way: stored entries, each opened with zip64 (the reader's offset rule
    # expects the zip64 extra field np.savez writes).
    with zipfile.ZipFile(
        folder / f"day_{day}_sparse_multi_hot.npz", "w", compression=zipfile.ZIP_STORED, allowZip64=True
    ) as npz:
        for c in range(NUM_CATEGORICAL):
            dtype = np.dtype(info.cat_dtypes[c]).newbyteorder("<")
            with npz.open(f"{c}.npy", "w", force_zip64=True) as entry:
                _write_npy(
                    entry,
                    (rows, sizes[c]),
                    IDS_DTYPE,
                    _chunks(pieces, info, cat_file(c), dtype, sizes[c], chunk_rows),
                )
    for name, part, source, width, dtype in (
        (NUMERICAL_FILE, "dense", NUMERICAL_DTYPE, NUM_NUMERICAL, DENSE_DTYPE),
        (LABEL_FILE, "labels", LABEL_DTYPE, 1, LABELS_DTYPE),
    ):
        with open(folder / f"day_{day}_{part}.npy", "wb") as handle:
            _write_npy(handle, (rows, width), dtype, _chunks(pieces, info, name, source, width, chunk_rows))
    return rows


def write_mlperf_multihot(
    binary_dir: str | Path, target: str | Path | None = None, config: ConvertConfig | None = None
) -> dict[str, Any]:
    """Write the reference's multi-hot layout of a complete split binary dataset.

    Args:
        binary_dir: the dataset (one-hot or multi-hot; checked quickly first).
        target: the output directory; default :func:`output_dir`. Replaced atomically.
        config: batch_rows (rows per chunk), fsync, overwrite.

    Returns:
        A summary: output, rows per day, bytes, seconds, and the reader's flags.
    """
    config = config or ConvertConfig()
    info = verify_dataset(binary_dir, full=False)
    target = Path(target) if target is not None else output_dir(binary_dir)
    refuse_overlap(target, {"binary dataset": Path(binary_dir)})
    start = time.perf_counter()
    with atomic_directory(target, overwrite=config.overwrite, fsync=config.fsync) as tmp:
        rows = [
            _write_day(info, d, pieces, tmp, config.batch_rows) for d, pieces in enumerate(_day_pieces(info))
        ]
        description = {
            "format": FORMAT,
            "source": str(Path(binary_dir).absolute()),
            "source_fingerprint": info.source_fingerprint,
            "threshold_spec": info.threshold_spec,
            "rows_per_day": rows,
            "dlrm_main_flags": {
                "--num_embeddings_per_feature": ",".join(map(str, info.table_sizes)),
                "--multi_hot_sizes": ",".join(map(str, info.multi_hot_sizes)),
            },
        }
        (tmp / DESCRIPTION).write_text(json.dumps(description, indent=1) + "\n")
        written = sum(p.stat().st_size for p in tmp.iterdir())
    return {
        "output": str(target),
        "rows_per_day": rows,
        "bytes_written": written,
        "seconds": round(time.perf_counter() - start, 3),
        **description["dlrm_main_flags"],
    }
