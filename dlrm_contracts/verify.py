"""Check a split binary dataset before anyone trusts it (the trainer calls this at start).

Quick mode reads only metadata: ``_SUCCESS``, ``dataset.json`` against the format and against
``model_size.json``, and every file's size against rows × ids per row × dtype (a multi-hot
column holds its multi-hot size of ids per row). The full scan also reads every
value, in memory-mapped chunks spread over a thread pool (numpy reductions release the GIL):
labels in {0, 1}, numericals finite, every id in [0, table size). All problems found are
reported together in one :class:`DatasetError`.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from dlrm_contracts.binary_format import (
    FORMAT_VERSION,
    LABEL_DTYPE,
    LABEL_FILE,
    NUM_NUMERICAL,
    NUMERICAL_DTYPE,
    NUMERICAL_FILE,
    DamagedDatasetError,
    DatasetError,
    DatasetInfo,
    all_files,
    cat_dtype,
    dtype_name,
    file_checksum,
    file_key,
    model_size_list,
    multi_hot_sizes,
    read_info,
    read_json,
    row_width,
)
from dlrm_contracts.layout import DATASET_JSON, MODEL_SIZE_JSON, SUCCESS
from dlrm_contracts.schema import CAT_COLUMNS, NUM_CATEGORICAL, SPLITS

__all__ = ["DatasetError", "DamagedDatasetError", "DatasetInfo", "verify_dataset", "verify_checksums"]

CHUNK_ELEMENTS = 8 * 1024 * 1024
MAX_PROBLEMS = 20


def _description_problems(info: DatasetInfo, model_size: dict[str, Any]) -> list[str]:
    problems = []
    data = read_json(info.path / DATASET_JSON)
    if data.get("format_version") != FORMAT_VERSION:
        problems.append(
            f"format_version is {data.get('format_version')!r}, this reader knows {FORMAT_VERSION}"
        )
    for key, want in (
        ("label_dtype", dtype_name(LABEL_DTYPE)),
        ("numerical_dtype", dtype_name(NUMERICAL_DTYPE)),
        ("num_numerical", NUM_NUMERICAL),
    ):
        if data.get(key) != want:
            problems.append(f"{key} is {data.get(key)!r}, expected {want!r}")
    for split, rows in info.splits.items():
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
            problems.append(f"splits.{split} is {rows!r}, expected a row count")
    if len(info.table_sizes) != NUM_CATEGORICAL or len(info.cat_dtypes) != NUM_CATEGORICAL:
        problems.append(f"table_sizes / cat_dtypes must list {NUM_CATEGORICAL} entries")
        return problems
    for i, (size, name) in enumerate(zip(info.table_sizes, info.cat_dtypes)):
        try:
            want = dtype_name(cat_dtype(size))
        except (DatasetError, TypeError) as exc:
            problems.append(f"table_sizes[{i}] ({CAT_COLUMNS[i]}): {exc}")
            continue
        if name != want:
            problems.append(
                f"cat_dtypes[{i}] ({CAT_COLUMNS[i]}) is {name!r} but a table of {size} needs {want!r}"
            )
    try:
        multi_hot_sizes(info)
    except DatasetError as exc:
        problems.append(str(exc))
    try:
        sizes = model_size_list(model_size, info.path / MODEL_SIZE_JSON)
        if sizes != list(info.table_sizes):
            diff = [f"{c}: {a} vs {b}" for c, a, b in zip(CAT_COLUMNS, sizes, info.table_sizes) if a != b]
            problems.append(
                f"model_size.json disagrees with dataset.json table_sizes ({', '.join(diff[:5])})"
            )
    except DatasetError as exc:
        problems.append(str(exc))
    return problems


def _size_problems(info: DatasetInfo) -> list[str]:
    problems = []
    for split in SPLITS:
        for name in all_files():
            path = info.file(split, name)
            dtype, width = row_width(name, info)
            want = info.splits[split] * dtype.itemsize * width
            if not path.is_file():
                problems.append(f"{split}/{name} is missing")
            elif path.stat().st_size != want:
                problems.append(
                    f"{split}/{name} has {path.stat().st_size} bytes; "
                    f"{info.splits[split]} rows of {width} × {dtype.name} "
                    f"need {want}"
                )
    return problems


def _scan_file(path: Path, dtype: np.dtype, width: int, name: str, info: DatasetInfo) -> str | None:
    """First problem in one file's values, or None."""
    data = np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.empty(0, dtype)
    step = max(width, CHUNK_ELEMENTS // width * width)
    for start in range(0, len(data), step):
        chunk = data[start : start + step]
        row = start // width
        if name == LABEL_FILE:
            if chunk.max() > 1:
                bad = int(np.argmax(chunk > 1))
                return f"label {int(chunk[bad])} at row {row + bad} (labels are 0 or 1)"
        elif name == NUMERICAL_FILE:
            finite = np.isfinite(chunk)
            if not finite.all():
                bad = int(np.argmin(finite))
                return f"non-finite value {chunk[bad]} at row {row + bad // width}"
        else:
            index = int(name[len("cat_") : -len(".bin")])
            size = info.table_sizes[index]
            low, high = chunk.min(), chunk.max()
            if low < 0 or high >= size:
                bad = int(np.argmax((chunk < 0) | (chunk >= size)))
                return (
                    f"id {int(chunk[bad])} at row {row + bad // width} outside [0, {size}) "
                    f"({CAT_COLUMNS[index]})"
                )
    return None


def _value_problems(info: DatasetInfo, workers: int) -> list[str]:
    jobs = []
    for split in SPLITS:
        if info.splits[split] == 0:
            continue
        for name in all_files():
            dtype, width = row_width(name, info)
            jobs.append((split, name, info.file(split, name), dtype, width))
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="verify") as pool:
        results = pool.map(lambda j: (j[0], j[1], _scan_file(j[2], j[3], j[4], j[1], info)), jobs)
        return [f"{split}/{name}: {problem}" for split, name, problem in results if problem]


def checksum_problems(info: DatasetInfo, workers: int = 2) -> list[str]:
    """Files whose bytes differ from the checksum recorded when they were written (reads
    every file once; I/O bound, threads overlap the reads)."""
    recorded = info.checksums
    if not recorded:
        return [
            f"{DATASET_JSON} records no checksums (written before they were recorded), so "
            "its files cannot be shown intact"
        ]
    names = [file_key(split, name) for split in SPLITS for name in all_files()]
    missing = [name for name in names if name not in recorded]
    with ThreadPoolExecutor(max(1, workers), thread_name_prefix="checksum") as pool:
        found = pool.map(
            lambda name: file_checksum(info.path / name) if (info.path / name).is_file() else None, names
        )
        differ = [
            f"{name} is missing" if now is None else f"{name} differs from what was written (checksum)"
            for name, now in zip(names, found)
            if now != recorded.get(name, now)
        ]
    return [f"{name} has no recorded checksum" for name in missing] + differ


def verify_checksums(path: str | Path, workers: int = 2) -> DatasetInfo:
    """The quick check, then every file's checksum against the one recorded when it was
    written: what a derivation checks before it reuses a dataset's files.

    Raises:
        DamagedDatasetError: listing what differs (files named).
    """
    info = verify_dataset(path, full=False)
    problems = checksum_problems(info, workers)
    if problems:
        raise DamagedDatasetError(
            f"dataset {path} is not what was written: " + "; ".join(problems[:MAX_PROBLEMS]), problems
        )
    return info


def verify_dataset(
    path: str | Path, full: bool = True, workers: int = 2, require_success: bool = True
) -> DatasetInfo:
    """Check a split binary dataset before it is trusted; every problem is reported at once.

    Args:
        path: the dataset directory.
        full: also read every value (labels, finite numericals, ids inside their tables);
            False checks metadata and file sizes only, in milliseconds whatever the size.
        workers: threads of the full scan.
        require_success: refuse a dataset without ``_SUCCESS``; False for one still being
            written (the converters check their output before marking it complete).

    Returns:
        The dataset's description (``dataset.json`` plus its path).

    Raises:
        DatasetError: listing the problems found (at most 20 shown).
    """
    path = Path(path)
    if not path.is_dir():
        raise DamagedDatasetError(f"{path} is not a directory")
    if require_success and not (path / SUCCESS).is_file():
        raise DamagedDatasetError(
            f"{path} has no {SUCCESS}: the dataset is incomplete (a "
            "conversion was interrupted or is still running); convert it "
            "again"
        )
    try:
        info = read_info(path)
        problems = _description_problems(info, read_json(path / MODEL_SIZE_JSON))
    except DamagedDatasetError:
        raise
    except DatasetError as exc:  # dataset.json or model_size.json unreadable or incomplete
        raise DamagedDatasetError(str(exc)) from None
    if not problems:
        problems = _size_problems(info)
    if not problems and full:
        problems = _value_problems(info, workers)
        if not problems and info.checksums:  # the scan read every file: check what was written
            problems = checksum_problems(info, workers)
    if problems:
        shown = problems[:MAX_PROBLEMS]
        more = f"\n  … and {len(problems) - MAX_PROBLEMS} more" if len(problems) > MAX_PROBLEMS else ""
        raise DamagedDatasetError(f"dataset {path} is not valid:\n  " + "\n  ".join(shown) + more, problems)
    return info
