"""A value group's dictionary part and index region, made in the merge before the ids exist;
only the ids are filled in after the barrier.

Why: a value's id needs every group's count histogram, which exists only once the whole merge
is done. Everything else about a kept value (its hex string, its count, its dictionary row, its
index slot) is known in the merge, while the group's totals are in memory. The merge therefore
stages the group's part with each row's rank among the group's values of the same count in the
id column, and its index region with each slot pointing at its row. After the barrier each id
is ``first id of its count class + rank``: the dictionaries phase writes 4 bytes per value into
the part and rewrites the region's slots, instead of formatting, encoding and hashing every
kept value while the rest of the job waits (docs/perf-history.md, "At the Terabyte's cardinality").

The part keeps the dictionaries' format (value, id, count), so readers are unchanged. The ids
are written in place, which is sound because the part is written so that its id column is a
plain array at a known place: Parquet's PLAIN encoding of a REQUIRED int32 column,
uncompressed, without statistics, one data page per row group; its values are then the last
``4 * rows`` bytes of each row group's column chunk. Before any byte is written, the bytes there
are compared with the ranks the merge wrote (or, for a retried task, the ids): a file of any
other shape is an error, never patched.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np

from dlrm_contracts.hex_text import format_hex
from spark_jobs.engines.arrow import dictionary_index
from spark_jobs.engines.arrow.value_counts import Counts, class_index

# Rows per row group of a part, and the most rows a data page may hold: one page per row group
# is what makes the id column a plain array (pyarrow's default splits pages at 20,000 rows).
PART_ROW_GROUP_ROWS = 1 << 20
_ID_BYTES = 4


def _paths(directory: str, group: int) -> tuple[Path, Path, Path, Path]:
    """The staged part, its rows (class index and rank per value), its classes, its region."""
    base = Path(directory) / f"part-{group:07d}"
    return (base.with_suffix(".parquet"), base.with_suffix(".rows.npy"),
            base.with_suffix(".classes.npy"), base.with_suffix(".region.npy"))


def stage_group(directory: str, group: int, totals: Counts, histogram_counts: np.ndarray,
                minimum: int) -> int:
    """Stage a group's part and index region from its totals (values ascending) and the
    counts of their histogram (ascending); returns the values kept. Every file is replaced
    whole, so a retried merge task rewrites its own."""
    from spark_jobs.engines.arrow.kernels import build_region, ranks_in_class

    kept = totals.counts >= minimum
    if not kept.any():
        return 0
    values, counts = totals.values[kept], totals.counts[kept]
    classes = histogram_counts[histogram_counts >= minimum]    # the group's kept counts
    in_class = class_index(classes, counts)
    ranks = np.empty(len(values), np.int64)
    ranks_in_class(in_class, np.zeros(len(classes), np.int64), ranks)
    part, rows, classes_path, region_path = _paths(directory, group)
    _write_part(part, values, ranks.astype(np.int32), counts)
    region = np.zeros(dictionary_index.region_slots(len(values)), np.uint64)
    build_region(np.ascontiguousarray(values, np.uint32),
                 np.arange(1, len(values) + 1, dtype=np.int32), region)
    save_array(rows, np.stack([in_class.astype(np.int32), ranks.astype(np.int32)]))
    save_array(classes_path, classes.astype(np.int64))
    save_array(region_path, region)
    return len(values)


def fill_group(directory: str, group: int, classes: np.ndarray, class_first: np.ndarray,
               part_path: Path, index_dir: str, column: str, region: tuple[int, int]) -> int:
    """After the barrier: the staged part's ids filled in and the part moved to ``part_path``,
    the region's slots given their ids and written into the index, the staged files removed
    (by the tasks, in parallel, rather than by the driver after them). Returns the values
    kept."""
    from spark_jobs.engines.arrow.kernels import relabel_region

    staged, rows_path, classes_path, region_path = _paths(directory, group)
    if not rows_path.exists() and part_path.exists():     # a retried task: this group is done
        import pyarrow.parquet as pq
        return pq.ParquetFile(part_path).metadata.num_rows
    if not np.array_equal(np.load(classes_path), classes):
        raise ValueError(f"value group {group}: the staged dictionary part's counts differ from "
                         f"the histogram's (a stale staging directory {directory}?)")
    in_class, ranks = np.load(rows_path)
    ids = (class_first[in_class] + ranks).astype(np.int32)
    source = staged if staged.exists() else part_path     # a retried task: already moved
    fill_ids(source, ranks, ids)
    if source == staged:
        part_path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, part_path)
    slots = np.load(region_path)
    if len(slots) != region[1]:
        raise ValueError(f"value group {group}: a staged index region of {len(slots)} slots "
                         f"where the index has {region[1]}")
    relabel_region(slots, ids)
    dictionary_index.write_built_region(index_dir, column, region[0], slots)
    for path in (region_path, classes_path, rows_path):   # the rows last: they mark it undone
        path.unlink()
    return len(ids)


def fill_ids(path: Path, placeholders: np.ndarray, ids: np.ndarray) -> None:
    """Write ``ids`` over the id column of a part written by ``_write_part`` with
    ``placeholders`` there (or already ``ids``: a retry)."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata
    column = meta.schema.to_arrow_schema().get_field_index("id")
    fd = os.open(path, os.O_RDWR)
    try:
        start = 0
        for r in range(meta.num_row_groups):
            group = meta.row_group(r)
            chunk, rows = group.column(column), group.num_rows
            offset = chunk.data_page_offset + chunk.total_compressed_size - _ID_BYTES * rows
            found = np.frombuffer(os.pread(fd, _ID_BYTES * rows, offset), "<i4")
            want = np.ascontiguousarray(ids[start:start + rows], "<i4")
            if chunk.compression != "UNCOMPRESSED" or not (
                    np.array_equal(found, placeholders[start:start + rows])
                    or np.array_equal(found, want)):
                raise ValueError(f"{path}: its id column is not where this job writes it; "
                                 f"delete the workdir's counts/.totals and run again")
            if os.pwrite(fd, want.tobytes(), offset) != want.nbytes:
                raise OSError(f"{path}: short write of its ids")
            start += rows
    finally:
        os.close(fd)
    if start != len(ids):
        raise ValueError(f"{path}: {start} rows where {len(ids)} were staged")


def _write_part(path: Path, values: np.ndarray, ids: np.ndarray, counts: np.ndarray) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([pa.field("value", pa.string(), nullable=False),
                        pa.field("id", pa.int32(), nullable=False),
                        pa.field("count", pa.int64(), nullable=False)])
    table = pa.table({"value": format_hex(values), "id": pa.array(ids, pa.int32()),
                      "count": pa.array(counts.astype(np.int64, copy=False))}, schema=schema)
    # statistics only for the values (a reader's range filter uses them); the ids' would be the
    # placeholders', and the counts' cost more than they serve
    write_atomically(path, lambda temporary: pq.write_table(
        table, temporary, row_group_size=PART_ROW_GROUP_ROWS,
        max_rows_per_page=PART_ROW_GROUP_ROWS, data_page_size=1 << 30, data_page_version="1.0",
        use_dictionary=["count"], compression={"value": "snappy", "id": "none", "count": "snappy"},
        write_statistics=["value"]))


def save_array(path: Path, array: np.ndarray) -> None:
    """One .npy file, replaced whole (np.save is given a file: given a name it would add .npy)."""
    def write(temporary: Path) -> None:
        with open(temporary, "wb") as out:
            np.save(out, array, allow_pickle=False)
    write_atomically(path, write)


def write_atomically(path: Path, write) -> None:
    """``write(temporary)``, then the temporary renamed onto ``path``: a retried task replaces
    its own file whole, and a reader never sees half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
