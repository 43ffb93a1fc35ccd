"""Categorical value → id inside the Arrow engine's tasks, from a per-worker cached index.

Each Python worker builds one hash index over the dictionaries of the columns it looks up
(``ArrowEngine._indexed_columns``: within ``broadcast_max_values``, smallest first up to
``arrow_index_max_values`` values), reading them from the workdir's dictionary parquet itself: nothing is collected to the driver or broadcast through it. Spark
reuses Python workers across tasks (``spark.python.worker.reuse``, on by default), so the
index is built once per worker and run, not once per task. Other dictionaries are joined by
Spark on the value after the task.

Keys are ``column << 32 | value`` for every cached column together, so one hash lookup per
batch serves all 26 columns; a missing value (-1) matches nothing and gets id 0.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dlrm_contracts.schema import CAT_COLUMNS
from spark_jobs.fastparse import parse_hex

_CACHE: dict[str, "DictionaryIndex"] = {}


class DictionaryIndex:
    def __init__(self, dict_dir: str, columns: tuple[int, ...]):
        import pandas as pd
        import pyarrow.parquet as pq

        keys, ids = [np.zeros(0, np.int64)], [np.zeros(0, np.int32)]
        for j in columns:
            path = Path(dict_dir) / f"column={CAT_COLUMNS[j]}"
            if not path.is_dir():        # no value kept: every id is 0
                continue
            table = pq.read_table(path, columns=["value", "id"])
            keys.append((np.int64(j) << np.int64(32)) | parse_hex(table["value"].combine_chunks()))
            ids.append(table["id"].to_numpy().astype(np.int32))
        self.columns = np.asarray(columns, np.int64)
        self.index = pd.Index(np.concatenate(keys))
        self.ids = np.concatenate([np.zeros(1, np.int32), *ids])   # slot 0: not found → id 0
        self.index.get_indexer(self.index[:1])                      # build the hash table now

    def lookup(self, values: np.ndarray) -> np.ndarray:
        """values [n, len(columns)] (MISSING = -1) → int32 ids, 0 for rare or missing."""
        keys = (self.columns << np.int64(32)) | values
        found = self.index.get_indexer(keys.ravel()) + 1
        return self.ids[found].reshape(values.shape)

    @property
    def size(self) -> int:
        return len(self.index)


def dictionary_index(dict_dir: str, columns: tuple[int, ...], token: str) -> DictionaryIndex:
    """The worker's index for this run (``token`` names the run); an older one is dropped."""
    key = f"{token}:{dict_dir}:{columns}"
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = DictionaryIndex(dict_dir, columns)
    return _CACHE[key]
