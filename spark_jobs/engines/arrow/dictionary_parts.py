"""A value group's dictionary part and index region, made in the merge before the ids exist;
only the ids are filled in after the barrier.

Why: a value's id needs every group's count histogram, which exists only once the whole merge
is done. Everything else about a kept value (its hex string, its count, its dictionary row, its
index slot) is known in the merge, while the group's totals are in memory. The merge therefore
stages the group's part with each row's rank among the group's values of the same count in the
id column, and its index region with each slot pointing at its row. After the barrier each id
is ``first id of its count class + rank``: the dictionaries phase writes 4 bytes per value into
the part and rewrites the region's slots, instead of formatting, encoding and hashing every
kept value while the rest of the job waits.

The region is staged as the raw slots file it will be in the index (one file per range,
spark_jobs/engines/arrow/dictionary_index.py): after the barrier its slots are relabelled in place and the file
is renamed into the index, so its pages are written once.

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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlrm_contracts.hex_text import format_hex
from spark_jobs.engines.arrow import dictionary_index
from spark_jobs.engines.arrow.atomic_write import write_atomically
from spark_jobs.engines.arrow.value_counts import Counts, class_index

# Rows per row group of a part, and the most rows a data page may hold: one page per row group
# is what makes the id column a plain array (pyarrow's default splits pages at 20,000 rows).
PART_ROW_GROUP_ROWS = 1 << 20
_ID_BYTES = 4


def _paths(directory: str, group: int) -> tuple[Path, Path, Path, Path]:
    """The staged part, its rows (rank and class index per value), its classes, its region."""
    base = Path(directory) / f"part-{group:07d}"
    return (
        base.with_suffix(".parquet"),
        base.with_suffix(".rows"),
        base.with_suffix(".classes.npy"),
        base.with_suffix(".slots"),
    )


def stage_group(
    directory: str, group: int, totals: Counts, histogram_counts: np.ndarray, minimum: int
) -> int:
    """Stage a group's part and index region from its totals (values ascending) and the
    counts of their histogram (ascending); returns the values kept. Every file is replaced
    whole, so a retried merge task rewrites its own."""
    from spark_jobs.engines.arrow.kernels import build_region, ranks_in_class

    kept = totals.counts >= minimum
    if not kept.any():
        return 0
    values, counts = totals.values[kept], totals.counts[kept]
    classes = histogram_counts[histogram_counts >= minimum]  # the group's kept counts
    in_class = class_index(classes, counts)
    ranks = np.empty(len(values), np.int64)
    ranks_in_class(in_class, np.zeros(len(classes), np.int64), ranks)
    part, rows, classes_path, region_path = _paths(directory, group)
    _write_part(part, values, ranks.astype(np.int32), counts)
    region = np.zeros(dictionary_index.region_slots(len(values)), np.uint64)
    build_region(
        np.ascontiguousarray(values, np.uint32), np.arange(1, len(values) + 1, dtype=np.int32), region
    )
    write_atomically(rows, lambda temporary: _write_rows(temporary, ranks, in_class, len(classes)))
    save_array(classes_path, classes.astype(np.int64))
    write_atomically(region_path, region.tofile)  # raw slots: it becomes the index's file
    return len(values)


@dataclass(frozen=True)
class GroupFill:
    """What fills one staged group after the barrier: the group, its region's place in the
    index (its column's name, its rank among the column's groups, the region's slots), and
    its kept count classes with each class's first id (the driver's arithmetic)."""

    group: int
    column: str
    rank: int
    slots: int
    classes: np.ndarray
    class_first: np.ndarray


def fill_group(directory: str, fill: GroupFill, part_path: Path, index_dir: str) -> int:
    """After the barrier: the staged part's ids filled in and the part moved to ``part_path``,
    the staged region's slots given their ids in place and the region moved into the index,
    the staged files removed (by the tasks, in parallel, rather than by the driver after
    them). Returns the values kept."""
    group, classes = fill.group, fill.classes
    staged, rows_path, classes_path, region_path = _paths(directory, group)
    if not rows_path.exists() and part_path.exists():  # a retried task: this group is done
        import pyarrow.parquet as pq

        return pq.ParquetFile(part_path).metadata.num_rows
    if not np.array_equal(np.load(classes_path), classes):
        raise ValueError(
            f"value group {group}: the staged dictionary part's counts differ from "
            f"the histogram's (a stale staging directory {directory}?)"
        )
    ranks, in_class = _read_rows(rows_path, len(classes))
    labelled_ids = np.zeros(len(ranks) + 1, np.int32)  # [0]: an empty slot's, then by row
    ids = labelled_ids[1:]
    np.add(fill.class_first[in_class], ranks, out=ids, casting="unsafe")
    source = staged if staged.exists() else part_path  # a retried task: already moved
    fill_ids(source, ranks, ids)
    if source == staged:
        part_path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staged, part_path)
    _install_region(region_path, labelled_ids, part_path, index_dir, fill.column, fill.rank, fill.slots)
    for path in (classes_path, rows_path):  # the rows last: they mark it undone
        path.unlink()
    return len(ids)


def _install_region(
    staged: Path,
    labelled_ids: np.ndarray,
    part_path: Path,
    index_dir: str,
    column: str,
    rank: int,
    slots: int,
) -> None:
    """The staged region (its slots pointing at rows) relabelled in place and moved into the
    index: its pages are already in the page cache, where a copy into another file would
    fill new ones. Relabelling twice would corrupt it, so the file is first renamed to mark
    the work under way; a retried task that finds that mark, or neither the staged region nor
    the index's, rebuilds the region from the filled part instead."""
    from spark_jobs.engines.arrow.kernels import relabel_region

    relabelling = staged.with_name(staged.name + ".relabelling")
    if staged.exists():
        os.replace(staged, relabelling)
        region = np.memmap(relabelling, np.uint64, "r+")
        if len(region) != slots:
            raise ValueError(
                f"{staged}: a staged index region of {len(region)} slots where the index has {slots}"
            )
        relabel_region(region.view(np.ndarray), labelled_ids)
        region.flush()  # msync: the relabelled pages reach the file before it is renamed
        del region
        dictionary_index.install_region(index_dir, column, rank, relabelling)
    elif relabelling.exists() or not dictionary_index.region_path(index_dir, column, rank).exists():
        _rebuild_region(part_path, index_dir, column, rank, slots)
        relabelling.unlink(missing_ok=True)


def _rebuild_region(part_path: Path, index_dir: str, column: str, rank: int, slots: int) -> None:
    """A group's region built again from its filled part (a retried task's slow path)."""
    import pyarrow.parquet as pq

    from spark_jobs.engines.arrow.fastparse import parse_hex

    table = pq.read_table(part_path, columns=["value", "id"])
    dictionary_index.write_region(
        index_dir, column, rank, slots, parse_hex(table["value"].combine_chunks()), table["id"].to_numpy()
    )


def _class_dtype(classes: int) -> np.dtype:
    """The narrowest unsigned type of a group's class indexes: most groups have few counts."""
    return np.dtype(np.uint8 if classes <= 1 << 8 else np.uint16 if classes <= 1 << 16 else np.uint32)


def _write_rows(path: Path, ranks: np.ndarray, in_class: np.ndarray, classes: int) -> None:
    """Raw: each value's rank (int32), then its class index (the narrowest type that holds
    them): half the bytes of two int32 arrays for the merge to write and the fill to read."""
    with open(path, "wb") as out:
        out.write(np.ascontiguousarray(ranks, np.int32).data)
        out.write(np.ascontiguousarray(in_class, _class_dtype(classes)).data)


def _read_rows(path: Path, classes: int) -> tuple[np.ndarray, np.ndarray]:
    data = np.fromfile(path, np.uint8)
    width = 4 + _class_dtype(classes).itemsize
    if len(data) % width:
        raise ValueError(f"{path}: {len(data)} bytes is not a whole number of rows")
    n = len(data) // width
    return data[: 4 * n].view(np.int32), data[4 * n :].view(_class_dtype(classes))


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
            want = np.ascontiguousarray(ids[start : start + rows], "<i4")
            if chunk.compression != "UNCOMPRESSED" or not (
                np.array_equal(found, placeholders[start : start + rows]) or np.array_equal(found, want)
            ):
                raise ValueError(
                    f"{path}: its id column is not where this job writes it; "
                    f"delete the workdir's counts/.totals and run again"
                )
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

    schema = pa.schema(
        [
            pa.field("value", pa.string(), nullable=False),
            pa.field("id", pa.int32(), nullable=False),
            pa.field("count", pa.int64(), nullable=False),
        ]
    )
    table = pa.table(
        {
            "value": format_hex(values),
            "id": pa.array(ids, pa.int32()),
            "count": pa.array(counts.astype(np.int64, copy=False)),
        },
        schema=schema,
    )
    # statistics only for the values (a reader's range filter uses them); the ids' would be the
    # placeholders', and the counts' cost more than they serve
    write_atomically(
        path,
        lambda temporary: pq.write_table(
            table,
            temporary,
            row_group_size=PART_ROW_GROUP_ROWS,
            max_rows_per_page=PART_ROW_GROUP_ROWS,
            data_page_size=1 << 30,
            data_page_version="1.0",
            use_dictionary=["count"],
            compression={"value": "snappy", "id": "none", "count": "snappy"},
            write_statistics=["value"],
        ),
    )


def save_array(path: Path, array: np.ndarray) -> None:
    """One .npy file, replaced whole (np.save is given a file: given a name it would add .npy)."""

    def write(temporary: Path) -> None:
        with open(temporary, "wb") as out:
            np.save(out, array, allow_pickle=False)

    write_atomically(path, write)


# ---------------------------------------------------------------- a workdir behind a URL
#
# An object store has no rename and no write into an object: a group's files are staged and
# filled in a private local directory exactly as on a filesystem (the same functions, so the
# same bytes), then sent whole, one request per file. The staged objects stay until the
# driver removes the staging prefix, so a retried fill starts again from them.

_STAGED = (".parquet", ".rows", ".classes.npy", ".slots")


def _staged_names(group: int) -> list[str]:
    return [f"part-{group:07d}{suffix}" for suffix in _STAGED]


def stage_group_remote(
    url: str, group: int, totals: Counts, histogram_counts: np.ndarray, minimum: int
) -> int:
    """``stage_group`` into a local scratch directory, its files then written under ``url``."""
    import shutil

    from spark_jobs.engines.arrow import remote

    scratch = remote.local_scratch("criteo-dlrm-stage-")
    try:
        kept = stage_group(scratch, group, totals, histogram_counts, minimum)
        if kept:
            for name in _staged_names(group):
                remote.upload(Path(scratch) / name, remote.join(url, name))
        return kept
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _fetch_staged(source: str, group: int, staged: Path) -> None:
    """The group's staged files copied into ``staged``: fetched from the store, or from this
    host's staging directory (the ``local`` exchange). The originals stay for a retried task
    (the fill changes its copies in place)."""
    import shutil

    from spark_jobs.engines.arrow import remote

    pairs = [(remote.join(source, name), staged / name) for name in _staged_names(group)]
    if remote.is_url(source):
        remote.download_all(pairs)
        return
    staged.mkdir(parents=True, exist_ok=True)
    for origin, target in pairs:
        shutil.copyfile(origin, target)


def fill_group_remote(url: str, fill: GroupFill, part_url: str, index_url: str) -> tuple[int, str]:
    """``fill_group`` on the group's staged files (``url``: the store's staging prefix, or a
    directory of this host) copied into a local scratch directory; the filled part and the
    index region then written to ``part_url`` and under ``index_url``.
    Returns the values kept and the region's checksum, so the index is sealed from what the
    tasks wrote, without reading every region back from the store."""
    import shutil

    from spark_jobs.engines.arrow import remote
    from spark_jobs.engines.arrow.index_checks import region_checksum

    scratch = Path(remote.local_scratch("criteo-dlrm-fill-"))
    try:
        staged, index_dir = scratch / "staged", scratch / "index"
        (index_dir / fill.column).mkdir(parents=True)
        _fetch_staged(url, fill.group, staged)
        part = scratch / "part.parquet"
        kept = fill_group(str(staged), fill, part, str(index_dir))
        remote.upload(part, part_url)
        region = dictionary_index.region_path(index_dir, fill.column, fill.rank)
        data = region.read_bytes()
        remote.write_bytes(remote.join(index_url, fill.column, region.name), data)
        return kept, region_checksum(np.frombuffer(data, np.uint64))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
