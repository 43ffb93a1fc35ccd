"""Partial value counts handed from the count tasks to the merge through files in the workdir.

Why files and not rows: at the Terabyte's cardinality most values of a chunk are unique, so a
chunk's partial counts are about as many entries as its lines. Handed to Spark as rows, those
bytes were cached by the JVM, read back, split by value range, shuffled (serialised,
compressed, written, read, decompressed) and grouped before a merge task saw them: most of the
count phase's extra cost on columns of millions of values (docs/perf-history.md, "At the Terabyte's
cardinality"). Each count task instead writes its chunk's partial counts once, as sorted flat
arrays, and each merge task reads, for its value range, a slice of every file: two binary
searches and one copy per (file, column). The JVM only sees statistics and samples.

The workdir is where the merge already leaves its staged parts for the fill tasks: on a
cluster it is the shared filesystem docs/cluster.md requires, so any executor reads any file.

A file holds segments (day, column) of distinct values (uint32, ascending) and their counts
(uint32, counts within one day): a fixed header, the segment table, then all values, then
all counts. It is written whole under a temporary name and renamed: a retried task replaces
its own file and a reader never sees half of one.
"""

from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path

import numpy as np

from spark_jobs.engines.arrow.dictionary_parts import write_atomically
from spark_jobs.engines.arrow.value_counts import DAY_COUNT_DTYPE, VALUE_DTYPE, Counts

_MAGIC = b"DLRMPCv1"
_SEGMENT_FIELDS = 4                     # day, column, first entry, entries
_HEADER = len(_MAGIC) + 8
SUFFIX = ".partial"


def partials_dir(counts_dir: str | Path) -> Path:
    """Where one count pass leaves its partial counts (removed once merged)."""
    return Path(counts_dir) / ".partials"


def clear(directory: str | Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def files(directory: str | Path) -> list[str]:
    """The complete partial files of a pass (temporaries start with a dot)."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    return sorted(str(p) for p in folder.glob(f"*{SUFFIX}") if not p.name.startswith("."))


def write(path: str | Path, segments: list[tuple[int, int, Counts]]) -> None:
    """``segments``: (day, column, counts) with values ascending; empty ones are left out."""
    segments = [(day, column, c) for day, column, c in segments if len(c)]
    table = np.zeros((len(segments), _SEGMENT_FIELDS), np.int64)
    start = 0
    for k, (day, column, counts) in enumerate(segments):
        table[k] = (day, column, start, len(counts))
        start += len(counts)

    def write_file(temporary: Path) -> None:
        with open(temporary, "wb") as out:
            out.write(_MAGIC)
            out.write(np.int64(len(segments)).tobytes())
            out.write(table.tobytes())
            for _, _, counts in segments:
                out.write(np.ascontiguousarray(counts.values, VALUE_DTYPE).data)
            for _, _, counts in segments:
                out.write(np.ascontiguousarray(counts.counts, DAY_COUNT_DTYPE).data)

    write_atomically(Path(path), write_file)


class PartialFile:
    """One partial file, memory-mapped read-only while open (``with PartialFile(p) as f``)."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            head = fh.read(_HEADER)
            if len(head) < _HEADER or head[:len(_MAGIC)] != _MAGIC:
                raise ValueError(f"{path} is not a partial counts file of this version; "
                                 f"delete the workdir's counts/.partials and run again")
            n = int(np.frombuffer(head, np.int64, 1, len(_MAGIC))[0])
            self.segments = np.frombuffer(fh.read(8 * _SEGMENT_FIELDS * n), np.int64).reshape(
                n, _SEGMENT_FIELDS)
            self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) if size else None
        self._entries = int(self.segments[:, 3].sum()) if n else 0
        self._values_at = _HEADER + 8 * _SEGMENT_FIELDS * n
        if size != self._values_at + 8 * self._entries:
            self.close()
            raise ValueError(f"{path}: {size} bytes where its segment table says "
                             f"{self._values_at + 8 * self._entries}; delete the workdir's "
                             f"counts/.partials and run again")

    def __enter__(self) -> "PartialFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

    def slices(self, column: int, low: int, high: int | None) -> list[tuple[int, Counts]]:
        """Each segment of ``column``: (day, a copy of its counts with values in
        ``[low, high)``; ``high`` None: no upper bound)."""
        out = []
        for day, col, first, entries in self.segments:
            if col != column:
                continue
            values = np.frombuffer(self._map, VALUE_DTYPE, int(entries),
                                   self._values_at + 4 * int(first))
            counts = np.frombuffer(self._map, DAY_COUNT_DTYPE, int(entries),
                                   self._values_at + 4 * (self._entries + int(first)))
            a = int(np.searchsorted(values, np.uint32(low))) if low else 0
            b = len(values) if high is None else int(np.searchsorted(values, np.uint32(high)))
            if b > a:
                out.append((int(day), Counts(values[a:b].copy(), counts[a:b].copy())))
            del values, counts               # views of the map: gone before it closes
        return out


def read_range(paths: list[str], column: int, low: int, high: int | None) -> dict[int, list[Counts]]:
    """One value range of ``column`` from every file, by day. Each file is mapped only while
    it is read, so a worker holds one value range's copies, whatever the number of files."""
    by_day: dict[int, list[Counts]] = {}
    for path in paths:
        with PartialFile(path) as partial:
            for day, counts in partial.slices(column, low, high):
                by_day.setdefault(day, []).append(counts)
    return by_day
