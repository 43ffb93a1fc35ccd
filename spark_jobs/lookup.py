"""Categorical value → id inside the Arrow engine's tasks, from a per-worker cached index.

Each Python worker builds one hash index over the dictionaries of the columns it looks up
(``ArrowEngine._indexed_columns``: within ``broadcast_max_values``, smallest first up to
``arrow_index_max_values`` values), reading them from the workdir's dictionary parquet itself: nothing is collected to the driver or broadcast through it. Spark
reuses Python workers across tasks (``spark.python.worker.reuse``, on by default), so the
index is built once per worker and run, not once per task. Other dictionaries are joined by
Spark on the value after the task.

One hash index per column: most columns' tables are small enough to stay in the CPU cache
while their values are looked up, which one table over every column's keys is not. A missing
value (-1) matches nothing and gets id 0.
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

        self.columns = tuple(columns)
        self.tables: dict[int, tuple] = {}     # column → (hash index of values, ids; slot 0 = 0)
        for j in columns:
            path = Path(dict_dir) / f"column={CAT_COLUMNS[j]}"
            if not path.is_dir():        # no value kept: every id is 0
                continue
            table = pq.read_table(path, columns=["value", "id"])
            index = pd.Index(parse_hex(table["value"].combine_chunks()))
            index.get_indexer(index[:1])                  # build the hash table now
            ids = np.concatenate([np.zeros(1, np.int32), table["id"].to_numpy().astype(np.int32)])
            self.tables[j] = (index, ids)

    def lookup_into(self, values: np.ndarray, out: np.ndarray) -> None:
        """values [26, n] by column (MISSING = -1) → int32 ids in out [26, n] for the indexed
        columns; 0 for rare or missing."""
        for j in self.columns:
            if j in self.tables:
                index, ids = self.tables[j]
                out[j] = ids[index.get_indexer(values[j]) + 1]
            else:
                out[j] = 0


def dictionary_index(dict_dir: str, columns: tuple[int, ...], token: str) -> DictionaryIndex:
    """The worker's index for this run (``token`` names the run); an older one is dropped."""
    key = f"{token}:{dict_dir}:{columns}"
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = DictionaryIndex(dict_dir, columns)
    return _CACHE[key]
