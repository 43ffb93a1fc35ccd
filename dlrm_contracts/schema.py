"""The Criteo click-log record layout, named once for every stage.

A raw line is: label, 13 integer fields, 26 categorical fields (32-bit hashes written as
8 hex digits), tab separated, a missing value being an empty field.
"""

from __future__ import annotations

LABEL = "label"
NUM_INTEGER = 13
NUM_CATEGORICAL = 26
NUM_FIELDS = 1 + NUM_INTEGER + NUM_CATEGORICAL  # 40

INT_COLUMNS: tuple[str, ...] = tuple(f"I{i}" for i in range(1, NUM_INTEGER + 1))
CAT_COLUMNS: tuple[str, ...] = tuple(f"C{i}" for i in range(1, NUM_CATEGORICAL + 1))
ALL_COLUMNS: tuple[str, ...] = (LABEL, *INT_COLUMNS, *CAT_COLUMNS)

SPLITS: tuple[str, ...] = ("train", "test", "validation")

# Id given to values below the frequency threshold and to missing values.
RARE_OR_MISSING_ID = 0
