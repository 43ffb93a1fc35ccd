"""The Arrow engine's vector parse, chunk reader and order keys, without Spark.

The vector path (``parse_block``) and the exact slow path (``parse_line_exact``) must give the
same answer on the same lines, and both must agree with the plain-Python reference of the
rules in tests/spark_fixtures.py (an independent reading of docs/spark_jobs.md).
"""

from __future__ import annotations

import gzip
import random

import numpy as np
import pytest

from dlrm_contracts.config import PreprocessConfig
from dlrm_contracts.hex_text import format_hex
from spark_fixtures import BAD_LINES, TOO_LONG_LINES, random_line, reference_parse, salted_days
from spark_jobs.engines.arrow.chunks import ChunkReadError, line_blocks, plan_chunks
from spark_jobs.engines.arrow.fastparse import (
    MISSING,
    REASON_CODES,
    padded_buffer,
    parse_block,
    parse_hex,
    parse_line_exact,
)
from spark_jobs.inputs import DayFile

LIMIT = PreprocessConfig().max_line_bytes

# Pieces that hit every rule's edges: 64-bit limits, leading zeros, signs, case, terminators
# other than '\n' (data), non-ASCII bytes, fields one character too long.
ODD_PIECES = [
    "0",
    "1",
    "9",
    "-",
    "--1",
    "-0",
    "a",
    "F",
    "g",
    "\t",
    "\r",
    "\u0085",
    "\u2028",
    "é",
    " ",
    "+",
    "x",
    "12345678",
    "123456789",
    "1234567812345678",
    "12345678123456789",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "00000000000000000000001",
    "ABCDEF12",
    "abcdef123",
    "0x1f",
    "1e3",
    "1.5",
]


def _odd_line(rng: random.Random) -> str:
    fields = random_line(rng).split("\t")
    for _ in range(rng.randint(0, 3)):
        fields[rng.randrange(len(fields))] = "".join(rng.choice(ODD_PIECES) for _ in range(rng.randint(0, 3)))
    if rng.random() < 0.3:
        fields = fields[: rng.randint(0, 41)]
    if rng.random() < 0.05:
        fields.append("7")
    return "\t".join(fields)


def _block(lines: list[str]):
    data = padded_buffer(b"".join(line.encode() + b"\n" for line in lines))
    ends = np.flatnonzero(data == 10)
    starts = np.concatenate([[16], ends[:-1] + 1]).astype(np.int64)
    return data, starts, ends


def _as_reference(parsed, i: int):
    """Row i of a ParsedLines in the reference's terms."""
    reason = REASON_CODES[parsed.reason[i]] or None
    if reason:
        return reason
    ints = [None if m else int(v) for v, m in zip(parsed.ints[i], parsed.int_missing[i])]
    cats = [None if v == MISSING else "%08x" % v for v in parsed.cats[i]]
    return None, bool(parsed.padded[i]), int(parsed.label[i]), ints, cats


def _without_cr(line: str) -> str:
    """The line as the reader hands it on: one trailing '\r' dropped (CRLF files)."""
    return line[:-1] if line.endswith("\r") else line


def _exact_as_reference(line: str):
    reason, padded, label, ints, cats = parse_line_exact(_without_cr(line).encode(), LIMIT)
    if reason:
        return REASON_CODES[reason]
    return None, padded, label, ints, [None if c is None else "%08x" % c for c in cats]


def _reference(line: str):
    ref = reference_parse(_without_cr(line))
    return ref[0] if ref[0] else ref


def _lines(seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = [_odd_line(rng) for _ in range(3000)]
    lines += [line for group in BAD_LINES.values() for line in group] + TOO_LONG_LINES
    lines += [line for day in salted_days(seed, 2, 300) for line in day]
    rng.shuffle(lines)
    return lines


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_vector_path_slow_path_and_reference_agree_line_by_line(seed):
    lines = _lines(seed)
    parsed = parse_block(*_block(lines), LIMIT)
    for i, line in enumerate(lines):
        expected = _reference(line)
        assert _as_reference(parsed, i) == expected, repr(line)
        assert _exact_as_reference(line) == expected, repr(line)
    # the odd pieces really reached every rule and both paths
    assert set(parsed.reason.tolist()) == set(range(len(REASON_CODES)))
    assert parsed.slow.any() and parsed.padded.any()


def test_crlf_lines_parse_as_their_lf_twins():
    lines = _lines(4)[:500]
    lf = parse_block(*_block(lines))
    crlf = parse_block(*_block([line + "\r" for line in lines]))
    for name in ("reason", "padded", "label", "ints", "int_missing", "cats"):
        assert np.array_equal(getattr(lf, name), getattr(crlf, name)), name


def test_hex_values_round_trip_through_the_normalised_strings():
    rng = np.random.default_rng(0)
    values = np.concatenate([[0, 1, 0xFFFFFFFF], rng.integers(0, 2**32, 1000)]).astype(np.int64)
    strings = format_hex(values).to_pylist()
    assert strings == [f"{v:08x}" for v in values.tolist()]
    assert np.array_equal(parse_hex(strings), values)
    with pytest.raises(ValueError):
        parse_hex(["0000000G"])
    with pytest.raises(ValueError):
        parse_hex(["ABCDEF12"])  # dictionaries hold lowercase values only


def _read_all(path, chunk_bytes: int, block_bytes: int) -> list[bytes]:
    day = DayFile(0, path)
    out = []
    for chunk in plan_chunks([day], chunk_bytes):
        for block in line_blocks(chunk, block_bytes):
            out += [block.line(i) for i in range(len(block))]
    return out


@pytest.mark.parametrize("ending", [b"", b"\n"])
def test_every_line_is_read_once_whatever_the_chunk_and_block_sizes(tmp_path, ending):
    rng = random.Random(9)
    lines = [bytes(rng.choice(b"ab\t\r") for _ in range(rng.randint(0, 12))) for _ in range(300)]
    text = b"\n".join(lines) + ending
    plain = tmp_path / "day_0"
    plain.write_bytes(text)
    zipped = tmp_path / "day_1.gz"
    cut = len(text) // 3
    zipped.write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:]))  # two members
    for chunk_bytes in (1, 7, 64, 1000, 1 << 20):
        for block_bytes in (1, 5, 300, 1 << 16):
            assert _read_all(plain, chunk_bytes, block_bytes) == lines, (chunk_bytes, block_bytes)
    assert _read_all(zipped, 10, 50) == lines


def test_truncated_and_corrupt_gzip_days_are_read_errors_naming_the_file(tmp_path):
    rng = random.Random(3)
    data = gzip.compress("".join(f"1\t{rng.getrandbits(40)}\n" for _ in range(5000)).encode())
    truncated = tmp_path / "day_0.gz"
    truncated.write_bytes(data[:-100])
    with pytest.raises(ChunkReadError, match=r"day_0\.gz: EOFException"):
        _read_all(truncated, 1 << 20, 1 << 10)
    corrupt = tmp_path / "day_1.gz"
    corrupt.write_bytes(data[:20] + b"\xff" * 50 + data[70:])
    with pytest.raises(ChunkReadError, match=r"day_1\.gz: corrupt gzip"):
        _read_all(corrupt, 1 << 20, 1 << 10)


@pytest.mark.parametrize("flush_lines", [1, 7, 1 << 18])
def test_count_task_sums_whatever_the_flush_size(tmp_path, flush_lines):
    """Partial value counts merged within a chunk (any flush size) equal a plain count; the
    statistics rows count every line, the short and the rejected ones included; the sample
    rows are drawn from the partial files and stand for all their entries."""
    import pyarrow as pa

    from spark_jobs.engines.arrow.dictionaries import KIND_SAMPLE, KIND_STATS
    from spark_jobs.engines.arrow.tasks import CODE_BITS, LINES, ReadSettings, count_task
    from spark_jobs.engines.arrow.partial_files import files, read_layout, slices

    lines = _lines(5)[:800]
    path = tmp_path / "day_0"
    path.write_bytes("".join(line + "\n" for line in lines).encode())
    chunks = plan_chunks([DayFile(0, path)], 10_000)
    partials = tmp_path / "partials"
    task = count_task(
        chunks, frozenset([0]), ReadSettings(block_bytes=4096, count_flush_lines=flush_lines), str(partials)
    )
    ids = pa.record_batch({"id": pa.array(range(len(chunks)), pa.int64())})
    lines_seen, samples = 0, []
    for batch in task([ids]):
        for row in batch.to_pylist():
            if row["kind"] == KIND_STATS:
                lines_seen += row["count"] if row["value"] & ((1 << CODE_BITS) - 1) == LINES else 0
            else:
                assert row["kind"] == KIND_SAMPLE
                samples.append((row["column"], row["value"], np.frombuffer(row["values"], np.uint32)))
    got, entries, seen = {}, {}, {}
    assert len(files(partials)) == len(chunks)
    for name in files(partials):
        layout = read_layout(name)
        for column in range(26):
            for day, counts in slices(name, layout, column, 0, None):
                assert day == 0
                assert np.all(np.diff(counts.values.astype(np.int64)) > 0)  # distinct, ascending
                entries[column] = entries.get(column, 0) + len(counts)
                seen.setdefault(column, set()).update(counts.values.tolist())
                for value, count in zip(counts.values.tolist(), counts.counts.tolist()):
                    key = (column, "%08x" % value)
                    got[key] = got.get(key, 0) + count
    for column, stands_for, values in samples:
        assert np.all(np.diff(values.astype(np.int64)) > 0)
        assert set(values.tolist()) <= seen[column]  # a subset of the partials
    assert {c: sum(n for k, n, _ in samples if k == c) for c in entries} == entries
    expected = {}
    for line in lines:
        parsed = reference_parse(_without_cr(line))
        if parsed[0] is None:
            for j, value in enumerate(parsed[4]):
                if value is not None:
                    expected[(j, value)] = expected.get((j, value), 0) + 1
    assert got == expected
    assert lines_seen == len(lines)
    assert len(chunks) > 1
