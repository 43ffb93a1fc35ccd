"""The dictionary index: value → id for every categorical column, as flat files that every Python
worker memory-maps read-only.

One file of 64-bit slots per column (``<column>.slots``): an open-addressing hash table, the
value in the low 32 bits of a slot and its id (>= 1) in the high 32 bits, 0 for an empty slot.
A column's kept values are split into value ranges (those of the dictionary job's groups); each
range owns a region of the file, starting on a 4 KiB page, so the tasks that build neighbouring
regions write disjoint pages of one file. ``index.json`` holds, per column, the ranges' lower
bounds and their regions.

Why this shape:
- memory-mapped, the page cache holds one copy per node whatever the number of workers and
  tasks; a worker's private memory does not grow with the dictionaries;
- ``INDEX_LOAD`` kept values per slot (8 bytes a slot): 13.3 bytes per kept value;
- a lookup touches one cache line in nearly every case (linear probing), whatever the size.

The build and lookup loops are compiled with numba: per lookup they cost 10-43 ns against
52-215 ns for the best numpy formulation of the same probe (a vectorised gather per probe round
over a block of 4096 values), measured in docs/perf-history.md ("Dictionary lookups").
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

INDEX_FORMAT_VERSION = 1
INDEX_JSON = "index.json"
INDEX_LOAD = 0.6       # kept values per slot
PAGE_SLOTS = 512       # 4 KiB of slots: regions start on a page boundary


def slots_file(column: str) -> str:
    return f"{column}.slots"


def region_slots(kept: int) -> int:
    """Slots of a range's region: at most INDEX_LOAD full, at least one empty slot (a probe
    for an absent value ends there), whole pages."""
    if kept <= 0:
        return 0
    slots = max(int(np.ceil(kept / INDEX_LOAD)), kept + 1)
    return -(-slots // PAGE_SLOTS) * PAGE_SLOTS


@dataclass(frozen=True)
class ColumnLayout:
    """Where a column's ranges live in its slots file."""

    bounds: np.ndarray    # uint32 lower bound of each value range (bounds[0] = 0), ascending
    starts: np.ndarray    # int64 first slot of each range's region
    sizes: np.ndarray     # int64 slots of each range's region (0: nothing kept there)

    @classmethod
    def of(cls, bounds, kept_per_range) -> "ColumnLayout":
        sizes = np.array([region_slots(int(k)) for k in kept_per_range], np.int64)
        starts = np.zeros(len(sizes), np.int64)
        np.cumsum(sizes[:-1], out=starts[1:])
        return cls(np.asarray(bounds, np.uint32), starts, sizes)

    @property
    def total_slots(self) -> int:
        return int(self.sizes.sum())

    def to_json(self) -> dict:
        return {"bounds": self.bounds.tolist(), "starts": self.starts.tolist(),
                "sizes": self.sizes.tolist()}

    @classmethod
    def from_json(cls, data: dict) -> "ColumnLayout":
        return cls(np.array(data["bounds"], np.uint32), np.array(data["starts"], np.int64),
                   np.array(data["sizes"], np.int64))


def create_index(index_dir: Path, layouts: dict[str, ColumnLayout]) -> None:
    """Allocate every column's slots file (sparse, all slots empty) and write index.json; the
    regions are then filled by ``write_region`` from the dictionary tasks."""
    shutil.rmtree(index_dir, ignore_errors=True)
    index_dir.mkdir(parents=True)
    for column, layout in layouts.items():
        with open(index_dir / slots_file(column), "wb") as fh:
            fh.truncate(layout.total_slots * 8)
    meta = {"format_version": INDEX_FORMAT_VERSION, "load": INDEX_LOAD,
            "columns": {c: layout.to_json() for c, layout in layouts.items()}}
    (index_dir / INDEX_JSON).write_text(json.dumps(meta))


def write_region(index_dir: str, column: str, start: int, size: int, values: np.ndarray,
                 ids: np.ndarray) -> None:
    """Build one range's hash table and write it into its region of the column's file."""
    from spark_jobs.engines.arrow.kernels import build_region

    if size == 0:
        return
    region = np.zeros(size, np.uint64)
    build_region(np.ascontiguousarray(values, np.uint32), np.ascontiguousarray(ids, np.int32), region)
    write_built_region(index_dir, column, start, region)


def write_built_region(index_dir: str, column: str, start: int, region: np.ndarray) -> None:
    """Write a built hash table into its region of the column's file."""
    fd = os.open(Path(index_dir) / slots_file(column), os.O_WRONLY)
    try:
        written = os.pwrite(fd, region.data, start * 8)
    finally:
        os.close(fd)
    if written != region.nbytes:
        raise OSError(f"short write of the {column} index region ({written} of {region.nbytes} bytes)")


def index_bytes(index_dir: Path) -> int:
    return sum(p.stat().st_size for p in Path(index_dir).glob("*.slots"))


class DictionaryIndex:
    """The index, memory-mapped read-only: ids of whole blocks of values, column by column."""

    def __init__(self, index_dir: str, columns: tuple[str, ...]):
        meta = json.loads((Path(index_dir) / INDEX_JSON).read_text())
        if meta.get("format_version") != INDEX_FORMAT_VERSION:
            raise ValueError(f"{index_dir}: dictionary index format {meta.get('format_version')}, "
                             f"expected {INDEX_FORMAT_VERSION}")
        self.columns = columns
        self._tables = []
        for column in columns:
            layout = ColumnLayout.from_json(meta["columns"][column])
            slots = (np.memmap(Path(index_dir) / slots_file(column), np.uint64, "r")
                     if layout.total_slots else np.zeros(1, np.uint64))
            self._tables.append((layout, slots))

    def lookup_into(self, values: np.ndarray, out: np.ndarray) -> None:
        """values [columns, n] (int64, negative = missing) → int32 ids in out [columns, n];
        0 for a rare or missing value."""
        from spark_jobs.engines.arrow.kernels import lookup_column

        for j, (layout, slots) in enumerate(self._tables):
            lookup_column(values[j], layout.bounds, layout.starts, layout.sizes, slots, out[j])


_OPEN: dict[str, DictionaryIndex] = {}


def worker_index(index_dir: str, columns: tuple[str, ...], token: str,
                 local_root: str | None = None) -> DictionaryIndex:
    """The worker's index for this run (``token`` names the run; an older one is dropped).
    With ``local_root`` (a cluster), the files are first copied once per node into it."""
    key = f"{token}:{index_dir}"
    if key not in _OPEN:
        _OPEN.clear()
        source = local_copy(index_dir, local_root, token) if local_root else index_dir
        _OPEN[key] = DictionaryIndex(source, columns)
    return _OPEN[key]


def local_copy(index_dir: str, local_root: str, token: str) -> str:
    """``index_dir`` copied to ``local_root/criteo-dlrm-index-<token>`` unless a worker of this
    node already did: each copy goes to a directory of its own and is renamed into place, so
    concurrent workers never see a partial copy."""
    target = Path(local_root) / f"criteo-dlrm-index-{token}"
    if not (target / INDEX_JSON).is_file():
        staging = Path(local_root) / f".criteo-dlrm-index-{token}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(index_dir, staging)
        try:
            staging.rename(target)
        except OSError:                    # another worker's copy landed first
            shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def node_local_root() -> str | None:
    """The executor's first local directory (Spark sets SPARK_LOCAL_DIRS for Python workers)."""
    dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    return dirs.split(",")[0] or None
