"""Day files as byte-range chunks, and the lines of a chunk as padded byte blocks.

The Arrow engine's tasks read their input themselves: Spark schedules one task per chunk (a
byte range of a plain day file, or a whole ``.gz`` day), and the task reads its bytes straight
into numpy. Handing the text to Python through Spark's own reader costs more than the whole
parse: the JVM copies every line into an Arrow batch and ships it over a socket.

Line semantics are those of the SQL engine's reader (``lineSep '\\n'``): a line ends at
``'\\n'`` only; a last line without ``'\\n'`` is a line; a file ending in ``'\\n'`` has no
empty last line. A chunk owns every line that *starts* inside its byte range, so each line is
read by exactly one chunk whatever the chunk size. A line's position is ``(chunk << 33) | k``
for the k-th line of the chunk, as ``monotonically_increasing_id`` numbers the SQL engine's
read partitions, so the statistics and line numbering code serves both engines.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from spark_jobs.engines.arrow import remote
from spark_jobs.engines.arrow.fastparse import PAD, padded_buffer

_NEWLINE = 10


@dataclass(frozen=True)
class Chunk:
    day: int
    path: str
    index: int  # the chunk's number within its day
    start: int  # byte range [start, end) of the lines it owns
    end: int
    gzipped: bool


@dataclass
class LineBlock:
    """Whole lines of one chunk: ``data[starts[i]:ends[i]]`` (no '\\n'), numbered from ``first``
    within the chunk; ``data`` has PAD bytes of padding on each side (``padded_buffer``)."""

    data: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    first: int
    # Each line's full length (without '\n' and a trailing '\r') when the block holds only the
    # first bytes of a line too long to gather (``line_blocks``); None: every line is whole.
    cut: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.starts)

    def line(self, i: int) -> bytes:
        return self.data[self.starts[i] : self.ends[i]].tobytes()


class ChunkReadError(RuntimeError):
    """A day file that cannot be read to its end (a truncated or corrupt gzip stream)."""


def plan_chunks(days, chunk_bytes: int) -> list[Chunk]:
    """Chunks of about ``chunk_bytes`` per plain day file; one chunk per gzip file."""
    chunks = []
    for d in days:
        size = remote.size(d.path)
        if d.gzipped:
            chunks.append(Chunk(d.day, str(d.path), 0, 0, size, True))
            continue
        count = max(1, -(-size // max(1, chunk_bytes)))
        bounds = [size * k // count for k in range(count + 1)]
        chunks += [Chunk(d.day, str(d.path), k, bounds[k], bounds[k + 1], False) for k in range(count)]
    return chunks


def input_tasks(days, cfg) -> int:
    """The count and transform passes' reading tasks: one per chunk (what progress plans on)."""
    return len(plan_chunks(days, max(1, cfg.arrow_chunk_mb) << 20))


def _raw_pieces(chunk: Chunk, read_bytes: int) -> Iterator[bytes]:
    """The chunk's bytes from one byte before its start (to see whether a line starts there)
    to the end of the file, in pieces of at most ``read_bytes``; gzip streams decompressed
    (concatenated members included). A local file; behind a URL ``_remote_pieces``."""
    with open(chunk.path, "rb", buffering=0) as fh:
        if not chunk.gzipped:
            fh.seek(max(chunk.start - 1, 0))
            while piece := fh.read(read_bytes):
                yield piece
            return
        yield from _gunzip(fh, chunk.path, read_bytes)


class _StreamSource:
    """Reads of an S3 object as pieces of streamed GETs: one GET from the first offset to
    ``limit`` (a chunk's end plus one block), and only when a read goes past it, another to
    the object's end. So a chunk is one request whatever the read sizes."""

    def __init__(self, url: str, limit: float):
        self.url, self.limit = url, limit
        self.stream: remote.Stream | None = None
        self.at = -1

    def read(self, offset: int, size: int) -> bytes:
        if self.stream is None or offset != self.at:
            self.close()
            end = int(self.limit) if offset < self.limit < float("inf") else None
            self.stream, self.at = remote.stream_range(self.url, offset, end), offset
        assert self.stream is not None
        data = self.stream.read(size)
        self.at += len(data)
        if len(data) < size and self.at == self.limit:  # the GET's end, not the object's
            self.close()
            return data + self.read(self.at, size - len(data))
        return data

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()
            self.stream = None


class _RangeSource:
    """Reads of an object as ranged requests, one each (stores without a streamed read here)."""

    def __init__(self, url: str):
        self.url, self.handle = url, None

    def read(self, offset: int, size: int) -> bytes:
        if self.handle is None:
            self.handle = remote.open_remote(self.url)
        return remote.read_range(self.handle, offset, size)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None


class _ReadAhead:
    """An object read front to back (``read(n)`` hands the reads out in pieces of ``n``): reads
    grow from ``REMOTE_FIRST_READ_BYTES`` to ``largest`` (a task starts parsing after a short
    wait, then each read's latency is a small part of its transfer), and the next one is
    already under way on a thread (the network call releases the GIL) while the task parses
    the current one: a task holds at most two reads. Reads stop at ``limit`` (a chunk's end
    plus one block, for the line running across it); past it, more is read only when asked
    for."""

    def __init__(self, source, offset: int, limit: float, largest: int):
        from concurrent.futures import ThreadPoolExecutor

        self.source, self.offset, self.limit, self.largest = source, offset, limit, max(1, largest)
        self.buffer, self.at, self.done = b"", 0, False
        self.size = min(remote.REMOTE_FIRST_READ_BYTES, self.largest)
        self.pool = ThreadPoolExecutor(1)
        self.pending = self._request()

    def _request(self):
        size, self.size = self.size, min(2 * self.size, self.largest)
        if self.offset < self.limit:
            size = int(min(size, self.limit - self.offset))
        offset, self.offset = self.offset, self.offset + size
        return self.pool.submit(lambda: (self.source.read(offset, size), size))

    def read(self, n: int) -> bytes:
        if self.at >= len(self.buffer):
            if self.pending is None:
                if self.done:
                    return b""
                self.pending = self._request()
            self.buffer, asked = self.pending.result()
            self.at, self.pending = 0, None
            self.done = len(self.buffer) < asked  # the object's end
            if not self.done and self.offset < self.limit:
                self.pending = self._request()
        piece = self.buffer[self.at : self.at + n]
        self.at += len(piece)
        return piece

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.source.close()


def _remote_pieces(chunk: Chunk, read_bytes: int, largest: int, copy=None) -> Iterator[bytes]:
    """``_raw_pieces`` of a day file behind a URL: a plain file from one byte before the
    chunk's start, a ``.gz`` from its start to its end (its members are only found by
    inflating from the start); on S3 one streamed GET, elsewhere ranged requests. ``copy``
    (``input_copies.ChunkCopy``): the node's local copy of the chunk, kept or read."""
    start = 0 if chunk.gzipped else max(chunk.start - 1, 0)
    limit = float("inf") if chunk.gzipped else chunk.end + read_bytes

    def from_store(offset: int, wrap=None):
        source = _StreamSource(chunk.path, limit) if remote.streams(chunk.path) else _RangeSource(chunk.path)
        return _ReadAhead(wrap(source) if wrap else source, offset, limit, largest)

    reader = copy.reader(start, from_store) if copy is not None else from_store(start)
    try:
        if chunk.gzipped:
            yield from _gunzip(reader, chunk.path, read_bytes)
            return
        while piece := reader.read(read_bytes):
            yield piece
    finally:
        reader.close()


def _gunzip(fh, path: str, read_bytes: int) -> Iterator[bytes]:
    """The decompressed stream in pieces of at most ``read_bytes``: a megabyte of deflate
    can hold a gigabyte of text, so the output, not the input, bounds the memory."""
    stream, fed = zlib.decompressobj(wbits=31), False
    try:
        while compressed := fh.read(read_bytes):
            while compressed:
                fed = True
                yield from _inflate(stream, compressed, read_bytes)
                if not stream.eof:
                    break
                compressed = stream.unused_data  # another gzip member follows
                stream, fed = zlib.decompressobj(wbits=31), False
    except zlib.error as error:
        raise ChunkReadError(f"{path}: corrupt gzip stream ({error})") from None
    if fed and not stream.eof:
        raise ChunkReadError(
            f"{path}: EOFException: Unexpected end of gzip input stream (the file is truncated)"
        )


def _inflate(stream, data: bytes, limit: int) -> Iterator[bytes]:
    """``data`` fed to ``stream``, its output in pieces of at most ``limit`` bytes, up to the
    end of ``data`` or of the gzip member (what follows it is then ``stream.unused_data``).
    A full piece may leave output pending in the stream: it is asked again, with no new input
    once ``data`` is consumed."""
    while True:
        piece = stream.decompress(data, limit)
        if piece:
            yield piece
        if stream.eof:
            return
        data = stream.unconsumed_tail
        if not data and len(piece) < limit:
            return


@dataclass
class _LongLine:
    """A line longer than the limit, being read: its first bytes, its length so far, its last
    byte (a trailing '\\r' is not part of a line's length)."""

    head: bytes
    length: int
    last: int

    def add(self, piece: bytes, stop: int) -> None:
        """``piece[:stop]`` is more of the line (counted, not copied)."""
        if stop:
            self.length += stop
            self.last = piece[stop - 1]

    def block(self, first: int) -> LineBlock:
        """The line as a block of its first bytes, with its full length."""
        data = padded_buffer(self.head)
        return LineBlock(
            data,
            np.array([PAD], np.int64),
            np.array([PAD + len(self.head)], np.int64),
            first,
            cut=np.array([self.length - (self.last == 13)], np.int64),
        )


def line_blocks(
    chunk: Chunk,
    block_bytes: int = 1 << 20,
    max_line_bytes: int | None = None,
    remote_read_bytes: int = 64 << 20,
    copy=None,
) -> Iterator[LineBlock]:
    """The chunk's lines, in order, as blocks of about ``block_bytes`` of text.

    A line still unfinished after more than ``max_line_bytes`` + 1 bytes (room for a '\\r')
    is not gathered: its first ``max_line_bytes`` are kept, the rest only counted, and it comes
    as a block of its own (``LineBlock.cut``). So every byte is copied a bounded number of
    times and the reader holds at most ``block_bytes`` + ``max_line_bytes`` + 1 bytes of text,
    whatever the length of a line or the ratio of a gzip stream. None: no limit.
    ``remote_read_bytes``: the largest read of a day file behind a URL (``_ReadAhead``);
    ``copy``: its node-local copy, made or read (``input_copies``; a local file has none)."""
    pending = b""  # bytes after the last complete line seen so far
    offset = max(chunk.start - 1, 0) if not chunk.gzipped else 0  # file offset of pending[0]
    skip_to_line_start = not chunk.gzipped and chunk.start > 0
    first = 0
    long: _LongLine | None = None
    end = _end(chunk)
    pieces = (
        _remote_pieces(chunk, block_bytes, remote_read_bytes, copy)
        if remote.is_url(chunk.path)
        else _raw_pieces(chunk, block_bytes)
    )
    for piece in pieces:
        if long is not None:
            cut = piece.find(b"\n")
            long.add(piece, len(piece) if cut < 0 else cut)
            offset += len(piece) if cut < 0 else cut + 1
            if cut < 0:
                continue
            yield long.block(first)
            first, long, piece = first + 1, None, piece[cut + 1 :]
            if offset >= end:
                return
        text = pending + piece if pending else piece
        if skip_to_line_start:
            cut = text.find(b"\n")
            if cut < 0:
                pending, offset = b"", offset + len(text)
                if offset >= end:  # no line starts in this chunk
                    return
                continue
            text, offset = text[cut + 1 :], offset + cut + 1
            skip_to_line_start = False
            if offset >= end:
                return
        last = text.rfind(b"\n")
        if last < 0:
            pending = text
        else:
            block, done = _block(text[: last + 1], offset, chunk, first)
            pending, offset = text[last + 1 :], offset + last + 1
            if block is not None:
                first += len(block)
                yield block
            if done:
                return
        if max_line_bytes is not None and len(pending) > max_line_bytes + 1:
            long = _LongLine(pending[:max_line_bytes], len(pending), pending[-1])
            pending, offset = b"", offset + len(pending)
    if long is not None:
        yield long.block(first)
    elif pending and not skip_to_line_start and offset < end:
        yield _single_line_block(pending, first)


def _end(chunk: Chunk) -> float:
    return float("inf") if chunk.gzipped else chunk.end


def _block(text: bytes, offset: int, chunk: Chunk, first: int):
    """Lines of ``text`` (ending in '\\n', starting at file ``offset``) that start before the
    chunk's end; and whether the chunk's last line has been reached."""
    data = padded_buffer(text)
    ends = np.flatnonzero(data == _NEWLINE)
    starts = np.empty_like(ends)
    starts[0] = PAD
    starts[1:] = ends[:-1] + 1
    owned = int(np.searchsorted(starts - PAD + offset, _end(chunk), side="left"))
    done = owned < len(starts) or offset + len(text) >= _end(chunk)
    if owned == 0:
        return None, True
    return LineBlock(data, starts[:owned], ends[:owned], first), done


def _single_line_block(text: bytes, first: int) -> LineBlock:
    """The file's last line when it has no '\\n'."""
    data = padded_buffer(text)
    return LineBlock(data, np.array([PAD], np.int64), np.array([PAD + len(text)], np.int64), first)
