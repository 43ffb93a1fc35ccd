"""Partial value counts handed from the count tasks to the merge through files in the workdir.

Why files and not rows: at the Terabyte's cardinality most values of a chunk are unique, so a
chunk's partial counts are about as many entries as its lines. Handed to Spark as rows, those
bytes would be cached by the JVM, read back, split by value range, shuffled (serialised,
compressed, written, read, decompressed) and grouped before a merge task saw them: many passes
over as many entries as the input has lines, on columns of millions of values. Each count task
instead writes its chunk's partial counts once, as sorted flat arrays, and each merge task
reads, for its value range, a slice of every file (found through the file's fences, below).
The JVM only sees statistics and samples.

The workdir is where the merge already leaves its staged parts for the fill tasks: on a
cluster it is the shared filesystem docs/cluster.md requires, so any executor reads any file.

A file holds segments (day, column) of distinct values (uint32, ascending) and their counts
(uint32, counts within one day): a fixed header, the segment table, the fences (every
``FENCE``-th value of each segment), then all values, then all counts. It is written whole
under a temporary name and renamed: a retried task replaces its own file and a reader never
sees half of one.

Why fences: every merge group reads a slice of every file, so the reads grow as groups x
files, which is rows squared (the Terabyte: thousands of each). A merge task reads each
file's table and fences once; a group's slice is then found in memory to within ``FENCE``
values and read with two ``pread`` calls, with no mapping set up and torn down per (group,
file) and no page touched by a binary search over the file.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dlrm_contracts.atomic import pid_alive
from spark_jobs.engines.arrow import remote
from spark_jobs.engines.arrow.atomic_write import write_atomically
from spark_jobs.engines.arrow.value_counts import DAY_COUNT_DTYPE, VALUE_DTYPE, Counts

_MAGIC = b"DLRMPCv2"
_SEGMENT_FIELDS = 5  # day, column, first entry, entries, first fence
_HEADER = len(_MAGIC) + 8
FENCE = 256  # values per fence: a slice's read is at most 2 KiB long
SUFFIX = ".partial"
_HOST_PREFIX = "criteo-dlrm-partials-"


def partials_dir(counts_dir: str | Path) -> str | Path:
    """Where one count pass leaves its partial counts (removed once merged)."""
    if remote.is_url(counts_dir):
        return remote.join(counts_dir, "_partials")
    return Path(counts_dir) / ".partials"


def on_this_host(scratch_root: str | Path) -> Path:
    """A fresh directory for one count pass's partial files on this host's local disk, for
    the ``local`` exchange (every task on this host); the directories that runs no longer
    alive on this host left behind (a killed job) are removed first. The process id in the
    name says whose a directory is: the host is the one that runs every task."""
    root = Path(scratch_root)
    for entry in root.glob(f"{_HOST_PREFIX}*"):
        owner = entry.name[len(_HOST_PREFIX) :].split("-", 1)[0]
        if owner.isdigit() and not pid_alive(int(owner)):
            shutil.rmtree(entry, ignore_errors=True)
    folder = root / f"{_HOST_PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
    folder.mkdir(parents=True)
    return folder


def clear(directory: str | Path) -> None:
    if remote.is_url(directory):
        remote.delete_tree(str(directory))
        return
    shutil.rmtree(directory, ignore_errors=True)


def files(directory: str | Path) -> list[str]:
    """The complete partial files of a pass (temporaries start with a dot)."""
    if remote.is_url(directory):
        return remote.list_files(str(directory), SUFFIX)
    folder = Path(directory)
    if not folder.is_dir():
        return []
    return sorted(str(p) for p in folder.glob(f"*{SUFFIX}") if not p.name.startswith("."))


def write(path: str | Path, segments: list[tuple[int, int, Counts]]) -> None:
    """``segments``: (day, column, counts) with values ascending; empty ones are left out."""
    segments = [(day, column, c) for day, column, c in segments if len(c)]
    table = np.zeros((len(segments), _SEGMENT_FIELDS), np.int64)
    fences = [np.ascontiguousarray(c.values[::FENCE], VALUE_DTYPE) for _, _, c in segments]
    start = fence = 0
    for k, (day, column, counts) in enumerate(segments):
        table[k] = (day, column, start, len(counts), fence)
        start += len(counts)
        fence += len(fences[k])

    def write_file(temporary) -> None:
        with open(temporary, "wb") if isinstance(temporary, Path) else temporary as out:
            out.write(_MAGIC)
            out.write(np.int64(len(segments)).tobytes())
            out.write(table.tobytes())
            for f in fences:
                out.write(f.data)
            for _, _, counts in segments:
                out.write(np.ascontiguousarray(counts.values, VALUE_DTYPE).data)
            for _, _, counts in segments:
                out.write(np.ascontiguousarray(counts.counts, DAY_COUNT_DTYPE).data)

    if remote.is_url(path):  # one object, written whole by one request
        import io

        buffer = io.BytesIO()
        write_file(_Unclosed(buffer))
        remote.write_bytes(str(path), buffer.getbuffer())
        return
    write_atomically(Path(path), write_file)


class _Unclosed:
    """A BytesIO whose ``with`` block leaves it open (its bytes are sent after)."""

    def __init__(self, buffer):
        self.buffer = buffer

    def __enter__(self):
        return self.buffer

    def __exit__(self, *exc):
        return False


@dataclass(frozen=True)
class Layout:
    """A partial file's segment table, its fences and where its arrays start."""

    segments: np.ndarray  # [segments, 5]: day, column, first, entries, first fence
    by_column: dict[int, list[int]]  # column → its segments' rows in the table
    fences: np.ndarray  # every FENCE-th value of each segment
    entries: int
    values_at: int
    # behind a URL: the object, opened once for the task's ranged reads (None: a local file)
    source: object = field(default=None, compare=False, repr=False)

    @property
    def size(self) -> int:
        return self.values_at + 8 * self.entries


def read_layout(path: str) -> Layout:
    """The file's table and fences, read and checked against its size."""
    if remote.is_url(path):
        handle = remote.open_remote(path)
        size = handle.size()
        head = remote.read_range(handle, 0, _HEADER)
        n = _segment_count(path, head)
        # the table and the fences in one request: the fences' length is only known from the
        # table, so the request asks for the most they can be (a file's every value a fence)
        guess = 8 * _SEGMENT_FIELDS * n + 4 * (-(-max(0, size - _HEADER) // (8 * FENCE)) + n)
        rest = remote.read_range(handle, _HEADER, guess)
        segments = np.frombuffer(rest, np.int64, _SEGMENT_FIELDS * n).reshape(n, _SEGMENT_FIELDS)
        fence_count = int((-(-segments[:, 3] // FENCE)).sum())
        fences = np.frombuffer(rest, VALUE_DTYPE, fence_count, 8 * _SEGMENT_FIELDS * n)
        return _layout(path, size, n, segments, fences, fence_count, handle)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(_HEADER)
        n = _segment_count(path, head)
        segments = np.frombuffer(fh.read(8 * _SEGMENT_FIELDS * n), np.int64).reshape(n, _SEGMENT_FIELDS)
        fence_count = int((-(-segments[:, 3] // FENCE)).sum())
        fences = np.frombuffer(fh.read(4 * fence_count), VALUE_DTYPE)
    return _layout(path, size, n, segments, fences, fence_count, None)


def _segment_count(path: str, head: bytes) -> int:
    if len(head) < _HEADER or head[: len(_MAGIC)] != _MAGIC:
        raise ValueError(
            f"{path} is not a partial counts file of this version; "
            f"delete the workdir's counts/.partials and run again"
        )
    return int(np.frombuffer(head, np.int64, 1, len(_MAGIC))[0])


def _layout(path, size, n, segments, fences, fence_count, source) -> Layout:
    by_column: dict[int, list[int]] = {}
    for k, column in enumerate(segments[:, 1].tolist()):
        by_column.setdefault(column, []).append(k)
    entries = int(segments[:, 3].sum()) if n else 0
    layout = Layout(
        segments, by_column, fences, entries, _HEADER + 8 * _SEGMENT_FIELDS * n + 4 * fence_count, source
    )
    if size != layout.size or len(fences) != fence_count:
        raise ValueError(
            f"{path}: {size} bytes where its segment table says {layout.size}; "
            f"delete the workdir's counts/.partials and run again"
        )
    return layout


def slices(path: str, layout: Layout, column: int, low: int, high: int | None) -> list[tuple[int, Counts]]:
    """Each segment of ``column`` in the file: (day, its counts with values in ``[low, high)``;
    ``high`` None: no upper bound)."""
    out = []
    segments = layout.by_column.get(column)
    if not segments:  # nothing of this column in the file: not even opened
        return out
    fd = layout.source if layout.source is not None else os.open(path, os.O_RDONLY)
    try:
        for k in segments:
            day, _, first, entries, fence = (int(x) for x in layout.segments[k])
            fences = layout.fences[fence : fence + -(-entries // FENCE)]
            # the slice lies within [start, end): between the fences around low and high
            start = FENCE * max(int(np.searchsorted(fences, np.uint32(low), "right")) - 1, 0)
            end = (
                entries
                if high is None
                else min(entries, FENCE * int(np.searchsorted(fences, np.uint32(high), "left")))
            )
            if end <= start:
                continue
            values = _read(fd, path, layout.values_at + 4 * (first + start), end - start, VALUE_DTYPE)
            a = int(np.searchsorted(values, np.uint32(low))) if low else 0
            b = len(values) if high is None else int(np.searchsorted(values, np.uint32(high)))
            if b > a:
                counts = _read(
                    fd,
                    path,
                    layout.values_at + 4 * (layout.entries + first + start + a),
                    b - a,
                    DAY_COUNT_DTYPE,
                )
                out.append((day, Counts(values[a:b], counts)))
    finally:
        if layout.source is None:
            os.close(fd)
    return out


def _read(fd, path: str, offset: int, n: int, dtype) -> np.ndarray:
    """``n`` 4-byte items read into a new (writable) array (``fd``: a descriptor, or an
    opened remote object: one ranged request)."""
    if not isinstance(fd, int):
        data = remote.read_range(fd, offset, 4 * n)
        if len(data) != 4 * n:
            raise ValueError(
                f"{path}: short read at {offset}; delete the workdir's counts/.partials and run again"
            )
        return np.frombuffer(data, dtype).copy()
    out = np.empty(n, dtype)
    if os.preadv(fd, [out], offset) != out.nbytes:
        raise ValueError(
            f"{path}: short read at {offset}; delete the workdir's counts/.partials and run again"
        )
    return out


def read_range(
    paths: list[str], column: int, low: int, high: int | None, layouts: dict[str, Layout] | None = None
) -> dict[int, list[Counts]]:
    """One value range of ``column`` from every file, by day: a worker holds one value
    range's slices, whatever the number of files. ``layouts`` (a task's own dict, filled
    here) keeps each file's table and fences for the task's next ranges."""
    layouts = {} if layouts is None else layouts
    by_day: dict[int, list[Counts]] = {}
    for path in paths:
        if path not in layouts:
            layouts[path] = read_layout(path)
        for day, counts in slices(path, layouts[path], column, low, high):
            by_day.setdefault(day, []).append(counts)
    return by_day
