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

# Why a raw line is rejected, in order of precedence (a line gets the first that applies;
# docs/spark_jobs.md, "Rules for every line"). The names are an interface: the data-quality
# report, the rejects files and the SavedModel's ``reject_reason`` output all use them.
LINE_TOO_LONG = "line_too_long"  # longer than preprocess.max_line_bytes
TOO_MANY_FIELDS = "too_many_fields"  # more than 40 fields
BAD_LABEL = "bad_label"  # the label is not 0 or 1
NON_INTEGER = "non_integer"  # an integer field is not a 64-bit integer
NON_HEX_CATEGORICAL = "non_hex_categorical"  # a categorical is not 1 to 8 hex digits
REJECT_REASONS: tuple[str, ...] = (
    LINE_TOO_LONG,
    TOO_MANY_FIELDS,
    BAD_LABEL,
    NON_INTEGER,
    NON_HEX_CATEGORICAL,
)

# Id given to values below the frequency threshold and to missing values.
RARE_OR_MISSING_ID = 0
