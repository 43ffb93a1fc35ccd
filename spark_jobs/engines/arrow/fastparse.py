"""Raw Criteo lines → typed columns with numpy over whole blocks of lines (the Arrow engine's parse).

The rules are those of docs/spark_jobs.md ("Rules for every line"); ``parse_line_exact`` states
them line by line in plain Python and is the *slow path*. ``parse_block`` applies the same rules
to a whole block at once:

- tabs are found with one scan of the block; a line's fields are the gaps between its tabs, so
  a short line (fewer than 40 fields) simply has empty trailing fields;
- a field of up to 8 characters is read as one little-endian 64-bit word that *ends* where
  the field ends (the block carries 16 bytes of padding on each side, so such a load never
  leaves the buffer); the bytes before the field are masked to ``'0'``. Checking and
  converting 8 digits or 8 hex characters is then a handful of 64-bit operations (SWAR);
- integers of up to 16 digits are two such words; a line with a longer integer field takes the
  slow path, which decides 64-bit overflow exactly (such lines are vanishingly rare).

A categorical is kept as the integer value of its hex digits: left zero-padding and letter
case do not change that value, so the normalisation rule (8 lowercase hex digits) holds by
construction, and ``dlrm_contracts.hex_text.format_hex`` gives the normalised string back.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlrm_contracts.schema import NUM_CATEGORICAL, NUM_FIELDS, NUM_INTEGER, REJECT_REASONS

# reason codes: 0 = valid, then the reject reasons in their order of precedence
REASON_CODES: tuple[str, ...] = ("", *REJECT_REASONS)
TOO_LONG, TOO_MANY, BAD_LABEL, NON_INTEGER, NON_HEX = 1, 2, 3, 4, 5
MISSING = -1  # the value of a missing categorical (a present one is 0 .. 2**32 - 1)
PAD = 16  # bytes of padding before and after a block's data
_FIRST_CAT = 1 + NUM_INTEGER
_TABS = NUM_FIELDS - 1
_MAX_FAST_DIGITS = 16
_INT64_MAX = 2**63 - 1

_ONES = np.uint64(0x0101010101010101)
_HIGH = np.uint64(0x8080808080808080)
_ZEROS = np.uint64(0x3030303030303030)  # eight '0' characters


@dataclass
class ParsedLines:
    """One block's lines, parsed. Arrays have one row per line, in line order."""

    reason: np.ndarray  # uint8 reason code (0 = valid)
    padded: np.ndarray  # bool: fewer than 40 fields
    slow: np.ndarray  # bool: decided by the exact slow path
    label: np.ndarray  # int32 (0 where rejected)
    ints: np.ndarray  # int64 [n, 13] (0 where missing)
    int_missing: np.ndarray  # bool [n, 13]
    cats: np.ndarray  # int64 [n, 26]: the hex value, MISSING where missing

    def __len__(self) -> int:
        return len(self.reason)

    @property
    def valid(self) -> np.ndarray:
        return self.reason == 0


def padded_buffer(payload: bytes | bytearray | memoryview) -> np.ndarray:
    """``payload`` copied into a uint8 array with PAD zero bytes on each side."""
    out = np.zeros(len(payload) + 2 * PAD, np.uint8)
    out[PAD : PAD + len(payload)] = np.frombuffer(payload, np.uint8)
    return out


def _words(data: np.ndarray) -> np.ndarray:
    """A view of ``data`` as overlapping little-endian uint64 words, one starting at every byte."""
    return np.ndarray((len(data) - 7,), dtype="<u8", buffer=data, offset=0, strides=(1,))


def _all_digits(x: np.ndarray) -> np.ndarray:
    """True where every byte of the word is '0'..'9' (a byte >= 0xFA carries into its neighbour,
    but it already fails the first test, so the word is rejected either way)."""
    high = np.uint64(0xF0F0F0F0F0F0F0F0)
    return ((x & high) == _ZEROS) & (((x + np.uint64(0x0606060606060606)) & high) == _ZEROS)


def _all_hex(x: np.ndarray) -> np.ndarray:
    """True where every byte of the word is a hex digit, either case. For a byte below 0x80,
    adding 0x80 - c sets its high bit exactly when the byte is >= c, with no carry into the next
    byte; bytes with the high bit set are rejected by ``~x`` (their carries only touch words
    that are rejected anyway)."""
    lower = x | np.uint64(0x2020202020202020)
    digit = (x + _ONES * np.uint64(0x80 - 0x30)) & ~(x + _ONES * np.uint64(0x80 - 0x3A))
    letter = (lower + _ONES * np.uint64(0x80 - 0x61)) & ~(lower + _ONES * np.uint64(0x80 - 0x67))
    return ((digit | letter) & ~x & _HIGH) == _HIGH


def _low_masks() -> tuple[np.ndarray, np.ndarray]:
    """For keep = 0..8: the mask that clears all but the last ``keep`` bytes of a word, and the
    '0' characters that fill the cleared bytes."""
    low = np.array([(1 << (8 * (8 - k))) - 1 if k else 2**64 - 1 for k in range(9)], np.uint64)
    return ~low, np.uint64(0x3030303030303030) & low


_KEEP_MASK, _ZERO_FILL = _low_masks()


def _keep_last(words: np.ndarray, keep: np.ndarray) -> np.ndarray:
    """The words with all but their last ``keep`` (0..8) bytes replaced by '0'."""
    words &= _KEEP_MASK[keep]
    words |= _ZERO_FILL[keep]
    return words


def _decimal8(words: np.ndarray) -> np.ndarray:
    """Eight ASCII digits (first digit in the lowest byte) → their value (0 .. 99,999,999)."""
    v = words - _ZEROS
    v = (v * np.uint64(10)) + (v >> np.uint64(8))
    v = ((v & np.uint64(0x000000FF000000FF)) * np.uint64(100 + (1000000 << 32))) + (
        ((v >> np.uint64(16)) & np.uint64(0x000000FF000000FF)) * np.uint64(1 + (10000 << 32))
    )
    return (v >> np.uint64(32)).astype(np.int64)


def _hex8(words: np.ndarray) -> np.ndarray:
    """Eight ASCII hex digits (either case, first in the lowest byte) → their value (uint32)."""
    v = words.byteswap()
    v = (v & np.uint64(0x0F0F0F0F0F0F0F0F)) + ((v >> np.uint64(6)) & _ONES) * np.uint64(9)
    v = ((v >> np.uint64(4)) | v) & np.uint64(0x00FF00FF00FF00FF)
    v = ((v >> np.uint64(8)) | v) & np.uint64(0x0000FFFF0000FFFF)
    v = ((v >> np.uint64(16)) | v) & np.uint64(0x00000000FFFFFFFF)
    return v.astype(np.int64)


def _full_lines(at: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """_field_bounds when every line has exactly 40 fields: the tabs are a [n, 39] matrix."""
    n = len(starts)
    # int32 halves the bytes of the transposing copy (a block is far below 2 GB)
    fe = np.empty((NUM_FIELDS, n), np.int32)
    fe[:_TABS] = at.astype(np.int32).T
    fe[_TABS] = ends
    length = np.empty_like(fe)
    np.subtract(fe[0], starts, out=length[0])
    np.subtract(fe[1:], fe[:-1], out=length[1:])
    length[1:] -= 1
    return fe, length, np.full(n, _TABS, np.int32)


def _field_bounds(data: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """Field ends and lengths [40, n] (one contiguous row per field, so every later step runs
    over long contiguous rows) and each line's tab count; missing fields are empty."""
    tabs = np.flatnonzero(data == 9)
    n = len(starts)
    if len(tabs) == n * _TABS and n:
        at = tabs.reshape(n, _TABS)
        if np.all(at[:, 0] > starts) and np.all(at[:, -1] < ends):  # 39 tabs in every line
            return _full_lines(at, starts, ends)
    first = np.searchsorted(tabs, starts)
    ntabs = np.searchsorted(tabs, ends) - first
    if len(tabs) == 0:
        tabs = np.zeros(1, np.int64)
    at = tabs[np.minimum(first + np.arange(_TABS)[:, None], len(tabs) - 1)]
    field = np.arange(NUM_FIELDS)[:, None]
    fs = np.empty((NUM_FIELDS, n), np.int64)
    fs[0] = starts
    fs[1:] = at + 1
    fe = np.empty_like(fs)
    fe[:_TABS] = at
    fe[_TABS] = ends
    fe = np.where(field >= ntabs, ends, fe)
    fs = np.where(field > ntabs, ends, fs)
    return fe, fe - fs, ntabs


def _parse_integers(words: np.ndarray, data: np.ndarray, fe: np.ndarray, length: np.ndarray):
    """I1..I13: values, missing mask, bad (non-integer) mask, too long for the fast path.
    Fields of up to 8 digits (nearly all) are one word; longer ones add a second."""
    missing = length == 0
    negative = (data[fe - length] == 45) & ~missing  # '-'
    digits = length - negative
    long_field = digits > _MAX_FAST_DIGITS
    low = _keep_last(words[fe - 8], np.minimum(digits, 8))
    ok = _all_digits(low)
    value = _decimal8(low)
    wide = np.flatnonzero((digits > 8) & ~long_field)
    if len(wide):
        at = np.unravel_index(wide, digits.shape)
        high = _keep_last(words[fe[at] - 16], digits[at] - 8)
        ok[at] &= _all_digits(high)
        value[at] += _decimal8(high) * 100_000_000
    bad = ~missing & ~long_field & (~ok | (digits == 0))
    np.negative(value, out=value, where=negative)
    value[missing | bad] = 0
    return value, missing, bad, long_field & ~missing


def _parse_categoricals(words: np.ndarray, fe: np.ndarray, length: np.ndarray):
    """C1..C26: hex values (MISSING where empty) and the bad (non-hex) mask."""
    missing = length == 0
    word = _keep_last(words[fe - 8], np.minimum(length, 8))
    ok = _all_hex(word)
    bad = ~missing & ((length > 8) | ~ok)
    value = np.where(missing | bad, MISSING, _hex8(word))
    return value, bad


def parse_block(
    data: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    max_line_bytes: int | None = None,
    lengths: np.ndarray | None = None,
) -> ParsedLines:
    """Parse lines ``data[starts[i]:ends[i]]`` (``data`` from ``padded_buffer``; ends exclude the
    '\\n'; a trailing '\\r' is dropped here). Exact for every line: the few lines the vector
    path cannot decide are re-parsed by ``parse_line_exact``. A line longer than
    ``max_line_bytes`` (None: no limit) is rejected before its fields count; ``lengths``: the
    lines' full lengths where ``data`` holds only their first bytes (``LineBlock.cut``)."""
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    crlf = (ends > starts) & (data[np.maximum(ends - 1, 0)] == 13)
    ends = ends - crlf
    if lengths is None:
        lengths = ends - starts
    too_long = lengths > (np.iinfo(np.int64).max if max_line_bytes is None else max_line_bytes)
    fe, length, ntabs = _field_bounds(data, starts, ends)
    words = _words(data)
    label_char = data[starts]
    label_ok = (length[0] == 1) & ((label_char == 48) | (label_char == 49))
    ints, int_missing, int_bad, int_long = _parse_integers(
        words, data, fe[1:_FIRST_CAT], length[1:_FIRST_CAT]
    )
    cats, cat_bad = _parse_categoricals(words, fe[_FIRST_CAT:], length[_FIRST_CAT:])
    too_many = ntabs > _TABS
    reason = np.select(
        [too_long, too_many, ~label_ok, int_bad.any(axis=0), cat_bad.any(axis=0)],
        [TOO_LONG, TOO_MANY, BAD_LABEL, NON_INTEGER, NON_HEX],
        0,
    ).astype(np.uint8)
    slow = int_long.any(axis=0) & ~too_many & label_ok & ~too_long
    # [fields, n] → [n, fields] views (no copy)
    parsed = ParsedLines(
        reason=reason,
        padded=(ntabs < _TABS) & (reason == 0),
        slow=slow,
        label=np.where(reason == 0, label_char.astype(np.int32) - 48, 0).astype(np.int32),
        ints=ints.T,
        int_missing=int_missing.T,
        cats=cats.T,
    )
    for i in np.flatnonzero(slow):
        _set_line(parsed, i, parse_line_exact(data[starts[i] : ends[i]].tobytes()))
    return parsed


def _set_line(parsed: ParsedLines, i: int, exact: tuple) -> None:
    reason, padded, label, ints, cats = exact
    parsed.reason[i] = reason
    parsed.padded[i] = padded and reason == 0
    parsed.label[i] = label if reason == 0 else 0
    ok = reason == 0
    parsed.ints[i] = [x if (ok and x is not None) else 0 for x in ints]
    parsed.int_missing[i] = [x is None for x in ints]
    parsed.cats[i] = [c if (ok and c is not None) else MISSING for c in cats]


_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")


def _is_integer(field: bytes) -> bool:
    body = field[1:] if field[:1] == b"-" else field
    return bool(body) and set(body) <= _DIGITS and -(2**63) <= int(field) <= _INT64_MAX


def parse_line_exact(line: bytes, max_line_bytes: int | None = None) -> tuple[int, bool, int, list, list]:
    """The rules, one line at a time: (reason code, padded, label, 13 ints or None, 26 cats or
    None). ``line`` has no '\\n' and no trailing '\\r'. The slow path, and the reading of the
    rules that the vector path is tested against."""
    rejected = (0, [None] * NUM_INTEGER, [None] * NUM_CATEGORICAL)
    if max_line_bytes is not None and len(line) > max_line_bytes:
        return (TOO_LONG, False, *rejected)
    fields = line.split(b"\t")
    padded = len(fields) < NUM_FIELDS
    if len(fields) > NUM_FIELDS:
        return (TOO_MANY, padded, *rejected)
    fields += [b""] * (NUM_FIELDS - len(fields))
    if fields[0] not in (b"0", b"1"):
        return (BAD_LABEL, padded, *rejected)
    raw_ints, raw_cats = fields[1:_FIRST_CAT], fields[_FIRST_CAT:]
    if not all(_is_integer(f) for f in raw_ints if f):
        return (NON_INTEGER, padded, *rejected)
    if not all(len(f) <= 8 and set(f) <= _HEX for f in raw_cats if f):
        return (NON_HEX, padded, *rejected)
    return (
        0,
        padded,
        int(fields[0]),
        [int(f) if f else None for f in raw_ints],
        [int(f, 16) if f else None for f in raw_cats],
    )


def parse_hex(strings) -> np.ndarray:
    """Normalised 8-character hex strings (an Arrow string array or a list) → int64 values."""
    import pyarrow as pa

    array = pa.array(strings, pa.string()) if not isinstance(strings, pa.Array) else strings
    array = array.cast(pa.string())
    if len(array) == 0:
        return np.zeros(0, np.int64)
    if array.null_count:
        raise ValueError("a dictionary value is null")
    offsets = np.frombuffer(array.buffers()[1], np.int32, len(array) + 1, array.offset * 4)
    if np.any(np.diff(offsets) != 8):
        raise ValueError("dictionary values must be 8 hex digits")
    data = np.frombuffer(array.buffers()[2], np.uint8)[offsets[0] : offsets[-1]]
    words = data.view("<u8")
    case_bits = np.uint64(0x2020202020202020)  # set in digits and lowercase letters
    if not np.all(_all_hex(words)) or np.any((words & case_bits) != case_bits):
        raise ValueError("dictionary values must be lowercase hex digits")
    return _hex8(words)
