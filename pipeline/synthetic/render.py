"""Sampled columns → the bytes of Criteo Terabyte lines.

Formatting is vectorised (numpy for the hex digits, pyarrow.compute for integer-to-text and
the tab join), because a Python loop over rows could not reach 100k rows/s.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.synthetic.shape import Features

_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
# Every 16-bit number as its 4 lowercase hex digits, packed in one uint32 (native byte order),
# so an 8-digit value is two table lookups.
_HEX4 = np.ascontiguousarray(
    np.stack([_HEX_DIGITS[(np.arange(1 << 16) >> shift) & 0xF] for shift in (12, 8, 4, 0)],
             axis=1)).view(np.uint32).ravel()


def hex_column(values: np.ndarray, missing: np.ndarray) -> pa.StringArray:
    """uint32 values as 8 lowercase hex digits; the empty string where ``missing``."""
    present = values[~missing] if missing.any() else values
    digits = np.empty((present.size, 2), np.uint32)
    np.take(_HEX4, present >> np.uint32(16), out=digits[:, 0])
    np.take(_HEX4, present & np.uint32(0xFFFF), out=digits[:, 1])
    if present is values:
        offsets = np.arange(0, 8 * values.size + 1, 8, dtype=np.int32)
    else:
        offsets = np.zeros(values.size + 1, np.int32)
        np.cumsum(np.where(missing, 0, 8), out=offsets[1:])
    return pa.StringArray.from_buffers(values.size, pa.py_buffer(offsets), pa.py_buffer(digits))


def integer_column(values: np.ndarray, missing: np.ndarray) -> pa.Array:
    """int64 values as decimal text; the empty string where ``missing``."""
    text = pc.cast(pa.array(values, type=pa.int64(), mask=missing), pa.string())
    return pc.fill_null(text, "")


def render_lines(labels: np.ndarray, features: Features, hex_values: np.ndarray) -> bytes:
    """All rows as tab-separated, LF-terminated lines (40 fields, empty = missing)."""
    columns = [pc.cast(pa.array(labels.astype(np.int8)), pa.string())]
    columns += [integer_column(v, m) for v, m in zip(features.int_values, features.int_missing)]
    columns += [hex_column(v, r == 0) for v, r in zip(hex_values, features.cat_ranks)]
    lines = pc.binary_join_element_wise(*columns, "\t")
    # Joining each line with an empty string on "\n" appends the line end.
    lines = pc.binary_join_element_wise(lines, "", "\n")
    offsets = np.frombuffer(lines.buffers()[1], np.int32, count=len(lines) + 1,
                            offset=lines.offset * 4)
    data = lines.buffers()[2]
    return data[int(offsets[0]):int(offsets[-1])].to_pybytes()
