"""Categorical values as the logs write them: 8 lowercase hex digits (the normalised form).

One formatter for every writer of that text: the dictionaries' ``value`` column (spark_jobs),
and the synthetic day files (pipeline.synthetic), so the two can never disagree on a value's
spelling. Vectorised: two table lookups per value into one buffer, no Python string per value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
# Every 16-bit number as its 4 lowercase hex digits, packed in one uint32 (native byte order),
# so an 8-digit value is two table lookups.
_HEX4 = (
    np.ascontiguousarray(
        np.stack([_HEX_DIGITS[(np.arange(1 << 16) >> shift) & 0xF] for shift in (12, 8, 4, 0)], axis=1)
    )
    .view(np.uint32)
    .ravel()
)


def format_hex(values: np.ndarray, missing: np.ndarray | None = None) -> pa.StringArray:
    """Values (0 .. 2**32 - 1, any integer dtype) as 8 lowercase hex digits each; the empty
    string where ``missing`` (a missing field of a raw line)."""
    values = np.asarray(values).astype(np.uint32, copy=False)
    if missing is not None and not missing.any():
        missing = None
    present = values if missing is None else values[~missing]
    digits = np.empty((present.size, 2), np.uint32)
    np.take(_HEX4, present >> np.uint32(16), out=digits[:, 0])
    np.take(_HEX4, present & np.uint32(0xFFFF), out=digits[:, 1])
    if missing is None:
        offsets = np.arange(0, 8 * values.size + 1, 8, dtype=np.int32)
    else:
        offsets = np.zeros(values.size + 1, np.int32)
        np.cumsum(np.where(missing, 0, 8), out=offsets[1:])
    return pa.StringArray.from_buffers(values.size, pa.py_buffer(offsets), pa.py_buffer(digits))
