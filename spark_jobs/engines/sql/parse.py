"""Raw Criteo lines → typed, validated rows, with Spark SQL functions only (no Python UDFs).

Rules (also in docs/spark_jobs.md):
- lines end at '\\n' only (a '\\r', NEL or U+2028 elsewhere is data); a trailing '\\r' is
  dropped (CRLF files); fields are split on tabs, keeping empty ones;
- fewer than 40 fields: the missing trailing fields are read as missing values (``padded``);
- rejected, with the first matching reason: ``line_too_long`` (more than
  ``preprocess.max_line_bytes`` bytes), ``too_many_fields`` (more than 40),
  ``bad_label`` (label not exactly 0 or 1), ``non_integer`` (an integer field that is not an
  optional '-' followed by digits, or does not fit in 64 bits), ``non_hex_categorical`` (a
  categorical that is not 1-8 hex digits);
- categoricals are normalised to 8 lowercase hex digits (left-padded with zeros).

Speed: the job reads every line twice (count pass, transform pass), so the per-line cost is
what matters. A line is *fast* when cheap checks prove it valid and already normalised: a
regular expression over the label and integer fields only (the short head of the line), and
for the categoricals byte lengths of 0 or 8, ``unhex`` of their concatenation (all hex) and
lowercase. Only the other lines are classified field by field (``reason``). The transform pass
skips even the cheap checks for a day whose count pass found every line fast.

Categoricals are joined on ``xxhash64`` of the normalised 8-character value: for an 8-byte
input XXH64 is a bijection (every step is invertible), so the 64-bit key is exact, and a join
on a long hashes and compares one fixed-width word where a string join handles variable-length
bytes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from dlrm_contracts.schema import (
    BAD_LABEL,
    CAT_COLUMNS,
    INT_COLUMNS,
    LABEL,
    LINE_TOO_LONG,
    NON_HEX_CATEGORICAL,
    NON_INTEGER,
    NUM_CATEGORICAL,
    NUM_FIELDS,
    NUM_INTEGER,
    TOO_MANY_FIELDS,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

FIRST_CAT = 1 + NUM_INTEGER  # index of C1 in the split fields
# Spark's default spark.sql.files.maxPartitionBytes: the reads split plain files into tasks of
# at most this many bytes.
SPARK_SPLIT_BYTES = 128 << 20
_INT = r"(?:-?[0-9]{1,18})?"
# The label and integer head of a valid line (18 digits always fit in 64 bits): exactly 13
# integer fields followed by a tab or the end, or fewer than 13 and the end (a short line).
# The end is \z, never $: Java's $ also matches before a final line terminator ('\r', NEL,
# U+2028, U+2029), so "1\u0085" or "0\t5\u2028" would pass as valid (and CAST then fails).
FAST_HEAD = (
    rf"^[01](?:(?:\t{_INT}){{{NUM_INTEGER}}}(?:\t|\z)"
    rf"|(?:\t{_INT}){{0,{NUM_INTEGER - 1}}}\z)"
)


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _field(j: int) -> str:
    return f"get(f, {j})"


def _fast_sql(max_line_bytes: int) -> str:
    """True when the line is valid and its categoricals are already 8 lowercase hex digits
    (``octet_length`` is a field of Spark's strings: the length check costs nothing)."""
    cats = [_field(j) for j in range(FIRST_CAT, NUM_FIELDS)]
    lengths = " AND ".join(f"coalesce(octet_length({c}), 0) IN (0, 8)" for c in cats)
    joined = f"concat_ws('', {', '.join(cats)})"
    return (
        f"(octet_length(line) <= {int(max_line_bytes)} AND size(f) <= {NUM_FIELDS} AND line rlike {_sql_string(FAST_HEAD)} AND {lengths} "
        f"AND unhex({joined}) IS NOT NULL AND lower({joined}) = {joined})"
    )


def _reason_sql(max_line_bytes: int) -> str:
    """null for a valid line, else the first failing rule (the field-by-field classification).

    Kept small on purpose (it is rarely evaluated, but its generated code shares one method with
    the hot path): one regex over the joined integer fields, 13 overflow checks, one regex over
    the joined categoricals. No lambdas: they are not code-generated and would take the whole
    projection out of whole-stage codegen.
    """
    ints = f"concat_ws('\\t', slice(f, 2, {NUM_INTEGER}))"
    cats = f"concat_ws('\\t', slice(f, {FIRST_CAT + 1}, {NUM_CATEGORICAL}))"
    overflow = " OR ".join(
        f"coalesce({_field(j)} != '' AND try_cast({_field(j)} AS BIGINT) IS NULL, false)"
        for j in range(1, FIRST_CAT)
    )
    slow = (
        f"CASE WHEN octet_length(line) > {int(max_line_bytes)} THEN '{LINE_TOO_LONG}' "
        f"WHEN size(f) > {NUM_FIELDS} THEN '{TOO_MANY_FIELDS}' "
        f"WHEN NOT coalesce(get(f, 0) IN ('0', '1'), false) THEN '{BAD_LABEL}' "
        f"WHEN NOT {ints} rlike '^(?:-?[0-9]+)?(?:\\t(?:-?[0-9]+)?)*\\\\z' OR {overflow} "
        f"THEN '{NON_INTEGER}' "
        f"WHEN NOT {cats} rlike '^(?:[0-9a-fA-F]{{1,8}})?(?:\\t(?:[0-9a-fA-F]{{1,8}})?)*\\\\z' "
        f"THEN '{NON_HEX_CATEGORICAL}' END"
    )
    return f"CASE WHEN fast THEN NULL ELSE {slow} END"


def input_tasks(days) -> int:
    """The tasks Spark's text reader splits the days into: one per gzip file (it cannot be
    split), one per ``SPARK_SPLIT_BYTES`` of a plain file (what progress plans on)."""
    return sum(1 if d.gzipped else max(1, math.ceil(d.path.stat().st_size / SPARK_SPLIT_BYTES)) for d in days)


def read_day(session: SparkSession, path: str, day: int) -> DataFrame:
    """One day file as rows of (day, line): '.gz' is decompressed, lines end at '\\n' only, a
    trailing '\\r' is stripped (CRLF); a '\\r' elsewhere stays in the line (and rejects it).

    ``day`` is a *string* literal on purpose: code generation inlines integer literals into
    the generated source but passes strings by reference, so every day's read shares one
    generated class, compiled (by Janino and by the JIT) once instead of once per day.
    """
    # lineSep '\n': Hadoop's default reader also ends a line at a lone '\r', which would split
    # "a\rb" into two lines and shift every later line number and the test/validation split
    return (
        session.read.option("lineSep", "\n")
        .text(path)
        .selectExpr(
            f"'{int(day)}' AS day",
            "CASE WHEN endswith(value, '\\r') THEN substr(value, 1, length(value) - 1) "
            "ELSE value END AS line",
        )
    )


def split_fields(lines: DataFrame, max_line_bytes: int, checked: bool = True) -> DataFrame:
    """(day, line) → + f (the fields), fast, reason, pos.

    ``pos`` is monotonically_increasing_id (partition index << 33 | row), so it follows the
    lines of the file. It is computed in the same projection as ``reason`` on purpose: a
    nondeterministic projection stops the optimizer from pushing a later ``reason IS NULL``
    filter below it, which would inline ``split`` and the checks dozens of times.
    ``checked=False`` is for lines already known to be all fast (the count pass saw them): the
    checks are skipped and every line is taken as fast and valid.
    """
    frame = lines.selectExpr("*", "split(line, '\\t', -1) AS f")
    if not checked:
        return frame.selectExpr(
            "*", "true AS fast", "CAST(NULL AS STRING) AS reason", "monotonically_increasing_id() AS pos"
        )
    return frame.selectExpr("*", f"{_fast_sql(max_line_bytes)} AS fast").selectExpr(
        "*", f"{_reason_sql(max_line_bytes)} AS reason", "monotonically_increasing_id() AS pos"
    )


def label_sql() -> str:
    return f"CAST(CASE WHEN get(f, 0) = '1' THEN 1 ELSE 0 END AS INT) AS {LABEL}"


def int_sqls() -> list[str]:
    """I1..I13 as nullable BIGINT; ``cast`` is exact on fast lines, ``try_cast`` on the others."""
    out = []
    for i, c in enumerate(INT_COLUMNS, start=1):
        x = f"nullif({_field(i)}, '')"
        out.append(f"CASE WHEN fast THEN CAST({x} AS BIGINT) ELSE try_cast({x} AS BIGINT) END AS {c}")
    return out


def cat_value_sql(j: int) -> str:
    """The normalised value of field j (8 lowercase hex digits), null when missing."""
    x = f"nullif({_field(j)}, '')"
    return f"CASE WHEN fast THEN {x} ELSE lpad(lower({x}), 8, '0') END"


def cat_sqls() -> list[str]:
    return [f"{cat_value_sql(j)} AS {c}" for j, c in enumerate(CAT_COLUMNS, start=FIRST_CAT)]


def cat_key_sqls() -> list[str]:
    """C1..C26 as join keys: xxhash64 of the normalised value (exact, see the module doc)."""
    # xxhash64(NULL) is the seed, a valid key: a missing value must stay NULL (no match, id 0)
    return [
        f"CASE WHEN {cat_value_sql(j)} IS NULL THEN CAST(NULL AS BIGINT) "
        f"ELSE {value_key_sql(cat_value_sql(j))} END AS {c}"
        for j, c in enumerate(CAT_COLUMNS, start=FIRST_CAT)
    ]


def cat_hex_sqls() -> list[str]:
    """C1..C26 as the BIGINT value of their hex digits, null when missing (capped ids: the
    value itself, not a join key, is what the id is computed from)."""
    return [f"{hex_value_sql(cat_value_sql(j))} AS {c}" for j, c in enumerate(CAT_COLUMNS, start=FIRST_CAT)]


def value_key_sql(value: str) -> str:
    """The join key of the normalised value ``value`` (SQL): the rows' side in ``cat_key_sqls``,
    the dictionaries' side in the transform's joins."""
    return f"xxhash64({value})"


def hex_value_sql(value: str) -> str:
    """The BIGINT value of the hex digits of ``value`` (SQL), null when it is null."""
    return f"CAST(conv({value}, 16, 10) AS BIGINT)"


def value_key(column: Column) -> Column:
    """``value_key_sql`` as a Column."""
    from pyspark.sql import functions as F

    return F.xxhash64(column)


def parse_for_counting(lines: DataFrame, max_line_bytes: int) -> DataFrame:
    """(day, line) → day, pos, fast, reason, padded, raw, raw_bytes, I* (raw text), C* (strings).

    The count pass needs only whether an integer field is present, so it is not converted.
    ``raw`` is what the rejects keep of a rejected line: its first ``max_line_bytes`` bytes
    (cut as bytes, as the Arrow engine cuts them); ``raw_bytes`` its full length.
    """
    kept = f"CAST(substr(CAST(line AS BINARY), 1, {int(max_line_bytes)}) AS STRING)"
    return split_fields(lines, max_line_bytes).selectExpr(
        "day",
        "pos",
        "fast",
        "reason",
        f"size(f) < {NUM_FIELDS} AS padded",
        f"CASE WHEN reason IS NOT NULL THEN {kept} END AS raw",
        "CASE WHEN reason IS NOT NULL THEN CAST(octet_length(line) AS BIGINT) END AS raw_bytes",
        *[f"nullif({_field(i)}, '') AS {c}" for i, c in enumerate(INT_COLUMNS, start=1)],
        *cat_sqls(),
    )


def parse_for_transform(
    lines: DataFrame, max_line_bytes: int, checked: bool, hex_values: bool = False
) -> DataFrame:
    """(day, line) → valid rows: day, pos, label, I* (BIGINT), C* (join keys; with
    ``hex_values`` the values themselves, as BIGINT)."""
    # ``pos >= 0`` (always true) keeps ``pos`` referenced: once pruned the projection is
    # deterministic and the validity filter would be pushed below it.
    cats = cat_hex_sqls() if hex_values else cat_key_sqls()
    return (
        split_fields(lines, max_line_bytes, checked)
        .where("reason IS NULL AND pos >= 0")
        .selectExpr("day", "pos", label_sql(), *int_sqls(), *cats)
    )


def log_transform(column: Column) -> Column:
    """log(x + 3) as float32 for x > -3; missing or x ≤ -3 → 0."""
    from pyspark.sql import functions as F

    # log(x + 3) is never null for x > -3, but Spark types it nullable: the coalesce makes the
    # column required in the parquet schema, as the Arrow engine writes it
    logged = F.when(column > -3, F.log(column.cast("double") + 3.0)).otherwise(F.lit(0.0))
    return F.coalesce(logged, F.lit(0.0)).cast("float")
