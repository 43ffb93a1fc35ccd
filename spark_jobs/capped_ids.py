"""Capped ids (``preprocess.ids: modulo``): a value's id is its hexadecimal value modulo its
column's cap, a missing value's id is 0; the table of a column has exactly ``cap`` rows.

This is the rule of TorchRec's Criteo reader, which MLPerf DLRMv2 trains with: its
``criteo.py`` reads a categorical as ``int(text or "0", 16)`` (so a missing value is 0) and its
``InMemoryBinaryCriteoIterDataPipe`` takes each column modulo ``hashes``, the caps it is given
(``num_embeddings_per_feature``). A present value whose hex value is a multiple of the cap
shares id 0 with the missing ones, as it does there. Nothing is counted and no dictionary is
built: the id of a value depends on the value and the cap alone, so every day is transformed
on its own, and an unseen value has an id like any other.

The engines compute it their own way (numpy in the Arrow engine's tasks, a Spark SQL
expression in the SQL engine, ``spark_jobs.engines.sql.transform.capped_categoricals``); this
module holds the rule once in numpy, which the Arrow engine uses and the tests check both
engines against.
"""

from __future__ import annotations

import numpy as np

from dlrm_contracts.schema import CAT_COLUMNS


def capped_ids(values: np.ndarray, caps, out: np.ndarray | None = None) -> np.ndarray:
    """``values`` [26, n] (int64 hex values, negative = missing) → int32 ids ``value % cap``
    of each row's column, 0 where missing. ``caps``: 26 ints, in column order."""
    caps = np.asarray(caps, np.int64).reshape(len(CAT_COLUMNS), 1)
    ids = np.remainder(values, caps)
    ids[values < 0] = 0
    if out is None:
        return ids.astype(np.int32)
    out[...] = ids
    return out


class CappedIds:
    """What a transform task gives ids with under ``ids: modulo``: the same call as the
    dictionary index's (``lookup_into``), with no index to open."""

    def __init__(self, caps: tuple[int, ...]):
        self.caps = np.asarray(caps, np.int64)

    def lookup_into(self, values: np.ndarray, out: np.ndarray) -> None:
        capped_ids(values, self.caps, out)
