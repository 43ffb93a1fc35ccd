"""A dataset at a higher frequency threshold, from the binary one and the counts: no Spark.

Ids are assigned by descending count, so the values kept at T′ ≥ T are exactly ids 1..k′ of
each table, with k′ read off the count histogram. Deriving the T′ dataset is therefore a clamp
(id > k′ → 0) and, where a table shrinks below a dtype boundary, a narrower dtype. Files that
do not change (labels, numericals, tables whose size stays) are hard-linked (or copied across
filesystems); the rest are streamed in memory-mapped chunks over a thread pool. A lower
threshold would need values the dataset no longer has: that is refused (rerun spark_jobs).
A multi-hot dataset's rows depend on every table's size (dlrm_contracts.multi_hot), so its
multi-hot columns from the first one whose table shrinks on are materialized again from their
one-hot ids (each row's first id): the result is the dataset convert writes at the new
threshold.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from converters.convert import write_other_formats
from dlrm_contracts.atomic import atomic_directory, refuse_overlap
from dlrm_contracts.binary_format import (
    CHECKSUMS_KEY,
    LABEL_FILE,
    NUMERICAL_FILE,
    DamagedDatasetError,
    DatasetError,
    DatasetInfo,
    MULTI_HOT_KEYS,
    cat_dtype,
    cat_file,
    checksum_text,
    describe,
    file_key,
    new_checksum,
    write_json,
)
from dlrm_contracts.config import ConvertConfig
from dlrm_contracts.dataset_identity import DICTIONARIES_FINGERPRINT_KEY
from dlrm_contracts.id_modes import recorded_or_default
from dlrm_contracts.multi_hot import MultiHotSpec, iter_tables, materialize, spec_of_dataset
from dlrm_contracts.layout import DATASET_JSON, MODEL_SIZE_JSON
from dlrm_contracts.progress import counting
from dlrm_contracts.schema import CAT_COLUMNS, SPLITS
from dlrm_contracts.table_sizes import new_table_sizes, written_threshold_spec
from dlrm_contracts.thresholds import ThresholdSpec, parse_threshold_spec
from dlrm_contracts.verify import verify_checksums, verify_dataset

log = logging.getLogger(__name__)


def _link_or_copy(source: Path, target: Path, link: bool) -> None:
    if link:
        try:
            os.link(source, target)
            return
        except OSError:
            pass
    shutil.copyfile(source, target)


def clamp_ids_file(source: Path, target: Path, old_dtype: np.dtype, new_size: int, chunk_rows: int) -> str:
    """Copy ids, with ids >= new_size set to 0, in the dtype of a table of new_size; returns
    the checksum of what was written."""
    new_dtype = cat_dtype(new_size)
    digest = new_checksum()
    ids = np.memmap(source, dtype=old_dtype, mode="r") if source.stat().st_size else np.empty(0, old_dtype)
    with open(target, "wb") as out:
        for start in range(0, len(ids), chunk_rows):
            chunk = ids[start : start + chunk_rows]
            dropped = chunk >= new_size
            narrowed = chunk.astype(new_dtype)  # dropped ids may wrap here; zeroed next
            narrowed[dropped] = 0
            data = memoryview(narrowed).cast("B")
            out.write(data)
            digest.update(data)
    return checksum_text(digest)


def rematerialize_ids_file(
    source: Path,
    target: Path,
    old_dtype: np.dtype,
    width: int,
    new_size: int,
    table: np.ndarray,
    chunk_rows: int,
) -> str:
    """A multi-hot column at new table sizes: each row's first id is its one-hot id (row r of
    a lookup table starts with r), clamped like a one-hot column, then materialized again with
    the lookup table of the new sizes (every draw depends on them); returns the checksum."""
    digest = new_checksum()
    ids = (
        np.memmap(source, dtype=old_dtype, mode="r").reshape(-1, width)
        if source.stat().st_size
        else np.empty((0, width), old_dtype)
    )
    with open(target, "wb") as out:
        for start in range(0, len(ids), chunk_rows):
            one_hot = ids[start : start + chunk_rows, 0].astype(np.int64)
            one_hot[one_hot >= new_size] = 0
            data = memoryview(materialize(one_hot, table)).cast("B")
            out.write(data)
            digest.update(data)
    return checksum_text(digest)


def _rewritten_multi_hot(info: DatasetInfo, sizes) -> tuple[MultiHotSpec | None, set[int]]:
    """The source's materialization at the new sizes, and the multi-hot columns whose rows
    change: those whose draws come after a multi-hot column whose table changed size (one
    stream runs through the columns in order)."""
    old = spec_of_dataset(info)
    if old is None:
        return None, set()
    new = dataclasses.replace(old, table_sizes=tuple(sizes))
    changed, columns = False, set()
    for c, k in enumerate(old.sizes):
        if k > 1:
            changed = changed or old.table_sizes[c] != new.table_sizes[c]
            if changed:
                columns.add(c)
    return new, columns


def _intact_source(source: Path, config: ConvertConfig) -> DatasetInfo:
    """The source dataset, shown intact before any of its files is reused: the quick check,
    then (``config.verify_checksums``) every file against its recorded checksum.

    Raises:
        DamagedDatasetError: the source is incomplete, unreadable or not what was written
            (rebuild it from the parquet, never derive from it).
    """
    try:
        if config.verify_checksums:
            return verify_checksums(source, config.workers)
        return verify_dataset(source, full=False)
    except DamagedDatasetError:
        raise
    except DatasetError as exc:
        raise DamagedDatasetError(str(exc)) from None


def rethreshold(
    source_binary_dir: str | Path,
    counts_dir: str | Path,
    spec: str | int | ThresholdSpec,
    output_dir: str | Path,
    config: ConvertConfig | None = None,
    recorded_as: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """Write the dataset at a higher threshold from an existing one, without Spark.

    Ids are ordered by count, so raising the threshold only maps the ids past each new table
    size to 0; the count histogram gives those sizes. Tables that do not shrink are hard-linked
    (``config.link_unchanged``) rather than copied.

    Args:
        source_binary_dir: a complete dataset whose ``dataset.json`` records its threshold.
        counts_dir: the counts of the same run (its histogram must give the source's sizes).
        spec: the new threshold spec; at least the source's for every column.
        output_dir: where the new dataset goes, atomically (must not overlap the inputs).
        config: workers, fsync, overwrite, link_unchanged; defaults to ``ConvertConfig()``.
        recorded_as: (source, counts) as ``dataset.json`` names them, when the two directories
            are local copies of published ones (a workdir URL); None = their paths.

    Returns:
        A summary: rows, threshold specs (new and base), table sizes before and after, the
        columns rewritten, bytes written, seconds.

    Raises:
        LowerThresholdError: ``spec`` would need values already merged into id 0 (rerun Spark).
        DamagedDatasetError: the source is incomplete or its files are not what was written
            (rebuild it from the parquet).
        DatasetError: the source has no threshold, or the counts belong to another dataset.
    """
    config = config or ConvertConfig()
    source, output = Path(source_binary_dir), Path(output_dir)
    refuse_overlap(output, {"source dataset": source, "counts": counts_dir})
    info = _intact_source(source, config)
    mode = recorded_or_default(info.extra)
    base = written_threshold_spec(info.threshold_spec, source) if mode.other_thresholds_readable else None
    new = parse_threshold_spec(spec)
    refusal = mode.threshold_refusal(new, base)
    if refusal is not None:
        raise DatasetError(f"{source} has {refusal}; {mode.threshold_remedy}")
    assert base is not None  # every mode whose threshold may change has one
    sizes = new_table_sizes(counts_dir, base, new, info.table_sizes)
    multi, rematerialized = _rewritten_multi_hot(info, sizes)
    start = time.perf_counter()
    # Files reused as they are keep the source's checksums (recorded when it was written;
    # checked above when config.verify_checksums), the rewritten ones get their own below.
    checksums = dict(info.checksums)
    with atomic_directory(output, overwrite=config.overwrite, fsync=config.fsync) as tmp:
        jobs = _link_unchanged(info, sizes, tmp, config.link_unchanged, rematerialized)
        tables = (
            dict(
                iter_tables(
                    multi, rematerialized, allocate=lambda c, shape, _d: np.empty(shape, cat_dtype(sizes[c]))
                )
            )
            if rematerialized
            else {}
        )
        checksums.update(_clamp_files(jobs, config, tables))
        del tables
        written = sum(job.target.stat().st_size for job in jobs)
        extra = _output_extra(info, source, counts_dir, checksums, recorded_as)
        result = describe(tmp, info.splits, sizes, str(new), info.source_fingerprint, extra)
        write_json(tmp / MODEL_SIZE_JSON, result.model_size)
        write_json(tmp / DATASET_JSON, result.to_json())
        verify_dataset(tmp, full=config.verify_full, require_success=False)
    seconds = time.perf_counter() - start
    log.info("rethreshold %s -> %s: %d rows in %.2f s", base, new, sum(info.splits.values()), seconds)
    return {
        **_summary(output, info, base, result, jobs, written, seconds),
        **write_other_formats(output, config),
    }


@dataclass(frozen=True)
class _ClampJob:
    """One ids file of a table that shrinks: rewritten, not linked."""

    column: int  # index into CAT_COLUMNS
    source: Path
    target: Path
    old_dtype: np.dtype
    new_size: int
    width: int = 1  # ids per row (multi-hot size)


def _link_unchanged(
    info: DatasetInfo, sizes: list[int] | tuple[int, ...], tmp: Path, link: bool, rematerialized: set[int]
) -> list[_ClampJob]:
    """Lay out the new dataset's splits: labels, numericals and the tables that keep their size
    (and, multi-hot, their rows) linked (or copied) from the source; the files of the other
    tables are returned."""
    jobs = []
    for split in SPLITS:
        (tmp / split).mkdir()
        for name in (LABEL_FILE, NUMERICAL_FILE):
            _link_or_copy(info.file(split, name), tmp / split / name, link)
        for i, (old_size, new_size) in enumerate(zip(info.table_sizes, sizes)):
            name = cat_file(i)
            if new_size == old_size and i not in rematerialized:
                _link_or_copy(info.file(split, name), tmp / split / name, link)
            else:
                jobs.append(
                    _ClampJob(
                        i,
                        info.file(split, name),
                        tmp / split / name,
                        np.dtype(info.cat_dtypes[i]),
                        new_size,
                        info.multi_hot_sizes[i],
                    )
                )
    return jobs


def _clamp_files(
    jobs: list[_ClampJob], config: ConvertConfig, tables: dict[int, np.ndarray]
) -> dict[str, str]:
    """Write every clamped (or materialized again) file over the thread pool; their checksums
    by file key."""
    checksums = {}
    with (
        ThreadPoolExecutor(max(1, config.workers), thread_name_prefix="rethreshold") as pool,
        counting("convert", len(jobs), "files", phase="rethreshold", enabled=config.progress) as bar,
    ):
        futures = [
            pool.submit(
                rematerialize_ids_file,
                job.source,
                job.target,
                job.old_dtype,
                job.width,
                job.new_size,
                tables[job.column],
                config.batch_rows,
            )
            if job.column in tables
            else pool.submit(
                clamp_ids_file, job.source, job.target, job.old_dtype, job.new_size, config.batch_rows * 8
            )
            for job in jobs
        ]
        for job, future in zip(jobs, futures):
            checksums[file_key(job.target.parent.name, job.target.name)] = future.result()
            bar.update(1)
    return checksums


def _output_extra(
    info: DatasetInfo,
    source: Path,
    counts_dir: str | Path,
    checksums: dict[str, str],
    recorded_as: tuple[str, str] | None = None,
) -> dict[str, Any]:
    """What dataset.json records beyond the format: where the dataset came from, and the
    checksums of every file (reused ones keep the source's)."""
    source_text, counts_text = recorded_as or (str(source.absolute()), str(Path(counts_dir).absolute()))
    extra = {
        "source": {
            "kind": "binary",
            "path": source_text,
            "threshold_spec": info.threshold_spec,
            "source_fingerprint": info.source_fingerprint,
        },
        "counts": counts_text,
        # same dictionaries: the kept values are a prefix of their ids
        DICTIONARIES_FINGERPRINT_KEY: info.extra.get(DICTIONARIES_FINGERPRINT_KEY),
        **({"ids": info.extra["ids"]} if "ids" in info.extra else {}),
        **{key: info.extra[key] for key in MULTI_HOT_KEYS if key in info.extra},
    }
    if info.checksums:  # all or none: a dataset without them cannot be shown intact
        extra[CHECKSUMS_KEY] = dict(sorted(checksums.items()))
    return extra


def _summary(
    output: Path,
    info: DatasetInfo,
    base: ThresholdSpec,
    result: DatasetInfo,
    jobs: list[_ClampJob],
    written: int,
    seconds: float,
) -> dict[str, Any]:
    """What a rethreshold made of ``info``'s dataset (its threshold ``base``): ``result``, at
    the threshold it records, by ``jobs``."""
    rows = sum(info.splits.values())
    return {
        "output": str(output),
        "rows": dict(info.splits),
        "threshold_spec": result.threshold_spec,
        "base_threshold_spec": str(base),
        "table_sizes_before": info.model_size,
        "table_sizes": result.model_size,
        "cat_dtypes": list(result.cat_dtypes),
        "columns_rewritten": [CAT_COLUMNS[i] for i in sorted({job.column for job in jobs})],
        "bytes_written": written,
        "seconds": round(seconds, 3),
        "rows_per_second": round(rows / seconds) if seconds else None,
    }
