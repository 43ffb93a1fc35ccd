"""The SQL engine's transform: parsed rows + dictionaries → the parquet splits.

Categoricals arrive as 64-bit keys (``spark_jobs.engines.sql.parse.cat_key_sqls``) and are
joined with the dictionaries' ``key`` column: small dictionaries are broadcast (map-side hash joins keep each
partition's row order); dictionaries above ``broadcast_max_values`` are joined with a shuffle,
never collected.

Two writes make the splits, test and validation first, then train; each query builds its
own broadcast dictionaries (one Spark job per dictionary). Train is hash-partitioned by
``key1`` (a seeded hash of the raw line) and sorted within each partition by (key1, key2, the
row), so its order depends only on the input and the seed and no range-partitioning sample
pass is needed; the last day's partitions follow its lines and are sorted by line position (a
global sort only after a shuffle join). The writer partitions by
split into a staging directory whose ``split=<name>`` folders become the split directories.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dlrm_contracts.schema import ALL_COLUMNS, CAT_COLUMNS, INT_COLUMNS, LABEL
from spark_jobs.engines.sql.parse import hex_value_sql, log_transform, value_key_sql

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

OUTPUT_COLUMNS = ALL_COLUMNS  # the splits hold the whole record, in its order


def map_categoricals(
    rows: DataFrame,
    session: SparkSession,
    dict_dir: Path,
    sizes: dict[str, int],
    broadcast_max_values: int,
    columns=CAT_COLUMNS,
    dictionary_key=value_key_sql,
) -> tuple[DataFrame, bool]:
    """Replace each of ``columns`` (keys) by its id (0 when rare or missing). Returns (rows,
    shuffled?). ``dictionary_key`` maps the SQL of the dictionary's ``value`` to the SQL of
    the rows' key."""
    # Every DataFrame call analyses the whole plan again, so 26 chained joins analysed 26
    # growing plans (seconds on the driver, every run). One SQL query over the rows and the
    # dictionaries' views is analysed once.
    shuffled = False
    dictionaries = session.read.parquet(str(dict_dir)) if max(sizes.values()) > 1 else None
    joins, ids, broadcast = [], {}, []
    for k, c in enumerate(columns):
        if sizes[c] <= 1:
            ids[c] = "CAST(0 AS INT)"
            continue
        if sizes[c] - 1 <= broadcast_max_values:
            broadcast.append(f"d{k}")
        else:
            shuffled = True
        table = f"(SELECT {dictionary_key('value')} AS k, id FROM {{dictionaries}} WHERE `column` = '{c}')"
        joins.append(f"LEFT JOIN {table} AS d{k} ON r.`{c}` = d{k}.k")
        ids[c] = f"CAST(coalesce(d{k}.id, 0) AS INT)"
    select = ", ".join(f"{ids[c]} AS `{c}`" if c in ids else f"r.`{c}`" for c in rows.columns)
    hint = f"/*+ BROADCAST({', '.join(broadcast)}) */ " if broadcast else ""
    query = f"SELECT {hint}{select} FROM {{rows}} AS r " + " ".join(joins)
    views = {"rows": rows, "dictionaries": dictionaries} if dictionaries is not None else {"rows": rows}
    return session.sql(query, **views), shuffled


@dataclass(frozen=True)
class Lookup:
    """How the transform reads the dictionaries: the run's mode's rule (``IdMode``: whether a
    categorical is read as its hex value, what a missing one is looked up as, the id of a
    value without one) and the caps every id is taken modulo (None: no caps)."""

    hex_values: bool
    missing_value: int | None
    rare_id: int
    caps: dict[str, int] | None


def looked_up(
    rows: DataFrame,
    session: SparkSession,
    dict_dir: Path,
    kept: dict[str, int],
    broadcast_max_values: int,
    lookup: Lookup,
) -> tuple[DataFrame, bool]:
    """Each C* → its id in the dictionaries of ``dict_dir`` (``kept``: the values with an id
    per column, which choose each join) read by ``lookup``'s rule. Returns (rows, shuffled?)."""
    from pyspark.sql import functions as F

    if lookup.missing_value is not None:
        missing = F.lit(lookup.missing_value).cast("long")
        rows = rows.withColumns({c: F.coalesce(F.col(c), missing) for c in CAT_COLUMNS})
    rows, shuffled = map_categoricals(
        rows,
        session,
        dict_dir,
        {c: kept[c] + 1 for c in CAT_COLUMNS},
        broadcast_max_values,
        dictionary_key=hex_value_sql if lookup.hex_values else value_key_sql,
    )
    if not lookup.rare_id and lookup.caps is None:
        return rows, shuffled
    ids = {}
    for c in CAT_COLUMNS:
        found = (
            F.when(F.col(c) == 0, F.lit(lookup.rare_id)).otherwise(F.col(c)) if lookup.rare_id else F.col(c)
        )
        ids[c] = (found % F.lit(int(lookup.caps[c])) if lookup.caps is not None else found).cast("int")
    return rows.withColumns(ids), shuffled


def capped_categoricals(rows: DataFrame, caps: dict[str, int]) -> tuple[DataFrame, bool]:
    """Capped ids (``spark_jobs.capped_ids``): each C* (its hex value) becomes value % cap, 0
    when missing. Nothing is joined, so the rows keep their order: (rows, False)."""
    from pyspark.sql import functions as F

    ids = {c: F.coalesce(F.col(c) % F.lit(int(caps[c])), F.lit(0)).cast("int") for c in CAT_COLUMNS}
    return rows.withColumns(ids), False


def output_projection(rows: DataFrame, extra: tuple = ()) -> DataFrame:
    """label int32, I* float32 (log transform), C* int32, plus ``extra`` helper columns."""
    from pyspark.sql import functions as F

    return rows.select(
        F.col(LABEL).cast("int").alias(LABEL),
        *[log_transform(F.col(c)).alias(c) for c in INT_COLUMNS],
        *[F.col(c).cast("int").alias(c) for c in CAT_COLUMNS],
        *extra,
    )


def write_parquet(frame: DataFrame, path: Path, compression: str, partition_by: str | None = None) -> None:
    writer = frame.write.mode("overwrite").option("compression", compression)
    if partition_by:
        writer = writer.partitionBy(partition_by)
    writer.parquet(str(path))


def train_part(rows: DataFrame, partitions: int) -> DataFrame:
    """Train rows (output columns, ``_order``, ``_tie``) hash-partitioned by the seeded key and
    sorted within each file by (key, day << 40 | line): a total order, and a sort on a leading
    long key, which Spark does by radix sort on its prefix."""
    from pyspark.sql import functions as F

    return (
        rows.repartition(partitions, F.col("_order"))
        .sortWithinPartitions("_order", "_tie")
        .select(*OUTPUT_COLUMNS)
    )


def eval_part(rows: DataFrame, must_sort: bool) -> DataFrame:
    """Rows of the last day (output columns, ``split``, ``_order`` = line number): sorted by
    (split, line) within each read partition, the order the split-partitioned writer needs;
    globally after a shuffle join, which loses the line order."""
    frame = rows.select(*OUTPUT_COLUMNS, "split", "_order")
    frame = frame.orderBy("split", "_order") if must_sort else frame.sortWithinPartitions("split", "_order")
    return frame.drop("_order")
