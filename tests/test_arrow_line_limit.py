"""The Arrow engine's reader against huge lines and decompression bombs, without Spark.

A line longer than ``preprocess.max_line_bytes`` is handed on as its first bytes and its full
length (``LineBlock.cut``), whatever the chunk and block sizes; reading it copies each byte a
bounded number of times (not once per read, as gathering it would), and a gzip day's text is
inflated in bounded pieces, so a task's memory does not follow the compression ratio.
"""

from __future__ import annotations

import gzip
import os
import random
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from spark_jobs.engines.arrow import chunks as chunks_module
from spark_jobs.engines.arrow.chunks import line_blocks, plan_chunks
from spark_jobs.engines.arrow.fastparse import REASON_CODES, parse_block
from spark_jobs.engines.arrow.tasks import ReadSettings, reject_task
from spark_jobs.inputs import DayFile

ROOT = Path(__file__).resolve().parents[1]


def _stripped(line: bytes) -> bytes:
    return line[:-1] if line.endswith(b"\r") else line


def _read(path, chunk_bytes: int, block_bytes: int, limit: int) -> list[tuple[bytes, int]]:
    """(first ``limit`` bytes, full length) of every line, as the reader hands them on."""
    out = []
    for chunk in plan_chunks([DayFile(0, path)], chunk_bytes):
        for block in line_blocks(chunk, block_bytes, limit):
            for i in range(len(block)):
                if block.cut is not None:
                    out.append((block.line(i)[:limit], int(block.cut[i])))
                else:
                    line = _stripped(block.line(i))
                    out.append((line[:limit], len(line)))
    return out


@pytest.mark.parametrize("ending", [b"", b"\n"])
def test_long_lines_come_as_their_first_bytes_and_length_whatever_the_sizes(tmp_path, ending):
    rng = random.Random(5)
    limit = 20
    lines = [
        bytes(rng.choice(b"ab\t\r") for _ in range(rng.choice([0, 3, limit, limit + 1, limit + 2, 50, 300])))
        for _ in range(120)
    ]
    text = b"\n".join(lines) + ending
    plain = tmp_path / "day_0"
    plain.write_bytes(text)
    zipped = tmp_path / "day_1.gz"
    zipped.write_bytes(gzip.compress(text[:777]) + gzip.compress(text[777:]))
    want = [(_stripped(line)[:limit], len(_stripped(line))) for line in lines]
    for chunk_bytes in (1, 7, 64, 1000, 1 << 20):
        for block_bytes in (1, 5, 64, 1 << 16):
            assert _read(plain, chunk_bytes, block_bytes, limit) == want, (chunk_bytes, block_bytes)
    for block_bytes in (1, 5, 64, 1 << 16):
        assert _read(zipped, 1 << 20, block_bytes, limit) == want, block_bytes


def test_a_cut_line_is_rejected_as_too_long_and_keeps_only_its_first_bytes(tmp_path):
    limit = 1024
    valid = "1\t" + "\t".join(["5"] * 13) + "\t" + "\t".join(["0a0b0c0d"] * 26)
    huge = "1\t" + "0" * 300_000 + "5\r"  # valid but for its length; a CRLF line
    path = tmp_path / "day_0"
    path.write_text("\n".join([valid, huge, valid, "2" * 2000]) + "\n")
    chunks = plan_chunks([DayFile(0, path)], 1 << 20)
    settings = ReadSettings(block_bytes=4096, count_flush_lines=1 << 10, max_line_bytes=limit)
    blocks = list(line_blocks(chunks[0], settings.block_bytes, limit))
    reasons = [
        REASON_CODES[r] for b in blocks for r in parse_block(b.data, b.starts, b.ends, limit, b.cut).reason
    ]
    assert reasons == ["", "line_too_long", "", "line_too_long"]
    import pyarrow as pa

    rows = pa.Table.from_batches(
        list(reject_task(chunks, settings)(iter([pa.record_batch({"id": pa.array([0], pa.int64())})])))
    ).to_pylist()
    assert [(r["pos"], r["reason"], r["line_bytes"]) for r in rows] == [
        (1, "line_too_long", len(huge) - 1),
        (3, "line_too_long", 2000),
    ]
    assert [r["line"] for r in rows] == [huge[:limit], "2" * limit]


class _Counted(bytes):
    """A piece of input that counts the bytes copied when something is put in front of it
    (``pending + piece``: the reader's only copy of text it has not yet cut into lines)."""

    copied = 0

    def __radd__(self, other: bytes) -> bytes:
        _Counted.copied += len(other) + len(self)
        return bytes(other) + bytes(self)


def test_a_line_with_no_newline_is_read_in_linear_time(tmp_path, monkeypatch):
    """Each read used to be appended to everything read since the last '\\n', so a line of n
    bytes read in pieces of b cost n²/2b bytes of copies (339 s for a 300 MB line)."""
    size, block, limit = 4 << 20, 4096, 1024
    path = tmp_path / "day_0"
    path.write_bytes(b"1\t2\n" + b"7" * size + b"\n0\t3\n")
    pieces = chunks_module._raw_pieces
    monkeypatch.setattr(
        chunks_module, "_raw_pieces", lambda chunk, read: (_Counted(p) for p in pieces(chunk, read))
    )
    _Counted.copied = 0
    lines = _read(path, 1 << 30, block, limit)
    assert lines == [(b"1\t2", 3), (b"7" * limit, size), (b"0\t3", 3)]
    assert _Counted.copied <= 2 * size, _Counted.copied


def _zeros_gz(path, inflated: int) -> None:
    """A gzip file of ``inflated`` zero bytes, written a megabyte at a time."""
    with open(path, "wb") as fh:
        stream = zlib.compressobj(9, zlib.DEFLATED, 31)
        piece = bytes(1 << 20)
        for _ in range(inflated >> 20):
            fh.write(stream.compress(piece))
        fh.write(stream.flush())


def test_a_gzip_bomb_is_read_in_bounded_memory(tmp_path):
    """256 MB of zeros (one line, no '\\n') from a 250 KB file: the reader's peak memory grows
    by about a block and the kept first bytes, not by the inflated size."""
    bomb = tmp_path / "day_0.gz"
    _zeros_gz(bomb, 256 << 20)
    assert bomb.stat().st_size < 1 << 20
    script = textwrap.dedent(f"""
        import resource
        from spark_jobs.engines.arrow.chunks import line_blocks, plan_chunks
        from spark_jobs.inputs import DayFile
        (chunk,) = plan_chunks([DayFile(0, __import__("pathlib").Path({str(bomb)!r}))], 1 << 20)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        blocks = list(line_blocks(chunk, 1 << 20, 4096))
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert len(blocks) == 1 and int(blocks[0].cut[0]) == 256 << 20, blocks
        print((after - before) * 1024)
    """)
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    growth = int(out.stdout.split()[-1])
    assert growth < 32 << 20, f"peak memory grew by {growth / 2**20:.0f} MB"


def test_the_size_estimate_of_a_gzip_bomb_inflates_a_bounded_sample(tmp_path):
    """Progress and the preflight estimate a day's lines from its first compressed bytes: a
    bomb's sample is cut short at a bounded amount of text, read a piece at a time."""
    import tracemalloc

    from spark_jobs.inputs import SAMPLE_TEXT_RATIO, bytes_per_line

    bomb = tmp_path / "day_0.gz"
    _zeros_gz(bomb, 128 << 20)
    sample = 64 << 10
    tracemalloc.start()
    try:
        per_line = bytes_per_line(bomb, sample)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert per_line <= sample  # no line end seen: the bytes read, one line
    assert peak < 4 << 20 < SAMPLE_TEXT_RATIO * sample * 8, peak


def test_the_line_limit_is_a_checked_setting():
    """Below 1024 bytes the limit could reject valid Criteo lines (up to 510 bytes): refused
    when the config is made, with the setting named."""
    from dlrm_contracts.config import ConfigError, PreprocessConfig

    assert PreprocessConfig().max_line_bytes == 4096
    with pytest.raises(ConfigError, match="preprocess.max_line_bytes must be >= 1024"):
        PreprocessConfig(max_line_bytes=100)
