"""The SQL engine's rejects: the rejected lines of the parsed days, as JSON lines.

The parsed frames the count pass read are read again, only for the days that had rejects.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from spark_jobs.columns import literal_lookup
from spark_jobs.inputs import DayFile
from spark_jobs.stats import DayStats, line_number_column

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def write_rejects(
    parsed: dict[int, DataFrame], days: list[DayFile], stats: dict[int, DayStats], out_dir: Path
) -> None:
    """Rejected lines with their day file, 1-based line number, reason, first bytes
    (``parse_for_counting``'s ``raw``) and full length in bytes.

    Only days that have rejects are read again (clean data costs nothing here); the directory
    is emptied first, so it always holds exactly this run's rejects.
    """
    from functools import reduce

    from pyspark.sql import functions as F

    shutil.rmtree(out_dir, ignore_errors=True)
    dirty = [d for d in days if stats[d.day].rows_rejected]
    if not dirty:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return
    names = {str(d.day): d.name for d in dirty}
    rows = reduce(lambda a, b: a.unionByName(b), [parsed[d.day] for d in dirty])
    rejects = rows.where(F.col("reason").isNotNull()).select(
        literal_lookup(names, "day").alias("file"),
        (line_number_column(stats, [d.day for d in dirty]) + 1).alias("line_number"),
        "reason",
        F.col("raw").alias("line"),
        F.col("raw_bytes").alias("line_bytes"),
    )
    rejects.write.mode("overwrite").json(str(out_dir))
