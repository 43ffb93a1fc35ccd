"""Raw Criteo lines → typed, validated rows, with Spark SQL functions only (no Python UDFs).

Rules (also in docs/spark_jobs.md):
- a trailing '\\r' is dropped (CRLF files); fields are split on tabs, keeping empty ones;
- fewer than 40 fields: the missing trailing fields are read as missing values (``padded``);
- rejected, with the first matching reason: ``too_many_fields`` (more than 40),
  ``bad_label`` (label not exactly 0 or 1), ``non_integer`` (an integer field that is not an
  optional '-' followed by digits, or does not fit in 64 bits), ``non_hex_categorical`` (a
  categorical that is not 1-8 hex digits);
- categoricals are normalised to 8 lowercase hex digits (left-padded with zeros).

Each day keeps ``pos`` (monotonically_increasing_id of its own read, so order-preserving within
the file) and two seeded hashes of the line that give train its threshold-independent order.
"""

from __future__ import annotations

from functools import reduce

from pipeline.schema import CAT_COLUMNS, INT_COLUMNS, LABEL, NUM_FIELDS

REASONS: tuple[str, ...] = ("too_many_fields", "bad_label", "non_integer", "non_hex_categorical")
_INT_PATTERN = r"^-?[0-9]+$"


def _any(conditions):
    return reduce(lambda a, b: a | b, conditions)


def read_day(session, path: str, day: int):
    """One day file as rows of (day, pos, line): '.gz' is decompressed, '\\r' stripped."""
    from pyspark.sql import functions as F

    value = F.col("value")
    line = F.when(value.endswith("\r"), F.expr("substr(value, 1, length(value) - 1)")) \
        .otherwise(value)
    return (session.read.text(path)
            .select(F.lit(day).alias("day"),
                    F.monotonically_increasing_id().alias("pos"),
                    line.alias("line")))


def parse_lines(lines, seed: int):
    """(day, pos, line) → day, pos, key1, key2, reason, padded, raw, label, I*, C*.

    ``reason`` is null for a valid row; ``raw`` is the line only for rejected rows (so the
    cached rows stay compact). ``I*`` stay integers here (nullable) so that missing rates can
    be counted; the log transform happens when writing.
    """
    from pyspark.sql import functions as F

    fields = F.split(F.col("line"), "\t", -1)
    parsed = lines.select("day", "pos", "line", fields.alias("f"))
    field = [F.get(F.col("f"), i) for i in range(NUM_FIELDS)]
    label_text, int_text, cat_text = field[0], field[1:14], field[14:]

    int_value = [F.when(t != "", t.try_cast("bigint")) for t in int_text]
    bad_int = [(t != "") & (t.try_cast("bigint").isNull() | ~t.rlike(_INT_PATTERN))
               for t in int_text]
    bad_cat = [(t != "") & ((F.length(t) > 8) | F.unhex(t).isNull()) for t in cat_text]
    num_fields = F.size(F.col("f"))
    reason = (F.when(num_fields > NUM_FIELDS, F.lit("too_many_fields"))
              .when(label_text.isNull() | ~label_text.isin("0", "1"), F.lit("bad_label"))
              .when(_any(bad_int), F.lit("non_integer"))
              .when(_any(bad_cat), F.lit("non_hex_categorical")))
    cat_value = [F.when(t != "", F.lpad(F.lower(t), 8, "0")) for t in cat_text]
    seed_lit = F.lit(seed)
    return (parsed
            .select(
                "day", "pos",
                F.xxhash64(seed_lit, F.col("line")).alias("key1"),
                F.hash(seed_lit, F.col("line")).alias("key2"),
                reason.alias("reason"),
                (num_fields < NUM_FIELDS).alias("padded"),
                F.when(reason.isNotNull(), F.col("line")).alias("raw"),
                F.when(label_text == "1", 1).otherwise(0).cast("int").alias(LABEL),
                *[v.alias(c) for v, c in zip(int_value, INT_COLUMNS)],
                *[v.alias(c) for v, c in zip(cat_value, CAT_COLUMNS)],
            ))


def log_transform(column):
    """log(x + 3) as float32 for x > -3; missing or x ≤ -3 → 0."""
    from pyspark.sql import functions as F

    return (F.when(column > -3, F.log(column.cast("double") + 3.0))
            .otherwise(F.lit(0.0)).cast("float"))
