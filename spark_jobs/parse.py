"""Raw Criteo lines → typed, validated rows, with Spark SQL functions only (no Python UDFs).

Rules (also in docs/spark_jobs.md):
- a trailing '\\r' is dropped (CRLF files); fields are split on tabs, keeping empty ones;
- fewer than 40 fields: the missing trailing fields are read as missing values (``padded``);
- rejected, with the first matching reason: ``too_many_fields`` (more than 40),
  ``bad_label`` (label not exactly 0 or 1), ``non_integer`` (an integer field that is not an
  optional '-' followed by digits, or does not fit in 64 bits), ``non_hex_categorical`` (a
  categorical that is not 1-8 hex digits);
- categoricals are normalised to 8 lowercase hex digits (left-padded with zeros).

Speed: one regular expression over the whole line recognises the (almost always) valid lines;
only lines it does not match are classified field by field, with compact higher-order
functions. Everything is a SQL expression string, so the plan stays small and is built with a
handful of py4j calls.

Each day keeps ``pos`` (monotonically_increasing_id of its own read, so order-preserving within
the file) and two seeded hashes of the line that give train its threshold-independent order.
"""

from __future__ import annotations

from pipeline.schema import CAT_COLUMNS, INT_COLUMNS, LABEL, NUM_CATEGORICAL, NUM_FIELDS, NUM_INTEGER

REASONS: tuple[str, ...] = ("too_many_fields", "bad_label", "non_integer", "non_hex_categorical")

_INT = r"(?:-?[0-9]{1,18})?"
_HEX = r"(?:[0-9a-f]{8})?"
# Lines this matches are valid (a sound subset of the rules: 18 digits always fit in 64 bits)
# and their categoricals are already normalised (8 lowercase hex digits).
FAST_VALID = (rf"^[01](?:(?:\t{_INT}){{{NUM_INTEGER}}}(?:\t{_HEX}){{0,{NUM_CATEGORICAL}}}"
              rf"|(?:\t{_INT}){{0,{NUM_INTEGER - 1}}})$")


def _sql_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _reason_sql() -> str:
    """null for a valid line, else the first failing rule (the field-by-field classification)."""
    first_cat = 2 + NUM_INTEGER
    slow = (f"CASE WHEN size(f) > {NUM_FIELDS} THEN 'too_many_fields' "
            "WHEN NOT coalesce(get(f, 0) IN ('0', '1'), false) THEN 'bad_label' "
            f"WHEN exists(slice(f, 2, {NUM_INTEGER}), x -> x != '' AND "
            "(NOT x rlike '^-?[0-9]+$' OR try_cast(x AS BIGINT) IS NULL)) THEN 'non_integer' "
            f"WHEN exists(slice(f, {first_cat}, {NUM_CATEGORICAL}), x -> x != '' AND "
            "NOT x rlike '^[0-9a-fA-F]{1,8}$') THEN 'non_hex_categorical' END")
    return f"CASE WHEN fast THEN NULL ELSE {slow} END"


def read_day(session, path: str, day: int):
    """One day file as rows of (day, pos, line): '.gz' is decompressed, '\\r' stripped."""
    return session.read.text(path).selectExpr(
        f"{int(day)} AS day",
        "monotonically_increasing_id() AS pos",
        "CASE WHEN endswith(value, '\\r') THEN substr(value, 1, length(value) - 1) "
        "ELSE value END AS line")


def parse_lines(lines, seed: int):
    """(day, pos, line) → day, pos, key1, key2, reason, padded, raw, label, I*, C*.

    ``reason`` is null for a valid row; ``raw`` is the line only for rejected rows (so the
    cached rows stay compact). ``I*`` stay integers here (nullable) so that missing rates can
    be counted; the log transform happens when writing.
    """
    seed = int(seed)
    split = lines.selectExpr("day", "pos", "line", "split(line, '\\t', -1) AS f",
                             f"line rlike {_sql_string(FAST_VALID)} AS fast") \
        .selectExpr("*", f"{_reason_sql()} AS reason")
    ints = [f"try_cast(nullif(get(f, {i + 1}), '') AS BIGINT) AS {c}"
            for i, c in enumerate(INT_COLUMNS)]
    cats = [f"CASE WHEN fast THEN nullif(get(f, {j}), '') "
            f"ELSE lpad(lower(nullif(get(f, {j}), '')), 8, '0') END AS {c}"
            for j, c in enumerate(CAT_COLUMNS, start=1 + NUM_INTEGER)]
    return split.selectExpr(
        "day", "pos",
        f"xxhash64({seed}, line) AS key1",
        f"hash({seed}, line) AS key2",
        "reason",
        f"size(f) < {NUM_FIELDS} AS padded",
        "CASE WHEN reason IS NOT NULL THEN line END AS raw",
        f"CAST(CASE WHEN get(f, 0) = '1' THEN 1 ELSE 0 END AS INT) AS {LABEL}",
        *ints, *cats)


def log_transform(column):
    """log(x + 3) as float32 for x > -3; missing or x ≤ -3 → 0."""
    from pyspark.sql import functions as F

    return (F.when(column > -3, F.log(column.cast("double") + 3.0))
            .otherwise(F.lit(0.0)).cast("float"))
