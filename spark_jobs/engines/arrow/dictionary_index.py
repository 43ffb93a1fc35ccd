"""The dictionary index: value → id for every categorical column, as flat files that every Python
worker memory-maps read-only.

A column's kept values are split into value ranges (those of the dictionary job's groups); each
range's values live in one file of 64-bit slots (``<column>/<rank>.slots``): an open-addressing
hash table, the value in the low 32 bits of a slot and its id (>= 1) in the high 32 bits, 0 for
an empty slot. A range that keeps nothing has no file. ``index.json`` holds, per column, the
ranges' lower bounds and each region's place in the column's slots (a range's first slot and
its slots), as a worker sees them: the column's files mapped one after another into one span of
addresses, so a lookup addresses every range of a column through one array. Once the dictionary
tasks have written every file, the driver seals the index: each file's checksum, and
``index.json``'s own, are recorded in it; a worker checks all of it before it maps or looks up
anything (``spark_jobs.engines.arrow.index_checks``).

Why this shape:
- memory-mapped, the page cache holds one copy per node whatever the number of workers and
  tasks; a worker's private memory does not grow with the dictionaries;
- one file per range: the merge builds a range's table in the file it stays in, and the
  dictionary tasks only give its slots their ids in place and rename it into the index, where
  a copy into one file per column would write every table's pages a second time;
- ``INDEX_LOAD`` kept values per slot (8 bytes a slot): 13.3 bytes per kept value;
- a lookup touches one cache line in nearly every case (linear probing), whatever the size.

The build and lookup loops are compiled with numba: a lookup is one short probe loop, where
the best numpy formulation of the same probe (a vectorised gather per probe round over a block
of values) passes over the whole block once per round.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import mmap
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dlrm_contracts.atomic import replace_file, write_text_atomic
from spark_jobs.engines.arrow import remote
from spark_jobs.engines.arrow.atomic_write import write_atomically

INDEX_FORMAT_VERSION = 3  # 3: sealed with checksums
INDEX_JSON = "index.json"
INDEX_LOAD = 0.6  # kept values per slot
PAGE_SLOTS = 512  # 4 KiB of slots: regions start on a page boundary


def region_path(index_dir: str | Path, column: str, rank: int) -> Path:
    """The file of a column's range ``rank``."""
    return Path(index_dir) / column / f"{rank:05d}.slots"


def region_slots(kept: int) -> int:
    """Slots of a range's region: at most INDEX_LOAD full, at least one empty slot (a probe
    for an absent value ends there), whole pages."""
    if kept <= 0:
        return 0
    slots = max(int(np.ceil(kept / INDEX_LOAD)), kept + 1)
    return -(-slots // PAGE_SLOTS) * PAGE_SLOTS


@dataclass(frozen=True)
class ColumnLayout:
    """Where a column's ranges live in the span of its slots (each range's file mapped at its
    ``start``)."""

    bounds: np.ndarray  # uint32 lower bound of each value range (bounds[0] = 0), ascending
    starts: np.ndarray  # int64 first slot of each range's region
    sizes: np.ndarray  # int64 slots of each range's region (0: nothing kept there)

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
        return {"bounds": self.bounds.tolist(), "starts": self.starts.tolist(), "sizes": self.sizes.tolist()}


def create_index(index_dir: Path | str, layouts: dict[str, ColumnLayout]) -> None:
    """An empty index (a folder per column) and its index.json; the regions' files are then
    written by the dictionary tasks (``write_region``, or moved in by ``install_region``).
    Behind a URL: the prefix emptied and index.json written (objects need no folders)."""
    if remote.is_url(index_dir):
        remote.delete_tree(str(index_dir))
        meta = {
            "format_version": INDEX_FORMAT_VERSION,
            "load": INDEX_LOAD,
            "columns": {c: layout.to_json() for c, layout in layouts.items()},
        }
        remote.write_bytes(remote.join(index_dir, INDEX_JSON), json.dumps(meta).encode())
        return
    shutil.rmtree(index_dir, ignore_errors=True)
    index_dir.mkdir(parents=True)
    for column in layouts:
        (index_dir / column).mkdir()
    meta = {
        "format_version": INDEX_FORMAT_VERSION,
        "load": INDEX_LOAD,
        "columns": {c: layout.to_json() for c, layout in layouts.items()},
    }
    write_text_atomic(index_dir / INDEX_JSON, json.dumps(meta))


def write_region(
    index_dir: str, column: str, rank: int, size: int, values: np.ndarray, ids: np.ndarray
) -> None:
    """Build one range's hash table of ``size`` slots and write it as the range's file."""
    from spark_jobs.engines.arrow.kernels import build_region

    if size == 0:
        return
    if len(values) >= size:  # a probe for an absent value needs an empty slot
        raise ValueError(
            f"{region_path(index_dir, column, rank)}: {len(values)} values do not "
            f"fit a region of {size} slots"
        )
    region = np.zeros(size, np.uint64)
    build_region(np.ascontiguousarray(values, np.uint32), np.ascontiguousarray(ids, np.int32), region)
    write_atomically(region_path(index_dir, column, rank), region.tofile, fsync=True)


def install_region(index_dir: str, column: str, rank: int, built: Path) -> None:
    """Move a built table (a file on the same filesystem, its writable mappings flushed) into
    the index as the range's file: flushed to disk before the rename, so that another node
    copying the index from a shared filesystem never reads the slots before relabelling."""
    replace_file(built, region_path(index_dir, column, rank))


def seal_index(index_dir: Path, checksums: dict[tuple[str, int], str] | None = None) -> None:
    """Record in ``index.json`` each range file's checksum and then its own, once the
    dictionary tasks have written every file: a worker refuses an index that is not sealed
    or whose files or ``index.json`` differ from what was sealed. ``checksums``: each
    (column, range)'s, as the tasks that wrote the files behind a URL computed them (None:
    every file is read to compute them)."""
    from spark_jobs.engines.arrow import index_checks as checks

    if remote.is_url(index_dir):
        if checksums is None:
            _seal_remote(str(index_dir))
        else:
            _seal_remote_with(str(index_dir), checksums)
        return
    index_dir = Path(index_dir)
    meta = checks.read_meta(index_dir, sealed=False)
    for column, data in meta["columns"].items():
        _, _, sizes, _ = checks.column_arrays(meta, index_dir / INDEX_JSON, column, sealed=False)
        checks.check_files(index_dir, column, sizes)
        data["checksums"] = [
            _file_checksum(region_path(index_dir, column, rank)) if slots else None
            for rank, slots in enumerate(sizes.tolist())
        ]
    meta["checksum"] = checks.meta_checksum(meta["columns"])
    write_atomically(
        index_dir / INDEX_JSON, lambda temporary: temporary.write_text(json.dumps(meta)), fsync=True
    )


def _seal_remote(url: str) -> None:
    """The index behind ``url`` fetched into a scratch directory, sealed there (every file
    checked and summed, as on a filesystem), and its sealed index.json written back."""
    scratch = Path(remote.local_scratch("criteo-dlrm-seal-"))
    try:
        fetch_index(url, scratch / "index")
        seal_index(scratch / "index")
        remote.upload(scratch / "index" / INDEX_JSON, remote.join(url, INDEX_JSON))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _seal_remote_with(url: str, checksums: dict[tuple[str, int], str]) -> None:
    """The index behind ``url`` sealed with its files' checksums as their writers computed
    them: one read and one write of index.json, where reading every region back would move
    the whole index through the store again (the workers check each file before use)."""
    from spark_jobs.engines.arrow import index_checks as checks

    meta = json.loads(remote.read_bytes(remote.join(url, INDEX_JSON)))
    for column, data in meta["columns"].items():
        _, _, sizes, _ = checks.column_arrays(meta, Path(INDEX_JSON), column, sealed=False)
        missing = [
            rank for rank, slots in enumerate(sizes.tolist()) if slots and (column, rank) not in checksums
        ]
        if missing:
            raise checks.damaged(
                remote.join(url, column), f"the ranges {missing} were not written by the dictionary tasks"
            )
        data["checksums"] = [
            checksums[(column, rank)] if slots else None for rank, slots in enumerate(sizes.tolist())
        ]
    meta["checksum"] = checks.meta_checksum(meta["columns"])
    remote.write_bytes(remote.join(url, INDEX_JSON), json.dumps(meta).encode())


def fetch_index(url: str, target: Path) -> None:
    """Every file of the index behind ``url`` copied into the local directory ``target``."""
    prefix = url.rstrip("/") + "/"
    for source in remote.list_files(url, recursive=True):
        remote.download(source, target / source[len(prefix) :])


def _file_checksum(path: Path) -> str:
    from spark_jobs.engines.arrow.index_checks import region_checksum

    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return region_checksum(data)


def index_bytes(index_dir: Path) -> int:
    if remote.is_url(index_dir):
        return sum(size for _url, size in remote.list_sized(str(index_dir), ".slots", True))
    return sum(p.stat().st_size for p in Path(index_dir).glob("*/*.slots"))


class DictionaryIndex:
    """The index, memory-mapped read-only: ids of whole blocks of values, column by column."""

    def __init__(self, index_dir: str, columns: tuple[str, ...]):
        """Every column's layout and files checked before the first mapping, every mapped
        range's slots against its checksum before the first lookup (``index_checks``): a
        damaged index is a DictionaryIndexError naming the file."""
        directory = Path(index_dir)
        checked = _checked_columns(directory, columns)
        self.columns = columns
        self._tables = [
            (layout, _mapped_and_verified(directory, column, layout, checksums))
            for column, (layout, checksums) in checked.items()
        ]

    def lookup_into(self, values: np.ndarray, out: np.ndarray) -> None:
        """values [columns, n] (int64, negative = missing) → int32 ids in out [columns, n];
        0 for a rare or missing value."""
        from spark_jobs.engines.arrow.kernels import lookup_column

        for j, (layout, slots) in enumerate(self._tables):
            lookup_column(values[j], layout.bounds, layout.starts, layout.sizes, slots, out[j])


def _checked_columns(index_dir: Path, columns: tuple[str, ...]) -> dict:
    """column → (its checked layout, its ranges' checksums); every file checked too."""
    from spark_jobs.engines.arrow import index_checks as checks

    meta = checks.read_meta(index_dir)
    checked = {}
    for column in columns:
        bounds, starts, sizes, checksums = checks.column_arrays(meta, index_dir / INDEX_JSON, column)
        checks.check_files(index_dir, column, sizes)
        checked[column] = (ColumnLayout(bounds, starts, sizes), checksums)
    return checked


def _mapped_and_verified(index_dir: Path, column: str, layout: ColumnLayout, checksums: list) -> np.ndarray:
    """The column's slots mapped, each range's bytes checked against its checksum."""
    from spark_jobs.engines.arrow.index_checks import check_region

    if not layout.total_slots:
        return np.zeros(1, np.uint64)
    slots = _map_column(index_dir, column, layout)
    for rank in np.flatnonzero(layout.sizes):
        start, size = int(layout.starts[rank]), int(layout.sizes[rank])
        check_region(region_path(index_dir, column, int(rank)), slots[start : start + size], checksums[rank])
    return slots


_MAP_FIXED = 0x10  # Linux's value on every architecture; the mmap module lacks it


def _map_column(index_dir: Path, column: str, layout: ColumnLayout) -> np.ndarray:
    """The column's range files mapped read-only, each at its ``start``, into one span of
    addresses, as one uint64 array. The span is an anonymous read-only mapping owned by the
    array (through an ``mmap`` object): when the array goes, the span and every file mapped
    into it are unmapped together. ``layout`` is checked (``index_checks.column_arrays``):
    every range lies inside the span."""
    from spark_jobs.engines.arrow.index_checks import check_region_stat, damaged

    if not sys.platform.startswith("linux"):
        raise OSError(
            f"the dictionary index is mapped with Linux's mmap(MAP_FIXED): {sys.platform} is not supported"
        )
    span = mmap.mmap(
        -1, layout.total_slots * 8, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=mmap.PROT_READ
    )
    slots = np.frombuffer(span, np.uint64)
    base = slots.ctypes.data
    for rank in np.flatnonzero(layout.sizes):
        path = region_path(index_dir, column, int(rank))
        size = int(layout.sizes[rank]) * 8
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as error:
            raise damaged(path, f"unreadable ({error.strerror})") from None
        try:
            check_region_stat(path, os.fstat(fd), size // 8)  # the file mapped is the one checked
            address = base + int(layout.starts[rank]) * 8
            if _libc_mmap(address, size, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED, fd, 0) != address:
                raise OSError(ctypes.get_errno(), f"mapping {path}: {os.strerror(ctypes.get_errno())}")
        finally:
            os.close(fd)  # a mapping outlives its descriptor
    return slots


def _libc_mmap(address: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
    return _mmap_function()(address, length, prot, flags, fd, offset)


@functools.cache
def _mmap_function():
    """libc's mmap with its signature declared, once a process (a worker maps every range)."""
    mmap_call = ctypes.CDLL(None, use_errno=True).mmap
    mmap_call.restype = ctypes.c_void_p
    mmap_call.argtypes = (
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    )
    return mmap_call


_OPEN: dict[str, DictionaryIndex] = {}


def worker_index(
    index_dir: str, columns: tuple[str, ...], token: str, local_root: str | None = None
) -> DictionaryIndex:
    """The worker's index for this run (``token`` names the run; an older one is dropped).
    With ``local_root`` (a cluster), the files are first copied once per node into it."""
    key = f"{token}:{index_dir}"
    if key not in _OPEN:
        _OPEN.clear()
        if remote.is_url(index_dir) and not local_root:  # local mode, workdir behind a URL
            import tempfile

            local_root = tempfile.gettempdir()
        source = local_copy(index_dir, local_root, token) if local_root else index_dir
        _OPEN[key] = DictionaryIndex(source, columns)
    return _OPEN[key]


def local_copy(index_dir: str, local_root: str, token: str) -> str:
    """``index_dir`` copied to ``local_root/criteo-dlrm-index-<token>`` unless a worker of this
    node already did: each copy goes to a directory of its own and is renamed into place, so
    concurrent workers never see a partial copy."""
    target = Path(local_root) / f"criteo-dlrm-index-{token}"
    if (target / INDEX_JSON).is_file():
        return str(target)
    # one worker of the node copies, the others wait for its copy: each would read the whole
    # index from the workdir again (a lock released by the kernel if its holder dies)
    with _node_lock(Path(local_root)):
        if not (target / INDEX_JSON).is_file():
            staging = Path(local_root) / f".criteo-dlrm-index-{token}-{os.getpid()}"
            shutil.rmtree(staging, ignore_errors=True)
            if remote.is_url(index_dir):
                fetch_index(index_dir, staging)
            else:
                shutil.copytree(index_dir, staging)
            try:
                staging.rename(target)
            except OSError:  # another worker's copy landed first
                shutil.rmtree(staging, ignore_errors=True)
    return str(target)


@contextlib.contextmanager
def _node_lock(directory: Path):
    """An exclusive lock on ``directory`` among the processes of this node (``flock`` on the
    directory itself: no file is left behind)."""
    import fcntl

    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def node_local_root() -> str | None:
    """The executor's first local directory (Spark sets SPARK_LOCAL_DIRS for Python workers)."""
    dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    return dirs.split(",")[0] or None
