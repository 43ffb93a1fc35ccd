"""Contiguous ids (``preprocess.ids: contiguous``): how a raw value becomes its id, stated once
for the transform (``spark_jobs.contiguous_ids.ContiguousIds``) and the served model
(``trainer.serving``, which reads the same dictionaries as its vocabulary).

1. A missing value is the value ``MISSING_VALUE`` (TorchRec reads ``int(text or "0", 16)``).
2. The value's id in its column's dictionary (``parquet/contiguous_dictionaries``: ids from
   ``FIRST_ID`` on, by first appearance); a value with none (rare, or never numbered) is
   ``RARE_ID``.
3. With caps, that id modulo the column's cap. A model's table has the cap's rows, or (no caps)
   the highest id + 1, so taking the id modulo the table's rows states both cases.

The numbering itself is ``spark_jobs.contiguous_ids.contiguous_ids``.
"""

from __future__ import annotations

MISSING_VALUE = 0  # what a missing categorical is looked up as
RARE_ID = 1  # a value seen fewer than the threshold's times (or not in the numbered days)
FIRST_ID = 2  # the first value to appear
# Under the parquet directory, beside (not in) parquet/dictionaries: a reader of those (the
# frequency export's vocabulary, the stable lineage) takes an absent value as id 0 and the ids
# as table rows, neither of which holds here (missing is a value, rare is 1, the caps apply
# after).
DICTIONARIES_DIR = "contiguous_dictionaries"

__all__ = ["DICTIONARIES_DIR", "FIRST_ID", "MISSING_VALUE", "RARE_ID"]
