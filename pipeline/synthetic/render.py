"""Sampled columns → the bytes of Criteo Terabyte lines.

Formatting is vectorised (dlrm_contracts.hex_text for the hex digits, pyarrow.compute for
integer-to-text and the tab join), because a Python loop over rows could not reach 100k rows/s.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dlrm_contracts.hex_text import format_hex
from pipeline.synthetic.shape import Features


def integer_column(values: np.ndarray, missing: np.ndarray) -> pa.Array:
    """int64 values as decimal text; the empty string where ``missing``."""
    text = pc.cast(pa.array(values, type=pa.int64(), mask=missing), pa.string())
    return pc.fill_null(text, "")


def render_lines(labels: np.ndarray, features: Features, hex_values: np.ndarray) -> bytes:
    """All rows as tab-separated, LF-terminated lines (40 fields, empty = missing)."""
    columns = [pc.cast(pa.array(labels.astype(np.int8)), pa.string())]
    columns += [integer_column(v, m) for v, m in zip(features.int_values, features.int_missing)]
    columns += [format_hex(v, r == 0) for v, r in zip(hex_values, features.cat_ranks)]
    lines = pc.binary_join_element_wise(*columns, "\t")
    # Joining each line with an empty string on "\n" appends the line end.
    lines = pc.binary_join_element_wise(lines, "", "\n")
    offsets = np.frombuffer(lines.buffers()[1], np.int32, count=len(lines) + 1, offset=lines.offset * 4)
    data = lines.buffers()[2]
    return data[int(offsets[0]) : int(offsets[-1])].to_pybytes()
