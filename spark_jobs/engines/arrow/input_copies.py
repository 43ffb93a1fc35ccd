"""A node's local copies of the day-file chunks the count pass read behind a URL, read by the
later passes (rejects, transform) instead of the store.

Why: the Arrow engine reads its input twice, once to count and once to transform. On a local
or shared filesystem the second read comes from the page cache or the file server; behind a
URL it is every byte of the input fetched again, paid by the store, the network and the task
that receives it. So a count task behind a URL tees the bytes it reads into the executor's
local scratch directory (Spark's local directory of the application, ``SPARK_LOCAL_DIRS``),
and a later task of the same run on the same node reads that copy and asks the store only for
what the copy lacks.

A copy is an optimisation, never a requirement: when it is absent (another node runs the
task, a retried task, the copy budget was spent, the disk was full) the task reads the store
as before. A copy holds a prefix of the chunk's reads (the bytes the count task consumed,
from the chunk's first offset); a reader that needs more continues from the store where the
copy ends. A copy is written under a temporary name and renamed whole, so a reader never sees
a copy being written. Each node's copies take at most ``PreprocessConfig.arrow_input_copy_mb``
(a chunk whose copy would pass it is not copied; 0: no copy). The transform removes each copy
it has read (each chunk is transformed once); a count task removes the copies of other runs
it finds (a run that stopped before its transform), and Spark removes the application's local
directory when it ends.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable

# What a task does with a chunk's copy: make one while reading the store (the count), read
# one if there is one (the rejects), read one and remove it (the transform: the last reader).
KEEP, READ, TAKE = "keep", "read", "take"
PREFIX = "criteo-dlrm-input-"
_PART = ".part"
_WHOLE = ".whole"  # the copy reaches the object's end: nothing is left to ask the store for


@dataclass(frozen=True)
class CopySpec:
    """A run's copies: ``run`` names them (another run's copies are never read), ``budget``
    bytes at most per node."""

    run: str
    budget: int

    @classmethod
    def new(cls, budget_mb: int) -> "CopySpec | None":
        return cls(uuid.uuid4().hex, budget_mb << 20) if budget_mb > 0 else None


def scratch_root() -> Path:
    """The executor's local directory (the first of Spark's), else the temporary directory."""
    return Path(os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or tempfile.gettempdir())


def directory(spec: CopySpec) -> Path:
    return scratch_root() / f"{PREFIX}{spec.run}"


@dataclass(frozen=True)
class ChunkCopy:
    """One chunk's copy as a task sees it: ``reader(start, from_store)`` gives the reader of
    the chunk's bytes from ``start`` through the copy as ``mode`` says. ``from_store(offset,
    wrap=None)``: a reader of the store's bytes from ``offset``, its source of bytes (what
    fetches them, on the reader's own thread) wrapped by ``wrap``."""

    spec: CopySpec
    name: str  # the chunk's: day, number, byte range
    mode: str
    planned: int  # the bytes a copy of the chunk may take (for the budget)

    @classmethod
    def of(cls, spec: CopySpec | None, chunk, mode: str | None, read_bytes: int) -> "ChunkCopy | None":
        if spec is None or mode is None:
            return None
        planned = chunk.end if chunk.gzipped else chunk.end - chunk.start + 1 + read_bytes
        return cls(spec, f"{chunk.day}-{chunk.index}-{chunk.start}-{chunk.end}", mode, planned)

    def reader(self, start: int, from_store: Callable[..., Any]):
        if self.mode in (READ, TAKE):
            found = self._find()
            if found is not None:
                return _CopyReader(found, start, from_store, remove=self.mode == TAKE)
            return from_store(start)
        if self.mode == KEEP:
            target = self._reserve()
            if target is not None:
                try:
                    out = open(target, "wb")
                except OSError:
                    target.unlink(missing_ok=True)
                    return from_store(start)
                final = directory(self.spec) / self.name
                return from_store(start, lambda source: _TeeSource(source, out, target, final, start))
        return from_store(start)

    def _find(self) -> Path | None:
        base = directory(self.spec) / self.name
        for path in (base.with_name(base.name + _WHOLE), base):
            if path.exists():
                return path
        return None

    def _reserve(self) -> Path | None:
        """A temporary file for the copy (its name carries the bytes it may take), or None when
        the node's copies would pass the budget. Two tasks reserving at once may both give
        up: the budget is never passed, a copy is only skipped."""
        folder = directory(self.spec)
        try:
            if not folder.exists():
                _remove_other_runs(self.spec)
                folder.mkdir(parents=True, exist_ok=True)
            target = folder / f".{self.name}.{self.planned}.{os.getpid()}{_PART}"
            target.touch()
            if _used(folder) > self.spec.budget:
                target.unlink()
                return None
            return target
        except OSError:
            return None


def _used(folder: Path) -> int:
    """The bytes the node's copies take: finished ones by size, those being written by what
    they reserved."""
    total = 0
    for entry in os.scandir(folder):
        if entry.name.endswith(_PART):
            total += int(entry.name.split(".")[-3])
        else:
            try:
                total += entry.stat().st_size
            except FileNotFoundError:  # taken by a transform meanwhile
                pass
    return total


def _remove_other_runs(spec: CopySpec) -> None:
    """Copies of another run in this scratch directory (a run stopped before its transform):
    removed, so they never add up across the runs of one application."""
    import shutil

    for entry in scratch_root().glob(f"{PREFIX}*"):
        if entry.name != f"{PREFIX}{spec.run}":
            shutil.rmtree(entry, ignore_errors=True)


class _TeeSource:
    """A source of the store's bytes (``read(offset, size)``) whose reads are also written to
    a temporary file, renamed into the copy when the source is closed: a prefix of the
    chunk's bytes, whatever was fetched. It runs on the reader's fetching thread, so the
    writes overlap the parse. A failed write (a full disk) or a read out of sequence drops
    the copy, never the task."""

    def __init__(self, source, out: BinaryIO, temporary: Path, final: Path, start: int):
        self.source, self.temporary, self.final = source, temporary, final
        self.out: BinaryIO | None = out
        self.next, self.ended = start, False

    def read(self, offset: int, size: int) -> bytes:
        data = self.source.read(offset, size)
        if len(data) < size:  # the object's end
            self.ended = True
        if self.out is not None:
            try:
                if offset != self.next:
                    raise OSError("a read out of sequence")
                self.out.write(data)
                self.next += len(data)
            except OSError:
                self._drop()
        return data

    def _drop(self) -> None:
        if self.out is not None:
            self.out.close()
        self.out = None
        self.temporary.unlink(missing_ok=True)

    def close(self) -> None:
        self.source.close()
        if self.out is None:
            return
        try:
            self.out.close()
            self.out = None
            final = self.final.with_name(self.final.name + _WHOLE) if self.ended else self.final
            os.replace(self.temporary, final)
        except OSError:
            self.temporary.unlink(missing_ok=True)


class _CopyReader:
    """A chunk's bytes from its copy, then (when the copy does not reach the object's end and
    more is asked for) from the store where the copy ends."""

    def __init__(self, path: Path, start: int, from_store, remove: bool):
        self.path, self.start, self.from_store, self.remove = path, start, from_store, remove
        self.whole = path.name.endswith(_WHOLE)
        self.file = open(path, "rb", buffering=0)
        self.copied = 0
        self.rest: Any = None  # the store's reader, once the copy ends

    def read(self, n: int) -> bytes:
        if self.rest is None:
            piece = self.file.read(n)
            if piece or self.whole:
                self.copied += len(piece)
                return piece
            self.rest = self.from_store(self.start + self.copied)
        return self.rest.read(n)

    def close(self) -> None:
        self.file.close()
        if self.rest is not None:
            self.rest.close()
        if self.remove:
            self.path.unlink(missing_ok=True)
